"""The pure policy core: unit tests and a state machine against a model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
)

from trio_dispatch import Budget, QueueFull, Tenant
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket


def t(started_at: float, seq: int) -> Ticket:
    return Ticket(started_at, seq)


def test_grants_at_once_while_slots_are_free() -> None:
    policy = SlotPolicy(2)
    assert policy.acquire(t(5, 0)) == [t(5, 0)]
    assert policy.acquire(t(9, 1)) == [t(9, 1)]
    assert policy.acquire(t(1, 2)) == []
    assert (policy.in_flight, policy.waiting) == (2, 1)


def test_grants_go_to_the_oldest_turn_then_first_come() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    for ticket in [t(7, 1), t(3, 2), t(7, 3), t(3, 4), t(1, 5)]:
        assert policy.acquire(ticket) == []
    order = []
    holder = t(0, 0)
    for _ in range(5):
        (holder,) = policy.release(holder)
        order.append(holder)
    assert order == [t(1, 5), t(3, 2), t(3, 4), t(7, 1), t(7, 3)]


def test_newcomer_never_takes_a_free_slot_while_anyone_waits() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(10, 0))
    policy.acquire(t(11, 1))
    policy.pause(5.0)
    # The release frees a slot that nobody may take while paused...
    assert policy.release(t(10, 0)) == []
    # ...and a newcomer does not take it either: it queues.
    assert policy.acquire(t(12, 2)) == []
    assert policy.tick(5.0) == [t(11, 1)]
    assert policy.waiters() == [t(12, 2)]


def test_an_older_turn_arriving_later_goes_before_younger_waiters() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(11, 1))
    policy.acquire(t(1, 2))
    assert policy.release(t(0, 0)) == [t(1, 2)]


def test_cancel_of_waiter_withdraws_it() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    policy.acquire(t(2, 2))
    assert policy.cancel(t(1, 1)) == []
    assert policy.release(t(0, 0)) == [t(2, 2)]
    assert policy.statistics().withdrawn_total == 1


def test_a_hand_off_keeps_the_counters_and_the_queue_exact() -> None:
    policy = SlotPolicy(2)
    for seq in range(4):
        policy.acquire(t(seq, seq))
    policy.cancel(t(3, 3))  # a withdrawn entry behind the last waiter
    assert policy.release(t(0, 0)) == [t(2, 2)]
    assert policy.waiters() == []
    stats = policy.statistics()
    assert (
        stats.granted_total,
        stats.released_total,
        stats.withdrawn_total,
        stats.peak_in_flight,
        stats.peak_waiting,
    ) == (3, 1, 1, 2, 2)
    assert policy.release(t(1, 1)) == []
    # Nothing left queued, dead or alive: a newcomer goes at once.
    assert policy.acquire(t(9, 9)) == [t(9, 9)]


def test_cancel_of_holder_is_a_release() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    assert policy.cancel(t(0, 0)) == [t(1, 1)]
    assert policy.holders() == {t(1, 1)}


def test_release_and_cancel_of_unknown_or_finished_do_nothing() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.release(t(0, 0))
    before = policy.statistics()
    assert policy.release(t(0, 0)) == []
    assert policy.cancel(t(0, 0)) == []
    assert policy.cancel(t(5, 9)) == []
    assert policy.statistics() == before


def test_release_of_a_waiting_ticket_is_misuse() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    with pytest.raises(
        RuntimeError, match=r"^ticket .* is waiting, not holding a slot$"
    ):
        policy.release(t(1, 1))
    assert policy.waiters() == [t(1, 1)]


def test_duplicate_ticket_is_refused() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    with pytest.raises(ValueError, match=r"^ticket .* is already known$"):
        policy.acquire(t(0, 0))
    assert policy.in_flight == 1


def test_lowering_the_limit_lets_holders_finish() -> None:
    policy = SlotPolicy(3)
    for seq in range(5):
        policy.acquire(t(seq, seq))
    assert policy.set_limit(1) == []
    assert policy.release(t(0, 0)) == []
    assert policy.release(t(1, 1)) == []
    assert policy.in_flight == 1
    assert policy.release(t(2, 2)) == [t(3, 3)]


def test_raising_the_limit_grants_at_once_in_order() -> None:
    policy = SlotPolicy(1)
    for seq in range(4):
        policy.acquire(t(10 - seq, seq))
    assert policy.set_limit(3) == [t(7, 3), t(8, 2)]


def test_lifting_the_limit_grants_everyone_and_ignores_pauses() -> None:
    policy = SlotPolicy(1)
    for seq in range(3):
        policy.acquire(t(seq, seq))
    policy.pause(100.0)
    assert policy.set_limit(None) == [t(1, 1), t(2, 2)]
    assert policy.acquire(t(3, 3)) == [t(3, 3)]


def test_pause_holds_grants_until_tick_reaches_it() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    policy.pause(10.0)
    assert policy.release(t(0, 0)) == []
    assert policy.acquire(t(2, 2)) == []
    assert policy.tick(9.999) == []
    assert policy.paused_until == 10.0
    assert policy.tick(10.0) == [t(1, 1)]
    assert policy.paused_until is None


def test_a_later_pause_extends_and_an_earlier_one_does_not_shorten() -> None:
    policy = SlotPolicy(1)
    policy.pause(10.0)
    policy.pause(5.0)
    assert policy.paused_until == 10.0
    policy.pause(12.5)
    assert policy.paused_until == 12.5


def test_pause_refuses_nan() -> None:
    policy = SlotPolicy(1)
    with pytest.raises(ValueError, match=r"^until must be a number, got nan$"):
        policy.pause(math.nan)
    assert policy.paused_until is None


# -- rate-limit reports: clamped pauses, backoff, resume -------------------------


def _refused_at(policy: SlotPolicy, now: float, ticket: Ticket) -> float:
    """Grant ``ticket`` at ``now``, report a rate limit, release; the pause's end."""
    assert policy.tick(now) == []
    assert policy.acquire(ticket) == [ticket]
    policy.report_rate_limit(now)
    assert policy.release(ticket) == []
    assert policy.paused_until is not None
    return policy.paused_until


