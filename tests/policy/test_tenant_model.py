"""The tenant rule of ``SlotPolicy`` against a small reference model.

A hypothesis state machine drives the policy with random arrivals (random
tenants, models and ranks), releases, cancellations, weight and cap
changes, tenants removed, limit changes, pauses and time, and holds it to
``TenantModel``: the rule of the design written out the obvious way, in
exact fractions, with no incremental state to get wrong (every counter is
``base + (held * now - sum of the holders' starts) / weight``, every
selection a scan of every waiting ticket). Weights are powers of two and
times integers, so the policy's floats are exact and equal the model's
fractions: the grants must be the same, in the same order, and so must the
service counters.

Checked after every step: the same grants in the same order; the same
holders, waiters and counters; work-conserving (no free slot while a
waiter's tenant is below its cap, unless paused); no grant to a tenant at
its cap; oldest first within a tenant; and, in runs that set no cap, the
service-gap bound of the policy's docstring: every backlogged tenant f has
``c_f <= m + L * H / w_f``, with m the least counter among the backlogged,
L the highest limit of the run, H the longest hold observed so far (holds
still running count with their age), and w_f the least weight f had.
"""

from __future__ import annotations

import math
import os
import random
from fractions import Fraction
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_dispatch import Budget, Tenant
from trio_dispatch._policy._tenants import Tenants
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket

TENANTS = (None, "a", "b", "c")
NAMED = ("a", "b", "c")
MODELS = (None, "x", "y")
WEIGHTS = (0.5, 1.0, 2.0, 4.0)


class _State:
    """One tenant in the model."""

    def __init__(self) -> None:
        self.weight = Fraction(1)
        self.cap: int | None = None
        self.configured = False
        self.base = Fraction(0)
        # Each holder's start of accrual: its grant, or the latest fold.
        self.starts: dict[Ticket, Fraction] = {}

    def service(self, now: Fraction) -> Fraction:
        held = len(self.starts)
        return self.base + (held * now - sum(self.starts.values(), Fraction(0))) / (
            self.weight
        )

    def fold(self, now: Fraction) -> None:
        self.base = self.service(now)
        for ticket in self.starts:
            self.starts[ticket] = now


