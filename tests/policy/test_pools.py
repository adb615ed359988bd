"""Pools in the pure core: one queue in turn order over several members."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_dispatch import Budget, QueueFull, Tenant
from trio_dispatch.lowlevel import GroupState, SlotPolicy, Throttle, Ticket


def t(rank: float, seq: int, model: str | None = None) -> Ticket:
    return Ticket(rank, seq, 0, None, model)


def pool(
    a: int | None = 1,
    b: int | None = 1,
    *,
    affinity_wait: float = 2.0,
    **options: object,
) -> SlotPolicy:
    policy = SlotPolicy(a, provider="a", affinity_wait=affinity_wait, **options)  # type: ignore[arg-type]
    assert policy.add_member("b", b) == []
    return policy


def test_a_grant_goes_to_whichever_member_has_a_slot() -> None:
    policy = pool()
    assert policy.acquire(t(5, 0)) == [t(5, 0)]
    assert policy.acquire(t(6, 1)) == [t(6, 1)]
    assert (policy.member_of(t(5, 0)), policy.member_of(t(6, 1))) == ("a", "b")
    assert policy.acquire(t(7, 2)) == []
    assert policy.statistics().limit == 2
    assert policy.members == ["a", "b"]


def test_the_oldest_turn_goes_first_across_members() -> None:
    policy = pool()
    policy.acquire(t(0, 0))
    policy.acquire(t(0, 1))
    for ticket in [t(7, 2), t(3, 3), t(9, 4), t(1, 5)]:
        assert policy.acquire(ticket) == []
    # Whichever member frees its slot, the oldest waiting turn takes it.
    assert policy.release(t(0, 1)) == [t(1, 5)]
    assert policy.member_of(t(1, 5)) == "b"
    assert policy.release(t(0, 0)) == [t(3, 3)]
    assert policy.member_of(t(3, 3)) == "a"
    assert policy.release(t(1, 5)) == [t(7, 2)]
    assert policy.waiters() == [t(9, 4)]


def test_the_member_with_the_most_free_slots_is_chosen_ties_in_order() -> None:
    policy = pool(2, 3)
    grants = [policy.acquire(t(i, i))[0] for i in range(5)]
    assert [policy.member_of(ticket) for ticket in grants] == ["b", "a", "b", "a", "b"]
    statistics = policy.member_statistics()
    assert (statistics["a"].in_flight, statistics["b"].in_flight) == (2, 3)
    assert (statistics["a"].peak_in_flight, statistics["b"].peak_in_flight) == (2, 3)


def test_an_unlimited_member_takes_what_the_others_cannot() -> None:
    policy = pool(1, None)
    for i in range(4):
        assert policy.acquire(t(i, i)) == [t(i, i)]
    assert policy.member_statistics()["b"].in_flight == 4
    assert policy.limit is None


def test_a_request_for_one_member_waits_for_it_in_turn_order() -> None:
    policy = pool()
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="b")
    # The oldest asks for a alone; the younger one for any member.
    assert policy.acquire(t(1, 2), member="a") == []
    assert policy.acquire(t(2, 3)) == []
    assert policy.acquire(t(3, 4), member="b") == []
    # b frees a slot: a's request does not hold up the pool's.
    assert policy.release(t(0, 1)) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "b"
    # a frees one: its own request, the oldest, takes it.
    assert policy.release(t(0, 0)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "a"
    assert policy.release(t(2, 3)) == [t(3, 4)]
    assert policy.member_statistics()["b"].waiting == 0


def test_a_direct_request_takes_its_place_before_younger_pool_requests() -> None:
    policy = pool()
    policy.acquire(t(0, 0))
    policy.acquire(t(0, 1))
    policy.acquire(t(5, 2))
    policy.acquire(t(1, 3), member="a")
    assert policy.member_statistics()["a"].waiting == 1
    # a's slot goes to the older direct request, not the pool's younger one.
    assert policy.release(t(0, 0)) == [t(1, 3)]
    assert policy.waiters() == [t(5, 2)]


def test_a_paused_member_is_passed_over_and_its_pause_is_its_own() -> None:
    policy = pool(2, 2)
    policy.report_rate_limit(0.0, 10.0, member="b")
    assert policy.member_statistics()["b"].paused_until == 10.0
    assert policy.paused_until is None  # a still grants
    # No call waits for b's pause while a has a slot.
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.acquire(t(1, 1)) == [t(1, 1)]
    assert {policy.member_of(t(0, 0)), policy.member_of(t(1, 1))} == {"a"}
    assert policy.acquire(t(2, 2)) == []
    policy.report_rate_limit(0.0, 20.0, member="a")
    # Every member is paused: the pool is, until the first pause ends.
    assert policy.statistics().paused_until == 10.0
    assert policy.wake_at == 10.0
    assert policy.tick(10.0) == [t(2, 2)]
    assert policy.member_of(t(2, 2)) == "b"


def test_every_request_waits_while_every_member_is_paused() -> None:
    policy = pool()
    policy.report_rate_limit(0.0, 10.0, member="a")
    policy.report_rate_limit(0.0, 4.0, member="b")
    assert policy.acquire(t(0, 0)) == []
    assert policy.acquire(t(1, 1)) == []
    assert policy.wake_at == 4.0
    assert policy.tick(4.0) == [t(0, 0)]
    assert policy.member_of(t(0, 0)) == "b"
    assert policy.wake_at == 10.0
    assert policy.tick(10.0) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "a"


def test_each_member_keeps_its_own_limit() -> None:
    policy = pool()
    policy.acquire(t(0, 0))
    policy.acquire(t(0, 1))
    policy.acquire(t(1, 2))
    policy.acquire(t(2, 3))
    assert policy.set_limit(2, member="b") == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"
    assert policy.member_statistics()["b"].limit == 2
    assert policy.set_limit(2) == [t(2, 3)]  # the first member: a
    assert policy.member_of(t(2, 3)) == "a"
    assert policy.statistics().limit == 4


def test_each_member_keeps_its_own_budget() -> None:
    policy = pool(4, 4)
    policy.set_model_budget("m", Budget(requests_per_minute=1), member="a")
    policy.advance(0.0)
    assert policy.acquire(t(0, 0, "m")) == [t(0, 0, "m")]
    assert policy.acquire(t(1, 1, "m")) == [t(1, 1, "m")]
    # The model's budget is a's alone: b has none and takes the rest.
    assert policy.acquire(t(2, 2, "m")) == [t(2, 2, "m")]
    assert [policy.member_of(t(i, i, "m")) for i in range(3)] == ["a", "b", "b"]
    assert "m" in policy.model_budget_statistics(member="a")
    assert policy.model_budget_statistics(member="b") == {}


def test_a_members_budget_holding_its_head_back_does_not_stop_the_other() -> None:
    throttle = Throttle(Budget(requests_per_minute=1))
    policy = SlotPolicy(4, provider="a", throttle=throttle)
    policy.add_member("b", 1)
    policy.advance(0.0)
    assert policy.acquire(t(0, 0)) == [t(0, 0)]  # on a (4 free)
    assert policy.acquire(t(1, 1)) == [t(1, 1)]  # a's budget is out: b
    assert policy.member_of(t(1, 1)) == "b"
    assert policy.acquire(t(2, 2)) == []
    assert policy.wake_at == 60.0  # a's budget holds one more request then
    assert policy.tick(60.0) == [t(2, 2)]
    assert policy.member_of(t(2, 2)) == "a"


def test_a_preferred_member_is_waited_for_at_most_affinity_wait() -> None:
    policy = pool(affinity_wait=2.0)
    policy.acquire(t(0, 0))  # on a
    assert policy.acquire(t(1, 1), prefer="a") == []  # b is free, but it waits
    assert policy.member_statistics()["a"].waiting == 1
    assert policy.wake_at == 2.0
    assert policy.tick(1.0) == []
    assert policy.tick(2.0) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "b"
    statistics = policy.member_statistics()["a"]
    assert (statistics.affinity_hits, statistics.affinity_moves) == (0, 1)


def test_a_preferred_member_that_frees_in_time_takes_its_conversation() -> None:
    policy = pool(affinity_wait=2.0)
    policy.acquire(t(0, 0))  # on a
    policy.acquire(t(0, 1))  # on b
    policy.acquire(t(1, 2), prefer="a")
    policy.acquire(t(2, 3))
    policy.advance(0.5)
    # b frees first: the pool's request takes it, the preferring one waits.
    assert policy.release(t(0, 1)) == [t(2, 3)]
    assert policy.release(t(0, 0)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "a"
    assert policy.member_statistics()["a"].affinity_hits == 1
    assert policy.wake_at is None  # its expiry is gone with it


def test_a_request_whose_preference_ran_out_still_prefers_its_member() -> None:
    policy = pool(2, 2, affinity_wait=1.0)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="a")
    policy.acquire(t(0, 2), member="b")
    policy.acquire(t(0, 3), member="b")
    policy.acquire(t(1, 4), prefer="a")
    assert policy.tick(1.0) == []  # nobody has room: it waits for any
    assert policy.member_statistics()["a"].waiting == 0
    assert policy.release(t(0, 2)) == [t(1, 4)]  # b's slot: it takes it
    assert policy.member_of(t(1, 4)) == "b"


def test_a_preference_goes_at_once_to_its_free_member() -> None:
    policy = pool(2, 2)
    policy.acquire(t(0, 0))  # b: both have 2 free, a first... then b
    assert policy.member_of(t(0, 0)) == "a"
    assert policy.acquire(t(1, 1), prefer="a") == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "a"  # though b has more free slots


def test_affinity_wait_zero_or_one_member_ignores_preferences() -> None:
    policy = pool(affinity_wait=0.0)
    policy.acquire(t(0, 0))
    assert policy.acquire(t(1, 1), prefer="a") == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "b"
    alone = SlotPolicy(1, provider="a")
    alone.acquire(t(0, 0))
    assert alone.acquire(t(1, 1), prefer="a") == []
    assert alone.wake_at is None
    assert alone.release(t(0, 0)) == [t(1, 1)]


def test_a_preference_for_no_member_changes_nothing() -> None:
    policy = pool()
    policy.acquire(t(0, 0))
    assert policy.acquire(t(1, 1), prefer="c") == [t(1, 1)]


def test_a_member_added_takes_the_waiting_requests_in_order() -> None:
    policy = SlotPolicy(1, provider="a")
    policy.acquire(t(0, 0))
    for ticket in [t(3, 1), t(1, 2), t(2, 3)]:
        policy.acquire(ticket)
    assert policy.add_member("b", 2) == [t(1, 2), t(2, 3)]
    assert [policy.member_of(t(1, 2)), policy.member_of(t(2, 3))] == ["b", "b"]
    assert policy.waiters() == [t(3, 1)]


def test_a_member_removed_lets_its_holders_finish_and_fails_its_own_requests() -> None:
    policy = pool(affinity_wait=5.0)
    policy.acquire(t(0, 0))  # a
    policy.acquire(t(0, 1))  # b
    policy.acquire(t(1, 2), member="b")
    policy.acquire(t(2, 3), prefer="b")
    policy.acquire(t(3, 4))
    grants, orphans = policy.remove_member("b")
    assert (grants, orphans) == ([], [t(1, 2)])
    assert policy.members == ["a"]
    assert policy.statistics().rejected_total == 1
    # The one that preferred b waits for any member now, in its place.
    assert policy.waiters() == [t(2, 3), t(3, 4)]
    # b's holder gives its slot back: nobody may take it (b is gone).
    assert policy.release(t(0, 1)) == []
    assert policy.member_of(t(0, 1)) is None
    assert policy.release(t(0, 0)) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "a"


def test_the_first_member_removed_the_next_is_the_default() -> None:
    policy = pool(1, 3)
    policy.remove_member("a")
    assert policy.limit == 3
    assert policy.set_limit(1) == []
    assert policy.member_statistics()["b"].limit == 1


def test_members_are_checked() -> None:
    policy = pool()
    with pytest.raises(ValueError, match=r"^'b' is a member already$"):
        policy.add_member("b", 1)
    with pytest.raises(ValueError, match=r"^no member 'c' in this policy$"):
        policy.acquire(t(0, 0), member="c")
    with pytest.raises(ValueError, match=r"^no member 'c' in this policy$"):
        policy.set_limit(2, member="c")
    with pytest.raises(ValueError, match=r"^limit must be a positive integer, got 0$"):
        policy.add_member("c", 0)
    policy.remove_member("b")
    with pytest.raises(ValueError, match=r"^'a' is the last member$"):
        policy.remove_member("a")
    assert policy.waiting == 0  # nothing refused was queued


def test_a_full_queue_refuses_a_member_request_nobody_can_take() -> None:
    policy = pool(max_waiting=1)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(1, 1), member="a")
    with pytest.raises(QueueFull):
        policy.acquire(t(2, 2), member="a")
    # One b can take still goes.
    assert policy.acquire(t(3, 3)) == [t(3, 3)]


def test_a_tenants_cap_is_over_the_whole_pool() -> None:
    policy = pool(2, 2, tenants={"x": Tenant(limit=2)})
    for i in range(3):
        policy.acquire(Ticket(i, i, 0, "x"))
    assert policy.in_flight == 2
    assert policy.acquire(Ticket(5, 5, 0, "y")) == [Ticket(5, 5, 0, "y")]


class _Health:
    """A member's health in the reference: its failures in a row, cooldown, probe."""

    def __init__(self) -> None:
        self.failures = 0
        self.out_until: float | None = None
        self.half_open = False
        self.probe: Ticket | None = None
        self.outages = 0

    def row(self) -> tuple[int, float | None, bool, int]:
        return self.failures, self.out_until, self.half_open, self.outages