def test_reports_without_a_delay_back_off_from_default_pause_to_max_pause() -> None:
    policy = SlotPolicy(1, default_pause=1.0, max_pause=8.0)
    now = 0.0
    pauses = []
    for seq in range(6):
        until = _refused_at(policy, now, t(seq, seq))
        pauses.append(until - now)
        now = until
    assert pauses == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    # A success (granted after the latest report, released with none since)
    # ends the streak: the next report starts from default_pause again.
    assert policy.tick(now) == []
    assert policy.acquire(t(6, 6)) == [t(6, 6)]
    assert policy.release(t(6, 6)) == []
    assert _refused_at(policy, now, t(7, 7)) == now + 1.0


def test_reports_with_no_grant_between_them_share_a_round() -> None:
    # Three requests in flight together are refused together: one round.
    policy = SlotPolicy(3, default_pause=1.0, max_pause=60.0)
    holders = [t(seq, seq) for seq in range(3)]
    for ticket in holders:
        policy.acquire(ticket)
    for index, ticket in enumerate(holders):
        policy.report_rate_limit(0.25 * index)
        policy.release(ticket)
    assert policy.paused_until == 1.5
    # The next request, granted after them, is refused: the second round.
    assert _refused_at(policy, 1.5, t(3, 3)) == 3.5


