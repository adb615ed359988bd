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
from fractions import Fraction

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trio_dispatch import Budget, Tenant
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
