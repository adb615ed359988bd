"""Per-model budgets in ``SlotPolicy``: each model paced by its own budget.

A model's throttle (configured, or learned from the figures of that
model's answers) is asked beside the provider's, for that model's tickets
only: a model it holds back blocks only itself, the other models' tickets
still go, nobody of the model passes its held-back head, and ``wake_at``
is the first instant any held-back model (or the provider) is ready.
"""

from __future__ import annotations

import itertools

import pytest

from trio_dispatch import Budget, QueueFull, Quota, RateLimitInfo, Tenant
from trio_dispatch._policy._budgets import FORGET_AFTER
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket

ONE_PER_MINUTE = Budget(requests_per_minute=1)


def wake_at(policy: SlotPolicy) -> float | None:
    """The policy's ``wake_at``, read afresh (not narrowed by an earlier assert)."""
    return policy.wake_at


class Tickets:
    """Fresh tickets in arrival order."""

    def __init__(self) -> None:
        self.seq = itertools.count()

    def __call__(
        self, rank: float, model: str | None = None, tenant: str | None = None
    ) -> Ticket:
        return Ticket(float(rank), next(self.seq), 0, tenant, model)


def test_a_held_back_model_does_not_block_another() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    slow0, slow1, fast2, none3 = t(0, "slow"), t(1, "slow"), t(2, "fast"), t(3)
    assert policy.acquire(slow0) == [slow0]
    assert policy.acquire(slow1) == []  # its minute's request is spent
    assert policy.acquire(fast2) == [fast2]  # younger, of another model
    assert policy.acquire(none3) == [none3]  # and of none
    assert wake_at(policy) == 60.0
    stats = policy.model_budget_statistics()
    assert set(stats) == {"slow"}
    assert stats["slow"].waiting_for_budget
    assert policy.budget_statistics() is None  # the provider has none
    assert policy.tick(59.0) == []
    assert policy.tick(60.0) == [slow1]
    assert wake_at(policy) is None


def test_within_a_model_nobody_passes_its_held_back_head() -> None:
    # 100 tokens a minute: the head needs 80 of the 20 left, 36 s away;
    # a younger request of 10 tokens fits, but waits behind it.
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    big0, big1, small2 = t(0, "m"), t(1, "m"), t(2, "m")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    assert policy.acquire(small2, 10) == []
    assert wake_at(policy) == 36.0
    assert policy.tick(36.0) == [big1]
    # 10 tokens are missing for small2 now: 6 s.
    assert wake_at(policy) == 42.0
    assert policy.tick(42.0) == [small2]


def test_an_older_ticket_of_the_model_may_become_its_head() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    policy.acquire(t(0, "m"), 80)
    young = t(9, "m")
    assert policy.acquire(young, 80) == []
    old = t(1, "m")  # an older turn's retry: the new head, and it fits
    assert policy.acquire(old, 10) == [old]
    assert policy.waiters() == [young]


def test_the_provider_budget_still_blocks_every_model() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4,
        throttle=Throttle(ONE_PER_MINUTE),
        models={"fast": Throttle(Budget(requests_per_minute=600))},
    )
    policy.advance(0.0)
    first, fast1, none2 = t(0, "fast"), t(1, "fast"), t(2)
    assert policy.acquire(first) == [first]
    assert policy.acquire(fast1) == []
    assert policy.acquire(none2) == []  # nobody passes the provider's head
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [fast1]
    assert wake_at(policy) == 120.0
    stats = policy.model_budget_statistics()
    assert stats["fast"].requests_available == 599.0  # full again at 60, less 1


def test_wake_at_is_the_first_held_back_model_ready() -> None:
    t = Tickets()
    policy = SlotPolicy(
        5,
        models={
            "a": Throttle(Budget(requests_per_minute=1)),
            "b": Throttle(Budget(requests_per_minute=2)),
        },
    )
    policy.advance(0.0)
    a0, b1, b2, a3, b4 = t(0, "a"), t(1, "b"), t(2, "b"), t(3, "a"), t(4, "b")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(b1) == [b1]
    assert policy.acquire(b2) == [b2]
    assert policy.acquire(a3) == []
    assert policy.acquire(b4) == []
    # b refills 1 request in 30 s, a in 60 s.
    assert wake_at(policy) == 30.0
    assert policy.tick(30.0) == [b4]
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [a3]
    assert wake_at(policy) is None


