"""``AdaptiveLimit``: AIMD between its bounds, in the core and end to end."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from trio_dispatch import AdaptiveLimit, Budget, open_dispatcher
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket


def t(started_at: float, seq: int) -> Ticket:
    return Ticket(started_at, seq)


def adaptive_policy(initial: int, minimum: int = 1, maximum: int = 64) -> SlotPolicy:
    spec = AdaptiveLimit(initial=initial, minimum=minimum, maximum=maximum)
    return SlotPolicy(None, throttle=Throttle(adaptive=spec))


def hold(policy: SlotPolicy, count: int, first: int = 0) -> list[Ticket]:
    tickets = [t(0, first + n) for n in range(count)]
    for ticket in tickets:
        assert policy.acquire(ticket) == [ticket]
    return tickets


# -- the core -----------------------------------------------------------------


def test_it_starts_at_initial() -> None:
    policy = adaptive_policy(8)
    assert policy.limit == 8


def test_slow_start_adds_one_per_success_with_the_limit_in_use() -> None:
    policy = adaptive_policy(2, maximum=5)
    for ticket in hold(policy, 2):
        policy.release(ticket)
    assert policy.limit == 4
    for ticket in hold(policy, 4, first=2):
        policy.release(ticket)
    assert policy.limit == 5  # never above maximum


def test_a_success_with_the_limit_not_in_use_adds_nothing() -> None:
    policy = adaptive_policy(8)
    (ticket,) = hold(policy, 1)  # 1 of 8: not in use
    policy.release(ticket)
    assert policy.limit == 8


def test_a_round_of_rate_limits_multiplies_it_by_the_backoff() -> None:
    policy = adaptive_policy(10)
    holders = hold(policy, 10)
    policy.report_rate_limit(0.0)
    assert policy.limit == 9
    # Reports with no grant between them share the round.
    policy.report_rate_limit(0.0)
    assert policy.limit == 9
    # The holders at the report do not count as successes...
    for ticket in holders:
        policy.release(ticket)
    assert policy.limit == 9
    policy.resume()
    # ...and after a rate limit, a success with the limit in use (5 of
    # 9 held, or more) adds 1 / limit: 5 / 9 a round of 9, so 2 rounds.
    for first in (10, 20):
        assert policy.limit == 9
        for ticket in hold(policy, 9, first=first):
            policy.release(ticket)
    assert policy.limit == 10


def test_it_never_goes_below_minimum() -> None:
    policy = adaptive_policy(3, minimum=2)
    for round_ in range(5):
        policy.resume()
        holders = hold(policy, policy.limit or 0, first=10 * round_)
        policy.report_rate_limit(0.0)
        for ticket in holders:
            policy.release(ticket)
    assert policy.limit == 2


def test_a_fixed_limit_replaces_it() -> None:
    policy = adaptive_policy(2)
    assert policy.set_limit(5) == []
    for ticket in hold(policy, 5):
        policy.release(ticket)
    assert policy.limit == 5
    assert policy.throttle is not None
    assert policy.throttle.adaptive is None


def test_lowering_lets_the_holders_finish() -> None:
    policy = adaptive_policy(4)
    holders = hold(policy, 4)
    policy.report_rate_limit(0.0, 0.5)
    assert policy.limit == 3
    policy.tick(0.5)
    assert policy.acquire(t(1, 9)) == []
    assert policy.release(holders[0]) == []  # 3 hold: at the limit
    assert policy.release(holders[1]) == [t(1, 9)]


# -- end to end ---------------------------------------------------------------


async def test_statistics_show_the_current_value_and_that_it_adapts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spec = AdaptiveLimit(initial=4, minimum=2, maximum=8)
    async with open_dispatcher({"p": spec}, default_pause=1.0) as dispatcher:
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.adaptive) == (4, True)
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(hold_for, dispatcher, 1.0)
            await trio.testing.wait_all_tasks_blocked()
            dispatcher.report_rate_limit("p")
            stats = dispatcher.statistics().providers["p"]
            assert (stats.limit, stats.paused) == (3, True)
            assert dispatcher.limits() == {"p": 3}
        dispatcher.set_limit("p", 6)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.adaptive) == (6, False)
        dispatcher.set_limit("p", spec)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.adaptive) == (4, True)


async def hold_for(dispatcher: object, seconds: float) -> None:
    async with dispatcher.slot("p"):  # type: ignore[attr-defined]  # a Dispatcher
        await trio.sleep(seconds)


async def test_an_adaptive_limit_set_on_an_unused_provider() -> None:
    async with open_dispatcher() as dispatcher:
        dispatcher.set_limit("q", AdaptiveLimit(initial=3, maximum=4))
        stats = dispatcher.statistics().providers["q"]
        assert (stats.limit, stats.adaptive) == (3, True)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"initial": 0, "maximum": 4},
            ValueError,
            "initial must be a positive integer, got 0",
        ),
        (
            {"initial": 2, "minimum": -1, "maximum": 4},
            ValueError,
            "minimum must be a positive integer, got -1",
        ),
        (
            {"initial": 2, "maximum": 2.5},
            TypeError,
            "maximum must be a positive integer, got 2.5",
        ),
        (
            {"initial": True, "maximum": 4},
            TypeError,
            "initial must be a positive integer, got True",
        ),
        (
            {"initial": 3, "minimum": 5, "maximum": 4},
            ValueError,
            "minimum must be at most maximum=4, got 5",
        ),
        (
            {"initial": 9, "minimum": 1, "maximum": 4},
            ValueError,
            "initial must be from minimum=1 to maximum=4, got 9",
        ),
        (
            {"initial": 1, "minimum": 2, "maximum": 4},
            ValueError,
            "initial must be from minimum=2 to maximum=4, got 1",
        ),
        (
            {"initial": 2, "maximum": 4, "backoff": 1},
            ValueError,
            "backoff must be a number between 0 and 1, both excluded, got 1",
        ),
        (
            {"initial": 2, "maximum": 4, "backoff": 0.0},
            ValueError,
            "backoff must be a number between 0 and 1, both excluded, got 0.0",
        ),
        (
            {"initial": 2, "maximum": 4, "backoff": math.nan},
            ValueError,
            "backoff must be a number from 0 to 1, got nan",
        ),
        (
            {"initial": 2, "maximum": 4, "backoff": "0.5"},
            TypeError,
            "backoff must be a number from 0 to 1, got '0.5'",
        ),
    ],
)
def test_bad_adaptive_limits_are_refused_at_the_call(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        AdaptiveLimit(**kwargs)  # type: ignore[arg-type]  # the errors tested


# -- property: never outside its range, never above the current limit ------


class AdaptiveMachine(RuleBasedStateMachine):
    """Random successes, rate limits, cancellations, limit changes and time.

    Drives the policy with a throttle holding an adaptive limit and a token
    budget, and checks after every step: the limit stays in its range while
    adaptive, no call grants above the limit in force, and grants go in
    ticket order (nobody left waiting is older than a ticket just granted).
    """

    waiting = Bundle("waiting")

    def __init__(self) -> None:
        super().__init__()
        self.spec = AdaptiveLimit(initial=4, minimum=2, maximum=9)
        throttle = Throttle(Budget(tokens_per_minute=600), adaptive=self.spec)
        self.policy = SlotPolicy(None, throttle=throttle)
        self.adaptive = True
        self.seq = 0
        self.now = 0.0
        self.ceiling = 0

    def _granted(self, grants: list[Ticket]) -> None:
        policy = self.policy
        limit = policy.limit
        if grants:
            assert limit is not None
            assert policy.in_flight <= limit, "granted above the limit"
            assert grants == sorted(grants)
            assert all(waiter > grants[-1] for waiter in policy.waiters())

    @rule(target=waiting, started_at=st.integers(0, 5), tokens=st.integers(0, 300))
    def acquire(self, started_at: int, tokens: int) -> Ticket:
        ticket = Ticket(float(started_at), self.seq)
        self.seq += 1
        self._granted(self.policy.acquire(ticket, tokens))
        return ticket

    @rule(ticket=waiting)
    def cancel(self, ticket: Ticket) -> None:
        self._granted(self.policy.cancel(ticket))

    @rule(data=st.data(), tokens=st.integers(0, 300))
    def succeed(self, data: st.DataObject, tokens: int) -> None:
        holders = sorted(self.policy.holders())
        if not holders:
            return
        ticket = data.draw(st.sampled_from(holders))
        self._granted(self.policy.report_usage(ticket, tokens))
        self._granted(self.policy.release(ticket))

    @rule(retry_after=st.one_of(st.none(), st.integers(0, 3)))
    def rate_limited(self, retry_after: int | None) -> None:
        before = self.policy.limit
        self.policy.report_rate_limit(self.now, retry_after)
        if before is not None and self.policy.limit is not None:
            assert self.policy.limit <= before
        self.ceiling = self.policy.in_flight

    @rule(limit=st.one_of(st.integers(1, 6), st.just("adaptive")))
    def set_limit(self, limit: int | str) -> None:
        self.adaptive = limit == "adaptive"
        self.ceiling = self.policy.in_flight
        self._granted(self.policy.set_limit(self.spec if self.adaptive else limit))  # type: ignore[arg-type]  # int when not adaptive

    @rule(seconds=st.integers(0, 5))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        self._granted(self.policy.tick(self.now))

    @invariant()
    def within_its_range_and_the_limit(self) -> None:
        policy = self.policy
        limit = policy.limit
        assert limit is not None
        if self.adaptive:
            assert self.spec.minimum <= limit <= self.spec.maximum
        assert policy.in_flight <= max(limit, self.ceiling)
        self.ceiling = min(self.ceiling, policy.in_flight)

    @invariant()
    def something_wakes_whoever_waits(self) -> None:
        # A waiter is either behind a full limit, a pause or the budget, and
        # for the last two the policy says when to look again.
        policy = self.policy
        if (
            policy.waiting
            and policy.limit is not None
            and policy.in_flight < policy.limit
        ):
            wake_at = policy.wake_at
            assert wake_at is not None
            assert wake_at >= self.now


AdaptiveMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None
)
test_adaptive_limit_state_machine = AdaptiveMachine.TestCase