def test_a_slot_held_across_a_report_is_no_success_when_it_comes_back() -> None:
    policy = SlotPolicy(2, default_pause=1.0, max_pause=60.0)
    policy.acquire(t(0, 0))  # held across every report below
    policy.acquire(t(1, 1))
    policy.report_rate_limit(0.0)
    policy.release(t(1, 1))
    policy.acquire(t(2, 2))
    assert policy.tick(1.0) == [t(2, 2)]
    assert policy.release(t(0, 0)) == []  # granted before the report
    policy.report_rate_limit(1.5)  # t(2, 2) was granted since: round two
    assert policy.paused_until == 3.5
    assert policy.release(t(2, 2)) == []  # held across that report
    assert _refused_at(policy, 3.5, t(3, 3)) == 7.5  # round three


def test_a_grant_cancelled_before_use_is_no_success() -> None:
    policy = SlotPolicy(1, default_pause=1.0, max_pause=60.0)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    policy.report_rate_limit(0.0)
    policy.release(t(0, 0))
    assert policy.tick(1.0) == [t(1, 1)]
    assert policy.cancel(t(1, 1)) == []  # the grant raced a cancellation
    assert _refused_at(policy, 1.0, t(2, 2)) == 3.0


def test_a_server_delay_is_honoured_up_to_max_pause_and_counts_as_a_round() -> None:
    policy = SlotPolicy(2, default_pause=1.0, max_pause=60.0)
    policy.report_rate_limit(0.0, retry_after=999_999_999)
    assert policy.paused_until == 60.0
    policy.report_rate_limit(10.0, retry_after=0.5)  # never shortens
    assert policy.paused_until == 60.0
    policy.report_rate_limit(30.0, retry_after=999)  # extends, up to max_pause
    assert policy.paused_until == 90.0
    assert policy.tick(90.0) == []
    policy.acquire(t(0, 0))
    policy.report_rate_limit(90.0, retry_after=2.5)  # round two, as given
    assert policy.paused_until == 92.5
    policy.release(t(0, 0))
    assert _refused_at(policy, 92.5, t(1, 1)) == 96.5  # round three: 4 s


# A delay of zero is no delay: the backoff, as without one.
@pytest.mark.parametrize("retry_after", [0, 0.0])
def test_the_policy_backs_off_for_a_zero_delay(retry_after: float) -> None:
    policy = SlotPolicy(2, default_pause=1.0, max_pause=60.0)
    policy.report_rate_limit(10.0, retry_after)
    assert policy.paused_until == 11.0
    assert policy.tick(11.0) == []
    policy.acquire(Ticket(11.0, 0))
    policy.report_rate_limit(11.0, retry_after)  # a new round: doubled
    assert policy.paused_until == 13.0


def test_resume_ends_the_pause_and_the_streak_and_grants_in_ticket_order() -> None:
    policy = SlotPolicy(2, default_pause=1.0, max_pause=60.0)
    policy.acquire(t(0, 0))
    policy.report_rate_limit(0.0, retry_after=50)
    policy.release(t(0, 0))
    for ticket in [t(9, 1), t(3, 2), t(5, 3)]:
        assert policy.acquire(ticket) == []
    assert policy.resume() == [t(3, 2), t(5, 3)]
    assert (policy.paused_until, policy.waiters()) == (None, [t(9, 1)])
    # The streak is over too: the next report starts from default_pause.
    policy.report_rate_limit(7.0)
    assert policy.paused_until == 8.0
    assert policy.resume() == []
    assert policy.resume() == []  # not paused: nothing to do


def test_a_raw_pause_takes_an_int_beyond_any_float_as_forever() -> None:
    # pause() is the raw instrument: it accepts inf, so 10**400 is inf too,
    # where float() would raise OverflowError. resume() ends it.
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    policy.pause(10**400)
    assert policy.paused_until == math.inf
    assert policy.release(t(0, 0)) == []
    assert policy.resume() == [t(1, 1)]