def test_no_wake_up_for_a_model_while_no_slot_is_free() -> None:
    t = Tickets()
    policy = SlotPolicy(2, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    slow0, slow1, fast2 = t(0, "slow"), t(1, "slow"), t(2, "fast")
    policy.acquire(slow0)
    policy.acquire(slow1)
    assert wake_at(policy) == 60.0
    assert policy.acquire(fast2) == [fast2]
    # Both slots are held: a release looks again, no timer needed.
    assert wake_at(policy) is None
    policy.advance(61.0)
    assert policy.release(fast2) == [slow1]


def test_figures_for_a_model_teach_that_model_only() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
    assert policy.observe_rate_limits(0.0, info, model="m") == []
    assert policy.budget_statistics() is None
    stats = policy.model_budget_statistics()
    assert set(stats) == {"m"}
    assert stats["m"].learned
    assert stats["m"].requests_per_minute == 60.0
    m0, other1 = t(0, "m"), t(1, "other")
    assert policy.acquire(m0) == []  # none left: 1 s to the next
    assert policy.acquire(other1) == [other1]
    assert wake_at(policy) == 1.0
    assert policy.tick(1.0) == [m0]


def test_figures_without_a_model_teach_the_provider() -> None:
    policy = SlotPolicy(4)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=60.0))
    policy.observe_rate_limits(0.0, info)
    assert policy.model_budget_statistics() == {}
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.requests_available == 10.0


def test_a_budget_set_at_run_time_applies_to_the_waiting() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
    policy.observe_rate_limits(0.0, info, model="m")
    m0 = t(0, "m")
    assert policy.acquire(m0) == []
    # A configured budget replaces the learned one; it starts full.
    assert policy.set_model_budget("m", Budget(requests_per_minute=5)) == [m0]
    stats = policy.model_budget_statistics()["m"]
    assert (stats.requests_per_minute, stats.requests_available) == (5.0, 4.0)
    # A new model's budget too.
    assert policy.set_model_budget("n", ONE_PER_MINUTE) == []
    n1, n2 = t(1, "n"), t(2, "n")
    assert policy.acquire(n1) == [n1]
    assert policy.acquire(n2) == []


def test_usage_given_back_lets_the_model_head_through() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    big0, big1 = t(0, "m"), t(1, "m")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    # big0 used only 10 of its 80: 70 come back, and big1 fits.
    assert policy.report_usage(big0, 10) == [big1]


def test_models_and_tenants_together() -> None:
    # b has the least counter, but its head is of the held-back model: a's
    # ticket takes the slot; b's younger ticket, of another model, goes
    # before a's next.
    t = Tickets()
    policy = SlotPolicy(2, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    a0, spent = t(0, "fast", "a"), t(1, "slow", "c")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(spent) == [spent]
    policy.advance(1.0)
    b2 = t(2, "slow", "b")
    assert policy.acquire(b2) == []
    policy.advance(3.0)
    a4 = t(4, "fast", "a")
    assert policy.acquire(a4) == []
    stats = policy.tenant_statistics()
    assert (stats["a"].service, stats["b"].service) == (3.0, 0.0)
    policy.advance(4.0)
    assert policy.release(spent) == [a4]
    b5 = t(5, "fast", "b")
    assert policy.acquire(b5) == []
    assert wake_at(policy) is None  # no slot free: a release looks again
    policy.advance(5.0)
    assert policy.release(a0) == [b5]
    assert policy.waiters() == [b2]
    policy.advance(6.0)
    assert policy.release(a4) == []
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [b2]


def test_an_answer_for_a_model_makes_its_next_figures_the_newest() -> None:
    # The figures of the answer of a request granted after the latest
    # figures may raise the learned level (see _budgets), for a model too.
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    first = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=60.0))
    policy.observe_rate_limits(0.0, first, model="m")
    m0 = t(0, "m")
    assert policy.acquire(m0) == [m0]
    policy.answered(m0)
    later = RateLimitInfo(requests=Quota(limit=60, remaining=50, reset=60.0))
    policy.observe_rate_limits(0.0, later, model="m")
    assert policy.model_budget_statistics()["m"].requests_available == 50.0