class _Reference:
    """The pool rule by brute force: the oldest ticket some member with room may take.

    With members' health: a member out of service has no room; a half-open
    one has room for one ticket, its probe, while none holds.
    """

    def __init__(
        self, affinity_wait: float, failure_threshold: int, failure_cooldown: float
    ) -> None:
        self.affinity_wait = affinity_wait
        self.failure_threshold = failure_threshold
        self.failure_cooldown = failure_cooldown
        self.now = 0.0
        self.limits: dict[str, int | None] = {"a": 1}
        self.paused: dict[str, float | None] = {"a": None}
        self.held: dict[str, set[Ticket]] = {"a": set()}
        self.health: dict[str, _Health] = {"a": _Health()}
        self.holder_of: dict[Ticket, str] = {}
        # The holders of members removed: their end touches no member.
        self.orphans: set[Ticket] = set()
        self.pools: dict[str, list[str]] = {}
        # ticket: [member or pool asked for (None: any), member preferred
        # (None: none that counts), when it was queued, whether it waits
        # for the preferred member alone still, the members it avoids
        # (None: none that count)]
        self.waiting: dict[Ticket, list[object]] = {}

    def room(self, name: str) -> bool:
        health = self.health[name]
        if health.out_until is not None or (
            health.half_open and health.probe is not None
        ):
            return False
        limit = self.limits[name]
        if limit is None:
            return True
        return self.paused[name] is None and len(self.held[name]) < limit

    def waits_for(self, name: str) -> bool:
        """Whether a ticket that prefers ``name`` waits for it: in service, not paused."""
        health = self.health[name]
        return (
            self.paused[name] is None
            and health.out_until is None
            and not health.half_open
        )

    def choices(self, asked: str | None) -> list[str]:
        if asked is None:
            return list(self.limits)
        return list(self.pools.get(asked, [asked]))

    def candidates(self, ticket: Ticket) -> list[str]:
        asked, prefer, queued_at, alone, avoided = self.waiting[ticket]
        assert asked is None or isinstance(asked, str)
        assert isinstance(queued_at, float)
        assert avoided is None or isinstance(avoided, frozenset)
        if asked is not None and asked not in self.pools:
            return [asked]
        if alone and self.now < queued_at + self.affinity_wait:
            return [prefer]  # type: ignore[list-item]
        choices = self.choices(asked)
        if avoided is not None:
            # The pool's members now, but those avoided, unless none is left.
            kept = [name for name in choices if name not in avoided]
            if kept:
                choices = kept
        free = {
            name: float("inf")
            if self.limits[name] is None
            else self.limits[name] - len(self.held[name])  # type: ignore[operator]
            for name in choices
        }
        # A half-open member awaiting its probe first, then the most free slots.
        awaiting = {
            name
            for name in choices
            if self.health[name].half_open and self.health[name].probe is None
        }
        ordered = sorted(
            choices,
            key=lambda name: -float("inf") if name in awaiting else -free[name],
        )
        if isinstance(prefer, str) and prefer in free:
            ordered.remove(prefer)
            ordered.insert(0, prefer)
        return ordered

    def end_cooldowns(self) -> None:
        """The cooldowns that ran out by now end: those members are half-open, for their probe."""
        for health in self.health.values():
            if health.out_until is not None and self.now >= health.out_until:
                health.out_until = None
                health.half_open = True

    def fill(self) -> list[tuple[Ticket, str]]:
        grants: list[tuple[Ticket, str]] = []
        while True:
            chosen = None
            for ticket in sorted(self.waiting):
                for name in self.candidates(ticket):
                    if self.room(name):
                        chosen = ticket, name
                        break
                if chosen is not None:
                    break
            if chosen is None:
                return grants
            ticket, name = chosen
            del self.waiting[ticket]
            self.held[name].add(ticket)
            self.holder_of[ticket] = name
            if self.health[name].half_open:
                self.health[name].probe = ticket
            grants.append(chosen)

    def finish(self, ticket: Ticket, outcome: str) -> None:
        """Held ``ticket`` ends: ``"release"`` (a success), ``"fail"`` or ``"cancel"``."""
        name = self.holder_of.pop(ticket)
        if ticket in self.orphans:
            self.orphans.remove(ticket)
            return
        self.held[name].remove(ticket)
        health = self.health[name]
        if outcome == "release":
            health.failures = 0
            if health.probe == ticket:
                health.half_open = False  # back in service
        elif outcome == "fail":
            if health.half_open:
                if health.probe == ticket:
                    self.go_out(name)
            elif health.out_until is None:
                health.failures += 1
                # A member alone is never taken out: nowhere else to go.
                if health.failures >= self.failure_threshold and len(self.limits) > 1:
                    self.go_out(name)
        if health.probe == ticket:
            health.probe = None

    def go_out(self, name: str) -> None:
        health = self.health[name]
        health.out_until = self.now + self.failure_cooldown
        health.half_open = False
        health.outages += 1
        self.stop_waiting_alone(name)

    def stop_waiting_alone(self, stops: object) -> None:
        for entry in self.waiting.values():
            if entry[3] and entry[1] == stops:
                entry[3] = False


