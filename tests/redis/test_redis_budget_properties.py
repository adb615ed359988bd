"""Random interleavings over dispatchers sharing budgets and an adaptive limit.

Three dispatchers ("nodes") on a fresh namespace of one real redis-server
share a request budget, a token budget and an ``AdaptiveLimit``, and replay
a generated list of operations: requests with random token estimates,
releases with random usage reports, cancellations, rate-limit reports (each
moves the adaptive limit and pauses the fleet), a node's crash, and pauses
that let the fleet settle. Checked, against what the test itself saw:

* at every grant, live holders never exceed the adaptive limit's maximum,
  and the fleet's limit never leaves its bounds;
* the requests granted never exceed the request bucket's capacity plus its
  refill over the example's wall-clock time (Redis refills on its own
  clock, on this same host);
* the tokens charged at grant never exceed the token bucket's capacity,
  plus its refill, plus what usage reports gave back (a grant needs its
  cost in the bucket, so the bucket's level never pays for more);
* every request ends, granted or cancelled, and at the end the ledger
  holds nothing: no lease, entry, charge or mark of any of them.

Time is real, so the examples are few and short.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import coredis
import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import AdaptiveLimit, Budget, open_dispatcher

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

NODES = 3
LEASE = 0.6
LIMIT = AdaptiveLimit(initial=2, minimum=1, maximum=3, backoff=0.5)
REQUESTS_PER_MINUTE = 9
TOKENS_PER_MINUTE = 1_000

operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["acquire"] * 6
            + ["release"] * 3
            + ["cancel", "rate_limit", "crash", "settle"]
        ),
        st.integers(0, 30),
        st.integers(0, 9),
        st.integers(0, 400),
    ),
    min_size=1,
    max_size=24,
)


@coredis_leaks
@fleet_examples(10)
@given(ops=operations)
async def test_random_interleavings_keep_the_fleet_budgets(
    shared_server: RedisServer,
    dead_ledgers: set[Ledger],
    ops: list[tuple[str, int, int, int]],
) -> None:
    namespace = uuid.uuid4().hex
    requests: list[FleetRequest] = []
    crashed: set[int] = set()
    granted = charged = given_back = 0

    def live_holders() -> int:
        return sum(
            1 for r in requests if r.state == "holding" and r.node not in crashed
        )

    async def run(
        dispatcher: Dispatcher, request: FleetRequest, started_at: float
    ) -> None:
        nonlocal granted, charged, given_back
        with request.scope:
            async with dispatcher.slot(
                "p", started_at=started_at, tokens=request.tokens
            ) as slot:
                request.state = "holding"
                granted += 1
                charged += request.tokens
                assert live_holders() <= LIMIT.maximum
                await request.release.wait()
                slot.report_usage(request.used)
                given_back += max(0, request.tokens - request.used)
        request.state = "done" if request.state == "holding" else "cancelled"

    began = time.time()
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": LIMIT},
                    budgets={
                        "p": Budget(
                            requests_per_minute=REQUESTS_PER_MINUTE,
                            tokens_per_minute=TOKENS_PER_MINUTE,
                        )
                    },
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
            for op, a, b, tokens in ops:
                node = a % NODES
                if op == "acquire" and node not in crashed:
                    request = FleetRequest(node, tokens, (tokens * b) // 5)
                    requests.append(request)
                    started_at = trio.current_time() - b * 0.01
                    nursery.start_soon(run, nodes[node], request, started_at)
                elif op == "release" and requests:
                    requests[a % len(requests)].release.set()
                elif op == "cancel" and requests:
                    requests[a % len(requests)].scope.cancel()
                elif op == "rate_limit" and node not in crashed:
                    nodes[node].report_rate_limit("p", 0.02)
                elif op == "crash" and not crashed:
                    crashed.add(node)
                    crash(nodes[node], dead_ledgers)
                    for request in requests:
                        if request.node == node:
                            request.scope.cancel()
                elif op == "settle":
                    await trio.sleep(0.05)
                await trio.sleep(0.005)
            # What the budgets hold back for longer than an example lasts is
            # cancelled: every request must end either way.
            await end_all(requests, lease=LEASE, cancel_waiting=True)
        elapsed = time.time() - began
        assert granted <= REQUESTS_PER_MINUTE * (1 + elapsed / 60)
        assert charged <= TOKENS_PER_MINUTE * (1 + elapsed / 60) + given_back
        for n, member in enumerate(nodes):
            if n not in crashed:
                stats = member.statistics().providers["p"]
                assert stats.adaptive
                assert stats.limit is not None
                assert LIMIT.minimum <= stats.limit <= LIMIT.maximum
        await wait_until_drained(client, namespace, LEASE, crashed=bool(crashed))
