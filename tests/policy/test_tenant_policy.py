"""The tenant rule of ``SlotPolicy``: exact grant orders, hand-computed.

Each scenario gives every tenant's tickets and how long each slot is held,
and checks the grants one by one against the order worked out by hand
from the rule (see ``SlotPolicy``'s docstring): the next free slot goes to
the backlogged tenant with the least service counter (slot-seconds over
its weight), ties to the fewest slots held for its weight, then to the
oldest head. Times and weights are chosen so that every counter is exact.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

import pytest

from trio_dispatch import Budget, QueueFull, Tenant
from trio_dispatch._policy._tenants import TenantState
from trio_dispatch.lowlevel import SlotPolicy, Ticket

if TYPE_CHECKING:
    from collections.abc import Callable


class Tickets:
    """Tickets numbered in arrival order, named ``a1``, ``b2``... for the asserts."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.names: dict[Ticket, str] = {}

    def __call__(
        self,
        rank: float,
        tenant: str | None = None,
        name: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        ticket = Ticket(float(rank), next(self.seq), 0, tenant, model)
        self.names[ticket] = name or f"{tenant}{rank}"
        return ticket


def needs_clock(policy: SlotPolicy) -> bool:
    """The policy's ``needs_clock``, read afresh (not narrowed by an earlier assert)."""
    return policy.needs_clock


def serve(
    policy: SlotPolicy, tickets: Tickets, queued: list[Ticket], hold: float
) -> list[str]:
    """Queue ``queued`` at 0; every grant holds ``hold`` s; the names in grant order.

    Slots are given back in the order they were granted, each ``hold``
    seconds after its grant, until nothing waits or holds.
    """
    policy.advance(0.0)
    held: list[tuple[float, Ticket]] = []
    order: list[str] = []

    def granted(grants: list[Ticket], now: float) -> None:
        for ticket in grants:
            held.append((now + hold, ticket))
            order.append(tickets.names[ticket])

    for ticket in queued:
        granted(policy.acquire(ticket), 0.0)
    while held:
        held.sort()
        until, ticket = held.pop(0)
        policy.advance(until)
        granted(policy.release(ticket), until)
    return order


def test_equal_weights_alternate_between_tenants() -> None:
    # a1 goes at once; a's others and b's all join at the floor 0. At 1, a
    # has 1 slot-second, b none: b1. Then each has the same, and the older
    # head breaks the tie: a2, then b2 (a has 2 against b's 1)...
    t = Tickets()
    policy = SlotPolicy(1)
    queued = [t(0, "a"), t(1, "a"), t(2, "a"), t(3, "b"), t(4, "b"), t(5, "b")]
    order = serve(policy, t, queued, hold=1.0)
    assert order == ["a0", "b3", "a1", "b4", "a2", "b5"]


def test_oldest_first_alone_gives_the_older_tenant_everything_first() -> None:
    # The same tickets without tenants: ticket order.
    t = Tickets()
    policy = SlotPolicy(1)
    queued = [t(0), t(1), t(2), t(3), t(4), t(5)]
    order = serve(policy, t, queued, hold=1.0)
    assert order == ["None0", "None1", "None2", "None3", "None4", "None5"]


def test_weights_three_to_one_give_three_slots_to_one() -> None:
    # Holds of 3 s: a (weight 3) gains 1 per slot, b (weight 1) gains 3.
    # At 3: a 1, b 0: b10. At 6: a 1 < b 3: a1, at 9 a2 (a 2), at 12 a
    # ties b at 3 and its head is older: a3; at 15 a 4 > 3: b11; then a4,
    # a5, a6 (the last on a tie at 6), and b12.
    t = Tickets()
    policy = SlotPolicy(1, tenants={"a": Tenant(weight=3.0)})
    queued = [t(rank, "a") for rank in range(7)] + [
        t(rank, "b") for rank in (10, 11, 12)
    ]
    order = serve(policy, t, queued, hold=3.0)
    assert order == ["a0", "b10", "a1", "a2", "a3", "b11", "a4", "a5", "a6", "b12"]
    stats = policy.tenant_statistics(27.0)
    assert stats["a"].service == 7.0  # 21 slot-seconds over weight 3
    assert stats["a"].weight == 3.0
    assert "b" not in stats  # unconfigured and idle: forgotten


def test_ties_on_service_go_to_the_tenant_holding_less_for_its_weight() -> None:
    # a0 and a1 go at once; the limit goes down to 2, and a2 and b5 wait,
    # b at a's counter, 0. When a0 leaves at once, both counters are 0, and
    # b5 goes before the older a2: a still holds a slot, b none.
    t = Tickets()
    policy = SlotPolicy(3)
    policy.advance(0.0)
    a0, a1, a2, b5 = t(0, "a"), t(1, "a"), t(2, "a"), t(5, "b")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(a1) == [a1]
    assert policy.set_limit(2) == []
    assert policy.acquire(a2) == []
    assert policy.acquire(b5) == []
    assert policy.release(a0) == [b5]


def test_a_cap_leaves_a_slot_free_rather_than_exceed_it() -> None:
    t = Tickets()
    policy = SlotPolicy(3, tenants={"a": Tenant(limit=1)})
    policy.advance(0.0)
    a0, a1, a2, b5 = t(0, "a"), t(1, "a"), t(2, "a"), t(5, "b")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(a1) == []
    assert policy.acquire(a2) == []
    assert policy.acquire(b5) == [b5]
    assert (policy.in_flight, policy.waiting) == (2, 2)
    stats = policy.tenant_statistics()
    assert (stats["a"].in_flight, stats["a"].waiting, stats["a"].limit) == (1, 2, 1)
    policy.advance(1.0)
    assert policy.release(a0) == [a1]


def test_lowering_a_cap_lets_holders_finish_and_raising_it_grants() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    held = [t(rank, "a") for rank in range(3)]
    for ticket in held:
        assert policy.acquire(ticket) == [ticket]
    assert policy.set_tenant("a", Tenant(limit=1)) == []
    assert policy.in_flight == 3  # nobody is taken a slot from
    waiting = t(3, "a")
    assert policy.acquire(waiting) == []
    assert policy.release(held[0]) == []
    assert policy.release(held[1]) == []  # still 1 held: at the cap
    assert policy.set_tenant("a", Tenant(limit=2)) == [waiting]
    assert policy.in_flight == 2


def test_a_tenant_that_starts_waiting_is_raised_to_the_floor() -> None:
    # a holds one slot from 0 and has another waiting: its counter grows.
    # b arrives at 4 and starts from a's counter, 4, not from 0.
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    a0, a1 = t(0, "a"), t(1, "a")
    policy.acquire(a0)
    policy.acquire(a1)
    policy.advance(4.0)
    b9 = t(9, "b")
    policy.acquire(b9)
    stats = policy.tenant_statistics()
    assert (stats["a"].service, stats["b"].service) == (4.0, 4.0)
    policy.advance(5.0)
    assert policy.release(a0) == [b9]  # a has 5 now, b 4


def test_idle_time_is_not_banked() -> None:
    # a is configured, so remembered, and idle while b takes 10 slot-seconds.
    # When a comes back it is raised to b's counter: it alternates with b
    # instead of taking the next 10 slots.
    t = Tickets()
    policy = SlotPolicy(1, tenants={"a": Tenant()})
    queued = [t(rank, "b") for rank in range(10)]
    order = serve(policy, t, queued, hold=1.0)
    assert len(order) == 10
    now = 10.0
    policy.advance(now)
    b = [t(rank, "b") for rank in range(20, 24)]
    a = [t(rank, "a") for rank in range(30, 33)]
    first = b[0]
    assert policy.acquire(first) == [first]
    for ticket in [*b[1:], *a]:
        assert policy.acquire(ticket) == []
    # b was forgotten when idle, and came back from the counter it left
    # with at 9 (its last grant); a joins at b's counter, 9, not at its 0.
    stats = policy.tenant_statistics()
    assert (stats["a"].service, stats["b"].service) == (9.0, 9.0)
    order = []
    holder: Ticket | None = first
    while holder is not None:
        now += 1.0
        policy.advance(now)
        grants = policy.release(holder)
        holder = grants[0] if grants else None
        if holder is not None:
            order.append(t.names[holder])
    assert order == ["a30", "b21", "a31", "b22", "a32", "b23"]


def test_a_weight_changed_at_run_time_counts_from_then() -> None:
    t = Tickets()
    policy = SlotPolicy(1, tenants={"a": Tenant(weight=1.0)})
    policy.advance(0.0)
    a0 = t(0, "a")
    policy.acquire(a0)
    policy.advance(2.0)
    assert policy.set_tenant("a", Tenant(weight=2.0)) == []
    policy.advance(4.0)
    # 2 s at weight 1, then 2 s at weight 2.
    assert policy.tenant_statistics()["a"].service == 3.0
    assert policy.tenant_statistics(6.0)["a"].service == 4.0


def test_removing_a_tenant_goes_back_to_the_defaults() -> None:
    t = Tickets()
    policy = SlotPolicy(2, tenants={"a": Tenant(weight=2.0, limit=1)})
    policy.advance(0.0)
    a0 = t(0, "a")
    policy.acquire(a0)
    assert policy.tenants() == {"a": Tenant(weight=2.0, limit=1)}
    policy.advance(2.0)
    a1 = t(1, "a")
    assert policy.acquire(a1) == []  # capped at 1
    assert policy.set_tenant("a", None) == [a1]  # no cap any more
    assert policy.tenants() == {}
    shown = policy.tenant_statistics()["a"]
    assert (shown.weight, shown.limit, shown.service) == (1.0, None, 1.0)


# A policy that counts no tenant stays on its default path when told to forget one.
def test_forgetting_a_tenant_counts_no_tenant() -> None:
    policy = SlotPolicy(1)
    assert policy.set_tenant("acme", None) == []
    assert (policy.needs_clock, policy.counts_tenants) == (False, False)
    # The default path still: one grant, the next waits in ticket order.
    assert policy.acquire(Ticket(0.0, 0)) == [Ticket(0.0, 0)]
    assert policy.acquire(Ticket(1.0, 1)) == []
    assert policy.release(Ticket(0.0, 0)) == [Ticket(1.0, 1)]
    assert policy.tenant_statistics(0.0) == {}


def test_unconfigured_tenants_are_forgotten_when_idle() -> None:
    t = Tickets()
    policy = SlotPolicy(2, tenants={"kept": Tenant()})
    policy.advance(0.0)
    z = t(0, "z")
    policy.acquire(z)
    assert set(policy.tenant_statistics()) == {"kept", "z"}
    policy.advance(3.0)
    policy.release(z)
    assert set(policy.tenant_statistics()) == {"kept"}
    # It comes back from the floor: the counter it left with, at 0.
    z1 = t(1, "z")
    assert policy.acquire(z1) == [z1]
    assert policy.tenant_statistics()["z"].service == 0.0


def test_a_withdrawn_waiter_leaves_no_trace() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    a0, z1 = t(0, "a"), t(1, "z")
    policy.acquire(a0)
    policy.acquire(z1)
    assert policy.cancel(z1) == []
    assert set(policy.tenant_statistics()) == {"a"}
    assert (policy.waiting, policy.statistics().withdrawn_total) == (0, 1)


def test_one_tenant_keeps_the_order_of_tickets() -> None:
    # Ranks out of order (older turns' retries) and equal ranks: a single
    # named tenant is granted exactly as the policy without tenants.
    ranks = [5, 3, 9, 3, 1, 7, 7, 0, 4, 2]
    orders = []
    for tenant in (None, "only"):
        t = Tickets()
        policy = SlotPolicy(2)
        orders.append(serve(policy, t, [t(r, tenant, str(r)) for r in ranks], 1.5))
    assert orders[0] == orders[1]
    assert orders[0] == ["5", "3", "0", "1", "2", "3", "4", "7", "7", "9"]


def test_the_default_tenant_shares_like_any_other() -> None:
    # Tickets without a tenant are the default tenant's (weight 1): beside
    # a named one they alternate as two named ones would, and it is not
    # shown in the statistics.
    t = Tickets()
    policy = SlotPolicy(1)
    queued = [t(0), t(1), t(2), t(3, "a"), t(4, "a"), t(5, "a")]
    order = serve(policy, t, queued, hold=1.0)
    assert order == ["None0", "a3", "None1", "a4", "None2", "a5"]
    assert policy.needs_clock


def test_the_clock_is_needed_only_once_tenants_are_counted() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.acquire(t(0))
    policy.acquire(t(1, model="m"))
    assert not needs_clock(policy)
    policy.acquire(t(2, "a"))
    assert needs_clock(policy)
    assert SlotPolicy(1, tenants={"a": Tenant()}).needs_clock


def test_queue_full_counts_only_those_that_would_wait() -> None:
    t = Tickets()
    policy = SlotPolicy(2, max_waiting=1, tenants={"a": Tenant(limit=1)})
    policy.advance(0.0)
    a0, a1, b2, c3 = t(0, "a"), t(1, "a"), t(2, "b"), t(3, "c")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(a1) == []  # a is at its cap: it waits
    assert policy.acquire(b2) == [b2]  # the queue is full, but a slot is free
    with pytest.raises(QueueFull, match=r"^1 request already waits \(max_waiting=1\)$"):
        policy.acquire(c3)
    assert (policy.waiting, policy.statistics().rejected_total) == (1, 1)
    assert set(policy.tenant_statistics()) == {"a", "b"}


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda p: p.set_tenant(1, Tenant()),
            TypeError,
            "tenant must be a non-empty string, got 1",
        ),
        (
            lambda p: p.set_tenant("", Tenant()),
            ValueError,
            "tenant must be a non-empty string, got ''",
        ),
        (
            lambda p: p.set_tenant("x" * 257, Tenant()),
            ValueError,
            "tenant must be at most 256 characters, got one of 257",
        ),
        (
            lambda p: p.set_tenant("a", 2.0),
            TypeError,
            "settings must be a Tenant or None, got 2.0",
        ),
        (
            lambda p: p.set_model_budget("", Budget()),
            ValueError,
            "model must be a non-empty string, got ''",
        ),
        (
            lambda p: p.set_model_budget(None, Budget()),
            TypeError,
            "model must be a non-empty string, got None",
        ),
        (
            lambda p: p.set_model_budget("m", 60),
            TypeError,
            "budget must be a Budget, got 60",
        ),
    ],
)
def test_bad_input_is_refused_at_the_call(
    call: object, error: type[Exception], message: str
) -> None:
    policy = SlotPolicy(1)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(policy)  # type: ignore[operator]  # each lambda takes the policy
    assert not policy.needs_clock
    assert policy.tenants() == {}
    assert policy.model_budget_statistics() == {}


