"""Budgets (requests and tokens per minute) in the pure core and end to end.

The throttle and the policy are driven directly with exact numbers; the
dispatcher runs under ``autojump_clock`` with exact grant times.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import (
    AdaptiveLimit,
    Budget,
    QueueFull,
    Quota,
    RateLimitInfo,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch._integrations._hooks import RateLimitHooks
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta, Usage

from .._helpers import Hooked

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher
    from trio_dispatch.messages import StreamEvent


def t(started_at: float, seq: int) -> Ticket:
    return Ticket(started_at, seq)


def tokens_per_second(rate: float) -> Budget:
    return Budget(tokens_per_minute=60 * rate)


# -- the pure core ----------------------------------------------------------


def test_a_token_budget_grants_when_the_cost_is_there() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    assert policy.acquire(t(0, 0), 4000) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 3000) == []
    # 2000 left, 1000 missing at 100 a second.
    assert policy.wake_at == 10.0
    assert policy.tick(9.5) == []
    assert policy.tick(10.0) == [t(0, 1)]
    assert policy.wake_at is None


def test_a_large_old_request_is_not_overtaken_by_small_new_ones() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    assert policy.acquire(t(0, 0), 5000) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 3000) == []  # 1000 left: waits 20 s
    assert policy.acquire(t(1, 2), 100) == []  # would fit, but waits behind
    assert policy.tick(19.0) == []
    assert policy.tick(20.0) == [t(0, 1)]
    # The small one then needs its own 100 tokens: 1 s more.
    assert policy.wake_at == 21.0
    assert policy.tick(21.0) == [t(1, 2)]


def test_an_older_turn_arriving_later_goes_first_for_the_budget_too() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.acquire(t(5, 0), 6000)
    policy.acquire(t(5, 1), 100)
    policy.acquire(t(1, 2), 200)  # an older turn's retry
    assert policy.tick(2.0) == [t(1, 2)]
    assert policy.tick(3.0) == [t(5, 1)]


def test_a_request_larger_than_the_budget_goes_when_the_bucket_is_full() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    assert policy.acquire(t(0, 0), 1000) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 9000) == []
    assert policy.wake_at == 10.0  # full again: 6000
    assert policy.tick(10.0) == [t(0, 1)]
    stats = policy.budget_statistics()
    assert stats is not None
    # Charged the capacity, not its 9000: it empties the bucket, no more.
    assert stats.tokens_available == 0
    # The next request waits for its own tokens only.
    assert policy.acquire(t(0, 2), 100) == []
    assert policy.wake_at == 11.0


def test_an_absurd_estimate_is_charged_the_capacity_and_waits_one_refill_at_most() -> (
    None
):
    # 6000 a minute: a full refill takes 60 s, whatever the estimate says.
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    assert policy.acquire(t(0, 0), 10**16) == [t(0, 0)]
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == 0
    assert policy.acquire(t(0, 1), 10**400) == []
    assert policy.wake_at == 60.0
    assert policy.tick(60.0) == [t(0, 1)]
    # A usage is charged at most the capacity too: no debt, and what the
    # first charge took beyond its usage comes back.
    assert policy.report_usage(t(0, 1), 10**30) == []
    assert policy.report_usage(t(0, 0), 100) == []
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == 5900
    assert policy.acquire(t(0, 2), 10**16) == []
    assert policy.wake_at == 61.0


def test_a_usage_report_above_the_level_empties_the_bucket_and_no_more() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    assert policy.acquire(t(0, 0), 1000) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 1000) == [t(0, 1)]
    # Each used a whole minute's budget: the bucket is empty, not in debt.
    assert policy.report_usage(t(0, 0), 6000) == []
    assert policy.report_usage(t(0, 1), 6000) == []
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == 0
    assert policy.acquire(t(0, 2), 6000) == []
    assert policy.wake_at == 60.0


def test_learning_never_lowers_the_level_below_minus_the_capacity() -> None:
    throttle = Throttle()
    policy = SlotPolicy(10, throttle=throttle)
    figures = RateLimitInfo(tokens=Quota(limit=6000, remaining=6000))
    throttle.observe(figures)
    assert policy.acquire(t(0, 0), 10**16) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 10**16) == []
    policy.advance(60.0)
    assert policy.tick(60.0) == [t(0, 1)]
    # Two unanswered requests of a whole budget each, and nothing left.
    throttle.observe(RateLimitInfo(tokens=Quota(limit=6000, remaining=0)))
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == -6000


def test_usage_gives_back_what_the_estimate_took_too_much() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.acquire(t(0, 0), 6000)
    assert policy.acquire(t(0, 1), 3000) == []
    assert policy.wake_at == 30.0
    policy.advance(1.0)
    # Used 1000 of its 6000: 5000 back, with the 100 of the refill.
    assert policy.report_usage(t(0, 0), 1000) == [t(0, 1)]
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == 2100


def test_usage_above_the_estimate_is_taken_too() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.acquire(t(0, 0), 1000)
    assert policy.report_usage(t(0, 0), 3000) == []
    policy.acquire(t(0, 1), 4000)
    assert policy.wake_at == 10.0  # 3000 left, and 4000 needed
    # The latest report counts: 2000 in the end, 1000 back.
    assert policy.report_usage(t(0, 0), 2000) == [t(0, 1)]


def test_usage_of_a_released_or_unknown_ticket_changes_nothing() -> None:
    throttle = Throttle(tokens_per_second(100))
    policy = SlotPolicy(10, throttle=throttle)
    policy.acquire(t(0, 0), 1000)
    policy.release(t(0, 0))
    assert policy.report_usage(t(0, 0), 0) == []
    assert policy.report_usage(t(9, 9), 0) == []
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_available == 5000


def test_a_request_budget_spaces_grants_by_its_rate() -> None:
    policy = SlotPolicy(None, throttle=Throttle(Budget(requests_per_minute=2)))
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.acquire(t(0, 1)) == [t(0, 1)]
    assert policy.acquire(t(0, 2)) == []
    assert policy.wake_at == 30.0
    assert policy.tick(30.0) == [t(0, 2)]


def test_cancelling_the_head_the_budget_holds_back_lets_the_next_go() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.acquire(t(0, 0), 5500)
    policy.acquire(t(0, 1), 5000)
    policy.acquire(t(0, 2), 500)
    assert policy.cancel(t(0, 1)) == [t(0, 2)]
    assert policy.wake_at is None


def test_a_pause_and_the_budget_both_hold_back() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.acquire(t(0, 0), 6000)
    policy.acquire(t(0, 1), 100)
    policy.report_rate_limit(0.0, 5.0)
    # The budget is there at 1 s, the pause ends at 5 s.
    assert policy.wake_at == 5.0
    assert policy.tick(1.0) == []
    assert policy.tick(5.0) == [t(0, 1)]


def test_the_queue_bound_refuses_and_forgets_the_estimate() -> None:
    policy = SlotPolicy(10, max_waiting=0, throttle=Throttle(tokens_per_second(1)))
    policy.acquire(t(0, 0), 60)
    with pytest.raises(QueueFull):
        policy.acquire(t(0, 1), 1)
    assert policy.waiting == 0
    assert policy.wake_at is None


# -- learned budgets ---------------------------------------------------------


def tokens(
    limit: int | None, remaining: int | None, reset: float | None = None
) -> RateLimitInfo:
    return RateLimitInfo(tokens=Quota(limit=limit, remaining=remaining, reset=reset))


def available(policy: SlotPolicy) -> float | None:
    stats = policy.budget_statistics()
    assert stats is not None
    return stats.tokens_available


def test_figures_become_a_bucket_that_only_lowers_what_is_left() -> None:
    policy = SlotPolicy(10)
    assert policy.budget_statistics() is None
    policy.observe_rate_limits(0.0, tokens(6000, 5000, 10.0))
    stats = policy.budget_statistics()
    assert stats is not None
    assert (stats.tokens_per_minute, stats.tokens_available) == (6000, 5000)
    assert stats.learned
    # A higher remaining later does not raise it: the local charges count.
    policy.acquire(t(0, 0), 1000)
    policy.observe_rate_limits(0.0, tokens(6000, 5500, 5.0))
    # ...and the server may not have counted the 1000 held yet.
    assert available(policy) == 4000
    policy.observe_rate_limits(0.0, tokens(6000, 2000, 40.0))
    assert available(policy) == 1000
    policy.advance(10.0)
    assert available(policy) == 2000


def test_a_learned_budget_paces_grants() -> None:
    policy = SlotPolicy(10)
    policy.observe_rate_limits(0.0, tokens(6000, 0, 60.0))
    assert policy.acquire(t(0, 0), 500) == []
    assert policy.wake_at == 5.0
    assert policy.tick(5.0) == [t(0, 0)]


def test_a_budget_learned_while_a_request_waits_charges_its_estimate() -> None:
    policy = SlotPolicy(1)
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 500) == []
    policy.observe_rate_limits(0.0, tokens(6000, 6000, 60.0))
    assert policy.release(t(0, 0)) == [t(0, 1)]
    assert available(policy) == 5500


def test_a_model_budget_learned_while_its_request_waits_charges_its_estimate() -> None:
    policy = SlotPolicy(1)
    first, second = Ticket(0, 0, model="m"), Ticket(0, 1, model="m")
    assert policy.acquire(first) == [first]
    assert policy.acquire(second, 500) == []
    policy.observe_rate_limits(0.0, tokens(6000, 6000, 60.0), "m")
    assert policy.release(first) == [second]
    stats = policy.model_budget_statistics()["m"]
    assert stats.tokens_available == 5500


def test_an_adaptive_limit_made_while_a_request_waits_keeps_its_estimate() -> None:
    policy = SlotPolicy(1)
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.acquire(t(0, 1), 500) == []
    policy.set_limit(AdaptiveLimit(initial=1, minimum=1, maximum=2))
    policy.observe_rate_limits(0.0, tokens(6000, 6000, 60.0))
    assert policy.release(t(0, 0)) == [t(0, 1)]
    assert available(policy) == 5500


def test_a_window_longer_than_a_minute_refills_slower() -> None:
    policy = SlotPolicy(10)
    # 3600 used and half an hour to refill them: 2 a second, not 6000 / 60.
    policy.observe_rate_limits(0.0, tokens(6000, 2400, 1800.0))
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.tokens_per_minute == 120


def test_requests_figures_pace_requests() -> None:
    policy = SlotPolicy(None)
    policy.observe_rate_limits(
        0.0, RateLimitInfo(requests=Quota(limit=60, remaining=1, reset=59.0))
    )
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.acquire(t(0, 1)) == []
    assert policy.wake_at == 1.0


@pytest.mark.parametrize(
    "info",
    [
        pytest.param(tokens(0, 0, 1.0), id="zero-limit"),
        pytest.param(tokens(10**30, 10**30, 1.0), id="enormous"),
        pytest.param(tokens(None, None, 5.0), id="reset-only"),
        pytest.param(RateLimitInfo(retry_after=3.0), id="retry-after-only"),
        pytest.param(tokens(None, 10**400), id="beyond-a-float"),
    ],
)
def test_figures_that_say_nothing_usable_pace_nothing(info: RateLimitInfo) -> None:
    policy = SlotPolicy(10)
    policy.observe_rate_limits(0.0, info)
    assert policy.acquire(t(0, 0), 10**6) == [t(0, 0)]
    stats = policy.budget_statistics()
    assert stats is None or stats.tokens_available is None


def test_a_configured_budget_keeps_its_rate_and_is_lowered_by_figures() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100)))
    policy.observe_rate_limits(0.0, tokens(60_000, 1000, 1.0))
    stats = policy.budget_statistics()
    assert stats is not None
    assert (stats.tokens_per_minute, stats.tokens_available) == (6000, 1000)


def test_a_throttle_that_does_not_learn_ignores_figures() -> None:
    policy = SlotPolicy(10, throttle=Throttle(tokens_per_second(100), learn=False))
    policy.observe_rate_limits(0.0, tokens(6000, 0, 60.0))
    assert available(policy) == 6000


# -- end to end, in virtual time ---------------------------------------------


async def test_exact_grant_times_with_corrections_from_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: dict[str, float] = {}

    async def request(
        dispatcher: Dispatcher, name: str, cost: int, used: int | None
    ) -> None:
        async with dispatcher.slot("p", tokens=cost) as slot:
            assert slot.granted_at is not None
            granted[name] = slot.granted_at
            await trio.sleep(1)
            if used is not None:
                slot.report_usage(used)
            await trio.sleep(100)

    budgets = {"p": tokens_per_second(100)}
    async with (
        open_dispatcher({"p": 10}, budgets=budgets) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(request, dispatcher, "a", 4000, 1000)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(request, dispatcher, "b", 3000, 5000)
        await trio.sleep(1.5)
        # a gave 3000 back at 1 s, and b went at once.
        stats = dispatcher.statistics().providers["p"].budget
        assert stats is not None
        assert (stats.tokens_per_minute, stats.tokens_available) == (6000, 2150)
        nursery.start_soon(request, dispatcher, "c", 6000, None)
        await trio.sleep(1.5)
        # b took 2000 more at 2 s: c needs 5800 from there, 58 s.
        nursery.start_soon(request, dispatcher, "d", 100, None)
        await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["p"].budget
        assert stats is not None
        assert stats.waiting_for_budget
    # d, tiny, waited behind c, as old requests go first.
    assert granted == {"a": 0.0, "b": 1.0, "c": 60.0, "d": 61.0}


async def test_learned_figures_pace_a_dispatcher_with_no_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    info = RateLimitInfo(requests=Quota(limit=60, remaining=1, reset=59.0))
    for learn, expected in [(True, [0.0, 1.0, 2.0]), (False, [0.0, 0.0, 0.0])]:
        async with open_dispatcher({"p": 10}, learn_budgets=learn) as dispatcher:
            start = trio.current_time()
            dispatcher.observe_rate_limits("p", info)
            times = []
            for _ in range(3):
                async with dispatcher.slot("p") as slot:
                    assert slot.granted_at is not None
                    times.append(slot.granted_at - start)
            assert times == expected
            budget = dispatcher.statistics().providers["p"].budget
            assert (budget is not None) == learn


async def test_figures_for_an_idle_unlimited_provider_pace_it_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        dispatcher.observe_rate_limits("q", tokens(600, 0, 60.0))
        async with dispatcher.slot("q", tokens=20) as slot:
            assert slot.granted_at == 2.0


class Answering:
    """A provider that answers one text delta and its usage."""

    id = "p"

    def __init__(self, used: Usage) -> None:
        self.used = used

    def stream(self, request: ChatRequest) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        return self._stream(request)  # type: ignore[return-value]  # a context manager

    @asynccontextmanager
    async def _stream(
        self, request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        await trio.lowlevel.checkpoint()
        yield Events([TextDelta("hi"), Finish("stop"), self.used])


class Events:
    """An async iterator over a list of events."""

    def __init__(self, events: list[StreamEvent]) -> None:
        self.events = events

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> StreamEvent:
        await trio.lowlevel.checkpoint()
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)


async def test_wrap_provider_charges_the_estimate_and_corrects_it_with_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budgets = {"p": Budget(tokens_per_minute=60_000)}
    used = Usage(input_tokens=10, output_tokens=20, cache_read_tokens=5)
    request = ChatRequest([ChatMessage("user", "x" * 400)], max_tokens=1000)
    async with open_dispatcher({"p": 1}, budgets=budgets) as dispatcher:
        provider = wrap_provider(Answering(used), dispatcher)  # type: ignore[arg-type]  # a Provider
        async with provider.stream(request) as events:
            first = await events.__anext__()
            assert first == TextDelta("hi")
            budget = dispatcher.statistics().providers["p"].budget
            assert budget is not None
            # 100 tokens of text, 7 of framing, and max_tokens.
            assert budget.tokens_available == 60_000 - 1107
            seen = [event async for event in events]
            assert seen == [Finish("stop"), used]
            budget = dispatcher.statistics().providers["p"].budget
            assert budget is not None
            assert budget.tokens_available == 60_000 - 35


async def test_usage_is_reported_only_while_the_slot_is_held() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        slot = dispatcher.slot("p", tokens=5)
        with pytest.raises(RuntimeError, match=r"^usage can be reported only"):
            slot.report_usage(1)
        async with slot:
            slot.report_usage(1)
            with pytest.raises(TypeError, match=r"^tokens must be a non-negative"):
                slot.report_usage(1.5)  # type: ignore[arg-type]  # the error tested
        with pytest.raises(RuntimeError, match=r"^usage can be reported only"):
            slot.report_usage(1)


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"tokens_per_minute": 0},
            ValueError,
            "tokens_per_minute must be a positive number, got 0",
        ),
        (
            {"tokens_per_minute": -5},
            ValueError,
            "tokens_per_minute must be a positive number, got -5",
        ),
        (
            {"requests_per_minute": math.nan},
            ValueError,
            "requests_per_minute must be a positive number, got nan",
        ),
        (
            {"requests_per_minute": math.inf},
            ValueError,
            "requests_per_minute must be a positive number, got inf",
        ),
        (
            {"requests_per_minute": True},
            TypeError,
            "requests_per_minute must be a positive number, got True",
        ),
        (
            {"tokens_per_minute": "9"},
            TypeError,
            "tokens_per_minute must be a positive number, got '9'",
        ),
        (
            {"default_max_tokens": 0},
            ValueError,
            "default_max_tokens must be a positive integer, got 0",
        ),
        (
            {"default_max_tokens": 1.0},
            TypeError,
            "default_max_tokens must be a positive integer, got 1.0",
        ),
    ],
)
def test_bad_budgets_are_refused_at_the_call(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        Budget(**kwargs)  # type: ignore[arg-type]  # the errors tested


def test_open_dispatcher_checks_budgets_at_the_call() -> None:
    with pytest.raises(TypeError, match=r"^budgets must be a mapping"):
        open_dispatcher(budgets=[("p", Budget())])  # type: ignore[arg-type]  # the error tested
    with pytest.raises(TypeError, match=r"^budget for 'p' must be a Budget, got 5$"):
        open_dispatcher(budgets={"p": 5})  # type: ignore[dict-item]  # the error tested
    with pytest.raises(TypeError, match=r"^provider must be a non-empty string"):
        open_dispatcher(budgets={1: Budget()})  # type: ignore[dict-item]  # the error tested
    with pytest.raises(TypeError, match=r"^learn_budgets must be True or False"):
        open_dispatcher(learn_budgets=1)  # type: ignore[arg-type]  # the error tested


async def test_observe_rate_limits_checks_its_types_and_never_fails_on_content() -> (
    None
):
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(TypeError, match=r"^provider must be a non-empty string"):
            dispatcher.observe_rate_limits(1, RateLimitInfo())  # type: ignore[arg-type]  # the error tested
        with pytest.raises(
            TypeError, match=r"^info must be a RateLimitInfo, got \{\}$"
        ):
            dispatcher.observe_rate_limits("p", {})  # type: ignore[arg-type]  # the error tested
        for info in [
            RateLimitInfo(),
            tokens(0, 0, 0.0),
            tokens(5, 10**400, 0.0),
            RateLimitInfo(requests=Quota(limit=1, remaining=0, reset=0.0)),
        ]:
            dispatcher.observe_rate_limits("p", info)
        assert dispatcher.statistics().providers["p"].in_flight == 0
    # Closed: ignored.
    dispatcher.observe_rate_limits("p", tokens(1, 0, 1.0))


async def test_slot_checks_its_tokens() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            ValueError, match=r"^tokens must be a non-negative integer, got -1$"
        ):
            dispatcher.slot("p", tokens=-1)
        with pytest.raises(
            TypeError, match=r"^tokens must be a non-negative integer, got True$"
        ):
            dispatcher.slot("p", tokens=True)


def test_only_requests_whose_answer_has_not_started_are_taken_again() -> None:
    policy = SlotPolicy(10)
    policy.observe_rate_limits(0.0, tokens(6000, 6000, 0.0))
    policy.acquire(t(0, 0), 1000)
    policy.acquire(t(0, 1), 500)
    # The first one's answer started: the server counted it in remaining.
    policy.answered(t(0, 0))
    policy.observe_rate_limits(0.0, tokens(6000, 4000, 20.0))
    assert available(policy) == 3500
    # A reported usage means the answer started too.
    policy.report_usage(t(0, 1), 500)
    policy.observe_rate_limits(0.0, tokens(6000, 3000, 30.0))
    assert available(policy) == 3000


async def test_figures_reported_as_a_wrapped_stream_opens_count_its_request_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    request = ChatRequest([ChatMessage("user", "x" * 400)], max_tokens=1000)
    async with open_dispatcher({"p": 1}) as dispatcher:
        dispatcher.observe_rate_limits("p", tokens(60_000, 60_000, 0.0))
        # A provider given the dispatcher's own callback, as ours report.
        hooks = RateLimitHooks("p", None, dispatcher.observe_rate_limits)
        provider = wrap_provider(
            Hooked(hooks, tokens(60_000, 50_000, 10.0)), dispatcher
        )
        async with provider.stream(request) as events:
            assert await events.__anext__() == TextDelta("hi")
            budget = dispatcher.statistics().providers["p"].budget
            assert budget is not None
            # The server's 50,000 count this request: not taken again.
            assert budget.tokens_available == 50_000


async def test_wrap_provider_marks_the_answer_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    used = Usage(input_tokens=10, output_tokens=20)
    request = ChatRequest([ChatMessage("user", "x" * 400)], max_tokens=1000)
    async with open_dispatcher({"p": 1}) as dispatcher:
        dispatcher.observe_rate_limits("p", tokens(60_000, 60_000, 0.0))
        provider = wrap_provider(Answering(used), dispatcher)  # type: ignore[arg-type]  # a Provider
        async with provider.stream(request) as events:
            assert await events.__anext__() == TextDelta("hi")
            # The server says what it has left with this request counted.
            dispatcher.observe_rate_limits("p", tokens(60_000, 50_000, 10.0))
            budget = dispatcher.statistics().providers["p"].budget
            assert budget is not None
            assert budget.tokens_available == 50_000