def test_queue_full_refuses_a_newcomer_held_back_by_a_budget() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4,
        max_waiting=1,
        throttle=Throttle(Budget(tokens_per_minute=100)),
        models={"slow": Throttle(ONE_PER_MINUTE)},
        tenants={"a": Tenant()},
    )
    policy.advance(0.0)
    slow0, slow1 = t(0, "slow"), t(1, "slow")
    assert policy.acquire(slow0, 1) == [slow0]
    assert policy.acquire(slow1) == []
    # The queue is full: a newcomer of the held-back model is refused...
    with pytest.raises(QueueFull):
        policy.acquire(t(2, "slow"))
    # ...and so is one the provider's tokens do not hold (99 left).
    with pytest.raises(QueueFull):
        policy.acquire(t(3, "fast"), 100)
    # One that may go, goes.
    fast4 = t(4, "fast")
    assert policy.acquire(fast4, 50) == [fast4]
    assert policy.statistics().rejected_total == 2


def test_withdrawing_the_head_the_provider_holds_back_lets_the_next_go() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4, throttle=Throttle(Budget(tokens_per_minute=100)), tenants={"a": Tenant()}
    )
    policy.advance(0.0)
    big0, big1, small2 = t(0, "m", "a"), t(1, "m", "a"), t(2, "m", "a")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    assert policy.acquire(small2, 10) == []  # nobody passes the held-back head
    assert wake_at(policy) == 36.0
    assert policy.cancel(big1) == [small2]
    assert wake_at(policy) is None


def test_a_pause_outlasts_a_held_back_model() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    policy.acquire(t(0, "slow"))
    policy.acquire(t(1, "slow"))
    assert wake_at(policy) == 60.0
    policy.pause(90.0)
    assert wake_at(policy) == 90.0
    assert policy.tick(60.0) == []
    assert wake_at(policy) == 90.0


def test_model_throttles_are_checked_by_the_constructor() -> None:
    with pytest.raises(TypeError, match=r"^throttle of 'm' must be a Throttle, got 5$"):
        SlotPolicy(1, models={"m": 5})  # type: ignore[dict-item]  # on purpose
    with pytest.raises(ValueError, match=r"^model must be a non-empty string, got ''$"):
        SlotPolicy(1, models={"": Throttle()})


# Learned budgets are forgotten once their model is idle and they are full.


def per_minute(limit: int, remaining: int, reset: float | None = None) -> RateLimitInfo:
    """Request figures: ``limit`` a minute, ``remaining`` left."""
    return RateLimitInfo(requests=Quota(limit=limit, remaining=remaining, reset=reset))


def test_a_learned_model_budget_is_forgotten_once_idle_for_a_while_and_full() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    # Half of 10 a minute left: full again 30 s later, at 30.
    policy.observe_rate_limits(0.0, per_minute(10, 5), "m")
    ticket = t(0, "m")
    assert policy.acquire(ticket) == [ticket]
    policy.advance(1.0)
    policy.release(ticket)
    assert FORGET_AFTER == 60.0
    policy.advance(60.75)  # idle since 1: not for long enough yet
    assert set(policy.model_budget_statistics()) == {"m"}
    assert policy.throttled
    assert policy.model_budget_statistics(61.0) == {}  # as it would be then
    policy.advance(61.0)
    assert policy.model_budget_statistics() == {}
    assert not policy.throttled  # no throttle left, of a model or the provider


def test_a_learned_model_budget_is_kept_until_its_buckets_are_full_again() -> None:
    policy = SlotPolicy(4)
    policy.advance(0.0)
    # 600 a minute, none left, the whole back in an hour: 1 every 6 s.
    policy.observe_rate_limits(0.0, per_minute(600, 0, reset=3600.0), "m")
    policy.advance(3599.0)
    [stats] = policy.model_budget_statistics().values()
    assert stats.requests_available == pytest.approx(3599 / 6)
    policy.advance(3600.0)
    assert policy.model_budget_statistics() == {}