def test_a_default_pause_of_zero_stays_zero() -> None:
    policy = SlotPolicy(1, default_pause=0, max_pause=1.0)
    assert [_refused_at(policy, 5.0, t(seq, seq)) for seq in range(3)] == [5.0] * 3


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"max_pause": 0},
            ValueError,
            "max_pause must be a positive number of seconds, got 0",
        ),
        (
            {"max_pause": math.inf},
            ValueError,
            "max_pause must be a positive number of seconds, got inf",
        ),
        (
            {"max_pause": "60"},
            TypeError,
            "max_pause must be a positive number of seconds, got '60'",
        ),
        (
            {"default_pause": -1},
            ValueError,
            "default_pause must be a non-negative number of seconds, got -1",
        ),
        (
            {"default_pause": 61, "max_pause": 60},
            ValueError,
            "default_pause must be at most max_pause=60, got 61",
        ),
    ],
)
def test_bad_pause_settings_are_refused(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        SlotPolicy(1, **options)  # type: ignore[arg-type]  # the point of the test


def test_a_bad_report_is_refused_and_changes_nothing() -> None:
    policy = SlotPolicy(1, default_pause=1.0, max_pause=60.0)
    policy.acquire(t(0, 0))
    with pytest.raises(ValueError, match=r"^now must be a finite number, got nan$"):
        policy.report_rate_limit(math.nan)
    with pytest.raises(
        ValueError,
        match=r"^retry_after must be a non-negative number of seconds, got -1$",
    ):
        policy.report_rate_limit(0.0, retry_after=-1)
    assert policy.paused_until is None
    # No streak was started: the first real report is the first round.
    policy.report_rate_limit(0.0)
    assert policy.paused_until == 1.0


def test_max_waiting_refuses_at_once_and_changes_nothing() -> None:
    policy = SlotPolicy(1, max_waiting=1)
    policy.acquire(t(0, 0))
    policy.acquire(t(1, 1))
    before = (policy.holders(), policy.waiters())
    with pytest.raises(QueueFull, match=r"^1 request already waits \(max_waiting=1\)$"):
        policy.acquire(t(0.5, 2))
    assert (policy.holders(), policy.waiters()) == before
    assert policy.statistics().rejected_total == 1


def test_queue_full_says_how_many_wait_in_the_right_number_and_for_whom() -> None:
    policy = SlotPolicy(1, max_waiting=2, provider="openai")
    for seq in range(3):
        policy.acquire(t(0, seq))
    with pytest.raises(
        QueueFull, match=r"^2 requests already wait for 'openai' \(max_waiting=2\)$"
    ) as caught:
        policy.acquire(t(0, 3))
    assert (caught.value.provider, caught.value.max_waiting) == ("openai", 2)


def test_max_waiting_zero_grants_free_slots_and_refuses_waiting() -> None:
    policy = SlotPolicy(1, max_waiting=0)
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    with pytest.raises(QueueFull):
        policy.acquire(t(1, 1))


@pytest.mark.parametrize(
    ("limit", "error", "message"),
    [
        (0, ValueError, "limit must be a positive integer, got 0"),
        (-3, ValueError, "limit must be a positive integer, got -3"),
        (1.5, TypeError, "limit must be a positive integer, got 1.5"),
        (math.nan, TypeError, "limit must be a positive integer, got nan"),
        (True, TypeError, "limit must be a positive integer, got True"),
        ("4", TypeError, "limit must be a positive integer, got '4'"),
    ],
)
def test_bad_limits_are_refused(
    limit: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        SlotPolicy(limit)  # type: ignore[arg-type]  # the point of the test
    policy = SlotPolicy(2)
    with pytest.raises(error, match=f"^{message}$"):
        policy.set_limit(limit)  # type: ignore[arg-type]  # the point of the test
    assert policy.limit == 2


def queued(policy: SlotPolicy) -> int:
    """The entries in the policy's queues, those of withdrawn tickets included."""
    return sum(
        len(queue)
        for state in policy._tenants._states.values()
        for queue in state.queues.values()
    )


def test_cancelled_entries_are_compacted_away() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(0, 0))
    for seq in range(1, 1001):
        policy.acquire(t(seq, seq))
    for seq in range(1, 1000):
        policy.cancel(t(seq, seq))
    assert policy.waiting == 1
    assert queued(policy) <= 2 * policy.waiting + 64
    assert policy.release(t(0, 0)) == [t(1000, 1000)]


def test_out_of_order_tickets_are_compacted_away_too() -> None:
    policy = SlotPolicy(1)
    policy.acquire(t(5000, 0))
    for seq in range(1, 1001):
        policy.acquire(t(5000 - seq, seq))  # each older than the last
    for seq in range(1, 1000):
        policy.cancel(t(5000 - seq, seq))
    assert queued(policy) <= 2 * policy.waiting + 64
    assert policy.release(t(5000, 0)) == [t(4000, 1000)]


_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, 5)),
        st.tuples(st.sampled_from(["release", "cancel"]), st.integers(0, 30)),
        st.tuples(st.just("limit"), st.integers(1, 4)),
    ),
    max_size=40,
)


