"""The dispatcher and its scheduler actors, rule by rule, in virtual time."""

from __future__ import annotations

import math
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import trio_dispatch
from trio_dispatch import (
    Dispatcher,
    DispatcherClosed,
    DispatchError,
    QueueFull,
    SlotHoldTimeout,
    open_dispatcher,
)
from trio_dispatch.lowlevel import (
    Acquire,
    Pause,
    SchedulerActor,
    SchedulerMessage,
)

from .._helpers import settle, task_names, unknown_provider

OpenDispatcher = Callable[..., AbstractAsyncContextManager[Dispatcher]]


# Every limiter variant must pass the generic suite: the plain dispatcher,
# one with a generous hold bound (the timer code path), and one with a
# generous waiting bound (the QueueFull check path).
@pytest.fixture(
    params=[
        pytest.param({}, id="plain"),
        pytest.param({"max_hold": 10_000.0}, id="max_hold"),
        pytest.param({"max_waiting": 10_000}, id="max_waiting"),
    ]
)
def open_variant(request: pytest.FixtureRequest) -> OpenDispatcher:
    options: dict[str, Any] = request.param

    @asynccontextmanager
    async def open_it(
        limits: dict[str, int] | None = None,
        **more: Any,  # noqa: ANN401 (passed through)
    ) -> AsyncIterator[Dispatcher]:
        async with open_dispatcher(limits, **options, **more) as dispatcher:
            yield dispatcher

    return open_it


# ---------------------------------------------------------------- generic


async def test_one_scheduler_task_per_limited_provider(
    open_variant: OpenDispatcher,
) -> None:
    async with open_variant({"a": 1, "b": 2}) as dispatcher:
        await settle()
        schedulers = sorted(n for n in task_names() if n.startswith("trio_dispatch"))
        assert schedulers == [
            "trio_dispatch scheduler 'a'",
            "trio_dispatch scheduler 'b'",
        ]
        dispatcher.set_limit("c", 3)
        await settle()
        assert sum(n.startswith("trio_dispatch") for n in task_names()) == 3
    assert not [n for n in task_names() if n.startswith("trio_dispatch")]


async def test_grants_oldest_turn_first_ties_first_come(
    open_variant: OpenDispatcher, autojump_clock: trio.testing.MockClock
) -> None:
    order: list[str] = []
    async with open_variant({"p": 1}) as dispatcher:

        async def call(name: str, started_at: float) -> None:
            async with dispatcher.slot(
                "p", conversation_id=name, started_at=started_at
            ):
                order.append(name)
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            # "first" takes the free slot; the others queue in this order.
            for name, started_at in [
                ("first", 50.0),
                ("late-turn", 40.0),
                ("old-turn", 10.0),
                ("tie-a", 20.0),
                ("tie-b", 20.0),
                ("oldest", 5.0),
            ]:
                nursery.start_soon(call, name, started_at)
                await settle()
    assert order == ["first", "oldest", "old-turn", "tie-a", "tie-b", "late-turn"]
    assert trio.current_time() == 6.0


async def test_in_flight_never_exceeds_limit_and_no_one_waits_on_a_free_slot(
    open_variant: OpenDispatcher, autojump_clock: trio.testing.MockClock
) -> None:
    in_flight = 0
    peak = 0
    async with open_variant({"p": 3}) as dispatcher:

        async def call(duration: float) -> None:
            nonlocal in_flight, peak
            async with dispatcher.slot("p"):
                in_flight += 1
                peak = max(peak, in_flight)
                await trio.sleep(duration)
                in_flight -= 1

        async def watch() -> None:
            while True:
                await settle()
                stats = dispatcher.statistics().providers["p"]
                assert stats.in_flight <= 3
                if stats.waiting:
                    assert stats.in_flight == 3
                await trio.sleep(0.5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as calls:
                for i in range(12):
                    calls.start_soon(call, 1 + i % 4)
            nursery.cancel_scope.cancel()
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.waiting, stats.granted_total) == (0, 0, 12)
        assert stats.peak_in_flight == peak == 3