def test_bad_tenants_are_refused_by_the_constructor() -> None:
    with pytest.raises(TypeError, match=r"^settings must be a Tenant or None, got 2$"):
        SlotPolicy(1, tenants={"a": 2})  # type: ignore[dict-item]  # the wrong type on purpose
    with pytest.raises(TypeError, match=r"^tenant must be a non-empty string, got 3$"):
        SlotPolicy(1, tenants={3: Tenant()})  # type: ignore[dict-item]  # the wrong type on purpose


def test_many_withdrawn_waiters_are_swept_and_the_order_kept() -> None:
    # 300 of a's 400 waiters leave: the heaps are rebuilt from the living
    # (dead entries outnumber them), and the grants keep ticket order,
    # alternating with b as before.
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    holder = t(-1, "b")
    assert policy.acquire(holder) == [holder]
    a = [t(rank, "a") for rank in range(400)]
    for ticket in a:
        policy.acquire(ticket)
    b = [t(rank, "b") for rank in range(1000, 1003)]
    for ticket in b:
        policy.acquire(ticket)
    for ticket in a:
        if ticket.rank % 4:
            assert policy.cancel(ticket) == []
    assert policy.waiting == 103
    order = []
    for now in range(1, 8):
        policy.advance(float(now))
        (holder,) = policy.release(holder)
        order.append(t.names[holder])
    # b's holder makes b's counter 1 at 1: a0; then ties go to a's older
    # heads, and each lead goes to the other.
    assert order == ["a0", "a4", "b1000", "a8", "b1001", "a12", "b1002"]


