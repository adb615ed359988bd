"""Misuse of the protocol fails the one who misused it, never the dispatcher.

Code that talks to a ``SchedulerActor`` directly can send what a ``Slot``
never sends (a ticket twice, the release of a ticket that still waits); a
slot can be exited from a task other than the one that entered it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import Slot, open_dispatcher
from trio_dispatch.lowlevel import Acquire, Pause, Release, SetLimit

from ._helpers import RecordingReply, local_scheduler, settle

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher


async def _hold(slot: Slot, outcomes: list[str]) -> None:
    try:
        async with slot:
            outcomes.append("granted")
    except (RuntimeError, ValueError) as exc:
        outcomes.append(f"{type(exc).__name__}: {exc}")


def _statistics(dispatcher: Dispatcher) -> tuple[int, int, int, int, int]:
    stats = dispatcher.statistics().providers["p"]
    return (
        stats.in_flight,
        stats.waiting,
        stats.granted_total,
        stats.released_total,
        stats.withdrawn_total,
    )


# ---------------------------------------------------------------- scheduler


async def test_an_acquire_with_a_known_ticket_fails_alone_and_others_are_served() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        waiter = dispatcher.slot("p")
        nursery.start_soon(_hold, waiter, outcomes)
        await settle()
        actor = local_scheduler(dispatcher, "p")
        on_holder, on_waiter = RecordingReply(), RecordingReply()
        actor.send(Acquire(holder.ticket, on_holder))  # type: ignore[arg-type]  # set once entered
        actor.send(Acquire(waiter.ticket, on_waiter))  # type: ignore[arg-type]  # set once entered
        await settle()
        for reply, slot in ((on_holder, holder), (on_waiter, waiter)):
            assert reply.grants == []
            assert [(type(e), str(e)) for e in reply.errors] == [
                (ValueError, f"ticket {slot.ticket!r} is already known")
            ]
        # Nothing changed: the holder holds, the waiter still waits its turn.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 0)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 0)
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_a_waiter_asking_again_with_its_own_ticket_is_failed_and_withdrawn() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        confused, patient = dispatcher.slot("p"), dispatcher.slot("p")
        nursery.start_soon(_hold, confused, outcomes)
        await settle()
        nursery.start_soon(_hold, patient, outcomes)
        await settle()
        local_scheduler(dispatcher, "p").send(Acquire(confused.ticket, confused))  # type: ignore[arg-type]  # set once entered
        await settle()
        assert outcomes == [f"ValueError: ticket {confused.ticket!r} is already known"]
        # Its ticket no longer waits: it is never granted to nobody.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 1)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes[1:] == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 1)


async def test_a_release_of_a_waiting_ticket_withdraws_it_and_fails_its_requester() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        victim, patient = dispatcher.slot("p"), dispatcher.slot("p")
        nursery.start_soon(_hold, victim, outcomes)
        await settle()
        nursery.start_soon(_hold, patient, outcomes)
        await settle()
        local_scheduler(dispatcher, "p").send(Release(victim.ticket))  # type: ignore[arg-type]  # set once entered
        await settle()
        assert outcomes == [
            f"RuntimeError: ticket {victim.ticket!r} is waiting, not holding a slot"
        ]
        assert not victim.held
        # The holder keeps its slot; the withdrawn ticket never gets one.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 1)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes[1:] == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 1)
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_a_bad_limit_or_pause_sent_to_a_scheduler_is_logged_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        actor = local_scheduler(dispatcher, "p")
        actor.send(SetLimit(0))
        actor.send(Pause(math.nan))
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.paused) == (2, False)
        async with dispatcher.slot("p") as first, dispatcher.slot("p") as second:
            assert first.held
            assert second.held
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "trio_dispatch",
            logging.ERROR,
            "the scheduler of 'p' ignored SetLimit(limit=0):"
            " limit must be a positive integer, got 0",
        ),
        (
            "trio_dispatch",
            logging.ERROR,
            "the scheduler of 'p' ignored Pause(reported_at=nan, retry_after=None):"
            " now must be a finite number, got nan",
        ),
    ]


# ---------------------------------------------------------------- slots


LEFT_ELSEWHERE = r"^a slot must be left by the task that entered it$"


@pytest.mark.parametrize("max_hold", [None, 5.0], ids=["plain", "max_hold"])
async def test_a_slot_left_from_another_task_is_given_back_once_then_refused(
    max_hold: float | None, autojump_clock: trio.testing.MockClock
) -> None:
    events: list[tuple[str, float]] = []
    async with (
        open_dispatcher({"p": 1}, max_hold=max_hold) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        slot = dispatcher.slot("p")
        entered = trio.Event()

        async def task_a() -> None:
            await slot.__aenter__()
            entered.set()
            # Well past max_hold: nothing may cancel this task now.
            await trio.sleep(20)
            events.append(("a done", trio.current_time()))

        async def task_b() -> None:
            await entered.wait()
            await trio.sleep(1)
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)
            events.append(("b refused", trio.current_time()))
            assert not slot.held
            # Leaving again, from anywhere, gives nothing back twice.
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)

        async def next_in_line() -> None:
            await entered.wait()
            async with dispatcher.slot("p", max_hold=None) as other:
                assert other.granted_at is not None
                events.append(("next granted", other.granted_at))

        nursery.start_soon(task_a)
        nursery.start_soon(task_b)
        nursery.start_soon(next_in_line)
    assert events == [("b refused", 1.0), ("next granted", 1.0), ("a done", 20.0)]
    stats = dispatcher.statistics().providers["p"]
    assert (stats.in_flight, stats.granted_total, stats.released_total) == (0, 2, 2)


@pytest.mark.parametrize("max_hold", [None, 5.0], ids=["plain", "max_hold"])
async def test_a_slot_left_elsewhere_then_by_its_own_task_closes_cleanly(
    max_hold: float | None, autojump_clock: trio.testing.MockClock
) -> None:
    events: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}, max_hold=max_hold) as dispatcher:

        async def leave_elsewhere(slot: Slot) -> None:
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)
            events.append(("left elsewhere", trio.current_time()))

        with trio.CancelScope() as outer:
            async with dispatcher.slot("p") as slot:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(leave_elsewhere, slot)
                await trio.sleep(10)
                events.append(("body done", trio.current_time()))
            events.append(("left", trio.current_time()))
        assert not outer.cancelled_caught
        await trio.sleep(10)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.granted_total, stats.released_total) == (
            0,
            1,
            1,
        )
    assert events == [("left elsewhere", 0.0), ("body done", 10.0), ("left", 10.0)]