async def test_holder_that_raises_gives_the_slot_back(
    open_variant: OpenDispatcher,
) -> None:
    async with open_variant({"p": 1}) as dispatcher:
        with pytest.raises(KeyError, match="boom"):
            async with dispatcher.slot("p"):
                raise KeyError("boom")
        await settle()
        assert dispatcher.statistics().providers["p"].in_flight == 0
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_waiter_cancelled_in_queue_is_withdrawn_and_never_granted(
    open_variant: OpenDispatcher,
) -> None:
    ran: list[str] = []
    async with open_variant({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()

        async def waiter(name: str, scope: trio.CancelScope) -> None:
            with scope:
                async with dispatcher.slot("p"):
                    ran.append(name)

        doomed, survivor = trio.CancelScope(), trio.CancelScope()
        nursery.start_soon(waiter, "doomed", doomed)
        await settle()
        nursery.start_soon(waiter, "survivor", survivor)
        await settle()
        assert dispatcher.statistics().providers["p"].waiting == 2
        doomed.cancel()
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.waiting, stats.withdrawn_total) == (1, 1)
        await holder.__aexit__(None, None, None)
        await settle()
        assert ran == ["survivor"]
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.granted_total) == (0, 2)


# ---------------------------------------------------------------- unlimited


async def test_unlimited_provider_checkpoints_and_grants_at_once() -> None:
    async with open_dispatcher({"limited": 1}, unknown_providers="allow") as dispatcher:
        with trio.testing.assert_checkpoints():
            async with (
                dispatcher.slot("free") as first,
                dispatcher.slot("free") as second,
            ):
                assert first.held
                assert second.held
        with trio.CancelScope() as scope:
            scope.cancel()
            async with dispatcher.slot("free"):
                pytest.fail(
                    "a cancelled caller must not get a slot"
                )  # pragma: no cover
        stats = dispatcher.statistics().providers
        assert list(stats) == ["limited", "free"]
        free = stats["free"]
        assert (free.limit, free.in_flight, free.granted_total) == (None, 0, 2)
        assert dispatcher.limits() == {"limited": 1}


async def test_a_first_limit_counts_the_slots_taken_while_unlimited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher() as dispatcher, trio.open_nursery() as nursery:

        async def call(duration: float) -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())
                await trio.sleep(duration)

        with unknown_provider("p"):
            nursery.start_soon(call, 5)
            nursery.start_soon(call, 3)
            await settle()
        await trio.sleep(1)
        dispatcher.set_limit("p", 1)
        nursery.start_soon(call, 1)
        await settle()
        assert dispatcher.statistics().providers["p"].in_flight == 2
    # The newcomer waits until both unlimited holders are done (at 5).
    assert granted == [0.0, 0.0, 5.0]


async def test_limited_slot_checkpoints_even_when_free() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with trio.testing.assert_checkpoints():
            async with dispatcher.slot("p"):
                pass
        with trio.CancelScope() as scope:
            scope.cancel()
            async with dispatcher.slot("p"):
                pytest.fail(
                    "a cancelled caller must not get a slot"
                )  # pragma: no cover
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.granted_total, stats.in_flight) == (1, 0)


# ---------------------------------------------------------------- races


async def test_grant_racing_a_cancellation_never_leaks() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        outcomes: list[str] = []

        async def waiter(scope: trio.CancelScope) -> None:
            with scope:
                async with dispatcher.slot("p"):
                    outcomes.append("body ran")  # pragma: no cover
            outcomes.append("cancelled" if scope.cancelled_caught else "not cancelled")

        scope = trio.CancelScope()
        nursery.start_soon(waiter, scope)
        await settle()
        # In one step, with no checkpoint between: the release reaches the
        # scheduler first (it will grant the waiter), then the waiter is
        # cancelled. The grant finds nobody; the Cancel behind it gives it back.
        await holder.__aexit__(None, None, None)
        scope.cancel()
        await settle()
        assert outcomes == ["cancelled"]
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.waiting) == (0, 0)
        assert (stats.granted_total, stats.released_total) == (2, 2)
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_holder_cancelled_gives_the_slot_back_to_the_next_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted_at: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:

        async def holder() -> None:
            with trio.move_on_after(3):
                async with dispatcher.slot("p"):
                    await trio.sleep_forever()

        async def waiter() -> None:
            async with dispatcher.slot("p") as slot:
                assert slot.granted_at is not None
                granted_at.append(slot.granted_at)

        nursery.start_soon(holder)
        await settle()
        nursery.start_soon(waiter)
    assert granted_at == [3.0]