_names = st.sampled_from(["a", "b", "c", "d"])
_pools = st.sampled_from(["p", "q"])
_limits = st.one_of(st.none(), st.integers(1, 3))
_avoid = st.one_of(
    st.just(frozenset[str]()),
    st.frozensets(st.sampled_from(["a", "b", "c", "d", "zz"]), min_size=1, max_size=3),
)

#: The machine's health settings: a short row of failures and cooldown, so
#: that outages, probes and their ends come often.
_THRESHOLD = 2
_COOLDOWN = 2.0


class PoolMachine(RuleBasedStateMachine):
    """The pool policy against the brute-force rule, on random operations.

    Members fail too: a holder's call fails (``fail``), a member's calls
    fail in a row until it is out of service, a half-open member's probe
    succeeds, fails or is withdrawn; ticks end cooldowns; fallbacks
    ``avoid`` members.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seq = 0
        self.policy = SlotPolicy(
            1,
            provider="a",
            affinity_wait=2.0,
            failure_threshold=_THRESHOLD,
            failure_cooldown=_COOLDOWN,
        )
        self.model = _Reference(2.0, _THRESHOLD, _COOLDOWN)
        self.limits_lowered: set[str] = set()
        # Each holder's member's service when it was granted, as the policy
        # said after the grant: (member, "out" / "half_open" / "in", the
        # member's outages then, which tell its half-open spells apart).
        self.granted_in: dict[Ticket, tuple[str, str, int]] = {}

    def expect(self, grants: list[Ticket], expected: list[tuple[Ticket, str]]) -> None:
        policy = self.policy
        statistics = policy.member_statistics()
        for ticket in grants:
            name = policy.member_of(ticket)
            assert name is not None
            state = statistics[name]
            if state.out_of_service_until is not None:
                service = "out"
            elif state.half_open:
                service = "half_open"
            else:
                service = "in"
            self.granted_in[ticket] = name, service, state.outages_total
        assert [(ticket, policy.member_of(ticket)) for ticket in grants] == expected

    def due(self) -> bool:
        """Whether the policy asks for a tick now (the actor's, at its batch's end)."""
        wake_at = self.policy.wake_at
        return wake_at is not None and wake_at <= self.model.now

    def expect_or_defer(self, grants: list[Ticket], due: bool) -> None:
        """``expect``, for a call that frees no slot, made while a tick was ``due``.

        Such a call need not fill: what the waits for preferred members that
        ran out let through goes at the tick that is due (the actor's, at the
        end of the batch it handles). The reference fills at the next call
        that fills.
        """
        if due and not grants:
            return
        self.expect(grants, self.model.fill())

    @initialize(
        limit=st.sampled_from([0, None, 1, 2, 3]),
        limit_a=st.sampled_from([1, 2, None]),
        outage=st.booleans(),
    )
    def start(self, limit: int | None, limit_a: int | None, outage: bool) -> None:
        """a's limit; a second member, b (``0``: none); a out of service, or not.

        An outage at the start, with a ticket waiting for a alone, makes
        half-open members and their probes common, from a tick of 2 seconds
        on; and a ticket that preferred a moves when it goes out.
        """
        if limit_a != 1:
            self.set_limit("a", limit_a)
        if limit == 0:
            return
        self.add_member("b", limit)
        if not outage:
            return
        # a's calls fail but the last of its row; a takes one call more.
        for _ in range(_THRESHOLD):
            self.acquire([0], "member", None, "a", frozenset())
        held = [Ticket(0.0, seq) for seq in range(1, self.seq + 1)]
        for ticket in held[:-1]:
            self.finish(ticket, "fail")
        # One prefers a (it waits for it if a is full and b is not), one
        # asks for a alone (its probe, once its cooldown ends).
        self.acquire([0], "any", "a", "a", frozenset())
        self.acquire([0], "member", None, "a", frozenset())
        # The last of the row: a is out, the one that preferred it goes to
        # b at once if b has room.
        self.finish(held[-1], "fail")
        assert self.model.health["a"].out_until == _COOLDOWN

    @rule(
        ranks=st.lists(st.integers(0, 5), min_size=1, max_size=3),
        asked=st.sampled_from(["any", "member", "p", "q"]),
        prefer=st.one_of(st.none(), _names, st.just("zz")),
        name=_names,
        avoid=_avoid,
    )
    def acquire(
        self,
        ranks: list[int],
        asked: str,
        prefer: str | None,
        name: str,
        avoid: frozenset[str],
    ) -> None:
        """A few tickets alike arrive, one after the other."""
        model = self.model
        if asked == "member":
            target: str | None = name if name in model.limits else "a"
            if target not in model.limits:
                target = next(iter(model.limits))
        elif asked == "any":
            target = None
        else:
            target = asked if asked in model.pools else None
        choices = model.choices(target)
        several = target is None or target in model.pools
        # What it avoids counts in its pool, if some member is left to it.
        avoided = frozenset(avoid) & set(choices) if several else frozenset()
        if not avoided or len(avoided) == len(choices):
            avoided = frozenset()
        kept = [each for each in choices if each not in avoided]
        counts = several and len(kept) > 1 and prefer in kept
        for rank in ranks:
            self.seq += 1
            ticket = Ticket(float(rank), self.seq)
            grants = self.policy.acquire(
                ticket, member=target, prefer=prefer, avoid=sorted(avoid)
            )
            # A paused, out of service or half-open member is preferred
            # (tried first) but not waited for; an avoided one is not
            # preferred.
            model.waiting[ticket] = [
                target,
                prefer if counts else None,
                model.now,
                counts and model.waits_for(prefer),  # type: ignore[arg-type]  # counts: a member
                avoided or None,
            ]
            self.expect(grants, model.fill())

    def finish(self, ticket: Ticket, outcome: str) -> None:
        """Held ``ticket`` ends: ``"release"`` (a success), ``"fail"`` (now) or ``"cancel"``."""
        self.model.finish(ticket, outcome)
        # Told with an equal ticket, another object: the policy knows
        # tickets by value, as a sender that rebuilds them tells them.
        told = Ticket(*ticket)
        if outcome == "release":
            grants = self.policy.release(told)
        elif outcome == "fail":
            grants = self.policy.fail(told, self.model.now)
        else:
            grants = self.policy.cancel(told)
        self.expect(grants, self.model.fill())

    @precondition(lambda self: self.model.holder_of)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.finish(data.draw(st.sampled_from(sorted(self.model.holder_of))), "release")

    @precondition(lambda self: self.model.holder_of)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        """A holder's call fails before its answer, now."""
        self.finish(data.draw(st.sampled_from(sorted(self.model.holder_of))), "fail")

    @precondition(lambda self: self.model.holder_of)
    @rule(data=st.data())
    def fail_member(self, data: st.DataObject) -> None:
        """A member's calls fail one after the other, oldest first: its server is down.

        Those it is granted meanwhile fail too, up to four calls in all.
        """
        model = self.model
        name = data.draw(st.sampled_from(sorted(set(model.holder_of.values()))))
        for _ in range(4):
            held = model.held.get(name)
            if not held:
                break
            self.finish(min(held), "fail")

    @precondition(
        lambda self: any(
            health.probe is not None for health in self.model.health.values()
        )
    )
    @rule(data=st.data(), outcome=st.sampled_from(["release", "fail", "cancel"]))
    def end_probe(self, data: st.DataObject, outcome: str) -> None:
        """A half-open member's probe ends: it succeeds, fails or is withdrawn."""
        probes = sorted(
            health.probe
            for health in self.model.health.values()
            if health.probe is not None
        )
        self.finish(data.draw(st.sampled_from(probes)), outcome)

    @precondition(lambda self: self.model.holder_of)
    @rule(data=st.data())
    def cancel_holder(self, data: st.DataObject) -> None:
        """A grant that raced its cancellation: no success, no failure."""
        self.finish(data.draw(st.sampled_from(sorted(self.model.holder_of))), "cancel")

    @precondition(lambda self: self.model.waiting)
    @rule(data=st.data())
    def cancel_waiting(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.model.waiting)))
        due = self.due()
        del self.model.waiting[ticket]
        self.expect_or_defer(self.policy.cancel(ticket), due)

    @precondition(lambda self: self.model.waiting)
    @rule(data=st.data())
    def fail_waiting(self, data: st.DataObject) -> None:
        """Misuse: a waiting ticket cannot fail; nothing changes."""
        ticket = data.draw(st.sampled_from(sorted(self.model.waiting)))
        with pytest.raises(RuntimeError, match=r"is waiting, not holding a slot$"):
            self.policy.fail(ticket, self.model.now)

    @rule(name=_names, seconds=st.integers(1, 4))
    def pause(self, name: str, seconds: int) -> None:
        if name not in self.model.limits:
            return
        until = self.model.now + seconds
        due = self.due()
        grants = self.policy.pause(until, member=name)
        paused = self.model.paused[name]
        self.model.paused[name] = until if paused is None else max(paused, until)
        # Who waited for it alone waits for any member of its pool now.
        self.model.stop_waiting_alone(name)
        self.expect_or_defer(grants, due)

    @rule(name=_names)
    def resume(self, name: str) -> None:
        if name not in self.model.limits:
            return
        self.model.paused[name] = None
        self.expect(self.policy.resume(member=name), self.model.fill())

    @rule(name=_names, limit=_limits)
    def set_limit(self, name: str, limit: int | None) -> None:
        if name not in self.model.limits:
            return
        old = self.model.limits[name]
        if limit is not None and (old is None or limit < old):
            self.limits_lowered.add(name)
        self.model.limits[name] = limit
        self.expect(self.policy.set_limit(limit, member=name), self.model.fill())

    @rule(name=_names, limit=_limits)
    def add_member(self, name: str, limit: int | None) -> None:
        if name in self.model.limits:
            return
        self.model.limits[name] = limit
        self.model.paused[name] = None
        self.model.held[name] = set()
        self.model.health[name] = _Health()
        self.expect(self.policy.add_member(name, limit), self.model.fill())

    @rule(
        name=_names,
        limit=st.sampled_from([None, 1, 2]),
        ranks=st.lists(st.integers(0, 5), max_size=4),
        paused=st.booleans(),
    )
    def join_member(
        self, name: str, limit: int | None, ranks: list[int], paused: bool
    ) -> None:
        """A provider scheduled on its own joins, with its holders, waiters and pause."""
        model = self.model
        if name in model.limits:
            return
        own = SlotPolicy(limit, provider=name, now=model.now)
        for rank in ranks:
            self.seq += 1
            own.acquire(Ticket(float(rank), self.seq))
        if paused:
            own.pause(model.now + 2.0)
        state = own.member_state()
        grants = self.policy.add_member(
            name, limit, carried=state, waiting=state.waiting
        )
        model.limits[name] = limit
        model.paused[name] = model.now + 2.0 if paused else None
        model.held[name] = set(state.holders)
        model.health[name] = _Health()
        for ticket in state.holders:
            model.holder_of[ticket] = name
            self.granted_in[ticket] = name, "in", 0
        for ticket, _ in state.waiting:
            model.waiting[ticket] = [name, None, model.now, False, None]
        self.expect(grants, model.fill())

    @rule(
        names=st.lists(_names, min_size=1, max_size=2, unique=True),
        limit=st.sampled_from([None, 1, 1, 2]),
        asks=st.lists(
            st.tuples(
                st.integers(0, 5), st.sampled_from(["r", "r", "first"]), st.booleans()
            ),
            max_size=6,
        ),
        paused=st.booleans(),
    )
    def merge_group(
        self,
        names: list[str],
        limit: int | None,
        asks: list[tuple[int, str, bool]],
        paused: bool,
    ) -> None:
        """A group scheduled apart joins this one: its members, its pool, its queue.

        Its members with their holders and pause, its pool ``r``, and its
        waiting tickets in their lanes and their place: some wait for the
        member they prefer, as long as they would have there.
        """
        model = self.model
        if "r" in model.pools or any(name in model.limits for name in names):
            return
        first = names[0]
        other = SlotPolicy(
            limit,
            provider=first,
            affinity_wait=2.0,
            failure_threshold=_THRESHOLD,
            failure_cooldown=_COOLDOWN,
            now=model.now,
        )
        for name in names[1:]:
            other.add_member(name, limit)
        other.set_pool("r", names)
        if paused:
            other.pause(model.now + 2.0, member=first)
        entries: dict[Ticket, list[object]] = {}
        for rank, asked, prefers in asks:
            self.seq += 1
            ticket = Ticket(float(rank), self.seq)
            target = "r" if asked == "r" else first
            prefer = names[-1] if prefers else None
            other.acquire(ticket, member=target, prefer=prefer)
            counts = target == "r" and len(names) > 1 and prefer is not None
            waits_alone = counts and not (paused and prefer == first)
            entries[ticket] = [
                target,
                prefer if counts else None,
                model.now,
                waits_alone,
                None,
            ]
        state = other.group_state()
        grants = self.policy.merge(state, dict.fromkeys(names, limit))
        for name, carried in state.members:
            model.limits[name] = limit
            model.paused[name] = carried.paused_until
            model.held[name] = set(carried.holders)
            model.health[name] = _Health()
            for ticket in carried.holders:
                model.holder_of[ticket] = name
                self.granted_in[ticket] = name, "in", 0
        model.pools["r"] = list(names)
        for ticket in other.waiters():
            model.waiting[ticket] = entries[ticket]
        self.expect(grants, model.fill())

    @rule(name=_names)
    def remove_member(self, name: str) -> None:
        model = self.model
        if name not in model.limits or len(model.limits) == 1:
            return
        if any(members == [name] for members in model.pools.values()):
            with pytest.raises(ValueError, match="is the last member of pool"):
                self.policy.remove_member(name)
            return
        grants, orphans = self.policy.remove_member(name)
        model.stop_waiting_alone(name)
        expected = sorted(t for t, entry in model.waiting.items() if entry[0] == name)
        for ticket in expected:
            del model.waiting[ticket]
        for members in model.pools.values():
            if name in members:
                members.remove(name)
        model.orphans |= model.held[name]
        for ticket in model.held[name]:
            # A member of that name added again is another member.
            self.granted_in.pop(ticket, None)
        del model.limits[name], model.paused[name], model.held[name]
        del model.health[name]
        if len(model.limits) == 1:
            # A member left alone is never out of service: back in at once.
            (alone,) = model.health.values()
            alone.out_until, alone.half_open, alone.probe = None, False, None
        self.limits_lowered.discard(name)
        assert sorted(orphans) == expected
        self.expect(grants, model.fill())

    @rule(pool=_pools, names=st.lists(_names, min_size=1, max_size=4, unique=True))
    def set_pool(self, pool: str, names: list[str]) -> None:
        model = self.model
        members = [name for name in names if name in model.limits]
        if not members:
            return
        grants = self.policy.set_pool(pool, members)
        model.pools[pool] = members
        for entry in model.waiting.values():
            if entry[0] == pool and entry[3] and entry[1] not in members:
                entry[3] = False
        self.expect(grants, model.fill())

    @rule(pool=_pools)
    def remove_pool(self, pool: str) -> None:
        model = self.model
        if pool not in model.pools:
            with pytest.raises(ValueError, match=r"^no pool '[pq]' in this policy$"):
                self.policy.remove_pool(pool)
            return
        due = self.due()
        grants, orphans = self.policy.remove_pool(pool)
        del model.pools[pool]
        expected = sorted(t for t, entry in model.waiting.items() if entry[0] == pool)
        for ticket in expected:
            del model.waiting[ticket]
        assert sorted(orphans) == expected
        self.expect_or_defer(grants, due)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    def advance(self, seconds: float) -> None:
        """Time passes, told without a tick (as before a message is handled).

        A cooldown that ran out ends (half-open) with the time told; what
        waits is granted at the next fill (an operation's, or a tick's).
        """
        self.model.now += seconds
        self.model.end_cooldowns()
        self.policy.advance(self.model.now)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    def tick(self, seconds: float) -> None:
        model = self.model
        model.now += seconds
        for name, until in model.paused.items():
            if until is not None and model.now >= until:
                model.paused[name] = None
        model.end_cooldowns()
        self.expect(self.policy.tick(model.now), model.fill())

    @invariant()
    def agree(self) -> None:
        policy, model = self.policy, self.model
        assert policy.members == list(model.limits)
        assert policy.pools == model.pools
        assert set(policy.waiters()) == set(model.waiting)
        assert {t: policy.member_of(t) for t in model.holder_of} == model.holder_of
        statistics = policy.member_statistics()
        for name, limit in model.limits.items():
            held = len(model.held[name])
            assert statistics[name].in_flight == held
            if limit is not None and name not in self.limits_lowered:
                assert held <= limit
            state = statistics[name]
            assert (
                state.failures,
                state.out_of_service_until,
                state.half_open,
                state.outages_total,
            ) == model.health[name].row()
        # Work-conserving: nobody waits whom a member with room may take,
        # but while a tick is due (a wait for a preferred member ended, a
        # pause or a cooldown ran out).
        wake_at = policy.wake_at
        if wake_at is None or wake_at > model.now:
            for ticket in model.waiting:
                assert not any(model.room(name) for name in model.candidates(ticket))

    @invariant()
    def wakes_for_what_waits(self) -> None:
        model = self.model
        wake_at = self.policy.wake_at
        ends = [until for until in model.paused.values() if until is not None]
        ends += [
            entry[2] + 2.0  # type: ignore[operator]
            for entry in model.waiting.values()
            if entry[3] and model.now < entry[2] + 2.0  # type: ignore[operator]
        ]
        ends += [
            health.out_until
            for health in model.health.values()
            if health.out_until is not None
        ]
        if ends:
            assert wake_at is not None
            # Due now (a tick is asked for at once) covers every end.
            assert wake_at <= min(ends) or wake_at <= model.now

    @invariant()
    def out_of_service_members_take_nothing_half_open_ones_one(self) -> None:
        """No holder was granted on a member out of service.

        A half-open member holds at most one slot granted since it became
        half-open: its probe.
        """
        policy = self.policy
        holders = policy.holders()
        statistics = policy.member_statistics()
        probes: dict[str, int] = {}
        for ticket, (name, service, outages) in self.granted_in.items():
            if ticket not in holders:
                continue
            assert service != "out", (ticket, name)
            state = statistics.get(name)
            if (
                service == "half_open"
                and state is not None
                and state.half_open
                and state.outages_total == outages
            ):
                probes[name] = probes.get(name, 0) + 1
        assert all(count <= 1 for count in probes.values()), probes


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)


