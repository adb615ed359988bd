"""Random interleavings over several dispatchers sharing one real Redis.

Each example opens three dispatchers ("nodes") on a fresh namespace of one
redis-server and replays a generated list of operations: a request for a
slot on a node, the release or cancellation of a request, a node's crash
(it loses Redis for good, as a dead process would: its holders count for
nothing from then on, and its leases must expire on their own), and pauses
that let the fleet settle. Checked: live holders never exceed the limit;
every request ends (granted or cancelled, nobody hangs); and at the end
the ledger is empty, crashed nodes' leases and entries included.

Time is real (Redis keeps its own), so the examples are few and short.
"""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import coredis
import pytest
import trio
from coredis.exceptions import ConnectionError as RedisConnectionError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_dispatch import open_dispatcher
from trio_dispatch._ledger import Ledger

from ._redis import RedisServer, coredis_leaks, needs_redis, running_redis

if TYPE_CHECKING:
    from collections.abc import Iterator

    from trio_dispatch import Dispatcher

pytestmark = needs_redis

LIMIT = 2
NODES = 3
LEASE = 0.6

# Requests dominate, so that the limit is contended; at most one node
# crashes per example (see the replay), so the fleet goes on.
operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["acquire"] * 6 + ["release"] * 3 + ["cancel", "crash", "settle"]
        ),
        st.integers(0, 30),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=24,
)


@pytest.fixture(scope="module")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def dead_ledgers() -> Iterator[set[Ledger]]:
    """The ledgers of crashed nodes: every script they run fails."""
    dead: set[Ledger] = set()
    run = Ledger._run

    async def run_unless_dead(
        ledger: Ledger,
        *args: Any,  # noqa: ANN401  # passed through
    ) -> Any:  # noqa: ANN401  # passed through
        if ledger in dead:
            raise RedisConnectionError("the process is gone")
        return await run(ledger, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Ledger, "_run", run_unless_dead)
        yield dead


class Request:
    def __init__(self, node: int) -> None:
        self.node = node
        self.scope = trio.CancelScope()
        self.release = trio.Event()
        self.state = "waiting"


@coredis_leaks
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations)
async def test_random_interleavings_keep_the_fleet_invariants(
    shared_server: RedisServer,
    dead_ledgers: set[Ledger],
    ops: list[tuple[str, int, int]],
) -> None:
    namespace = uuid.uuid4().hex
    requests: list[Request] = []
    crashed: set[int] = set()
    live_peak = 0

    def live_holders() -> int:
        return sum(
            1 for r in requests if r.state == "holding" and r.node not in crashed
        )

    async def run(dispatcher: Dispatcher, request: Request, started_at: float) -> None:
        nonlocal live_peak
        with request.scope:
            async with dispatcher.slot("p", started_at=started_at):
                request.state = "holding"
                live_peak = max(live_peak, live_holders())
                assert live_holders() <= LIMIT
                await request.release.wait()
        request.state = "done" if request.state == "holding" else "cancelled"

    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": LIMIT},
                    redis_url=shared_server.url,
                    namespace=namespace,
                    lease=LEASE,
                )
            )
            for _ in range(NODES)
        ]
        client = await stack.enter_async_context(
            coredis.Redis.from_url(shared_server.url, decode_responses=True)
        )
        async with trio.open_nursery() as nursery:
            for op, a, b in ops:
                if op == "acquire" and a % NODES not in crashed:
                    request = Request(a % NODES)
                    requests.append(request)
                    started_at = trio.current_time() - b * 0.01
                    nursery.start_soon(run, nodes[a % NODES], request, started_at)
                elif op == "release" and requests:
                    requests[a % len(requests)].release.set()
                elif op == "cancel" and requests:
                    requests[a % len(requests)].scope.cancel()
                elif op == "crash" and not crashed:
                    victim = a % NODES
                    crashed.add(victim)
                    ledger = nodes[victim]._ledger
                    assert ledger is not None
                    dead_ledgers.add(ledger)
                    for request in requests:
                        if request.node == victim:
                            request.scope.cancel()
                elif op == "settle":
                    await trio.sleep(0.05)
                await trio.sleep(0.005)
            # Let the last requests reach the ledger, then everyone lets go
            # as soon as granted: every request must end.
            await trio.sleep(0.1)
            with trio.fail_after(LEASE * 3 + 5):
                while any(r.state in {"waiting", "holding"} for r in requests):
                    for request in requests:
                        if request.state == "holding":
                            request.release.set()
                    await trio.sleep(0.01)
        assert live_peak <= LIMIT
        # Nothing leaks: live nodes give everything back at once (well
        # within a lease), and what crashed nodes held or queued expires.
        # A step prunes what has expired, and reports what is left.
        probe = Ledger(client, namespace, LEASE)
        with trio.fail_after(LEASE * 2 + 2 if crashed else LEASE / 2):
            while True:
                seen = await probe.step("p", "probe")
                if seen.in_flight == seen.queued == 0:
                    break
                await trio.sleep(0.02)
        for n, node in enumerate(nodes):
            if n not in crashed:
                stats = node.statistics().providers["p"]
                assert (stats.local_in_flight, stats.local_waiting) == (0, 0)
