"""``statistics()`` reflects everything done before the call, at once.

No test here lets the schedulers run between the action and the snapshot.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import Dispatcher, DispatcherClosed, open_dispatcher
from trio_dispatch.lowlevel import (
    Acquire,
    Pause,
    SchedulerActor,
    SchedulerMessage,
    Ticket,
)

from .._helpers import RecordingReply, local_scheduler, settle


async def _hold(dispatcher: Dispatcher, seconds: float) -> None:
    async with dispatcher.slot("p"):
        await trio.sleep(seconds)


async def test_statistics_right_after_set_limit_show_the_new_limit_and_its_grants(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        dispatcher.set_limit("p", 5)
        assert dispatcher.limits() == {"p": 5}
        assert dispatcher.statistics().providers["p"].limit == 5
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(_hold, dispatcher, 1)
            await settle()
            dispatcher.set_limit("p", 6)
            stats = dispatcher.statistics().providers["p"]
            assert (stats.limit, stats.in_flight, stats.waiting) == (6, 6, 0)
            assert stats.granted_total == 6


async def test_statistics_after_every_holder_returned_show_nothing_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 3}) as dispatcher:
        async with (
            dispatcher.slot("p"),
            dispatcher.slot("p"),
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(_hold, dispatcher, 1)
            await trio.sleep(1)
        # Leaving the block sent two releases; the scheduler has not run.
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.waiting) == (0, 0)
        assert (stats.granted_total, stats.released_total) == (3, 3)
        assert trio.current_time() == 1.0


async def test_statistics_end_a_pause_that_has_run_out_and_grant_its_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        dispatcher.report_rate_limit("p", retry_after=5)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.paused_until) == (True, 5.0)
        nursery.start_soon(_hold, dispatcher, 1)
        await settle()
        assert dispatcher.statistics().providers["p"].waiting == 1
        # The clock moves with no task running: the scheduler has not woken.
        autojump_clock.jump(5)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.in_flight, stats.waiting) == (False, 1, 0)
    assert trio.current_time() == 6.0


class Boom(Exception):
    """A bug inside a scheduler actor."""


async def test_a_scheduler_bug_met_by_a_sender_fails_the_waiters_and_reaches_the_nursery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = SchedulerActor._handle

    def crashing(self: SchedulerActor, message: SchedulerMessage, now: float) -> None:
        if isinstance(message, Pause):
            raise Boom("bug in the scheduler")
        handle(self, message, now)

    monkeypatch.setattr(SchedulerActor, "_handle", crashing)
    holder, behind, late = RecordingReply(), RecordingReply(), RecordingReply()
    with pytest.RaisesGroup(Boom, flatten_subgroups=True):
        async with open_dispatcher({"p": 1}) as dispatcher:
            scheduler = local_scheduler(dispatcher, "p")
            scheduler.send(Acquire(Ticket(0.0, 98), holder))
            scheduler.send(Acquire(Ticket(1.0, 99), behind))
            # The sender that meets the bug is not failed by it: the
            # scheduler stops, fails its waiter, and its task raises it.
            dispatcher.report_rate_limit("p", 1)
            assert [type(e) for e in behind.errors] == [DispatcherClosed]
            with pytest.raises(trio.ClosedResourceError):
                scheduler.send(Acquire(Ticket(2.0, 100), late))
            await trio.sleep_forever()
    assert [len(holder.grants), len(behind.grants), len(late.grants)] == [1, 0, 0]
    assert (holder.errors, late.errors) == ([], [])
