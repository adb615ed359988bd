"""The scheduler actor on its own, fed messages by hand."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import (
    Budget,
    DispatcherClosed,
    Quota,
    RateLimitInfo,
    Tenant,
    TenantStatistics,
)
from trio_dispatch.lowlevel import (
    Acquire,
    Cancel,
    ForMember,
    ObserveRateLimits,
    Pause,
    Release,
    Resume,
    SchedulerActor,
    SetLimit,
    SetModelBudget,
    SetPool,
    SetTenant,
    SlotPolicy,
    Throttle,
    Ticket,
)

from .._helpers import RecordingReply


async def test_acquires_still_queued_at_shutdown_are_failed() -> None:
    actor = SchedulerActor("p", SlotPolicy(1))
    holder, waiter, queued = RecordingReply(), RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(Acquire(Ticket(0, 0), holder))
        actor.send(Acquire(Ticket(1, 1), waiter))
        await trio.testing.wait_all_tasks_blocked()
        # Waiting behind the others when the actor closes.
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


async def test_a_closed_actor_handles_nothing_and_its_run_returns_at_once() -> None:
    actor = SchedulerActor("p", SlotPolicy(1))
    late = RecordingReply()
    actor.close()
    with pytest.raises(trio.ClosedResourceError):
        actor.send(Acquire(Ticket(0, 0), late))
    with trio.fail_after(1):
        assert await actor.run() is False
    assert (late.grants, late.errors) == ([], [])
    assert actor.policy.statistics().granted_total == 0


async def test_every_message_kind_reaches_the_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = SlotPolicy(1)
    actor = SchedulerActor("p", policy)
    replies = [RecordingReply() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        tickets = [actor.ticket(float(rank)) for rank in range(len(replies))]
        for ticket, reply in zip(tickets, replies, strict=True):
            actor.send(Acquire(ticket, reply))
        await trio.testing.wait_all_tasks_blocked()
        assert (policy.in_flight, policy.waiting) == (1, 2)
        actor.send(Cancel(tickets[1]))
        actor.send(Pause(0.0, retry_after=3.0))
        actor.send(Release(tickets[0]))
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


async def test_tenant_service_counts_slot_seconds_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Acquire and release go through the caller's task (no budget, no
    # pause): the actor reads the clock there once tenants are counted.
    actor = SchedulerActor("p", SlotPolicy(1, tenants={"a": Tenant(weight=2.0)}))
    a_reply, b_reply = RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        await trio.testing.wait_all_tasks_blocked()
        a = actor.ticket(trio.current_time(), tenant="a")
        actor.send(Acquire(a, a_reply))
        await trio.sleep(1)
        b = actor.ticket(trio.current_time(), tenant="b")
        actor.send(Acquire(b, b_reply))
        assert b_reply.grants == []
        await trio.sleep(2)
        actor.send(Release(a))
        assert [grant.granted_at for grant in b_reply.grants] == [3.0]
        await trio.sleep(2)
        # a: 3 slot-seconds over its weight 2; b: 2, from the floor 0.
        assert actor.statistics().tenants == {
            "a": TenantStatistics("a", 2.0, None, 0, 0, 1.5),
            "b": TenantStatistics("b", 1.0, None, 1, 0, 2.0),
        }
        actor.send(Release(b))
        # b was configured by nobody: forgotten once idle.
        assert set(actor.statistics().tenants) == {"a"}
        nursery.cancel_scope.cancel()
    assert [grant.granted_at for grant in a_reply.grants] == [0.0]


async def test_set_tenant_at_run_time_grants_what_a_raised_cap_lets_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = SchedulerActor("p", SlotPolicy(3, tenants={"a": Tenant(limit=1)}))
    replies = [RecordingReply() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        for reply in replies:
            actor.send(Acquire(actor.ticket(trio.current_time(), tenant="a"), reply))
        await trio.testing.wait_all_tasks_blocked()
        assert [len(reply.grants) for reply in replies] == [1, 0, 0]
        await trio.sleep(4)
        actor.send(SetTenant("a", Tenant(limit=2)))
        await trio.testing.wait_all_tasks_blocked()
        assert [g.granted_at for r in replies for g in r.grants] == [0.0, 4.0]
        actor.send(SetTenant("a", None))
        await trio.testing.wait_all_tasks_blocked()
        assert [g.granted_at for r in replies for g in r.grants] == [0.0, 4.0, 4.0]
        shown = actor.statistics().tenants["a"]
        assert (shown.limit, shown.in_flight, shown.waiting) == (None, 3, 0)
        nursery.cancel_scope.cancel()


async def test_model_budgets_through_the_actor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = SchedulerActor("p", SlotPolicy(4))
    replies = [RecordingReply() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(SetModelBudget("slow", Budget(requests_per_minute=1)))
        for reply, model in zip(replies, ("slow", "slow", "fast"), strict=True):
            actor.send(Acquire(actor.ticket(trio.current_time(), model=model), reply))
        await trio.testing.wait_all_tasks_blocked()
        assert [[g.granted_at for g in r.grants] for r in replies] == [[0.0], [], [0.0]]
        stats = actor.statistics()
        assert set(stats.models) == {"slow"}
        assert stats.models["slow"].waiting_for_budget
        assert stats.budget is None
        # The actor wakes by itself when the model's budget is back.
        await trio.sleep(100)
        assert [g.granted_at for g in replies[1].grants] == [60.0]
        info = RateLimitInfo(requests=Quota(limit=500, remaining=499, reset=0.12))
        actor.send(ObserveRateLimits(trio.current_time(), info, model="fast"))
        stats = actor.statistics()
        assert set(stats.models) == {"slow", "fast"}
        assert stats.models["fast"].learned
        assert stats.budget is None
        nursery.cancel_scope.cancel()


async def test_bad_tenant_and_model_settings_are_refused_at_the_call() -> None:
    actor = SchedulerActor("p", SlotPolicy(1))
    with pytest.raises(TypeError, match=r"^tenant must be a non-empty string, got 1$"):
        actor.send(SetTenant(1, Tenant()))  # type: ignore[arg-type]  # on purpose
    with pytest.raises(
        TypeError, match=r"^settings must be a Tenant or None, got \{'weight': 2\}$"
    ):
        actor.send(SetTenant("a", {"weight": 2}))  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ValueError, match=r"^model must be a non-empty string, got ''$"):
        actor.send(SetModelBudget("", Budget()))
    with pytest.raises(TypeError, match=r"^budget must be a Budget, got 5$"):
        actor.send(SetModelBudget("m", 5))  # type: ignore[arg-type]  # on purpose
    assert actor.statistics().tenants == {}
    assert actor.statistics().models == {}


async def test_an_acquire_that_lets_an_older_waiter_through_grants_that_waiter(
    mock_clock: trio.testing.MockClock,
) -> None:
    # B waits for the provider's budget, back at 60. An Acquire handled at
    # 70, before the actor's tick, lets B through and not itself (the one
    # request of the minute goes to B): the grant is B's, and the newcomer
    # waits. (Regression: the newcomer was told it was granted.)
    policy = SlotPolicy(4, throttle=Throttle(Budget(requests_per_minute=1)))
    actor = SchedulerActor("p", policy)
    a, b, c = RecordingReply(), RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(Acquire(actor.ticket(0.0), a))
        b_ticket = actor.ticket(1.0)
        actor.send(Acquire(b_ticket, b))
        await trio.testing.wait_all_tasks_blocked()
        assert (len(a.grants), len(b.grants)) == (1, 0)
        mock_clock.jump(70)
        c_ticket = actor.ticket(70.0)
        actor.send(Acquire(c_ticket, c))
        await trio.testing.wait_all_tasks_blocked()
        assert [g.ticket for g in b.grants] == [b_ticket]
        assert [g.granted_at for g in b.grants] == [70.0]
        assert (c.grants, c.errors) == ([], [])
        assert policy.waiters() == [c_ticket]
        # Its grant comes in its turn, when the budget is back.
        mock_clock.jump(60)
        await trio.testing.wait_all_tasks_blocked()
        assert [g.ticket for g in c.grants] == [c_ticket]
        nursery.cancel_scope.cancel()


async def test_an_acquire_granted_with_others_delivers_every_grant(
    mock_clock: trio.testing.MockClock,
) -> None:
    # The model "slow" holds B back until 60; at 70 an older ticket of
    # another model arrives, and the fill its Acquire makes grants both.
    policy = SlotPolicy(4, models={"slow": Throttle(Budget(requests_per_minute=1))})
    actor = SchedulerActor("p", policy)
    replies = [RecordingReply() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(Acquire(actor.ticket(5.0, model="slow"), replies[0]))
        actor.send(Acquire(actor.ticket(6.0, model="slow"), replies[1]))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(70)
        actor.send(Acquire(actor.ticket(0.0, model="fast"), replies[2]))
        await trio.testing.wait_all_tasks_blocked()
        assert [[g.granted_at for g in r.grants] for r in replies] == [
            [0.0],
            [70.0],
            [70.0],
        ]
        assert policy.waiting == 0
        nursery.cancel_scope.cancel()


async def test_a_withdrawal_that_lets_a_waiter_through_delivers_its_grant(
    mock_clock: trio.testing.MockClock,
) -> None:
    # B waits for the provider's budget, back at 60; C waits behind it. At
    # 70 C's requester misuses the protocol (a release of a waiting ticket):
    # C is withdrawn and failed, and the fill that withdrawal makes grants
    # B, which must reach B. (Regression: the grant was dropped, the slot
    # held by nobody.)
    policy = SlotPolicy(4, throttle=Throttle(Budget(requests_per_minute=1)))
    actor = SchedulerActor("p", policy)
    a, b, c = RecordingReply(), RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        actor.send(Acquire(actor.ticket(0.0), a))
        b_ticket = actor.ticket(1.0)
        actor.send(Acquire(b_ticket, b))
        c_ticket = actor.ticket(2.0)
        actor.send(Acquire(c_ticket, c))
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(70)
        actor.send(Release(c_ticket))
        await trio.testing.wait_all_tasks_blocked()
        assert [type(e) for e in c.errors] == [RuntimeError]
        assert [(g.ticket, g.granted_at) for g in b.grants] == [(b_ticket, 70.0)]
        assert (policy.in_flight, policy.waiting) == (2, 0)
        nursery.cancel_scope.cancel()


async def test_a_message_sent_while_one_is_handled_waits_for_it_in_order() -> None:
    # The one rule: the releasing task handles the Release; the grant it
    # makes reaches a requester that gives it back at once, from inside
    # the handling. That Release waits for the handling to end (the grant's
    # slot is still held when the reply returns), and the same task handles
    # it before its send returns: the next waiter is granted by then.
    actor = SchedulerActor("p", SlotPolicy(1))
    seen: list[tuple[int, int]] = []

    class GivingBack(RecordingReply):
        def granted(self, ticket: Ticket, granted_at: float) -> None:
            super().granted(ticket, granted_at)
            actor.send(Release(ticket))
            seen.append((actor.policy.in_flight, actor.policy.waiting))

    holder, giving_back, last = RecordingReply(), GivingBack(), RecordingReply()
    held = actor.ticket(0.0)
    actor.send(Acquire(held, holder))
    actor.send(Acquire(actor.ticket(1.0), giving_back))
    actor.send(Acquire(actor.ticket(2.0), last))
    assert [len(r.grants) for r in (holder, giving_back, last)] == [1, 0, 0]
    actor.send(Release(held))
    assert seen == [(1, 1)]
    assert [len(r.grants) for r in (holder, giving_back, last)] == [1, 1, 1]
    assert (actor.policy.in_flight, actor.policy.waiting) == (1, 0)
    stats = actor.statistics()
    assert (stats.granted_total, stats.released_total) == (3, 2)


async def test_a_message_is_handled_by_its_sender_before_send_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No task of the actor's runs: each send is handled in the sender's
    # task, in order, and the pause holds the acquire sent after it.
    actor = SchedulerActor("p", SlotPolicy(2))
    paused, later = RecordingReply(), RecordingReply()
    actor.send(Pause(trio.current_time(), 10.0))
    actor.send(Acquire(actor.ticket(0.0), paused))
    assert (paused.grants, actor.policy.waiting) == ([], 1)
    actor.send(Resume())
    assert [grant.granted_at for grant in paused.grants] == [0.0]
    actor.send(Acquire(actor.ticket(1.0), later))
    assert [grant.granted_at for grant in later.grants] == [0.0]
    assert actor.policy.in_flight == 2


def test_tickets_of_two_schedulers_are_never_equal() -> None:
    first = SchedulerActor("a", SlotPolicy(1))
    second = SchedulerActor("b", SlotPolicy(1))
    assert first.ticket(0.0) != second.ticket(0.0)


async def test_a_scheduler_that_gave_way_forwards_everything_and_fails_nobody(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[object] = []

    class Group:
        def send(self, message: object) -> None:
            sent.append(message)

    actor = SchedulerActor("p", SlotPolicy(1, throttle=Throttle()))
    held, waiting = RecordingReply(), RecordingReply()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(actor.run)
        first, second = actor.ticket(0.0), actor.ticket(1.0)
        actor.send(Acquire(first, held))
        actor.send(Acquire(second, waiting, None, 40))
        handover = actor.give_way(Group())
        assert handover.member == "p"
        assert handover.state.holders == (first,)
        assert handover.state.throttle is actor.policy.throttle
        assert [(a.ticket, a.reply, a.tokens) for a in handover.waiting] == [
            (second, waiting, 40)
        ]
        await trio.testing.wait_all_tasks_blocked()
        actor.send(Release(first))
    # Its run stopped, and the waiter was not failed: it moved.
    assert sent == [Release(first)]
    assert waiting.errors == []
    with pytest.raises(RuntimeError, match=r"^a scheduler gives way only while"):
        actor.give_way(Group())


async def test_a_group_gives_way_whole_and_the_other_takes_it_in_in_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def group(first: str, second: str, pool: str) -> SchedulerActor:
        policy = SlotPolicy(1, provider=first, affinity_wait=5.0)
        policy.add_member(second, 1)
        policy.set_pool(pool, [first, second])
        return SchedulerActor(pool, policy)

    gone, kept = group("c", "d", "r"), group("a", "b", "p")
    replies = {name: RecordingReply() for name in ("c1", "d1", "r1", "p1", "p2")}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gone.run)
        nursery.start_soon(kept.run)
        tickets = {name: gone.ticket(float(rank)) for rank, name in enumerate(replies)}
        # c and d each held (d by conversation "x"); r1 waits for the pool.
        for name in ("c1", "d1", "r1"):
            gone.send(
                ForMember(
                    "r",
                    Acquire(
                        tickets[name], replies[name], "x" if name == "d1" else None
                    ),
                )
            )
        assert gone.policy.member_of(tickets["d1"]) == "d"
        for name in ("p1", "p2"):
            kept.send(ForMember("p", Acquire(tickets[name], replies[name])))
        handover = gone.give_way_whole(kept)
        assert [acquire.ticket for acquire in handover.waiting] == [tickets["r1"]]
        assert handover.latest == {"x": "d"}
        kept.merge(handover, {"c": 1, "d": 1})
        assert kept.policy.members == ["a", "b", "c", "d"]
        assert kept.policy.pools == {"p": ["a", "b"], "r": ["c", "d"]}
        # A holder's release reaches the old scheduler, and goes on: d is
        # free, and r1 (older than everything waiting in kept) takes it.
        gone.send(Release(tickets["d1"]))
        assert [grant.ticket for grant in replies["r1"].grants] == [tickets["r1"]]
        assert kept.member_of(tickets["r1"]) == "d"
        # With a free, the conversation's next request, through a pool of
        # both groups, waits for d still: its latest member.
        kept.send(SetPool("all", ("a", "b", "c", "d")))
        kept.send(Release(tickets["p1"]))
        assert kept.policy.member_statistics()["a"].in_flight == 0
        later = RecordingReply()
        next_call = kept.ticket(9.0)
        kept.send(ForMember("all", Acquire(next_call, later, "x")))
        assert later.grants == []
        assert kept.policy.waiters() == [next_call]
        kept.send(Release(tickets["r1"]))
        assert kept.member_of(next_call) == "d"
        nursery.cancel_scope.cancel()
    assert all(reply.errors == [] for reply in replies.values())