async def test_slot_is_entered_once() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        slot = dispatcher.slot("p")
        async with slot:
            pass
        with pytest.raises(RuntimeError, match=r"^a slot can be entered only once$"):
            await slot.__aenter__()


# ---------------------------------------------------------------- limits


async def test_raising_the_limit_grants_waiters_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:

        async def call() -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())
                await trio.sleep(10)

        for _ in range(3):
            nursery.start_soon(call)
        await trio.sleep(2)
        dispatcher.set_limit("p", 3)
        assert dispatcher.limits() == {"p": 3}
    assert granted == [0.0, 2.0, 2.0]


async def test_lowering_the_limit_lets_holders_finish_then_grants_below_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher({"p": 3}) as dispatcher, trio.open_nursery() as nursery:

        async def call(duration: float) -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())
                await trio.sleep(duration)

        for duration in (1, 2, 3):
            nursery.start_soon(call, duration)
        await settle()
        nursery.start_soon(call, 1)
        await settle()
        dispatcher.set_limit("p", 1)
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.in_flight, stats.waiting) == (1, 3, 1)
    # Holders end at 1, 2 and 3; only when none is left does the waiter go.
    assert granted == [0.0, 0.0, 0.0, 3.0]


async def test_remove_limit_lets_waiters_through_and_frees_later_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:

        async def call() -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())
                await trio.sleep(5)

        for _ in range(3):
            nursery.start_soon(call)
        await trio.sleep(1)
        dispatcher.remove_limit("p")
        assert dispatcher.limits() == {}
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.in_flight, stats.waiting) == (None, 3, 0)
        nursery.start_soon(call)
        # Limiting it again counts every slot still held, from before the
        # removal and since; the holders finish before anyone else goes.
        await trio.sleep(1)
        dispatcher.set_limit("p", 2)
        await settle()
        assert dispatcher.statistics().providers["p"].in_flight == 4
        nursery.start_soon(call)
        await trio.sleep(1)
        dispatcher.remove_limit("never-limited")
        assert dispatcher.limits() == {"p": 2}
    # The first holder ends at 5, the three others at 6: the newcomer from
    # 2.0 waits for in_flight to drop under 2.
    assert granted == [0.0, 1.0, 1.0, 1.0, 6.0]


# ---------------------------------------------------------------- pauses


async def test_rate_limit_report_pauses_grants_until_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    finished: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:

        async def call(duration: float) -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())
                await trio.sleep(duration)
            finished.append(trio.current_time())

        nursery.start_soon(call, 2)
        await settle()
        nursery.start_soon(call, 1)
        await trio.sleep(0.5)
        dispatcher.report_rate_limit("p", retry_after=5)
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.paused_until) == (True, 5.5)
        await trio.sleep(1)
        # A second report extends the pause; a shorter one would not shorten it.
        dispatcher.report_rate_limit("p", retry_after=6)
        dispatcher.report_rate_limit("p", retry_after=0.5)
        await settle()
        assert dispatcher.statistics().providers["p"].paused_until == 7.5
    # The holder was not touched: it finished at 2. The waiter went at 7.5.
    assert granted == [0.0, 7.5]
    assert finished == [2.0, 8.5]