def named_pool(*limits: int | None) -> SlotPolicy:
    policy = SlotPolicy(limits[0], provider="m0", affinity_wait=2.0)
    for i, limit in enumerate(limits[1:], 1):
        policy.add_member(f"m{i}", limit)
    return policy


def test_a_named_pool_grants_on_its_members_only() -> None:
    policy = named_pool(1, 1, 1)
    policy.set_pool("p", ["m1", "m2"])
    assert policy.pools == {"p": ["m1", "m2"]}
    assert policy.acquire(t(0, 0), member="p") == [t(0, 0)]
    assert policy.acquire(t(1, 1), member="p") == [t(1, 1)]
    assert {policy.member_of(t(0, 0)), policy.member_of(t(1, 1))} == {"m1", "m2"}
    # m0 is free, but not in the pool.
    assert policy.acquire(t(2, 2), member="p") == []
    assert policy.acquire(t(3, 3), member="m0") == [t(3, 3)]


def test_two_pools_over_one_member_share_its_slots_in_turn_order() -> None:
    policy = named_pool(1, 1)
    policy.set_pool("gpt-4", ["m0", "m1"])
    policy.set_pool("gpt-5", ["m1"])
    policy.acquire(t(0, 0), member="gpt-4")
    policy.acquire(t(0, 1), member="gpt-4")
    policy.acquire(t(2, 2), member="gpt-4")
    policy.acquire(t(1, 3), member="gpt-5")
    # m1 frees: gpt-5's request is older than gpt-4's, and m1 serves both.
    holder = next(
        ticket for ticket in policy.holders() if policy.member_of(ticket) == "m1"
    )
    assert policy.release(holder) == [t(1, 3)]
    # m0 frees: gpt-5 cannot use it; gpt-4's request can.
    holder = next(
        ticket for ticket in policy.holders() if policy.member_of(ticket) == "m0"
    )
    assert policy.release(holder) == [t(2, 2)]