def test_a_configured_model_budget_is_never_forgotten() -> None:
    policy = SlotPolicy(4, models={"c": Throttle(Budget(requests_per_minute=10))})
    policy.set_model_budget("d", Budget(tokens_per_minute=100))
    policy.observe_rate_limits(0.0, per_minute(10, 5), "c")
    policy.observe_rate_limits(0.0, per_minute(10, 5), "d")
    # Learned first, configured later: kept too.
    policy.observe_rate_limits(0.0, per_minute(10, 5), "e")
    policy.set_model_budget("e", Budget(requests_per_minute=20))
    for hour in range(1, 11):
        policy.advance(3600.0 * hour)
    assert set(policy.model_budget_statistics()) == {"c", "d", "e"}


def test_a_model_with_waiters_or_holders_is_never_forgotten() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(10, 10), "held")
    policy.observe_rate_limits(0.0, per_minute(10, 10), "waits")
    held = t(0, "held")
    assert policy.acquire(held) == [held]  # holds the only slot for hours
    waiter = t(1, "waits")
    assert policy.acquire(waiter) == []
    policy.advance(7200.0)
    assert set(policy.model_budget_statistics()) == {"waits", "held"}
    assert policy.release(held) == [waiter]
    policy.advance(14400.0)  # "held" idle since 7200, "waits" holds
    assert set(policy.model_budget_statistics()) == {"waits"}
    assert policy.release(waiter) == []
    policy.advance(14459.75)
    assert set(policy.model_budget_statistics()) == {"waits"}
    policy.advance(14460.0)
    assert policy.model_budget_statistics() == {}


def test_a_waiter_withdrawn_leaves_its_model_idle_from_then() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    other = t(0)
    assert policy.acquire(other) == [other]
    policy.observe_rate_limits(0.0, per_minute(10, 10), "m")
    waiter = t(1, "m")
    assert policy.acquire(waiter) == []
    policy.advance(100.0)
    assert policy.cancel(waiter) == []
    policy.advance(159.75)
    assert set(policy.model_budget_statistics()) == {"m"}
    policy.advance(160.0)
    assert policy.model_budget_statistics() == {}


def test_a_forgotten_model_that_reports_again_is_learned_afresh() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(10, 0), "m")  # 60 s to full
    policy.advance(60.0)
    assert policy.model_budget_statistics() == {}
    ticket = t(1, "m")
    assert policy.acquire(ticket) == [ticket]  # no budget left to ask
    policy.observe_rate_limits(60.0, per_minute(20, 15), "m")
    [stats] = policy.model_budget_statistics().values()
    assert (stats.requests_per_minute, stats.requests_available) == (20.0, 15.0)
    assert stats.learned


def test_figures_for_an_idle_model_move_when_it_is_forgotten() -> None:
    policy = SlotPolicy(4)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(60, 60), "m")  # full
    policy.observe_rate_limits(30.0, per_minute(60, 0), "m")  # empty: full at 90
    policy.advance(89.75)
    assert set(policy.model_budget_statistics()) == {"m"}
    policy.advance(90.0)
    assert policy.model_budget_statistics() == {}


def test_a_grant_looks_only_at_the_throttles_of_the_models_it_meets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3,000 models seen once, idle: a grant for another costs what it did."""
    touched: list[set[int]] = [set()]

    def counting(name: str) -> None:
        method = getattr(Throttle, name)

        def counted(self: Throttle, *args: object, **kwargs: object) -> object:
            touched[-1].add(id(self))
            return method(self, *args, **kwargs)

        monkeypatch.setattr(Throttle, name, counted)

    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    for k in range(3000):
        ticket = t(k, f"ft-{k}")
        assert policy.acquire(ticket) == [ticket]
        policy.observe_rate_limits(0.0, per_minute(100, 99), f"ft-{k}")
        policy.release(ticket)
    policy.observe_rate_limits(0.0, per_minute(10**6, 10**6), "other")
    for name in [n for n in vars(Throttle) if not n.startswith("_")]:
        if callable(getattr(Throttle, name)):
            counting(name)
    now = 1.0
    for k in range(200):
        # One batch of the actor: the time, then what arrived.
        touched.append(set())
        policy.advance(now)
        ticket = t(3000 + k, "other")
        assert policy.acquire(ticket) == [ticket]
        now += 0.25
        policy.advance(now)
        assert policy.release(ticket) == []
    assert max(len(ids) for ids in touched[1:]) == 1
