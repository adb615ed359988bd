"""Budgets and adaptive limits shared by dispatchers through a real redis-server.

Several dispatchers in one trio run stand for several processes: each has
its own schedulers and connection, and they meet only in Redis. Time is
real (Redis keeps its own clock), so the budgets refill slowly (a few per
minute) and what is asserted is who gets a slot, never how fast.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import (
    AdaptiveLimit,
    Budget,
    Quota,
    RateLimitInfo,
    open_dispatcher,
)
from trio_dispatch.events import LimitChanged

from .._redis import RedisServer, lose_everything, needs_redis

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Dispatcher, ProviderStatistics

pytestmark = needs_redis

LEASE = 3.0


async def open_member(
    stack: AsyncExitStack, server: RedisServer, *args: object, **kwargs: object
) -> Dispatcher:
    """One dispatcher of the fleet, as if in a process of its own."""
    return await stack.enter_async_context(
        open_dispatcher(
            *args,  # type: ignore[arg-type]  # the tests pass valid settings
            redis_url=server.url,
            namespace="fleet",
            lease=LEASE,
            **kwargs,  # type: ignore[arg-type]  # the tests pass valid settings
        )
    )


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds, for at most 5 seconds (state across sockets)."""
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (polling state across sockets)
            await trio.sleep(0.005)


def stats(dispatcher: Dispatcher) -> ProviderStatistics:
    return dispatcher.statistics().providers["p"]


async def granted_within(
    dispatcher: Dispatcher, seconds: float, **kwargs: object
) -> bool:
    """Whether a slot of ``p`` is granted within ``seconds``; given back at once."""
    with trio.move_on_after(seconds):
        async with dispatcher.slot("p", **kwargs):  # type: ignore[arg-type]  # valid
            return True
    return False


async def test_a_budget_configured_in_one_process_binds_the_whole_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        # 2 requests a minute: once both are taken, nobody gets a third for
        # half a minute.
        one = await open_member(
            stack, server, {"p": 10}, budgets={"p": Budget(requests_per_minute=2)}
        )
        other = await open_member(stack, server, {"p": 10})
        assert await granted_within(one, 5)
        assert await granted_within(other, 5)
        assert not await granted_within(other, 0.5)
        assert not await granted_within(one, 0.5)
        for dispatcher in (one, other):
            budget = stats(dispatcher).budget
            assert budget is not None
            assert budget.requests_per_minute == pytest.approx(2)
            assert budget.requests_available is not None
            assert budget.requests_available < 1
            assert budget.learned is False


async def test_a_large_old_request_is_not_passed_by_small_new_ones_elsewhere(
    server: RedisServer,
) -> None:
    order: list[str] = []
    async with AsyncExitStack() as stack:
        budgets = {"p": Budget(tokens_per_minute=1_000)}
        big = await open_member(stack, server, {"p": 10}, budgets=budgets)
        small = await open_member(stack, server, {"p": 10}, budgets=budgets)
        async with trio.open_nursery() as nursery:
            first, report = trio.Event(), trio.Event()

            async def hold() -> None:
                async with big.slot("p", tokens=900) as slot:
                    first.set()
                    # What it used: the rest comes back once the others
                    # have been seen waiting.
                    await report.wait()
                    slot.report_usage(100)
                    await trio.sleep(0.2)

            nursery.start_soon(hold)
            await first.wait()
            now = trio.current_time()

            async def wait(
                dispatcher: Dispatcher, name: str, tokens: int, age: float
            ) -> None:
                async with dispatcher.slot("p", tokens=tokens, started_at=now - age):
                    order.append(name)

            nursery.start_soon(wait, big, "old-large", 800, 10.0)
            await until(lambda: stats(big).local_waiting == 1)
            nursery.start_soon(wait, small, "new-small", 50, 1.0)
            await until(lambda: stats(small).local_waiting == 1)
            # 100 tokens left hold the small one, not the large one: nothing
            # passes the large one.
            await trio.sleep(0.3)
            assert order == []
            budget = stats(small).budget
            assert budget is not None
            assert budget.waiting_for_budget is True
            report.set()
        assert order == ["old-large", "new-small"]