async def test_rate_limit_report_without_retry_after_uses_the_default_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"p": 1}, default_pause=30.0, unknown_providers="allow"
    ) as dispatcher:
        dispatcher.report_rate_limit("p")
        async with dispatcher.slot("p") as slot:
            assert slot.granted_at == 30.0
        dispatcher.report_rate_limit("unlimited", retry_after=100)
        async with dispatcher.slot("unlimited") as slot:
            assert slot.granted_at == 30.0
        await settle()
        stats = dispatcher.statistics()
        assert list(stats.providers) == ["p", "unlimited"]
        assert not stats.providers["p"].paused
        assert not stats.providers["unlimited"].paused


async def test_pause_of_zero_resumes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}, default_pause=0) as dispatcher:
        dispatcher.report_rate_limit("p")
        async with dispatcher.slot("p") as slot:
            assert slot.granted_at == 0.0


# ---------------------------------------------------------------- max_hold


async def test_max_hold_cancels_the_body_and_hands_the_slot_on_at_that_moment(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}, max_hold=5) as dispatcher:

        async def stuck() -> None:
            with pytest.raises(
                SlotHoldTimeout,
                match=r"^a slot of 'p' was held longer than max_hold=5 seconds$",
            ) as caught:
                async with dispatcher.slot("p"):
                    try:
                        await trio.sleep_forever()
                    except trio.Cancelled:
                        events.append(("body cancelled", trio.current_time()))
                        raise
            events.append(("timeout raised", trio.current_time()))
            assert (caught.value.provider, caught.value.max_hold) == ("p", 5.0)

        async def next_in_line() -> None:
            async with dispatcher.slot("p") as slot:
                assert slot.granted_at is not None
                events.append(("granted", slot.granted_at))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stuck)
            await settle()
            nursery.start_soon(next_in_line)
    assert events == [
        ("body cancelled", 5.0),
        ("timeout raised", 5.0),
        ("granted", 5.0),
    ]


async def test_max_hold_never_exceeds_the_limit_while_the_body_unwinds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher({"p": 1}, max_hold=5) as dispatcher:

        async def slow_to_stop() -> None:
            with pytest.raises(SlotHoldTimeout):
                async with dispatcher.slot("p"):
                    try:
                        await trio.sleep_forever()
                    finally:
                        with trio.CancelScope(shield=True):
                            await trio.sleep(2)  # closing a stream politely

        async def next_in_line() -> None:
            async with dispatcher.slot("p", max_hold=None):
                granted.append(trio.current_time())
                await trio.sleep(20)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_to_stop)
            await settle()
            nursery.start_soon(next_in_line)
    # Unlike a watchdog, the slot is not reclaimed while the body still runs.
    assert granted == [7.0]


async def test_max_hold_per_slot_overrides_and_a_quick_body_is_not_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(SlotHoldTimeout):
            async with dispatcher.slot("p", max_hold=1):
                await trio.sleep(2)
        assert trio.current_time() == 1.0
        async with dispatcher.slot("p", max_hold=1):
            await trio.sleep(0.5)
        assert trio.current_time() == 1.5


async def test_max_hold_timer_is_counted_from_the_grant(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher({"p": 1}, max_hold=3) as dispatcher,
        trio.open_nursery() as nursery,
    ):

        async def hold(duration: float) -> None:
            async with dispatcher.slot("p"):
                await trio.sleep(duration)

        nursery.start_soon(hold, 2.5)
        await settle()
        # Waits 2.5 s, then holds 2.5 s: it must not time out.
        nursery.start_soon(hold, 2.5)
    assert trio.current_time() == 5.0


# ---------------------------------------------------------------- max_waiting


async def test_max_waiting_refuses_at_once_with_queue_full() -> None:
    async with (
        open_dispatcher({"p": 1}, max_waiting=1) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        nursery.start_soon(_enter_and_leave, dispatcher)
        await settle()
        with pytest.raises(
            QueueFull, match=r"^1 request already waits for 'p' \(max_waiting=1\)$"
        ) as caught:
            async with dispatcher.slot("p"):
                pytest.fail("a refused caller must not get a slot")  # pragma: no cover
        assert (caught.value.provider, caught.value.max_waiting) == ("p", 1)
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.waiting, stats.rejected_total) == (1, 1, 1)
        await holder.__aexit__(None, None, None)