class TenantModel:
    """The tenant rule, written out plainly (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.paused_until: Fraction | None = None
        self.counting = False  # the policy counts tenants from the first one
        self.states: dict[str | None, _State] = {}
        self.waiting: list[Ticket] = []
        self.holders: set[Ticket] = set()
        self.last_left = Fraction(0)

    def state(self, tenant: str | None) -> _State:
        if tenant not in self.states:
            self.states[tenant] = _State()
        return self.states[tenant]

    def waiting_of(self, tenant: str | None) -> list[Ticket]:
        return [ticket for ticket in self.waiting if ticket.tenant == tenant]

    def backlogged(self) -> list[str | None]:
        return sorted({ticket.tenant for ticket in self.waiting}, key=str)

    def start_counting(self, now: Fraction) -> None:
        if self.counting:
            return
        self.counting = True
        for ticket in self.holders:
            self.state(ticket.tenant).starts[ticket] = now
        if self.waiting:
            # Every waiter is the default tenant's: it joins at the floor 0.
            self.state(None)

    def drop_if_idle(self, tenant: str | None) -> None:
        state = self.states.get(tenant)
        if (
            state is not None
            and not state.configured
            and not state.starts
            and not self.waiting_of(tenant)
        ):
            del self.states[tenant]

    def join(self, tenant: str | None, now: Fraction) -> None:
        others = [t for t in self.backlogged() if t != tenant]
        if others:
            floor = min(self.state(t).service(now) for t in others)
        else:
            floor = self.last_left
        state = self.state(tenant)
        state.base += max(Fraction(0), floor - state.service(now))

    def leave(self, tenant: str | None, now: Fraction) -> None:
        self.last_left = self.state(tenant).service(now)

    def acquire(self, ticket: Ticket, now: Fraction) -> list[Ticket]:
        if ticket.tenant is not None:
            self.start_counting(now)
        if self.counting and not self.waiting_of(ticket.tenant):
            self.join(ticket.tenant, now)
        self.waiting.append(ticket)
        return self.fill(now)

    def may_grant(self) -> bool:
        return self.paused_until is None and len(self.holders) < self.limit

    def fill(self, now: Fraction) -> list[Ticket]:
        grants: list[Ticket] = []
        while self.waiting and self.may_grant():
            if not self.counting:
                ticket = min(self.waiting)
            else:
                keys = []
                for tenant in self.backlogged():
                    state = self.state(tenant)
                    if state.cap is not None and len(state.starts) >= state.cap:
                        continue
                    head = min(self.waiting_of(tenant))
                    keys.append(
                        (state.service(now), len(state.starts) / state.weight, head)
                    )
                if not keys:
                    break
                ticket = min(keys)[2]
            self.waiting.remove(ticket)
            self.holders.add(ticket)
            grants.append(ticket)
            if self.counting:
                self.state(ticket.tenant).starts[ticket] = now
                if not self.waiting_of(ticket.tenant):
                    self.leave(ticket.tenant, now)
        return grants

    def release(self, ticket: Ticket, now: Fraction) -> list[Ticket]:
        if ticket not in self.holders:
            return []
        self.holders.remove(ticket)
        if self.counting:
            state = self.state(ticket.tenant)
            state.fold(now)
            del state.starts[ticket]
            self.drop_if_idle(ticket.tenant)
        return self.fill(now)

    def cancel(self, ticket: Ticket, now: Fraction) -> list[Ticket]:
        if ticket not in self.waiting:
            return self.release(ticket, now)
        self.waiting.remove(ticket)
        if self.counting and not self.waiting_of(ticket.tenant):
            self.leave(ticket.tenant, now)
            self.drop_if_idle(ticket.tenant)
        return self.fill(now)

    def set_tenant(
        self, tenant: str, weight: float | None, cap: int | None, now: Fraction
    ) -> list[Ticket]:
        if weight is None and not self.counting:
            return []  # the defaults, where no tenant is counted: nothing
        self.start_counting(now)
        if weight is None:
            state = self.states.get(tenant)
            if state is not None:
                state.fold(now)
                state.weight, state.cap, state.configured = Fraction(1), None, False
                self.drop_if_idle(tenant)
        else:
            state = self.state(tenant)
            state.fold(now)
            state.weight, state.cap = Fraction(weight), cap
            state.configured = True
        return self.fill(now)

    def service(self, tenant: str | None, now: Fraction) -> Fraction:
        state = self.states.get(tenant)
        return Fraction(0) if state is None else state.service(now)


class TenantMachine(RuleBasedStateMachine):
    """``SlotPolicy`` step by step beside ``TenantModel``."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.seq = 0
        self.policy = SlotPolicy(2)
        self.model = TenantModel(2)
        self.caps_allowed = False
        self.capped = False
        self.highest_limit = 2
        self.granted_at: dict[Ticket, int] = {}
        self.longest_hold = 0
        self.least_weight: dict[str | None, Fraction] = {}

    @initialize(limit=st.integers(1, 4), caps=st.booleans())
    def start(self, limit: int, caps: bool) -> None:
        self.policy = SlotPolicy(limit)
        self.model = TenantModel(limit)
        self.highest_limit = limit
        self.caps_allowed = caps

    def _at(self) -> Fraction:
        self.policy.advance(float(self.now))
        return Fraction(self.now)

    def _check(self, got: list[Ticket], expected: list[Ticket]) -> None:
        assert got == expected
        for ticket in got:
            self.granted_at[ticket] = self.now

    def _check_grants_one_by_one(
        self, got: list[Ticket], waiting_before: list[Ticket], held_before: set[Ticket]
    ) -> None:
        """Each grant: its tenant below its cap, the oldest of its tenant."""
        waiting = list(waiting_before)
        held = set(held_before)
        for ticket in got:
            same = [w for w in waiting if w.tenant == ticket.tenant]
            assert ticket == min(same), "a younger ticket of a tenant went first"
            if self.model.counting:
                state = self.model.states.get(ticket.tenant)
                cap = None if state is None else state.cap
                mine = sum(1 for h in held if h.tenant == ticket.tenant)
                assert cap is None or mine < cap, "a grant above a tenant's cap"
            waiting.remove(ticket)
            held.add(ticket)

    @rule(
        rank=st.integers(0, 20),
        tenant=st.sampled_from(TENANTS),
        model=st.sampled_from(MODELS),
    )
    def arrive(self, rank: int, tenant: str | None, model: str | None) -> None:
        ticket = Ticket(float(rank), self.seq, 0, tenant, model)
        self.seq += 1
        now = self._at()
        waiting_before = [*self.model.waiting, ticket]
        held_before = set(self.model.holders)
        expected = self.model.acquire(ticket, now)
        got = self.policy.acquire(ticket)
        self._check(got, expected)
        self._check_grants_one_by_one(got, waiting_before, held_before)

    def _end_hold(self, ticket: Ticket) -> None:
        if ticket in self.granted_at:
            self.longest_hold = max(
                self.longest_hold, self.now - self.granted_at.pop(ticket)
            )

    @precondition(lambda self: self.model.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.model.holders)))
        now = self._at()
        waiting_before = list(self.model.waiting)
        held_before = self.model.holders - {ticket}
        self._end_hold(ticket)
        expected = self.model.release(ticket, now)
        got = self.policy.release(ticket)
        self._check(got, expected)
        self._check_grants_one_by_one(got, waiting_before, held_before)

    @precondition(lambda self: self.model.waiting or self.model.holders)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(
            st.sampled_from(sorted([*self.model.waiting, *self.model.holders]))
        )
        now = self._at()
        self._end_hold(ticket)
        expected = self.model.cancel(ticket, now)
        self._check(self.policy.cancel(ticket), expected)

    @rule(
        tenant=st.sampled_from(NAMED),
        weight=st.sampled_from(WEIGHTS),
        cap=st.none() | st.integers(1, 3),
    )
    def set_tenant(self, tenant: str, weight: float, cap: int | None) -> None:
        if not self.caps_allowed:
            cap = None
        self.capped = self.capped or cap is not None
        least = self.least_weight.get(tenant, Fraction(1))
        self.least_weight[tenant] = min(least, Fraction(weight))
        now = self._at()
        expected = self.model.set_tenant(tenant, weight, cap, now)
        got = self.policy.set_tenant(tenant, Tenant(weight=weight, limit=cap))
        self._check(got, expected)

    @rule(tenant=st.sampled_from(NAMED))
    def remove_tenant(self, tenant: str) -> None:
        now = self._at()
        expected = self.model.set_tenant(tenant, None, None, now)
        self._check(self.policy.set_tenant(tenant, None), expected)

    @rule(limit=st.integers(1, 4))
    def set_limit(self, limit: int) -> None:
        self.highest_limit = max(self.highest_limit, limit)
        now = self._at()
        self.model.limit = limit
        expected = self.model.fill(now)
        self._check(self.policy.set_limit(limit), expected)

    @rule(seconds=st.integers(1, 4))
    def pause(self, seconds: int) -> None:
        now = self._at()
        until = now + seconds
        if self.model.paused_until is None or until > self.model.paused_until:
            self.model.paused_until = until
        self.policy.pause(float(self.now + seconds))

    @rule()
    def resume(self) -> None:
        now = self._at()
        self.model.paused_until = None
        expected = self.model.fill(now)
        self._check(self.policy.resume(), expected)

    @rule(seconds=st.integers(0, 5))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        now = Fraction(self.now)
        expected: list[Ticket] = []
        paused_until = self.model.paused_until
        if paused_until is not None and now >= paused_until:
            self.model.paused_until = None
            expected = self.model.fill(now)
        self._check(self.policy.tick(float(self.now)), expected)

    @invariant()
    def matches_the_model(self) -> None:
        policy, model = self.policy, self.model
        assert policy.holders() == model.holders
        assert policy.waiters() == sorted(model.waiting)
        stats = policy.tenant_statistics(float(self.now))
        now = Fraction(self.now)
        named = {t for t in model.states if t is not None}
        assert set(stats) == named
        for tenant, shown in stats.items():
            state = model.states[tenant]
            assert shown.service == model.service(tenant, now)
            assert shown.weight == state.weight
            assert shown.limit == state.cap
            assert shown.in_flight == len(state.starts)
            assert shown.waiting == len(model.waiting_of(tenant))
        assert policy.needs_clock == model.counting

    @invariant()
    def work_conserving(self) -> None:
        model = self.model
        if not model.may_grant():
            return
        for ticket in model.waiting:
            state = model.states.get(ticket.tenant) if model.counting else None
            cap = None if state is None else state.cap
            held = sum(1 for h in model.holders if h.tenant == ticket.tenant)
            assert cap is not None, f"{ticket} waits by a free slot"
            assert held >= cap, f"{ticket} waits by a free slot"

    @invariant()
    def service_gap_within_the_bound(self) -> None:
        model = self.model
        if self.capped or not model.counting:
            return
        backlogged = model.backlogged()
        if not backlogged:
            return
        now = Fraction(self.now)
        running = [self.now - start for start in self.granted_at.values()]
        hold = max([self.longest_hold, *running])
        counters = {t: model.service(t, now) for t in backlogged}
        least = min(counters.values())
        for tenant, counter in counters.items():
            weight = self.least_weight.get(tenant, Fraction(1))
            assert counter <= least + self.highest_limit * hold / weight, (
                f"tenant {tenant!r}: {counter} > {least} + {self.highest_limit}"
                f" * {hold} / {weight}"
            )


