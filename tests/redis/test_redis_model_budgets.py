"""Per-model budgets hold across a fleet sharing one real Redis.

Two shared schedulers of one provider ("nodes") on one namespace, on a
clock the test sets (``open_fleet``). A model's budget, configured by one
node or learned from the figures of one node's answers, paces that model's
requests on every node, and only them: the other models' requests pass a
head that its model's budget holds back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import Budget, Quota, RateLimitInfo, open_dispatcher
from trio_dispatch.lowlevel import ObserveRateLimits, SetModelBudget

from .._redis import needs_redis, open_fleet

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from trio_dispatch import Dispatcher

    from .._redis import RedisServer

pytestmark = needs_redis


async def test_a_model_held_back_blocks_only_its_own_requests_fleet_wide(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=4) as fleet:
        await fleet.pause()
        fleet.nodes[0].send(SetModelBudget("slow", Budget(requests_per_minute=1)))
        slow = [
            fleet.acquire(n % 2, older=10.0 - n / 100, model="slow") for n in range(3)
        ]
        fast = [fleet.acquire(1, model="fast") for _ in range(2)]
        await fleet.resume(3)
        # The slow model's budget holds one request a minute: its oldest
        # goes, its others wait, on both nodes; the fast model's younger
        # requests pass them.
        assert set(fleet.grants) == {slow[0], *fast}
        view = await fleet.view()
        assert view.in_flight == 3
        held_back = view.models["slow"]
        assert held_back.requests_available == pytest.approx(0.0)
        assert held_back.ready_in == 60.0
        # The slow model's head waits with a slot free: no other request
        # may take it, and nothing is granted before the budget is back.
        await fleet.clock(59_000)
        await fleet.settle()
        assert len(fleet.grants) == 3
        await fleet.clock(60_000)
        await fleet.settle(4)
        assert fleet.grants[3:] == [slow[1]]
        shown = fleet.nodes[1].statistics().models
        assert set(shown) == {"slow"}
        assert shown["slow"].requests_per_minute == 1.0
        assert not shown["slow"].learned


async def test_a_models_figures_on_one_node_pace_its_requests_on_the_other(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=4) as fleet:
        # Node 0's answer for "small" says 2 requests a minute, none left.
        fleet.nodes[0].send(
            ObserveRateLimits(
                0.0,
                RateLimitInfo(requests=Quota(limit=2, remaining=0, reset=60.0)),
                model="small",
            )
        )
        await fleet.settle()
        small = [fleet.acquire(1, older=1.0 - n / 100, model="small") for n in range(2)]
        other = fleet.acquire(1, model="other")
        await fleet.settle(1)
        await fleet.settle()
        assert fleet.grants == [other]
        view = await fleet.view()
        learned = view.models["small"]
        assert learned.learned
        assert learned.requests_capacity == 2.0
        assert learned.ready_in == 30.0
        # A request every 30 s, the oldest first.
        await fleet.clock(30_000)
        await fleet.settle(2)
        await fleet.settle()
        assert fleet.grants[1:] == [small[0]]
        await fleet.clock(60_000)
        await fleet.settle(3)
        assert fleet.grants[2:] == [small[1]]
        assert fleet.nodes[1].statistics().models["small"].learned


async def test_two_dispatchers_share_a_models_budget_and_pass_its_held_back_head(
    server: RedisServer,
) -> None:
    budgets = {"p/slow": Budget(requests_per_minute=1)}

    def opening() -> AbstractAsyncContextManager[Dispatcher]:
        return open_dispatcher(
            {"p": 4}, budgets=budgets, redis_url=server.url, namespace="models"
        )

    async with opening() as first, opening() as second:
        granted: list[str] = []

        async def request(dispatcher: Dispatcher, model: str, name: str) -> None:
            async with dispatcher.slot("p", model=model):
                granted.append(name)
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, first, "slow", "first slow")
            with trio.fail_after(10):
                while not granted:  # noqa: ASYNC110 (state across dispatchers)
                    await trio.sleep(0.01)
            # The slow model's budget (one a minute) is the fleet's: the
            # other dispatcher's request of it waits, its fast one passes.
            nursery.start_soon(request, second, "slow", "second slow")
            await trio.sleep(0.05)
            nursery.start_soon(request, second, "fast", "second fast")
            with trio.fail_after(10):
                while len(granted) < 2:  # noqa: ASYNC110 (state across dispatchers)
                    await trio.sleep(0.01)
            await trio.sleep(0.5)
            assert granted == ["first slow", "second fast"]
            stats = second.statistics().providers["p"]
            assert (stats.in_flight, stats.waiting) == (2, 1)
            slow = stats.models["slow"]
            assert slow.requests_per_minute == 1.0
            assert slow.waiting_for_budget
            nursery.cancel_scope.cancel()