@given(_OPERATIONS)
@settings(max_examples=200, deadline=None)
def test_one_queue_whatever_is_configured(
    operations: list[tuple[str, int]],
) -> None:
    # A policy that counts tenants and models from the start (a tenant and
    # a model budget configured) queues the default tenant's tickets as one
    # that counts nothing: oldest first, ties by arrival.
    plain = SlotPolicy(2)
    counting = SlotPolicy(
        2,
        tenants={"other": Tenant(weight=3.0)},
        models={"m": Throttle(Budget(requests_per_minute=60))},
    )
    assert (plain.counts_tenants, counting.counts_tenants) == (False, True)
    tickets: list[Ticket] = []
    for operation, value in operations:
        if operation == "acquire":
            ticket = t(value, len(tickets))
            tickets.append(ticket)
            got = (plain.acquire(ticket), counting.acquire(ticket))
        elif operation == "limit":
            got = (plain.set_limit(value), counting.set_limit(value))
        elif value < len(tickets):
            ticket = tickets[value]
            if operation == "cancel" or ticket not in plain.holders():
                got = (plain.cancel(ticket), counting.cancel(ticket))
            else:
                got = (plain.release(ticket), counting.release(ticket))
        else:
            continue
        assert got[0] == got[1]
        assert plain.waiters() == counting.waiters()
        assert plain.holders() == counting.holders()
    # And the same lifetime counts.
    assert plain.statistics() == counting.statistics()


def test_statistics_count_lifetime_events() -> None:
    policy = SlotPolicy(2)
    for seq in range(4):
        policy.acquire(t(seq, seq))
    policy.cancel(t(3, 3))
    policy.release(t(0, 0))
    stats = policy.statistics()
    assert (stats.in_flight, stats.waiting) == (2, 0)
    assert (stats.granted_total, stats.released_total, stats.withdrawn_total) == (
        3,
        1,
        1,
    )
    assert (stats.peak_in_flight, stats.peak_waiting) == (2, 2)
    assert (
        repr(policy) == "<SlotPolicy limit=2 in_flight=2 waiting=0 paused_until=None>"
    )


DEFAULT_PAUSE = 1.0
MAX_PAUSE = 8.0
# Seconds of turn age worth one priority class: small beside the starts
# drawn (0 to 5), so that classes cross and tie often.
AGING = 2