def test_a_pool_whose_members_change_replaces_its_waiters() -> None:
    policy = named_pool(1, 1, 1)
    policy.set_pool("p", ["m0"])
    policy.acquire(t(0, 0), member="p")
    policy.acquire(t(1, 1), member="p")
    policy.acquire(t(2, 2), member="p")
    assert policy.set_pool("p", ["m0", "m1", "m2"]) == [t(1, 1), t(2, 2)]
    assert policy.set_pool("p", ["m2"]) == []
    assert policy.member_of(t(1, 1)) == "m1"  # holders stay where they are


def test_a_member_leaving_a_pool_releases_the_conversations_waiting_for_it() -> None:
    policy = named_pool(1, 1)
    policy.set_pool("p", ["m0", "m1"])
    policy.acquire(t(0, 0), member="p", prefer="m0")  # m0
    policy.acquire(t(0, 1), member="p", prefer="m1")  # m1
    policy.release(t(0, 1))
    policy.acquire(t(0, 2), member="m1")  # m1 busy again, directly
    assert policy.acquire(t(1, 3), member="p", prefer="m0") == []
    waking = [policy.wake_at]
    # m0 leaves the pool: the request waits for the pool, not for m0.
    policy.set_pool("p", ["m1"])
    waking.append(policy.wake_at)
    assert waking == [2.0, None]
    assert policy.release(t(0, 0)) == []  # m0's slot is not the pool's
    assert policy.release(t(0, 2)) == [t(1, 3)]
    assert policy.member_of(t(1, 3)) == "m1"
    assert policy.member_statistics()["m0"].affinity_moves == 1