async def _enter_and_leave(dispatcher: Dispatcher) -> None:
    async with dispatcher.slot("p"):
        pass


# ---------------------------------------------------------------- closing


async def test_closing_fails_every_waiter_wherever_its_task_lives() -> None:
    outcomes: list[str] = []

    async def waiter(dispatcher: Dispatcher) -> None:
        try:
            async with dispatcher.slot("p"):
                outcomes.append("granted")  # pragma: no cover
        except DispatcherClosed as exc:
            outcomes.append(str(exc))

    async with trio.open_nursery() as outside:
        async with open_dispatcher({"p": 1}) as dispatcher:
            holder = dispatcher.slot("p")
            await holder.__aenter__()
            outside.start_soon(waiter, dispatcher)
            outside.start_soon(waiter, dispatcher)
            await settle()
        await settle()
        assert outcomes == ["the dispatcher closed while waiting for 'p'"] * 2
        # Later callers get the error at once; the holder's release is a no-op.
        with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
            async with dispatcher.slot("p"):
                pass  # pragma: no cover
        with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
            dispatcher.set_limit("p", 2)
        with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
            dispatcher.remove_limit("p")
        dispatcher.report_rate_limit("p", retry_after=1)
        assert holder.held
        await holder.__aexit__(None, None, None)
        assert repr(holder).endswith("state=done>")
        assert dispatcher.closed
        assert dispatcher.statistics().closed


async def test_holder_outside_keeps_running_after_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    finished: list[float] = []
    async with trio.open_nursery() as outside, open_dispatcher({"p": 1}) as dispatcher:

        async def holder() -> None:
            async with dispatcher.slot("p"):
                await trio.sleep(10)
            finished.append(trio.current_time())

        outside.start_soon(holder)
        await trio.sleep(1)
    assert finished == [10.0]


async def test_body_exception_comes_out_as_itself() -> None:
    with pytest.raises(ZeroDivisionError) as info:
        async with open_dispatcher({"p": 1}):
            1 / 0  # noqa: B018 (the point is the exception)
    assert not isinstance(info.value, BaseExceptionGroup)


async def test_body_exception_keeps_its_own_cause_and_context() -> None:
    cause = KeyError("cause")
    with pytest.raises(RuntimeError) as info:
        async with open_dispatcher({"p": 1}):
            try:
                raise ValueError("context")
            except ValueError:
                raise RuntimeError("outer") from cause
    assert info.value.__cause__ is cause
    assert isinstance(info.value.__context__, ValueError)


async def test_outer_cancellation_passes_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.move_on_after(1) as scope:
        async with open_dispatcher({"p": 1}):
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() == 1.0


async def test_nested_group_from_the_body_is_not_unwrapped() -> None:
    with pytest.RaisesGroup(ValueError, KeyError):
        async with open_dispatcher({"p": 1}):
            raise ExceptionGroup("mine", [ValueError(), KeyError()])


# ---------------------------------------------------------------- bad input

BAD_LIMITS = [
    (0, ValueError, "limit must be a positive integer, got 0"),
    (-1, ValueError, "limit must be a positive integer, got -1"),
    (2.0, TypeError, "limit must be a positive integer, got 2.0"),
    (math.nan, TypeError, "limit must be a positive integer, got nan"),
    (True, TypeError, "limit must be a positive integer, got True"),
    ("3", TypeError, "limit must be a positive integer, got '3'"),
    (None, TypeError, "limit must be a positive integer, got None"),
]