async def test_figures_seen_by_one_process_pace_the_others(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        seer = await open_member(stack, server, {"p": 10})
        other = await open_member(stack, server, {"p": 10})
        assert await granted_within(other, 5)
        seer.observe_rate_limits(
            "p", RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
        )
        await until(lambda: (b := stats(seer).budget) is not None and b.learned)
        assert not await granted_within(other, 0.5)
        budget = stats(other).budget
        assert budget is not None
        assert budget.learned is True
        assert budget.requests_per_minute == pytest.approx(60)


async def test_learn_budgets_off_keeps_a_process_figures_out_of_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        deaf = await open_member(stack, server, {"p": 10}, learn_budgets=False)
        other = await open_member(stack, server, {"p": 10})
        deaf.observe_rate_limits(
            "p", RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
        )
        assert await granted_within(other, 5)
        assert stats(other).budget is None


async def test_an_adaptive_limit_given_at_open_is_the_fleet_limit(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        first = await open_member(
            stack, server, {"p": AdaptiveLimit(initial=4, maximum=8, backoff=0.5)}
        )
        # A limit already stored wins over the one a later process brings.
        second = await open_member(stack, server, {"p": 2})
        await until(lambda: stats(second).adaptive)
        assert stats(second).limit == 4
        assert second.limits() == {"p": 4}
        events = second.events()
        # A rate limit seen by the second process halves it for both.
        async with events:
            async with first.slot("p"):
                second.report_rate_limit("p", 0.05)
                await until(lambda: stats(first).limit == 2)
            await until(lambda: stats(second).limit == 2)
            changed = None
            with trio.fail_after(5):
                async for event in events:
                    if isinstance(event, LimitChanged):
                        changed = event
                        break
        assert changed is not None
        assert (changed.limit, changed.previous) == (2, 4)


async def test_successes_with_the_limit_in_use_raise_it_for_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        left = await open_member(
            stack, server, {"p": AdaptiveLimit(initial=2, maximum=3)}
        )
        right = await open_member(stack, server, {"p": 1})
        await until(lambda: stats(right).limit == 2)
        # Both slots in use, across the two processes: two successes (slow
        # start, +1 each) take it to its maximum.
        both = trio.Event()
        async with trio.open_nursery() as nursery:

            async def use(dispatcher: Dispatcher) -> None:
                async with dispatcher.slot("p"):
                    await both.wait()

            nursery.start_soon(use, left)
            nursery.start_soon(use, right)
            await until(lambda: stats(left).in_flight == 2)
            both.set()
        await until(lambda: stats(left).limit == 3)
        await until(lambda: stats(right).limit == 3)


async def test_set_limit_with_an_adaptive_limit_reaches_every_process(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        left = await open_member(stack, server, {"p": 5})
        right = await open_member(stack, server, {"p": 9})
        await until(lambda: stats(right).limit == 5)
        left.set_limit("p", AdaptiveLimit(initial=3, maximum=6))
        assert stats(left).limit == 3
        await until(lambda: stats(right).adaptive and stats(right).limit == 3)
        right.set_limit("p", 4)
        await until(lambda: not stats(left).adaptive and stats(left).limit == 4)


async def test_usage_reported_on_a_shared_slot_gives_tokens_back(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one = await open_member(
            stack, server, {"p": 10}, budgets={"p": Budget(tokens_per_minute=1_000)}
        )
        other = await open_member(stack, server, {"p": 10})
        async with one.slot("p", tokens=900) as slot:
            assert not await granted_within(other, 0.3, tokens=500)
            slot.report_usage(200)
            assert await granted_within(other, 5, tokens=500)


@pytest.mark.parametrize("how", ["restart", "flushall"])
async def test_configured_budgets_are_stored_again_after_redis_comes_back_empty(
    server: RedisServer, how: str
) -> None:
    async def check(dispatcher: Dispatcher) -> None:
        """Both budgets hold: one m1 request a minute, two of the provider's."""
        # The first grant may wait for the reconnection: a few leases at most.
        assert await granted_within(dispatcher, LEASE * 3, model="m1")
        assert not await granted_within(dispatcher, 0.5, model="m1")
        assert await granted_within(dispatcher, 0.5)
        assert not await granted_within(dispatcher, 0.5)
        budget = stats(dispatcher).budget
        assert budget is not None
        assert (budget.requests_per_minute, budget.learned) == (2, False)
        assert stats(dispatcher).models["m1"].requests_per_minute == 1

    async with AsyncExitStack() as stack:
        await open_member(
            stack,
            server,
            {"p": 10},
            budgets={
                "p": Budget(requests_per_minute=2),
                "p/m1": Budget(requests_per_minute=1),
            },
        )
        other = await open_member(stack, server, {"p": 10})
        await check(other)
        await lose_everything(server, how)
        # Redis lost the budgets with everything else: the processes store
        # them again, and the other process's requests meet them at once.
        await check(other)


LATENCY = AdaptiveLimit(initial=1, maximum=16, signal="latency")


async def calls(
    dispatcher: Dispatcher, count: int, *, waited: float = 0.0, queued: float = 0.0
) -> None:
    """``count`` calls of ``p`` in flight together, each reporting its timings.

    Each holds its slot ``waited`` seconds and says its first token came
    ``queued`` seconds after its grant (0: at the floor, the server did not
    queue it), its last at the end.
    """
    async with AsyncExitStack() as held:
        slots = [
            await held.enter_async_context(dispatcher.slot("p")) for _ in range(count)
        ]
        await trio.sleep(waited)
        for slot in slots:
            assert slot.granted_at is not None
            slot.report_timing(
                first_token_at=slot.granted_at + queued,
                last_token_at=max(slot.granted_at + queued, trio.current_time()),
                output_tokens=1,
                prompt_tokens=10,
            )


async def seen(dispatcher: Dispatcher) -> int:
    """The fleet's limit of ``p`` as ``dispatcher`` sees it after a round of its own."""
    async with dispatcher.slot("p"):
        pass
    return dispatcher.limits()["p"]


async def test_a_latency_limit_moves_for_the_fleet_by_one_process_s_timings(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        judge = await open_member(stack, server, {"p": LATENCY})
        other = await open_member(stack, server, {"p": LATENCY})
        assert await seen(other) == 1
        assert stats(other).adaptive
        # A round is as many calls as the limit (two at least); calls at
        # their floors with the limit in use double it in the slow start.
        await calls(judge, 1)
        await calls(judge, 1)
        await until(lambda: judge.limits() == {"p": 2})
        assert await seen(other) == 2
        await calls(judge, 2)
        await until(lambda: judge.limits() == {"p": 4})
        assert await seen(other) == 4
        # Four calls that waited about a third of their time in the
        # server's queue: a queue of one request and a bit, so down by one.
        await calls(judge, 4, waited=0.2, queued=0.075)
        await until(lambda: judge.limits() == {"p": 3})
        assert await seen(other) == 3
        # Out of the slow start, and probing past a queue less often: a
        # rise after two rounds of room, by one.
        await calls(judge, 3)
        assert judge.limits() == {"p": 3}
        await calls(judge, 3)
        await until(lambda: judge.limits() == {"p": 4})
        assert await seen(other) == 4
        assert stats(other).adaptive


async def test_successes_alone_leave_a_latency_limit_of_the_fleet_alone(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        left = await open_member(stack, server, {"p": LATENCY})
        right = await open_member(stack, server, {"p": LATENCY})
        for dispatcher in (left, right) * 3:
            assert await seen(dispatcher) == 1
        # The rate-limit signal's slow start would be at 4 by now.
        assert stats(left).limit == stats(right).limit == 1


async def test_a_rate_limit_still_lowers_a_latency_limit_of_the_fleet(
    server: RedisServer,
) -> None:
    spec = AdaptiveLimit(initial=4, maximum=16, signal="latency")
    async with AsyncExitStack() as stack:
        first = await open_member(stack, server, {"p": spec})
        # The limit stored wins over a fixed one brought later.
        second = await open_member(stack, server, {"p": 9})
        async with first.slot("p"):
            second.report_rate_limit("p", 0.05)
            await until(lambda: first.limits() == {"p": 3})
        assert second.limits() == {"p": 3}
        # A latency limit set later, by any process, is the fleet's too,
        # judged by the process that sees the calls.
        second.set_limit("p", AdaptiveLimit(initial=2, maximum=8, signal="latency"))
        with trio.fail_after(5):
            while await seen(first) != 2:  # noqa: ASYNC110 (polling state across sockets)
                await trio.sleep(0.01)
        await calls(first, 2)
        await until(lambda: first.limits() == {"p": 4})
        assert await seen(second) == 4


@pytest.mark.parametrize("how", ["restart", "flushall"])
async def test_an_adaptive_limit_is_stored_again_after_redis_comes_back_empty(
    server: RedisServer, how: str
) -> None:
    async def check(dispatcher: Dispatcher) -> None:
        """Two slots, no third, and the limit is the adaptive one."""
        held = 0
        async with trio.open_nursery() as nursery:

            async def hold() -> None:
                nonlocal held
                async with dispatcher.slot("p"):
                    held += 1
                    await trio.sleep_forever()

            for _ in range(2):
                nursery.start_soon(hold)
            with trio.fail_after(LEASE * 3):
                while held < 2:  # noqa: ASYNC110 (state across sockets)
                    await trio.sleep(0.01)
            assert not await granted_within(dispatcher, 0.5)
            assert (stats(dispatcher).adaptive, stats(dispatcher).limit) == (True, 2)
            nursery.cancel_scope.cancel()

    async with AsyncExitStack() as stack:
        await open_member(
            stack, server, {"p": AdaptiveLimit(initial=2, maximum=2, backoff=0.5)}
        )
        other = await open_member(stack, server, {"p": 9})
        await check(other)
        await lose_everything(server, how)
        await check(other)