class Looks:
    """Counts how often the policy looks at a tenant: its counter or its head.

    Choosing a tenant, and finding the floor one joins at, reads tenants'
    counters (``TenantState.service``) and heads (``TenantState.head``); a
    scan of every backlogged tenant per grant or per arrival reads them
    once per tenant, so N tenants cost N * N looks where a heap costs a
    few per operation.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("service", "head"):
            method = getattr(TenantState, name)
            monkeypatch.setattr(TenantState, name, self._counted(method))

    def _counted(self, method: Callable[..., object]) -> Callable[..., object]:
        def counted(*args: object) -> object:
            self.count += 1
            return method(*args)

        return counted


def test_many_tenants_cost_a_few_looks_per_arrival_and_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thousand users nobody configured, one request each, behind four
    # slots held by another tenant: each arrival joins at the floor and
    # each slot given back is granted to one of them, in ticket order.
    n = 1000
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    plugs = [t(-1, "plug", f"plug{i}") for i in range(4)]
    for plug in plugs:
        assert policy.acquire(plug) == [plug]
    users = [t(rank, f"u{rank}") for rank in range(n)]
    looks = Looks(monkeypatch)
    for ticket in users:
        assert policy.acquire(ticket) == []
    arrivals = looks.count
    looks.count = 0
    granted: list[Ticket] = []
    holders = list(plugs)
    now = 0.0
    while holders:
        now += 1.0
        policy.advance(now)
        grants = policy.release(holders.pop(0))
        granted += grants
        holders += grants
    assert granted == users  # every counter equal: ticket order
    # A few looks each (a fold reads the counter too); a scan of the
    # backlogged would take n * n / 2 in all.
    assert arrivals <= 8 * n, f"{arrivals} looks for {n} arrivals"
    assert looks.count <= 8 * n, f"{looks.count} looks for {n} grants"


def test_tenants_holding_slots_cost_looks_bounded_by_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 500 tenants of three requests each, served by 8 slots held for 1 to
    # 3 s: the counters of the tenants that hold slots move between grants,
    # and only those need looking at again, at most one per slot.
    n, limit = 500, 8
    t = Tickets()
    policy = SlotPolicy(limit)
    policy.advance(0.0)
    looks = Looks(monkeypatch)
    held: list[tuple[float, Ticket]] = []
    for rank in range(3 * n):
        ticket = t(rank, f"u{rank % n}")
        held += [(1.0 + rank % 3, grant) for grant in policy.acquire(ticket)]
    grants = len(held)
    while held:
        held.sort()
        until, ticket = held.pop(0)
        policy.advance(until)
        for grant in policy.release(ticket):
            held.append((until + 1.0 + grant.rank % 3, grant))
            grants += 1
    assert grants == 3 * n
    assert looks.count <= 2 * (limit + 2) * grants, f"{looks.count} looks"