@pytest.mark.parametrize(("limit", "error", "message"), BAD_LIMITS)
async def test_bad_limit_is_refused_and_changes_nothing(
    limit: object, error: type[Exception], message: str
) -> None:
    for_p = message.replace("limit", "limit for 'p'", 1)
    with pytest.raises(error, match=f"^{for_p}$"):
        open_dispatcher({"q": 1, "p": limit})  # type: ignore[dict-item]  # the point
    async with open_dispatcher({"p": 2}) as dispatcher:
        with pytest.raises(error, match=f"^{message}$"):
            dispatcher.set_limit("p", limit)  # type: ignore[arg-type]  # the point
        with pytest.raises(error, match=f"^{message}$"):
            dispatcher.set_limit("new", limit)  # type: ignore[arg-type]  # the point
        await settle()
        assert dispatcher.limits() == {"p": 2}
        assert list(dispatcher.statistics().providers) == ["p"]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: open_dispatcher([("p", 1)]),  # type: ignore[arg-type]  # the point
            TypeError,
            r"limits must be a mapping of provider to limit, got \[\('p', 1\)\]",
        ),
        (
            lambda: open_dispatcher({"": 1}),
            ValueError,
            "provider must be a non-empty string, got ''",
        ),
        (
            lambda: open_dispatcher({3: 1}),  # type: ignore[dict-item]  # the point
            TypeError,
            "provider must be a non-empty string, got 3",
        ),
        (
            lambda: open_dispatcher(default_pause=-1),
            ValueError,
            "default_pause must be a non-negative number of seconds, got -1",
        ),
        (
            lambda: open_dispatcher(default_pause=math.inf),
            ValueError,
            "default_pause must be a non-negative number of seconds, got inf",
        ),
        (
            lambda: open_dispatcher(default_pause="1"),  # type: ignore[arg-type]  # the point
            TypeError,
            "default_pause must be a non-negative number of seconds, got '1'",
        ),
        (
            lambda: open_dispatcher(max_hold=0),
            ValueError,
            "max_hold must be a positive number of seconds, got 0",
        ),
        (
            lambda: open_dispatcher(max_hold=-2.5),
            ValueError,
            r"max_hold must be a positive number of seconds, got -2\.5",
        ),
        (
            lambda: open_dispatcher(max_hold=math.nan),
            ValueError,
            "max_hold must be a positive number of seconds, got nan",
        ),
        (
            lambda: open_dispatcher(max_waiting=-1),
            ValueError,
            "max_waiting must be a non-negative integer, got -1",
        ),
        (
            lambda: open_dispatcher(max_waiting=1.0),  # type: ignore[arg-type]  # the point
            TypeError,
            r"max_waiting must be a non-negative integer, got 1\.0",
        ),
    ],
)
def test_bad_dispatcher_options_are_refused_at_the_call(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        call()


async def test_bad_call_arguments_are_refused_and_change_nothing() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            ValueError, match=r"^provider must be a non-empty string, got ''$"
        ):
            dispatcher.slot("")
        with pytest.raises(
            TypeError, match=r"^provider must be a non-empty string, got None$"
        ):
            dispatcher.slot(None)  # type: ignore[arg-type]  # the point
        with pytest.raises(
            ValueError, match=r"^started_at must be a finite number, got nan$"
        ):
            dispatcher.slot("p", started_at=math.nan)
        with pytest.raises(
            TypeError, match=r"^started_at must be a finite number, got '0'$"
        ):
            dispatcher.slot("p", started_at="0")  # type: ignore[arg-type]  # the point
        with pytest.raises(
            TypeError, match=r"^conversation_id must be a string or None, got 7$"
        ):
            dispatcher.slot("p", conversation_id=7)  # type: ignore[arg-type]  # the point
        with pytest.raises(
            ValueError, match=r"^max_hold must be a positive number of seconds, got 0$"
        ):
            dispatcher.slot("p", max_hold=0)
        with pytest.raises(
            ValueError,
            match=r"^retry_after must be a non-negative number of seconds, got -1$",
        ):
            dispatcher.report_rate_limit("p", retry_after=-1)
        with pytest.raises(
            ValueError, match=r"^provider must be a non-empty string, got ''$"
        ):
            dispatcher.report_rate_limit("", retry_after=1)
        with pytest.raises(
            ValueError, match=r"^provider must be a non-empty string, got ''$"
        ):
            dispatcher.remove_limit("")
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.granted_total, stats.in_flight) == (False, 0, 0)


# ---------------------------------------------------------------- surface


