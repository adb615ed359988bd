"""The scheduler actor on its own, fed messages by hand."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import DispatcherClosed
from trio_dispatch.lowlevel import (
    Acquire,
    Cancel,
    Pause,
    Release,
    Resume,
    SchedulerActor,
    SetLimit,
    SlotPolicy,
    Ticket,
)

from ._helpers import RecordingReply


async def test_acquires_still_queued_at_shutdown_are_failed() -> None:
    actor = SchedulerActor("p", SlotPolicy(1))
    holder, waiter, queued = RecordingReply(), RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(Acquire(Ticket(0, 0), holder))
        actor.send(Acquire(Ticket(1, 1), waiter))
        await trio.testing.wait_all_tasks_blocked()
        # Queued behind the close: the scheduler never reads it normally.
        actor.send(Acquire(Ticket(2, 2), queued))
        actor.close()
        nursery.cancel_scope.cancel()
    assert [g.ticket for g in holder.grants] == [Ticket(0, 0)]
    assert (waiter.grants, queued.grants) == ([], [])
    for reply in (waiter, queued):
        assert [str(e) for e in reply.errors] == [
            "the dispatcher closed while waiting for 'p'"
        ]
        assert isinstance(reply.errors[0], DispatcherClosed)
    with pytest.raises(trio.ClosedResourceError):
        actor.send(Release(Ticket(0, 0)))


async def test_closing_alone_stops_the_actor_before_it_grants_anything_queued() -> None:
    actor = SchedulerActor("p", SlotPolicy(1))
    queued = RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await trio.testing.wait_all_tasks_blocked()
        # The Acquire wakes the actor, but the close comes before it runs.
        actor.send(Acquire(Ticket(0, 0), queued))
        actor.close()
    assert queued.grants == []
    assert [type(e) for e in queued.errors] == [DispatcherClosed]
    assert actor.policy.statistics().granted_total == 0


async def test_every_message_kind_reaches_the_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = SlotPolicy(1)
    actor = SchedulerActor("p", policy)
    replies = [RecordingReply() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        for seq, reply in enumerate(replies):
            actor.send(Acquire(actor.ticket(float(seq)), reply))
        await trio.testing.wait_all_tasks_blocked()
        assert (policy.in_flight, policy.waiting) == (1, 2)
        actor.send(Cancel(Ticket(1.0, 1)))
        actor.send(Pause(0.0, retry_after=3.0))
        actor.send(Release(Ticket(0.0, 0)))
        await trio.testing.wait_all_tasks_blocked()
        assert (policy.in_flight, policy.waiting, policy.paused_until) == (0, 1, 3.0)
        # The actor wakes at the pause's end by itself.
        await trio.sleep(5)
        assert [g.granted_at for g in replies[2].grants] == [3.0]
        actor.send(SetLimit(4))
        await trio.testing.wait_all_tasks_blocked()
        assert policy.limit == 4
        actor.send(Pause(5.0, retry_after=2.0))
        await trio.testing.wait_all_tasks_blocked()
        assert policy.paused_until == 7.0
        actor.send(Resume())
        await trio.testing.wait_all_tasks_blocked()
        assert policy.statistics().paused_until is None
        assert repr(actor) == (
            "<SchedulerActor provider='p' <SlotPolicy limit=4 in_flight=1"
            " waiting=0 paused_until=None>>"
        )
        nursery.cancel_scope.cancel()
    assert (replies[1].grants, replies[1].errors) == ([], [])
