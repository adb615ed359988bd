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
from typing import TYPE_CHECKING

import coredis
import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import open_dispatcher

from .._redis import (
    FleetRequest,
    RedisServer,
    coredis_leaks,
    crash,
    end_all,
    fleet_examples,
    needs_redis,
    wait_until_drained,
)

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher
    from trio_dispatch._redis._ledger import Ledger

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


@coredis_leaks
@fleet_examples(15)
@given(ops=operations)
async def test_random_interleavings_keep_the_fleet_invariants(
    shared_server: RedisServer,
    dead_ledgers: set[Ledger],
    ops: list[tuple[str, int, int]],
) -> None:
    namespace = uuid.uuid4().hex
    requests: list[FleetRequest] = []
    crashed: set[int] = set()
    live_peak = 0

    def live_holders() -> int:
        return sum(
            1 for r in requests if r.state == "holding" and r.node not in crashed
        )

    async def run(
        dispatcher: Dispatcher, request: FleetRequest, started_at: float
    ) -> None:
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
                    request = FleetRequest(a % NODES)
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
                    crash(nodes[victim], dead_ledgers)
                    for request in requests:
                        if request.node == victim:
                            request.scope.cancel()
                elif op == "settle":
                    await trio.sleep(0.05)
                await trio.sleep(0.005)
            # Every request must end: holders let go as soon as granted.
            await end_all(requests, lease=LEASE)
        assert live_peak <= LIMIT
        # Nothing leaks: live nodes give everything back at once, and what
        # crashed nodes held or queued expires.
        await wait_until_drained(client, namespace, LEASE, crashed=bool(crashed))
        for n, node in enumerate(nodes):
            if n not in crashed:
                stats = node.statistics().providers["p"]
                assert (stats.local_in_flight, stats.local_waiting) == (0, 0)