class PolicyMachine(RuleBasedStateMachine):
    """Random operations on SlotPolicy, checked against a plain model.

    The model is the specification written as directly as possible: a list
    of waiters granted by ``min`` of their place (class first, a class
    worth ``AGING`` seconds of turn age, then the turn's start, then
    arrival), each grant checked to pass only waiters that rule lets it
    pass, the holders with the moment (a count of
    events) each was granted, and the pause rules: a report opens a round
    if it starts a streak or a grant came after the previous report; its
    pause is the server's delay or ``DEFAULT_PAUSE * 2 ** (rounds - 1)``,
    at most ``MAX_PAUSE``; releasing a slot granted after the latest report
    ends the streak, and so does ``resume``.
    """

    waiting = Bundle("waiting")
    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.limit: int | None = 2
        self.policy = SlotPolicy(
            self.limit, default_pause=DEFAULT_PAUSE, max_pause=MAX_PAUSE
        )
        self.seq = 0
        self.now = 0.0
        self.paused_until: float | None = None
        self.model_waiting: list[Ticket] = []
        # Each ticket's turn start and class, as the requester gave them.
        self.turns: dict[Ticket, tuple[int, int]] = {}
        self.model_holders: dict[Ticket, int] = {}
        self.ended: set[Ticket] = set()
        self.ceiling = 0
        self.events = 0
        self.last_grant = 0
        self.last_report = 0
        self.rounds = 0

    def _model_grant(self, ticket: Ticket) -> None:
        self.events += 1
        self.model_holders[ticket] = self.last_grant = self.events

    def _place(self, ticket: Ticket) -> tuple[int, int]:
        started_at, priority = self.turns[ticket]
        return started_at - priority * AGING, ticket.seq

    def _may_pass(self, ticket: Ticket, other: Ticket) -> bool:
        """Whether ``ticket`` may be granted while ``other`` still waits.

        The bound of the aging rule, stated class by class: a lower class
        passes a higher one only with a turn older by ``AGING`` seconds per
        class between them, and a higher class passes a lower one only
        while its turn is younger by less than that.
        """
        start, priority = self.turns[ticket]
        other_start, other_priority = self.turns[other]
        credit = (priority - other_priority) * AGING
        if start - credit != other_start:
            return start - credit < other_start
        return ticket.seq < other.seq

    def _model_fill(self) -> list[Ticket]:
        grants = []
        while self.model_waiting and self._model_may_grant():
            ticket = min(self.model_waiting, key=self._place)
            self.model_waiting.remove(ticket)
            self._model_grant(ticket)
            grants.append(ticket)
        return grants

    def _model_may_grant(self) -> bool:
        if self.limit is None:
            return True
        return self.paused_until is None and len(self.model_holders) < self.limit

    def _check(self, got: list[Ticket], expected: list[Ticket]) -> None:
        assert got == expected
        assert not set(got) & self.ended, "a finished ticket was granted again"
        # Each grant passed only waiters the class rule lets it pass.
        still = self.policy.waiters()
        assert all(self._may_pass(g, w) for g in got for w in still)

    @rule(target=waiting, started_at=st.integers(0, 5), priority=st.integers(0, 2))
    def acquire(self, started_at: int, priority: int) -> Ticket:
        # The rank as the dispatcher computes it for a slot.
        ticket = Ticket(float(started_at - priority * AGING), self.seq, priority)
        self.turns[ticket] = (started_at, priority)
        self.seq += 1
        got = self.policy.acquire(ticket)
        if not self.model_waiting and self._model_may_grant():
            self._model_grant(ticket)
            expected = [ticket]
        else:
            self.model_waiting.append(ticket)
            expected = []
        self._check(got, expected)
        return ticket

    @rule(ticket=consumes(waiting))
    def cancel_whoever(self, ticket: Ticket) -> None:
        # The ticket may have been granted since it was queued: then the
        # cancel is a release, as when a grant races a cancellation.
        if ticket in self.model_waiting:
            self.model_waiting.remove(ticket)
            self.ended.add(ticket)
            expected: list[Ticket] = []
        elif ticket in self.model_holders:
            del self.model_holders[ticket]  # never used: no success
            self.ended.add(ticket)
            expected = self._model_fill()
        else:
            expected = []
        self._check(self.policy.cancel(ticket), expected)

    @rule(data=st.data())
    def release_a_holder(self, data: st.DataObject) -> None:
        if not self.model_holders:
            return
        ticket = data.draw(st.sampled_from(sorted(self.model_holders)))
        if self.model_holders.pop(ticket) > self.last_report:
            self.rounds = 0  # a success ends the streak
        self.ended.add(ticket)
        self._check(self.policy.release(ticket), self._model_fill())

    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        if not self.ended:
            return
        ticket = data.draw(st.sampled_from(sorted(self.ended)))
        self._check(self.policy.release(ticket), [])
        self._check(self.policy.cancel(ticket), [])

    @rule(limit=st.one_of(st.none(), st.integers(1, 4)))
    def set_limit(self, limit: int | None) -> None:
        self.limit = limit
        self.ceiling = len(self.model_holders)
        self._check(self.policy.set_limit(limit), self._model_fill())

    @rule(seconds=st.integers(0, 3))
    def pause(self, seconds: int) -> None:
        until = self.now + seconds
        self.policy.pause(until)
        if self.paused_until is None or until > self.paused_until:
            self.paused_until = until

    @rule(retry_after=st.one_of(st.none(), st.integers(0, 12)))
    def report_rate_limit(self, retry_after: int | None) -> None:
        if self.rounds == 0 or self.last_grant > self.last_report:
            self.rounds += 1
        self.events += 1
        self.last_report = self.events
        if not retry_after:  # none, or 0: no delay named
            seconds = min(DEFAULT_PAUSE * 2 ** (self.rounds - 1), MAX_PAUSE)
        else:
            seconds = min(retry_after, MAX_PAUSE)
        until = self.now + seconds
        self.policy.report_rate_limit(self.now, retry_after)
        if self.paused_until is None or until > self.paused_until:
            self.paused_until = until

    @rule()
    def resume(self) -> None:
        self.paused_until = None
        self.rounds = 0
        self._check(self.policy.resume(), self._model_fill())

    @rule(seconds=st.integers(0, 8))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        expected: list[Ticket] = []
        if self.paused_until is not None and self.now >= self.paused_until:
            self.paused_until = None
            expected = self._model_fill()
        self._check(self.policy.tick(self.now), expected)

    @invariant()
    def matches_the_model(self) -> None:
        assert self.policy.holders() == set(self.model_holders)
        assert self.policy.waiters() == sorted(self.model_waiting, key=self._place)
        assert self.policy.paused_until == self.paused_until
        # Private, but a wrong streak would otherwise show only several
        # steps later, in the length of a pause.
        assert self.policy._first.streak == self.rounds

    @invariant()
    def no_pause_outlasts_max_pause(self) -> None:
        # The raw pause() rule pauses for 3 s at most, below MAX_PAUSE too.
        paused_until = self.policy.paused_until
        assert paused_until is None or paused_until <= self.now + MAX_PAUSE

    @invariant()
    def invariants_hold(self) -> None:
        policy = self.policy
        limit = policy.limit
        # 1: never above the limit; after a lowering, the holders above it
        # only ever shrink until in_flight is back under the limit.
        if limit is not None:
            assert policy.in_flight <= max(limit, self.ceiling)
        self.ceiling = min(self.ceiling, policy.in_flight)
        # 2: work-conserving while not paused.
        if policy.waiting and (limit is None or policy.paused_until is None):
            assert limit is not None
            assert policy.in_flight >= limit
        # 4: every ticket is in at most one place.
        assert not policy.holders() & set(policy.waiters())
        assert not (policy.holders() | set(policy.waiters())) & self.ended


PolicyMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
test_policy_state_machine = PolicyMachine.TestCase


@pytest.mark.parametrize(
    ("provider", "error", "message"),
    [
        ("", ValueError, "provider must be a non-empty string, got ''"),
        (3, TypeError, "provider must be a non-empty string, got 3"),
    ],
)
def test_a_policy_refuses_a_provider_that_is_not_a_name(
    provider: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"^{message}$"):
        SlotPolicy(1, provider=provider)  # type: ignore[arg-type]  # the check's case