async def test_reprs_name_the_state() -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        assert repr(dispatcher) == "<Dispatcher open limits={'p': 2}>"
        slot = dispatcher.slot("p", conversation_id="c1", started_at=1.5)
        assert (
            repr(slot)
            == "<Slot provider='p' conversation_id='c1' started_at=1.5 priority=0 state=new>"
        )
        async with slot:
            assert "state=holding" in repr(slot)
    assert repr(dispatcher) == "<Dispatcher closed limits={'p': 2}>"


def test_errors_form_one_tree() -> None:
    for error in (DispatcherClosed, QueueFull, SlotHoldTimeout):
        assert issubclass(error, DispatchError)
    assert trio_dispatch.DispatchError is DispatchError


# ---------------------------------------------------------------- crashes


class Boom(Exception):
    """A bug inside a scheduler actor."""


@pytest.fixture
def crash_on_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every scheduler crash when it handles a Pause."""
    handle = SchedulerActor._handle

    def crashing(self: SchedulerActor, message: SchedulerMessage, now: float) -> None:
        if isinstance(message, Pause):
            raise Boom("bug in the scheduler")
        handle(self, message, now)

    monkeypatch.setattr(SchedulerActor, "_handle", crashing)


@pytest.mark.usefixtures("crash_on_pause")
async def test_a_scheduler_crash_is_not_lost_behind_the_bodys_cancelled_nursery() -> (
    None
):
    with pytest.RaisesGroup(Boom, match="Exceptions from Trio nursery"):
        async with (
            open_dispatcher({"p": 1}) as dispatcher,
            trio.open_nursery() as inner,
        ):
            inner.start_soon(trio.sleep_forever)
            dispatcher.report_rate_limit("p", 1)
            await trio.sleep_forever()


@pytest.mark.usefixtures("crash_on_pause")
async def test_a_scheduler_crash_mid_batch_fails_the_acquires_behind_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcome: list[str] = []

    async def waiter(dispatcher: Dispatcher) -> None:
        # Shielded, so only the scheduler's answer can end the wait.
        with trio.CancelScope(shield=True), trio.move_on_after(10) as timer:
            try:
                dispatcher.report_rate_limit("p", 1)  # Pause, then Acquire: one batch
                async with dispatcher.slot("p"):
                    outcome.append("granted")  # pragma: no cover
            except DispatcherClosed:
                outcome.append("closed")
        if timer.cancelled_caught:
            outcome.append("hung")  # pragma: no cover

    async def serve(task_status: trio.TaskStatus[Dispatcher]) -> None:
        async with open_dispatcher({"p": 1}) as dispatcher:
            task_status.started(dispatcher)
            await trio.sleep_forever()

    with pytest.RaisesGroup(Boom, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            dispatcher = await nursery.start(serve)
            nursery.start_soon(waiter, dispatcher)
            await trio.sleep_forever()
    assert outcome == ["closed"]


@pytest.mark.usefixtures("ctrl_c")
def test_a_keyboard_interrupt_after_the_acquire_is_sent_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Acquire reaches the scheduler through its send() (Backend).
    send = SchedulerActor.send
    interrupted = False

    def send_then_interrupt(self: SchedulerActor, message: SchedulerMessage) -> None:
        nonlocal interrupted
        send(self, message)
        if isinstance(message, Acquire) and not interrupted:
            interrupted = True
            signal.raise_signal(signal.SIGINT)  # unprotected code would get KI here

    monkeypatch.setattr(SchedulerActor, "send", send_then_interrupt)

    async def main() -> None:
        async with open_dispatcher({"p": 1}) as dispatcher:
            with pytest.raises(KeyboardInterrupt):
                async with dispatcher.slot("p"):
                    pass  # pragma: no cover
            await settle()
            assert dispatcher.statistics().providers["p"].in_flight == 0
            with trio.move_on_after(10) as timer:
                async with dispatcher.slot("p"):
                    pass
            assert not timer.cancelled_caught

    # trio delivers a KeyboardInterrupt to the main task: run one of our own.
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