def test_a_pool_removed_fails_its_waiters_and_keeps_its_members() -> None:
    policy = named_pool(1, 1)
    policy.set_pool("p", ["m0", "m1"])
    policy.acquire(t(0, 0), member="p")
    policy.acquire(t(0, 1), member="p")
    policy.acquire(t(1, 2), member="p", prefer="m0")
    policy.acquire(t(2, 3), member="p")
    policy.acquire(t(3, 4), member="m1")
    grants, orphans = policy.remove_pool("p")
    assert (grants, sorted(orphans)) == ([], [t(1, 2), t(2, 3)])
    assert policy.members == ["m0", "m1"]
    assert policy.statistics().rejected_total == 2
    assert policy.waiters() == [t(3, 4)]
    assert policy.wake_at is None


def test_pools_are_checked() -> None:
    policy = named_pool(1, 1)
    with pytest.raises(ValueError, match=r"^pool 'm0' has the name of a member$"):
        policy.set_pool("m0", ["m1"])
    with pytest.raises(ValueError, match=r"^pool 'p' must have a member$"):
        policy.set_pool("p", [])
    with pytest.raises(ValueError, match=r"^pool 'p' names a member twice$"):
        policy.set_pool("p", ["m1", "m1"])
    with pytest.raises(ValueError, match=r"^no member 'x' in this policy$"):
        policy.set_pool("p", ["x"])
    with pytest.raises(ValueError, match=r"^no pool 'p' in this policy$"):
        policy.remove_pool("p")
    policy.set_pool("p", ["m1"])
    with pytest.raises(ValueError, match=r"^'m1' is the last member of pool 'p'$"):
        policy.remove_member("m1")
    assert policy.members == ["m0", "m1"]