TenantMachine.TestCase.settings = settings(
    max_examples=600 if os.environ.get("CI") else 400,
    stateful_step_count=60,
    deadline=None,
)
test_tenant_state_machine = TenantMachine.TestCase


RATES = {"x": 2.0, "y": 6.0}  # requests per minute of each model's budget


class BudgetedTenantMachine(RuleBasedStateMachine):
    """Tenants and per-model budgets together, held to the invariants.

    No reference model here (the budgets' refill is the throttle's own,
    tested in test_budgets and test_model_budgets): after every step, a
    waiter beside a free slot is capped or held back by its model's
    budget, and then ``wake_at`` comes no later than that budget's next
    request; every grant is below its tenant's cap and the oldest of its
    tenant and model.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.seq = 0
        self.policy = SlotPolicy(
            3,
            models={
                model: Throttle(Budget(requests_per_minute=rate))
                for model, rate in RATES.items()
            },
        )
        self.waiting: set[Ticket] = set()
        self.holders: set[Ticket] = set()
        self.caps: dict[str | None, int | None] = {}

    def _granted(self, grants: list[Ticket]) -> None:
        for ticket in grants:
            assert ticket in self.waiting
            same = [
                w
                for w in self.waiting
                if w.tenant == ticket.tenant and w.model == ticket.model
            ]
            assert ticket == min(same), "a ticket passed an older one of its model"
            cap = self.caps.get(ticket.tenant)
            mine = sum(1 for h in self.holders if h.tenant == ticket.tenant)
            assert cap is None or mine < cap, "a grant above a tenant's cap"
            self.waiting.remove(ticket)
            self.holders.add(ticket)

    @rule(
        rank=st.integers(0, 20),
        tenant=st.sampled_from(TENANTS),
        model=st.sampled_from(MODELS),
    )
    def arrive(self, rank: int, tenant: str | None, model: str | None) -> None:
        ticket = Ticket(float(rank), self.seq, 0, tenant, model)
        self.seq += 1
        self.policy.advance(float(self.now))
        self.waiting.add(ticket)
        self._granted(self.policy.acquire(ticket))

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.holders)))
        self.policy.advance(float(self.now))
        self.holders.remove(ticket)
        self._granted(self.policy.release(ticket))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.policy.advance(float(self.now))
        self.waiting.remove(ticket)
        self._granted(self.policy.cancel(ticket))

    @rule(tenant=st.sampled_from(NAMED), cap=st.none() | st.integers(1, 2))
    def set_cap(self, tenant: str, cap: int | None) -> None:
        self.policy.advance(float(self.now))
        self.caps[tenant] = cap
        self._granted(self.policy.set_tenant(tenant, Tenant(limit=cap)))

    @rule(seconds=st.integers(0, 40))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds
        self._granted(self.policy.tick(float(self.now)))

    @rule()
    def wake_up_when_told(self) -> None:
        wake_at = self.policy.wake_at
        if wake_at is not None:
            self.now = max(self.now, math.ceil(wake_at))
            self._granted(self.policy.tick(float(self.now)))

    @invariant()
    def work_conserving_but_for_caps_and_budgets(self) -> None:
        policy = self.policy
        assert policy.holders() == self.holders
        assert set(policy.waiters()) == self.waiting
        if len(self.holders) >= 3:
            return
        budgets = policy.model_budget_statistics(float(self.now))
        for ticket in self.waiting:
            cap = self.caps.get(ticket.tenant)
            mine = sum(1 for h in self.holders if h.tenant == ticket.tenant)
            if cap is not None and mine >= cap:
                continue
            assert ticket.model is not None, f"{ticket} waits by a free slot"
            available = budgets[ticket.model].requests_available
            assert available is not None
            assert available < 1, f"{ticket} waits by a free slot and budget"
            # Held back by its budget: the policy wakes by the time it is back.
            wake_at = policy.wake_at
            assert wake_at is not None, "a held-back model with no wake-up"
            back = self.now + (1 - available) * 60 / RATES[ticket.model]
            assert wake_at <= back + 1e-9  # the refill's float rounding


BudgetedTenantMachine.TestCase.settings = settings(
    max_examples=500 if os.environ.get("CI") else 200,
    stateful_step_count=50,
    deadline=None,
)
test_budgeted_tenant_state_machine = BudgetedTenantMachine.TestCase


class ScannedTenant:
    """One tenant of ``ScanningTenants``: its counter kept as ``TenantState`` keeps it."""

    def __init__(self, name: str | None, now: float) -> None:
        self.name = name
        self.weight = 1.0
        self.cap: int | None = None
        self.configured = False
        self.held = 0
        self.base = 0.0
        self.last = now
        self.waiting: list[Ticket] = []

    def service(self, now: float) -> float:
        if not self.held or now <= self.last:
            return self.base
        return self.base + self.held * (now - self.last) / self.weight

    def fold(self, now: float) -> None:
        if now > self.last:
            self.base = self.service(now)
            self.last = now


class ScanningTenants:
    """The choice between tenants as a scan of every backlogged tenant.

    What ``Tenants`` did before its heaps, kept as the reference it must
    match choice for choice: the floor is the least counter of the
    backlogged, and the choice the least ``(counter, held / weight, head)``
    in the order the tenants became backlogged, the first one winning a
    tie.
    """

    def __init__(self) -> None:
        self.states: dict[str | None, ScannedTenant] = {}
        self.backlogged: dict[str | None, ScannedTenant] = {}
        self.last_left = 0.0

    def state(self, name: str | None, now: float) -> ScannedTenant:
        if name not in self.states:
            self.states[name] = ScannedTenant(name, now)
        return self.states[name]

    def drop_if_idle(self, state: ScannedTenant) -> None:
        if not state.configured and not state.held and not state.waiting:
            del self.states[state.name]

    def configure(self, name: str, settings: Tenant | None, now: float) -> None:
        if name not in self.states and settings is None:
            return
        state = self.state(name, now)
        state.fold(now)
        if settings is None:
            state.weight, state.cap, state.configured = 1.0, None, False
            self.drop_if_idle(state)
        else:
            state.weight, state.cap = settings.weight, settings.limit
            state.configured = True

    def hold(self, ticket: Ticket, now: float) -> None:
        state = self.state(ticket.tenant, now)
        state.fold(now)
        state.held += 1

    def queue(self, ticket: Ticket, now: float) -> None:
        state = self.state(ticket.tenant, now)
        if not state.waiting:
            others = [other.service(now) for other in self.backlogged.values()]
            floor = min(others) if others else self.last_left
            state.fold(now)
            state.base = max(state.base, floor)
            self.backlogged[state.name] = state
        state.waiting.append(ticket)

    def unqueue(self, ticket: Ticket, now: float) -> ScannedTenant:
        state = self.states[ticket.tenant]
        state.waiting.remove(ticket)
        if not state.waiting:
            del self.backlogged[state.name]
            self.last_left = state.service(now)
        return state

    def withdraw(self, ticket: Ticket, now: float) -> None:
        self.drop_if_idle(self.unqueue(ticket, now))

    def release(self, ticket: Ticket, now: float) -> None:
        state = self.states.get(ticket.tenant)
        if state is None or not state.held:
            return
        state.fold(now)
        state.held -= 1
        self.drop_if_idle(state)

    def select(self, now: float, blocked: list[str]) -> Ticket | None:
        best: tuple[float, float, Ticket] | None = None
        for state in self.backlogged.values():
            if state.cap is not None and state.held >= state.cap:
                continue
            heads = [
                t for t in state.waiting if t.model is None or t.model not in blocked
            ]
            if not heads:
                continue
            key = (state.service(now), state.held / state.weight, min(heads))
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def grant(self, ticket: Ticket, now: float) -> None:
        state = self.states[ticket.tenant]
        state.fold(now)
        state.held += 1
        self.unqueue(ticket, now)


# Weights and steps of time whose sums round, so that the floats the two
# keep must be computed alike to stay equal.
CHOICE_WEIGHTS = (0.1, 0.3, 1.0, 1.5, 3.0, 7.0)
STEPS = (0.0, 0.1, 1 / 3, 1.0, 2.7)
CHOICE_TENANTS = (None, "a", "b", "c")

choice_ops = st.one_of(
    st.tuples(
        st.just("arrive"),
        st.integers(0, 8),
        st.sampled_from(CHOICE_TENANTS),
        st.sampled_from(MODELS),
    ),
    st.tuples(st.just("withdraw"), st.integers(0, 1000)),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.just("hold"), st.sampled_from(CHOICE_TENANTS)),
    st.tuples(
        st.just("configure"),
        st.sampled_from(CHOICE_TENANTS[1:]),
        st.none() | st.sampled_from(CHOICE_WEIGHTS),
        st.none() | st.integers(1, 3),
    ),
    # Up to that many grants; bit i of the mask holds back the model of
    # the i-th choice (if it has one) instead of granting it.
    st.tuples(st.just("fill"), st.integers(1, 4), st.integers(0, 15)),
    st.tuples(st.just("advance"), st.sampled_from(STEPS)),
)


# One step of a run: its kind, then its arguments (see ``choice_ops``).
Op = tuple[Any, ...]


class ChoiceRun:
    """``Tenants`` and ``ScanningTenants`` driven alike, compared at every step."""

    def __init__(self) -> None:
        self.tenants = Tenants()
        self.reference = ScanningTenants()
        self.now = 0.0
        self.seq = 0
        # The waiting tickets, each in the lane of its model.
        self.waiting: dict[Ticket, str | None] = {}
        self.holders: list[Ticket] = []
        self.choices = 0

    def ticket(self, rank: float, tenant: str | None, model: str | None) -> Ticket:
        self.seq += 1
        return Ticket(rank, self.seq, 0, tenant, model)

    def apply(self, op: Op) -> None:
        kind, now = op[0], self.now
        if kind == "arrive":
            _, rank, tenant, model = op
            ticket = self.ticket(float(rank), tenant, model)
            self.waiting[ticket] = ticket.model
            self.tenants.queue(ticket, now, ticket.model)
            self.reference.queue(ticket, now)
        elif kind == "withdraw" and self.waiting:
            ticket = sorted(self.waiting)[op[1] % len(self.waiting)]
            del self.waiting[ticket]
            self.tenants.withdraw(ticket, now, self.waiting)
            self.reference.withdraw(ticket, now)
        elif kind == "release" and self.holders:
            ticket = self.holders.pop(op[1] % len(self.holders))
            self.tenants.release(ticket, now)
            self.reference.release(ticket, now)
        elif kind == "hold":
            ticket = self.ticket(-1.0, op[1], None)
            self.holders.append(ticket)
            self.tenants.hold(ticket, now)
            self.reference.hold(ticket, now)
        elif kind == "configure":
            _, name, weight, cap = op
            settings = None if weight is None else Tenant(weight=weight, limit=cap)
            self.tenants.configure(name, settings, now)
            self.reference.configure(name, settings, now)
        elif kind == "fill":
            self.fill(op[1], op[2])
        elif kind == "advance":
            self.now += op[1]
        self.check_counters()

    def fill(self, grants: int, mask: int) -> None:
        blocked: list[str] = []
        for bit in range(grants + 4):
            chosen = self.tenants.select(self.now, self.waiting, blocked)
            expected = self.reference.select(self.now, blocked)
            self.choices += 1
            assert (None if chosen is None else chosen[1]) == expected
            if chosen is None or grants == 0:
                return
            state, ticket = chosen
            assert state.name == ticket.tenant
            if ticket.model is not None and mask >> bit & 1:
                blocked.append(ticket.model)  # its budget holds it back
                continue
            self.tenants.grant(state, ticket, self.now, ticket.model)
            self.reference.grant(ticket, self.now)
            del self.waiting[ticket]
            self.holders.append(ticket)
            grants -= 1

    def check_counters(self) -> None:
        stats = self.tenants.statistics(self.now)
        expected = {
            name: (state.service(self.now), state.held, len(state.waiting))
            for name, state in self.reference.states.items()
            if name is not None
        }
        assert {
            name: (shown.service, shown.in_flight, shown.waiting)
            for name, shown in stats.items()
        } == expected


@settings(max_examples=400 if os.environ.get("CI") else 200, deadline=None)
@given(st.lists(choice_ops, min_size=40, max_size=200))
# A holder's counter moved since its tenant was kept: b goes first.
@example(
    [
        ("hold", "a"),
        ("arrive", 0, "a", None),
        ("advance", 1.0),
        ("arrive", 5, "b", None),
        ("fill", 1, 0),
    ]
)
# A slot given back lowers a's held / weight to b's: a's older head wins.
@example(
    [
        ("hold", "a"),
        ("hold", "a"),
        ("hold", "b"),
        ("arrive", 0, "a", None),
        ("arrive", 1, "b", None),
        ("release", 0),
        ("fill", 1, 0),
    ]
)
# A weight raised lowers a's held / weight below b's: a goes first.
@example(
    [
        ("hold", "a"),
        ("hold", "b"),
        ("arrive", 5, "a", None),
        ("arrive", 1, "b", None),
        ("configure", "a", 7.0, None),
        ("fill", 1, 0),
    ]
)
# Model x held back in one fill: the next fill goes by a's x0 again, not
# by the y2 that the first passed over to.
@example(
    [
        ("arrive", 0, "a", "x"),
        ("arrive", 2, "a", "y"),
        ("arrive", 1, "b", None),
        ("fill", 1, 1),
        ("arrive", 1, "c", None),
        ("fill", 1, 0),
    ]
)
def test_the_choice_between_tenants_is_the_scans(ops: list[Op]) -> None:
    run = ChoiceRun()
    for op in ops:
        run.apply(op)


def test_a_long_run_of_many_tenants_makes_the_scans_choices() -> None:
    # Long enough for dead entries to be swept from the heaps many times
    # over, with tenants that hold slots (their counters moving), caps,
    # weights, held-back models and withdrawn tickets.
    draw = random.Random(27)
    run = ChoiceRun()
    names = [None, *(f"t{i}" for i in range(40))]
    for _ in range(20_000):
        roll = draw.random()
        if roll < 0.4:
            op: Op = (
                "arrive",
                draw.randrange(60),
                draw.choice(names),
                draw.choice(MODELS),
            )
        elif roll < 0.5:
            op = ("withdraw", draw.randrange(1000))
        elif roll < 0.7:
            op = ("release", draw.randrange(1000))
        elif roll < 0.72:
            op = (
                "configure",
                draw.choice(names[1:]),
                draw.choice((None, *CHOICE_WEIGHTS)),
                draw.choice((None, 1, 2, 3)),
            )
        elif roll < 0.9:
            op = ("fill", draw.randrange(1, 5), draw.randrange(16))
        else:
            op = ("advance", draw.choice(STEPS))
        run.apply(op)
    assert run.choices > 5_000


def test_entries_left_behind_are_swept_and_the_choices_kept() -> None:
    # Each ticket older than a's head and each slot a gives back places a
    # again; the entries it leaves behind are swept once they outnumber
    # the living, so the heap stays within twice the backlogged tenants
    # (and a margin), and the choices stay the scan's.
    run = ChoiceRun()
    for _ in range(200):
        run.apply(("hold", "a"))
    run.apply(("arrive", 150, "b", None))
    for rank in range(400, 200, -1):
        run.apply(("arrive", rank, "a", "x"))
        run.apply(("release", 0))
        run.apply(("advance", 0.1))
    assert len(run.tenants._ready) <= 2 * 2 + 64 + 1
    while run.waiting:
        run.apply(("fill", 4, 0))
    assert run.choices > 200 // 4
