"""``Slot.report_timing``: an integration's own report of a call's token timings.

Checked at once; sent as an ``ObserveLatency`` while the slot is held;
what a latency-signal ``AdaptiveLimit`` learns from, end to end.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
import trio.testing

from trio_dispatch import AdaptiveLimit, open_dispatcher
from trio_dispatch.events import DispatchEvent, LimitChanged

from .._events import record


async def test_reports_move_a_latency_limit_end_to_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = AdaptiveLimit(initial=2, maximum=16, signal="latency")
    async with open_dispatcher({"p": spec}) as dispatcher:
        async with dispatcher.slot("p") as a, dispatcher.slot("p") as b:
            start = trio.current_time()
            await trio.sleep(1.0)
            for slot in (a, b):
                slot.report_timing(
                    first_token_at=start + 0.2,
                    last_token_at=start + 1.0,
                    output_tokens=9,
                    prompt_tokens=100,
                )
        # A round of two calls, at their floors, with the limit in use: the
        # slow start doubles it.
        assert dispatcher.limits() == {"p": 4}
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.adaptive) == (4, True)


async def test_a_latency_limits_moves_are_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = AdaptiveLimit(initial=2, maximum=16, signal="latency")
    seen: list[DispatchEvent] = []
    async with (
        open_dispatcher({"p": spec}) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, seen)
        async with dispatcher.slot("p") as a, dispatcher.slot("p") as b:
            now = trio.current_time()
            for slot in (a, b):
                slot.report_timing(
                    first_token_at=now,
                    last_token_at=now,
                    output_tokens=1,
                    prompt_tokens=10,
                )
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    moves = [event for event in seen if isinstance(event, LimitChanged)]
    assert moves == [LimitChanged(provider="p", at=0.0, limit=4, previous=2)]


async def test_reports_leave_other_limits_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        async with dispatcher.slot("p") as a, dispatcher.slot("p") as b:
            now = trio.current_time()
            for slot in (a, b):
                slot.report_timing(
                    first_token_at=now,
                    last_token_at=now,
                    output_tokens=1,
                    prompt_tokens=0,
                )
        assert dispatcher.limits() == {"p": 2}


async def test_a_report_after_the_slot_went_back_does_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = AdaptiveLimit(initial=1, maximum=16, signal="latency")
    async with open_dispatcher({"p": spec}) as dispatcher:
        async with dispatcher.slot("p") as slot:
            now = trio.current_time()
        for _ in range(4):
            slot.report_timing(
                first_token_at=now,
                last_token_at=now,
                output_tokens=1,
                prompt_tokens=0,
            )
        assert dispatcher.limits() == {"p": 1}


GOOD: dict[str, Any] = {
    "first_token_at": 1.0,
    "last_token_at": 2.0,
    "output_tokens": 3,
    "prompt_tokens": 10,
}


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"first_token_at": "1"},
            TypeError,
            r"^first_token_at must be a finite number, got '1'$",
        ),
        (
            {"last_token_at": math.inf},
            ValueError,
            r"^last_token_at must be a finite number, got inf$",
        ),
        (
            {"output_tokens": 2.0},
            TypeError,
            r"^output_tokens must be a non-negative integer, got 2\.0$",
        ),
        (
            {"output_tokens": 0},
            ValueError,
            r"^output_tokens must be at least 1, got 0$",
        ),
        (
            {"prompt_tokens": -1},
            ValueError,
            r"^prompt_tokens must be a non-negative integer, got -1$",
        ),
        (
            {"last_token_at": 0.5},
            ValueError,
            r"^last_token_at must not be before first_token_at=1\.0, got 0\.5$",
        ),
        (
            {"first_token_at": -5.0, "last_token_at": -4.0},
            ValueError,
            r"^first_token_at must not be before the grant at 0\.0, got -5\.0$",
        ),
    ],
)
async def test_bad_reports_are_refused_at_once_and_change_nothing(
    changes: dict[str, Any],
    error: type[Exception],
    message: str,
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = AdaptiveLimit(initial=1, maximum=16, signal="latency")
    async with open_dispatcher({"p": spec}) as dispatcher:
        async with dispatcher.slot("p") as slot:
            assert slot.granted_at == 0.0
            with pytest.raises(error, match=message):
                slot.report_timing(**{**GOOD, **changes})
            # The slot still holds, and a good report still counts: with the
            # next call's, a round at the floors, which doubles the limit.
            assert slot.held
            slot.report_timing(**GOOD)
        assert dispatcher.limits() == {"p": 1}
        async with dispatcher.slot("p") as slot:
            slot.report_timing(**GOOD)
        assert dispatcher.limits() == {"p": 2}