def test_a_paused_member_is_never_waited_for() -> None:
    policy = pool(affinity_wait=5.0)
    policy.acquire(t(0, 0))  # a
    policy.acquire(t(0, 1))  # b
    policy.acquire(t(1, 2), prefer="a")  # waits for a, up to 5 s
    policy.acquire(t(2, 3), prefer="a")
    assert policy.member_statistics()["a"].waiting == 2
    # a answers 429: nobody waits for it any more; b's slot goes at once to
    # the oldest, when b frees.
    assert policy.report_rate_limit(0.0, 30.0, member="a") == []
    assert policy.member_statistics()["a"].waiting == 0
    assert policy.wake_at == 30.0
    assert policy.release(t(0, 1)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"
    # b frees again: the next oldest goes, and a newcomer that prefers the
    # paused member does not wait for it, but takes b's next slot in turn.
    assert policy.release(t(1, 2)) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "b"
    assert policy.acquire(t(3, 4), prefer="a") == []
    assert policy.member_statistics()["a"].waiting == 0
    assert policy.release(t(2, 3)) == [t(3, 4)]


def test_a_pause_lets_the_waiters_of_the_paused_member_go_elsewhere_at_once() -> None:
    policy = pool(1, 2, affinity_wait=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="b")
    assert policy.acquire(t(1, 2), prefer="a") == []  # b has a free slot
    assert policy.pause(10.0, member="a") == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"
    assert policy.member_statistics()["a"].affinity_moves == 1


def test_removing_a_pool_while_a_budget_holds_a_member_back() -> None:
    # Regression: the refill ran before the pool's waiters were withdrawn,
    # and met a ticket of a pool that was gone.
    throttle = Throttle(Budget(requests_per_minute=1))
    policy = SlotPolicy(4, provider="a", throttle=throttle, affinity_wait=2.0)
    policy.add_member("b", 1)
    policy.set_pool("p", ["a", "b"])
    policy.advance(0.0)
    policy.acquire(t(0, 0))  # on a: its budget is spent
    policy.acquire(t(0, 1))  # on b
    assert policy.acquire(t(1, 2), member="p") == []
    assert policy.remove_pool("p") == ([], [t(1, 2)])
    assert policy.waiting == 0


def test_a_preference_that_ran_out_is_not_honoured_before_the_tick() -> None:
    # Regression: the wait for a preferred member ended only at a tick, so a
    # release handled after it (the run task's tick not come yet) gave the
    # slot to a younger ticket.
    policy = pool(affinity_wait=2.0)
    policy.advance(0.0)
    policy.acquire(t(0, 0))  # a
    policy.acquire(t(0, 1))  # b
    policy.acquire(t(1, 2), prefer="a")
    policy.acquire(t(2, 3))
    policy.advance(5.0)
    assert policy.release(t(0, 1)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"


def test_a_budget_that_held_a_ticket_back_lets_the_next_through_once_it_went_elsewhere() -> (
    None
):
    # Regression: a member whose token budget could not take the oldest
    # ticket stayed closed for the fill after that ticket went to another
    # member, and the younger one that fits waited for the budget's refill.
    throttle = Throttle(Budget(tokens_per_minute=3000))
    policy = SlotPolicy(4, provider="a", throttle=throttle)
    policy.add_member("b", 1)
    policy.advance(0.0)
    policy.acquire(t(0, 0), 2000)  # on a: 1,000 tokens left
    policy.acquire(t(0, 1), member="b")
    assert policy.acquire(t(1, 2), 2500) == []
    assert policy.acquire(t(2, 3), 100) == []
    assert policy.release(t(0, 1)) == [t(1, 2), t(2, 3)]
    assert (policy.member_of(t(1, 2)), policy.member_of(t(2, 3))) == ("b", "a")
    assert policy.wake_at is None


def test_a_member_added_with_model_budgets_counts_the_waiting_once() -> None:
    # Regression: the waiting tickets were counted twice for its models'
    # use, which then never fell to zero (its learned budgets never forgotten).
    policy = SlotPolicy(1, provider="a")
    for i in range(3):
        policy.acquire(Ticket(i, i, 0, None, "m"))
    policy.add_member(
        "b", None, models={"m": Throttle(Budget(requests_per_minute=100))}
    )
    for ticket in list(policy.holders()):
        policy.release(ticket)
    assert policy._members["b"].models._busy == {}  # the count itself


def test_a_member_and_a_pool_never_share_a_name() -> None:
    policy = named_pool(1, 1)
    policy.set_pool("p", ["m0"])
    with pytest.raises(ValueError, match=r"^'p' is a pool's name$"):
        policy.add_member("p", 1)


def test_a_members_state_moves_to_another_policy_whole() -> None:
    # What a member learned, its budgets, adaptive limit, pause and
    # backoff, moves with it: the other policy takes the same throttle on.
    own = SlotPolicy(2, provider="b", throttle=Throttle(Budget(requests_per_minute=60)))
    own.report_rate_limit(0.0)  # a round of the backoff: 1 s
    own.pause(7.0)
    state = own.member_state()
    assert state.throttle is own.throttle
    assert (state.paused_until, state.streak, state.step) == (7.0, 1, 1.0)
    assert not state.granted_since_report
    policy = SlotPolicy(1, provider="a")
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    grants = policy.add_member(
        "b", 2, throttle=state.throttle, models=state.models, carried=state
    )
    assert grants == []
    assert policy.member_pauses()["b"] == 7.0
    assert policy.member_budgets("b")[1] is not None
    assert policy.tick(7.0) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "b"
    # Its next report is a new round of the streak it brought (t(1, 1) was
    # granted since): the pause doubles.
    policy.report_rate_limit(8.0, member="b")
    assert policy.member_pauses()["b"] == 10.0


def test_a_provider_brings_its_holders_and_its_waiting_in_their_place() -> None:
    own = SlotPolicy(2, provider="b")
    assert own.acquire(t(10, 10)) == [t(10, 10)]
    assert own.acquire(t(11, 11, "m")) == [t(11, 11, "m")]
    own.acquire(t(12, 12), 300)
    state = own.member_state()
    assert state.holders == (t(10, 10), t(11, 11, "m"))
    assert state.waiting == ((t(12, 12), 300),)
    policy = SlotPolicy(1, provider="a", max_waiting=1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    # b comes full, its waiter in place before anything is granted on it:
    # nothing granted, its holders counted (as granted), its waiter not
    # refused for the full queue.
    grants = policy.add_member("b", 2, carried=state, waiting=state.waiting)
    assert grants == []
    assert (policy.in_flight, policy.waiting) == (3, 2)
    stats = policy.member_statistics()["b"]
    assert (stats.in_flight, stats.granted_total) == (2, 2)
    # Its slots go in ticket order: t(1, 1), waiting for any member, first.
    assert policy.release(t(10, 10)) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "b"
    assert policy.release(t(11, 11, "m")) == [t(12, 12)]
    assert policy.member_statistics()["b"].peak_in_flight == 2
    assert policy.statistics().released_total >= 0
    with pytest.raises(ValueError, match=r"^'b' cannot take holders over"):
        policy.carry(state, member="b")
    with pytest.raises(ValueError, match=r"^no member 'c' in this policy$"):
        policy.carry(state, member="c")


def test_waiting_tickets_requeued_keep_their_place_and_the_queue_bound() -> None:
    policy = SlotPolicy(1, provider="a", max_waiting=1)
    policy.acquire(t(0, 0))
    policy.acquire(t(5, 5))
    # Admitted elsewhere: never refused here, in ticket order among the rest.
    assert policy.requeue([(t(1, 1), 0), (t(2, 2), 0)]) == []
    assert policy.waiters() == [t(1, 1), t(2, 2), t(5, 5)]
    assert policy.release(t(0, 0)) == [t(1, 1)]
    with pytest.raises(ValueError, match=r"is already known$"):
        policy.requeue([(t(2, 2), 0)])


def test_a_pooled_policy_carries_no_member_out() -> None:
    with pytest.raises(
        ValueError, match=r"^a pooled policy's members are not carried elsewhere$"
    ):
        pool().member_state()


def test_a_members_server_load_and_failures_move_with_it() -> None:
    from trio_dispatch import ServerLoad  # noqa: PLC0415

    own = SlotPolicy(4, provider="b")
    assert own.acquire(t(0, 0)) == [t(0, 0)]
    own.fail(t(0, 0), 0.0)
    own.observe_server_load(ServerLoad(running=2, waiting=1))
    state = own.member_state()
    assert state.failures == 1
    assert state.server is not None
    policy = SlotPolicy(1, provider="a")
    policy.add_member("b", 4, carried=state)
    load = own.member_server_load("b")
    assert load[0] is not None
    assert policy.member_server_load("b") == load
    assert policy.member_statistics()["b"].failures == 1


def test_a_holder_of_a_tenant_brought_along_starts_the_tenants_count() -> None:
    from trio_dispatch import Tenant  # noqa: PLC0415

    own = SlotPolicy(2, provider="b")
    held = Ticket(0.0, 1, 0, "acme")
    assert own.acquire(held) == [held]
    policy = SlotPolicy(1, provider="a")
    before = policy.counts_tenants
    assert policy.add_member("b", 2, carried=own.member_state()) == []
    assert (before, policy.counts_tenants) == (False, True)
    policy.set_tenant("acme", Tenant(limit=1))
    # acme's cap of 1 counts the slot it brought: its next request waits.
    assert policy.acquire(Ticket(1.0, 2, 0, "acme")) == []
    assert policy.release(held) == [Ticket(1.0, 2, 0, "acme")]


def test_a_group_merges_in_whole_its_members_service_and_counts_with_it() -> None:
    # Group c + d: d went out of service (a cooldown until 10.0) after two
    # failures, c holds one slot and granted three, a ticket waits for the
    # pool r, another for c alone.
    other = SlotPolicy(
        1, provider="c", affinity_wait=2.0, failure_threshold=2, failure_cooldown=10.0
    )
    other.add_member("d", 2)
    other.set_pool("r", ["c", "d"])
    for seq in range(2):
        assert other.acquire(t(0, seq), member="d") == [t(0, seq)]
        other.fail(t(0, seq), 0.0)
    for seq in (2, 3):
        assert other.acquire(t(0, seq), member="c") == [t(0, seq)]
        other.release(t(0, seq))
    assert other.acquire(t(1, 4), member="c") == [t(1, 4)]
    assert other.acquire(t(2, 5), member="r") == []
    assert other.acquire(t(3, 6), member="c") == []
    state = other.group_state()
    assert [name for name, _ in state.members] == ["c", "d"]
    assert [each.ticket for each in state.waiting] == [t(2, 5), t(3, 6)]
    policy = pool(1, 1, failure_threshold=2, failure_cooldown=10.0)
    assert policy.acquire(t(0, 7)) == [t(0, 7)]
    assert policy.acquire(t(0, 8)) == [t(0, 8)]
    assert policy.acquire(t(9, 9)) == []
    assert policy.merge(state, {"c": 1, "d": 2}) == []
    assert policy.members == ["a", "b", "c", "d"]
    assert policy.pools == {"r": ["c", "d"]}
    stats = policy.member_statistics()
    assert (stats["c"].in_flight, stats["c"].granted_total) == (1, 3)
    assert (stats["d"].out_of_service_until, stats["d"].outages_total) == (10.0, 1)
    assert policy.waiters() == [t(2, 5), t(3, 6), t(9, 9)]
    # c's slot goes to the oldest that may take it: t(2, 5) (the pool's),
    # before t(3, 6) (c's alone); a's to t(9, 9), which may take any.
    assert policy.release(t(1, 4)) == [t(2, 5)]
    assert policy.member_of(t(2, 5)) == "c"
    assert policy.release(t(0, 7)) == [t(9, 9)]
    # d's cooldown ends: half-open, its probe the next it may take.
    assert policy.tick(10.0) == []
    assert policy.member_statistics()["d"].half_open


def test_a_ticket_waiting_for_its_preferred_member_waits_as_long_after_a_merge() -> (
    None
):
    other = SlotPolicy(1, provider="c", affinity_wait=2.0)
    other.add_member("d", 1)
    other.set_pool("r", ["c", "d"])
    assert other.acquire(t(0, 0), member="r", prefer="d") == [t(0, 0)]
    other.advance(1.0)
    # d is full, c free: it waits for d until 3.0.
    assert other.acquire(t(1, 1), member="r", prefer="d") == []
    state = other.group_state()
    (waiting,) = state.waiting
    assert (waiting.preferred, waiting.until) == ("d", 3.0)
    policy = SlotPolicy(1, provider="a", affinity_wait=2.0, now=1.5)
    assert policy.merge(state, {"c": 1, "d": 1}) == []
    assert policy.wake_at == 3.0
    assert policy.tick(3.0) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "c"
    assert policy.member_statistics()["d"].affinity_moves == 1


def test_a_merge_that_clashes_changes_nothing() -> None:
    other = SlotPolicy(1, provider="b")
    assert other.acquire(t(0, 0)) == [t(0, 0)]
    policy = pool()
    with pytest.raises(ValueError, match=r"^names taken here already: \['b'\]$"):
        policy.merge(other.group_state(), {})
    mine = SlotPolicy(1, provider="c")
    assert mine.acquire(t(0, 0)) == [t(0, 0)]
    with pytest.raises(ValueError, match=r"^tickets known here already"):
        mine.merge(GroupState((("z", other.member_state()),), {}, ()), {})
    assert (policy.members, mine.members) == (["a", "b"], ["c"])
    assert (policy.in_flight, mine.in_flight) == (0, 1)


def test_a_half_open_member_merges_with_its_probe_held() -> None:
    # d is half-open with its probe holding: after the merge it takes
    # nothing more until the probe ends, then is back in service.
    other = SlotPolicy(
        1, provider="c", affinity_wait=2.0, failure_threshold=1, failure_cooldown=5.0
    )
    other.add_member("d", 2)
    other.set_pool("r", ["c", "d"])
    assert other.acquire(t(0, 0), member="d") == [t(0, 0)]
    other.fail(t(0, 0), 0.0)
    other.tick(5.0)
    assert other.acquire(t(1, 1), member="d") == [t(1, 1)]  # its probe
    state = other.group_state()
    (d_state,) = [member for name, member in state.members if name == "d"]
    assert (d_state.half_open, d_state.probe) == (True, t(1, 1))
    policy = SlotPolicy(1, provider="a", now=5.0)
    assert policy.merge(state, {"c": 1, "d": 2}) == []
    assert policy.acquire(t(2, 2), member="d") == []
    assert policy.release(t(1, 1)) == [t(2, 2)]
    stats = policy.member_statistics()["d"]
    assert (stats.half_open, stats.in_flight, stats.outages_total) == (False, 1, 1)
