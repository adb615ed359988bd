"""The scheduling policy: who gets a provider's next free slot.

A plain synchronous state machine with no I/O and no trio (sans-IO, like
h11), so it can be tested exhaustively and driven in virtual time. The
scheduler actor feeds it messages and delivers the grants it returns.

One queue. Every ticket belongs to a tenant: its ``tenant``, or the
default tenant for ``None`` (weight 1, no cap), a tenant like the others.
From the first ticket on, whatever is configured, every waiting ticket is
queued by its tenant and model (``_tenants``), and every free slot goes by
one rule: to the backlogged tenant below its cap with the least ``(c_t,
held_t / w_t, head)``, for its head, its oldest waiting ticket in ticket
order (``rank``: the turn's start less its priority class's credit; then
arrival) of a model not held back. ``c_t`` is the tenant's service
counter, the slot-seconds its holders have had divided by its weight,
accruing while they hold: ``c_t(now) = base_t + (held_t * now - sum of
grant times) / w_t`` (``_tenants`` keeps it folded). A tenant that becomes
backlogged (something of it waits) is raised to the floor: the least
counter among the other backlogged tenants, or if none is, the counter of
the tenant that most recently stopped being backlogged, taken then. With
the default tenant alone the rule is ticket order.

Service and models' use are counted from the first ticket with a tenant,
the first ``set_tenant`` or the first budget of a model (``counts_tenants``;
the Redis ledger counts from the same moment): then every counter, and
the floor, start at 0, the holders' service counts from then, and a
model's tickets count for its budget's forgetting from then (see
``ModelThrottles``). Until then only the default tenant is in play, and
its counter is read by nobody. From the first tenant on ``needs_clock`` is
true: grants and releases need the time, from ``advance`` or ``tick``.

A grant costs O(log T) for T backlogged tenants, and as much again per
tenant whose key grew since it was last looked at, and an arrival O(log n)
in its tenant's queue of n (see ``_tenants``). An arrival that finds
nobody waiting and a slot it may take is the fill's only choice: it is
granted on the spot, as the fill would grant it, its tenant joining and
leaving in one step (``Tenants.grant_at_once``), with no queue to pass
through. A ticket cancelled while waiting is only forgotten by the set of
waiters and skipped when it surfaces; the queues are rebuilt when such
dead entries outnumber the living.

Invariants, after every call:

1. ``in_flight <= limit``, except that lowering the limit lets the holders
   above it finish: nothing is granted until ``in_flight < limit``.
2. Work-conserving: a slot is never free while a ticket waits that may
   take it: not paused, its tenant below its cap, its head held back by
   no budget. With the default tenant alone and no budget: while not
   paused, ``waiting > 0`` implies ``in_flight >= limit``.
3. Oldest first within a tenant, and within a model: a ticket is granted
   only when no older one of its tenant waits but of a model held back.
   With the default tenant alone and no model held back, grants go in
   ticket order. A newcomer never takes a free slot while anyone waits
   who may take it (see 2).
4. Every ticket ends exactly once: granted then released, cancelled while
   waiting, or refused. Cancelling a granted ticket releases it; releasing or
   cancelling an unknown or finished ticket does nothing, so a grant racing
   a cancellation never leaks.
5. A pause never ends before its time, whatever is reported later; only
   ``resume`` ends it early. Holders are never touched by a pause.
6. Caps: no tenant holds more than its cap through a grant (lowering a cap
   lets its holders finish).
7. The service gap. Let L be the limit and H the longest hold. While no
   backlogged tenant is capped or held back by a budget (and weights do
   not change), every backlogged tenant f has ``c_f <= m + L * H / w_f``,
   where m is the least counter among the backlogged; so for any two
   backlogged f and g, ``c_f - c_g <= L * H / w_f``. Why: m never goes
   down (counters only grow; a tenant joins at the floor m or above it;
   the least one leaving leaves a larger least, and ``last_left`` is the
   counter of the last to leave, at least the m it was). When f is
   granted a slot it has the least counter, m. Afterwards, until its next
   grant, only the slots it held at that grant accrue, at most L of them,
   each for at most H: c_f grows by at most ``L * H / w_f`` while m does
   not fall. A tenant that joins without a grant since its last one keeps
   that bound, or is raised to m itself.

Unconfigured tenants (the default one too) are forgotten when they hold
and wait for nothing, so memory stays bounded by the tenants in play, and
one that comes back starts from the floor.

Rate-limit reports pause grants, each for at most ``max_pause``. A report
that names the server's delay (``Retry-After``) pauses for that delay. One
that does not, or names one that is not positive (``Retry-After: 0``, a
date in the past: ``server_delay``), backs off: ``default_pause`` for the
first report of a streak, doubling with each later round, up to
``max_pause``. A report opens a new round when it starts a streak or when
a slot was granted since the previous report (its request may be the one
refused); reports with no grant between them come from requests already
in flight together, so they share a round and its pause. Every round
counts towards the streak, a server's delay or not: a rate limit is never
a success. The streak ends on a success, a slot granted after the latest
report and released with no report while it was held; the policy needs no
per-slot record for that, only the set of holders at the latest report.
``resume`` ends the pause and the streak.

Budgets and an adaptive limit live in an optional ``Throttle`` (see
``_budgets``), asked before each grant (``holds``, then ``take`` for the
ticket granted): a head the provider's budget holds back holds back every
ticket behind it, of every tenant (``wake_at`` says when to look again),
and the throttle may move the limit after a release or a rate-limit
report. A throttle made later (by the first figures, an adaptive limit, a
model's first budget) is told the estimates of the tickets waiting then:
it charges them as one made before would.

Model budgets. A model may have a throttle of its own (a ``Budget``
configured with ``set_model_budget`` or the ``models`` argument, or learned
from the first figures reported for it), asked beside the provider's for
the tickets of that model only. The provider's throttle holding the chosen
head back stops the grants (nobody passes, as above); a model's holding it
back blocks only that model for the rest of the fill: the other models'
tickets (of any tenant) still go, and ``wake_at`` is the earliest instant
any held-back model, or the provider, is ready. A grant looks only at the
throttles of the models it meets (``ModelThrottles``), so it costs the
same however many models are idle; and a learned throttle (never a
configured one) is forgotten once its model is idle, its buckets are full
again and ``FORGET_AFTER`` has passed (``_budgets.forgets``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from .._exceptions import QueueFull, queue_full
from .._validation import (
    check_deadline,
    check_instant,
    check_max_waiting,
    check_optional_seconds,
    check_pauses,
    check_provider,
    check_slot_limit,
    check_text,
)
from ..messages._limits import Tenant, check_tenant
from ._budgets import AdaptiveLimit, Budget, ModelThrottles, Throttle
from ._ratelimits import server_delay
from ._server import ServerGate
from ._tenants import Tenants

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._server_load._load import ServerLoad
    from ..messages._protocol import Ticket
    from ._budgets import BudgetStatistics
    from ._ratelimits import RateLimitInfo
    from ._tenants import TenantStatistics


@final
@attrs.frozen
class PolicyStatistics:
    """A snapshot of one policy's state and lifetime counters."""

    limit: int | None
    in_flight: int
    waiting: int
    paused_until: float | None
    granted_total: int
    released_total: int
    withdrawn_total: int
    rejected_total: int
    peak_in_flight: int
    peak_waiting: int


@final
class SlotPolicy:
    """Oldest-first admission of tickets under a concurrency limit, shared by tenants.

    Every method that can free a slot returns the tickets granted by that
    call, in grant order; the caller must deliver them. ``limit=None`` means
    unlimited: every ticket is granted at once and pauses have no effect.

    Args:
        limit: At most this many tickets hold a slot at once, or ``None``.
        max_waiting: At most this many tickets wait; a ticket that would wait
            beyond it is refused with ``QueueFull``. ``None`` for no bound.
        default_pause: Seconds of the first pause of a streak of rate-limit
            reports that name no delay; it doubles with each later round.
        max_pause: The longest pause a rate-limit report causes, in
            seconds, whatever delay it names. At least ``default_pause``.
        throttle: The provider's budgets and adaptive limit, or ``None``.
        tenants: Tenants' weights and caps, by name; the others have
            ``Tenant()``'s defaults.
        models: Throttles of the provider's models (``Throttle(budget,
            learn=..., now=...)``, without an adaptive limit), by model name.
        provider: The provider's name, for ``QueueFull``'s message and
            attribute, or ``None``.

    Attributes:
        needs_clock: Whether grants and releases need the time: true once
            a tenant was configured or a ticket with a tenant seen. The
            caller then calls ``advance(now)`` before each call (a plain
            attribute, read on every hand-off).
    """

    __slots__ = (
        "_counting",
        "_default_pause",
        "_estimates",
        "_gate",
        "_granted_at_report",
        "_granted_total",
        "_held_back",
        "_holders",
        "_limit",
        "_max_pause",
        "_max_waiting",
        "_models",
        "_now",
        "_paused_until",
        "_peak_in_flight",
        "_peak_waiting",
        "_provider",
        "_rejected_total",
        "_reported",
        "_server",
        "_step",
        "_streak",
        "_tenants",
        "_waiting",
        "_withdrawn_total",
        "needs_clock",
    )

    def __init__(
        self,
        limit: int | None,
        *,
        max_waiting: int | None = None,
        default_pause: float = 1.0,
        max_pause: float = 60.0,
        throttle: Throttle | None = None,
        tenants: Mapping[str, Tenant] | None = None,
        models: Mapping[str, Throttle] | None = None,
        provider: str | None = None,
    ) -> None:
        if limit is not None:
            check_slot_limit(limit)
        if provider is not None:
            check_provider(provider)
        configured = {} if tenants is None else dict(tenants)
        for name, settings in configured.items():
            check_tenant(name, settings)
        throttles = {} if models is None else dict(models)
        for model, model_throttle in throttles.items():
            check_text(model, "model")
            if not isinstance(model_throttle, Throttle):
                raise TypeError(
                    f"throttle of {model!r} must be a Throttle, got {model_throttle!r}"
                )
        # Budgets and the adaptive limit, when there are any (see _budgets).
        self._gate = throttle
        if throttle is not None and throttle.limit is not None:
            limit = throttle.limit
        check_max_waiting(max_waiting)
        self._default_pause, self._max_pause = check_pauses(default_pause, max_pause)
        self._limit = limit
        self._max_waiting = max_waiting
        self._provider = provider
        self._holders: set[Ticket] = set()
        self._waiting: set[Ticket] = set()
        # The estimates of the waiting tickets that have one, so that a
        # throttle made while they wait (the first figures, an adaptive
        # limit, a model's first budget) charges them as one made before.
        self._estimates: dict[Ticket, int] = {}
        self._paused_until: float | None = None
        # The backoff: rounds of rate-limit reports since the last success
        # (0: no streak), the pause of the current round without a delay,
        # granted_total at the latest report, and the holders at the latest
        # report that still hold (their release is not a success).
        self._streak = 0
        self._step = self._default_pause
        self._granted_at_report = 0
        self._reported: set[Ticket] = set()
        self._granted_total = 0
        self._withdrawn_total = 0
        self._rejected_total = 0
        self._peak_in_flight = 0
        self._peak_waiting = 0
        # The latest time told (advance, tick, a report): tenants' service
        # accrues in it.
        self._now = 0.0
        # The queue: every waiting ticket, by its tenant and model (see
        # _tenants); service and models' use are counted from the first
        # tenant or model on.
        self._tenants = Tenants()
        self._counting = False
        self._models = ModelThrottles(throttles)
        # The models whose throttle held their head back at the end of the
        # latest fill, with a slot still free: wake_at watches them.
        self._held_back: list[str] = []
        # The server's own load, once it is read (observe_server_load).
        self._server: ServerGate | None = None
        self.needs_clock = False
        if configured:
            self.needs_clock = True
            self._count()
            for name, settings in configured.items():
                self._tenants.configure(name, settings, self._now)
        elif throttles:
            self._count()

    def __repr__(self) -> str:
        return (
            f"<SlotPolicy limit={self._limit} in_flight={len(self._holders)}"
            f" waiting={len(self._waiting)} paused_until={self._paused_until}>"
        )

    @property
    def limit(self) -> int | None:
        """The current limit, or ``None`` for unlimited."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """How many tickets hold a slot."""
        return len(self._holders)

    @property
    def waiting(self) -> int:
        """How many tickets wait for a slot."""
        return len(self._waiting)

    @property
    def paused_until(self) -> float | None:
        """Until when grants are paused, or ``None``."""
        return self._paused_until

    @property
    def counts_tenants(self) -> bool:
        """Whether service and models' use are counted: from the first tenant or model on."""
        return self._counting

    @property
    def throttle(self) -> Throttle | None:
        """The budgets and adaptive limit asked before each grant, or ``None``."""
        return self._gate

    @property
    def throttled(self) -> bool:
        """Whether any budget is asked: the provider's or a model's."""
        return self._gate is not None or bool(self._models)

    @property
    def wake_at(self) -> float | None:
        """When the policy must be ticked next: a pause ends or budget is back."""
        paused_until = self._paused_until
        gate = self._gate
        if gate is None or not self._waiting or not gate.blocked:
            # Read per wake-up: a model held back is looked for only here.
            return self._wake_at_held_back() if self._held_back else paused_until
        if self._held_back:
            return self._wake_at_held_back()
        if paused_until is not None and self._limit is not None:
            return paused_until
        return gate.ready_at()

    def _wake_at_held_back(self) -> float | None:
        """``wake_at`` when some model's throttle holds its head back."""
        paused_until = self._paused_until
        if not self._waiting or (paused_until is not None and self._limit is not None):
            return paused_until
        models = self._models
        times = [models[model].ready_at() for model in self._held_back]
        gate = self._gate
        if gate is not None and gate.blocked:
            times.append(gate.ready_at())
        ready = [time for time in times if time is not None]
        return min(ready) if ready else paused_until

    def budget_statistics(self, now: float | None = None) -> BudgetStatistics | None:
        """The budgets at ``now`` (default: the latest time told), or ``None``."""
        return None if self._gate is None else self._gate.statistics(now)

    def holders(self) -> frozenset[Ticket]:
        """The tickets that hold a slot."""
        return frozenset(self._holders)

    def waiters(self) -> list[Ticket]:
        """The waiting tickets in ticket order: the grant order without tenants."""
        return sorted(self._waiting)

    def statistics(self) -> PolicyStatistics:
        """A frozen snapshot of the state and the lifetime counters."""
        return PolicyStatistics(
            limit=self._limit,
            in_flight=len(self._holders),
            waiting=len(self._waiting),
            paused_until=self._paused_until,
            granted_total=self._granted_total,
            # Every grant is held until released: the released ones are
            # those granted that no longer hold.
            released_total=self._granted_total - len(self._holders),
            withdrawn_total=self._withdrawn_total,
            rejected_total=self._rejected_total,
            peak_in_flight=self._peak_in_flight,
            peak_waiting=self._peak_waiting,
        )

    def acquire(self, ticket: Ticket, tokens: int = 0) -> list[Ticket]:
        """Admit ``ticket``: grant it at once if a slot is free, else queue it.

        ``tokens`` is its estimated cost for a token budget (0: none).
        Returns the tickets granted by this call, in grant order:
        ``[ticket]`` when it goes at once, but also, when a budget held the
        head back and is back by now, others before it, or instead of it.

        Raises:
            QueueFull: It would have to wait and ``max_waiting`` tickets
                already do. Nothing changed.
            ValueError: The ticket is already holding or waiting.
        """
        waiting = self._waiting
        holders = self._holders
        if ticket in holders or ticket in waiting:
            raise ValueError(f"ticket {ticket!r} is already known")
        if ticket.tenant is not None and not self._counting:
            # The first ticket with a tenant.
            self.needs_clock = True
            self._count()
        gate = self._gate
        model = ticket.model
        models = self._models
        model_gate = None if model is None else models.get(model)
        max_waiting = self._max_waiting
        if (
            max_waiting is not None
            and len(waiting) >= max_waiting
            and not self._grants_at_once(ticket, tokens, model_gate)
        ):
            raise self._refused()
        if tokens:
            if gate is not None:
                gate.expect(ticket, tokens)
            if model_gate is not None:
                model_gate.expect(ticket, tokens)
        if model is not None:
            models.use(model, 1)
        limit = self._limit
        if not waiting and self._grants_at_once(ticket, tokens, model_gate):
            # Nobody waits: a fill would choose it, alone, and grant it. So
            # it is, here, as the fill grants, with no queue to pass through.
            held = len(holders)
            if gate is not None:
                gate.take(ticket, held, limit)
            if model_gate is not None:
                model_gate.take(ticket, held, None)
            self._tenants.grant_at_once(ticket, self._now)
            holders.add(ticket)
            self._granted_total += 1
            self._peak_in_flight = max(self._peak_in_flight, held + 1)
            return [ticket]
        if tokens:
            self._estimates[ticket] = tokens
        waiting.add(ticket)
        self._tenants.queue(ticket, self._now)
        grants = (
            self._fill()
            if limit is None or (self._paused_until is None and len(holders) < limit)
            else []
        )
        if len(waiting) > self._peak_waiting:  # noqa: PLR1730  # no call on the hot path
            self._peak_waiting = len(waiting)
        return grants

    def _refused(self) -> QueueFull:
        """Count a ticket refused for a full queue; the error to raise."""
        self._rejected_total += 1
        assert self._max_waiting is not None  # only a bounded queue refuses
        return queue_full(self._provider, len(self._waiting), self._max_waiting)

    def _grants_at_once(
        self, ticket: Ticket, tokens: int, model_gate: Throttle | None
    ) -> bool:
        """Whether a fill now would grant ``ticket``, a newcomer, at once.

        Every other waiter may not take a free slot (invariant 2), so the
        newcomer goes if it may: a slot is free, its tenant below its cap,
        and no budget holds it back. With nobody waiting, no budget holds
        anyone back, and the fill would choose it: then this is exactly
        whether the fill grants it.
        """
        limit = self._limit
        if limit is not None and (
            self._paused_until is not None or len(self._holders) >= limit
        ):
            return False
        state = self._tenants.get(ticket.tenant)
        if state is not None and state.limit is not None and state.held >= state.limit:
            return False
        model = ticket.model
        if model is not None and model in self._held_back:
            return False
        gate = self._gate
        if gate is not None and (gate.blocked or not gate.fits(tokens)):
            return False
        server = self._server
        if server is not None and not server.holds(len(self._holders)):
            return False
        return model_gate is None or model_gate.fits(tokens)

    def _count(self) -> None:
        """Count service and models' use from now on (see the module notes)."""
        if self._counting:
            return
        self._counting = True
        self._tenants.restart(self._now)
        self._models.count(self._holders, self._waiting)

    def release(self, ticket: Ticket) -> list[Ticket]:
        """Give back a held slot; does nothing for an unknown or finished ticket.

        Raises:
            RuntimeError: The ticket is still waiting; cancel it instead.
        """
        if ticket in self._waiting:
            raise RuntimeError(f"ticket {ticket!r} is waiting, not holding a slot")
        if self._streak:
            self._end_streak_if_success(ticket)
        return self._release(ticket, success=True)

    def cancel(self, ticket: Ticket) -> list[Ticket]:
        """Withdraw a waiting ticket, or release it if it was already granted."""
        waiting = self._waiting
        if ticket not in waiting:
            # A grant that raced a cancellation: never sent, so not a success.
            if self._streak:
                self._reported.discard(ticket)
            return self._release(ticket, success=False)
        waiting.discard(ticket)
        self._estimates.pop(ticket, None)
        self._withdrawn_total += 1
        self._tenants.withdraw(ticket, self._now, waiting)
        gate = self._gate
        if gate is not None:
            gate.forget(ticket)
        model = ticket.model
        if model is not None:
            model_gate = self._models.get(model)
            if model_gate is not None:
                model_gate.forget(ticket)
            self._models.use(model, -1)
        # It may have been a head a budget held back.
        return self._refill()

    def set_limit(self, limit: int | AdaptiveLimit | None) -> list[Ticket]:
        """Change the limit.

        Raising it grants at once; lowering it lets the holders finish. An
        ``AdaptiveLimit`` starts at its ``initial`` value and moves on its
        own from there; an int or ``None`` replaces it.
        """
        if isinstance(limit, AdaptiveLimit):
            if self._gate is None:
                self._gate = self._expecting(Throttle(now=self._now))
            self._limit = self._gate.adapt(limit)
            return self._fill()
        if limit is not None:
            check_slot_limit(limit)
        if self._gate is not None:
            self._gate.adapt(None)
        self._limit = limit
        return self._fill()

    def advance(self, now: float) -> None:
        """Tell the policy the time, before handling what arrived at ``now``.

        The budgets refill; tenants' service accrues up to it.
        """
        if now > self._now:  # noqa: PLR1730  # no call on the hot path
            self._now = now
        if self._gate is not None:
            self._gate.advance(now)
        # A model's throttle is brought to the time when its model is used
        # (ModelThrottles.get): idle models cost a grant nothing.
        self._models.advance(now)

    def report_usage(self, ticket: Ticket, tokens: int) -> list[Ticket]:
        """The request of held ``ticket`` used ``tokens`` in all: correct its charge."""
        gate = self._gate
        model_gate = self._models.get(ticket.model)
        if model_gate is not None:
            model_gate.report_usage(ticket, tokens)
        if gate is not None:
            gate.report_usage(ticket, tokens)
        # Tokens given back may let a held-back head through.
        return self._refill()

    def answered(self, ticket: Ticket) -> None:
        """The answer of held ``ticket`` started: the server has counted it."""
        if self._gate is not None:
            self._gate.answered(ticket)
        if self._models:
            model_gate = self._models.get(ticket.model)
            if model_gate is not None:
                model_gate.answered(ticket)

    def observe_latency(
        self,
        ticket: Ticket,
        first_token: float,
        between_tokens: float | None,
        duration: float,
        prompt_tokens: int,
    ) -> list[Ticket]:
        """Held ``ticket``'s call ended with these timings (``Slot.report_timing``).

        A latency-signal adaptive limit learns from them, with the slots
        held now as the call's company; the tickets its rise lets through
        are returned. Nothing for a ticket that holds no slot.
        """
        gate = self._gate
        if gate is None or ticket not in self._holders:
            return []
        return self._latency_moved(
            gate.observe_latency(
                first_token, between_tokens, duration, prompt_tokens, len(self._holders)
            )
        )

    def apply_latency_verdict(self, change: int) -> list[Ticket]:
        """A latency signal's verdict of a round: the limit moves by ``Adaptive.move``.

        What the Redis ledger does with the verdicts each process's own
        signal sends (the differential test holds it to this). Returns the
        tickets a rise lets through; nothing but for a latency-signal
        adaptive limit.
        """
        gate = self._gate
        return self._latency_moved(
            None if gate is None else gate.apply_latency_verdict(change)
        )

    def _latency_moved(self, limit: int | None) -> list[Ticket]:
        """The latency signal moved the limit to ``limit`` (``None``: it did not)."""
        if limit is None:
            return []
        self._limit = limit
        return self._fill()

    def observe_server_load(self, load: ServerLoad | None) -> list[Ticket]:
        """The provider's server said its ``load`` (``None``: reading it failed).

        From the first reading on, a grant keeps our requests out of the
        server's own queue (``_server``): none while requests wait there,
        and, once its slots are learned, none beyond them. Returns the
        tickets a reading with room lets through.
        """
        server = self._server
        if server is None:
            server = self._server = ServerGate()
        server.observe(load, len(self._holders))
        return self._fill() if self._waiting else []

    @property
    def server_load(self) -> tuple[ServerLoad | None, int | None]:
        """The latest reading of the server's load and its slots learned, if any."""
        server = self._server
        return (None, None) if server is None else (server.load, server.slots)

    def set_tenant(self, tenant: str, settings: Tenant | None) -> list[Ticket]:
        """Give ``tenant`` a weight and a cap; ``None``: back to the defaults.

        Returns the tickets the change lets through (a cap raised).
        Defaults for a policy that counts no tenant yet change nothing (and
        start no counting), so a dispatcher may send them to every backend.

        Raises:
            TypeError: ``tenant`` is not a string, or ``settings`` not a
                ``Tenant`` or ``None``.
            ValueError: ``tenant`` is empty or too long.
        """
        check_tenant(tenant, settings)
        if settings is None and not self._counting:
            return []
        self.needs_clock = True
        self._count()
        self._tenants.configure(tenant, settings, self._now)
        return self._fill()

    def set_model_budget(
        self, model: str, budget: Budget, *, learn: bool = True
    ) -> list[Ticket]:
        """Give ``model`` a budget of its own, asked beside the provider's.

        A model that has a throttle already (learned from its figures, or
        configured) keeps it and takes the new budget, which starts full;
        else it gets ``Throttle(budget, learn=learn)``. Returns the tickets
        the change lets through.

        Raises:
            TypeError: ``model`` is not a string or ``budget`` not a ``Budget``.
            ValueError: ``model`` is empty.
        """
        check_text(model, "model")
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        if model not in self._models:
            self._add_model(model, Throttle(budget, learn=learn, now=self._now))
        else:
            self._models.configure(model, budget)
        return self._fill()

    def _add_model(self, model: str, throttle: Throttle) -> Throttle:
        """Give ``model``, which has none, ``throttle``, new; returns it."""
        self._models.add(model, self._expecting(throttle, model))
        self._count()
        return throttle

    def _expecting(self, throttle: Throttle, model: str | None = None) -> Throttle:
        """``throttle``, new, told the estimates of the waiters (of ``model``) it charges."""
        for ticket, tokens in self._estimates.items():
            if model is None or ticket.model == model:
                throttle.expect(ticket, tokens)
        return throttle

    def tenants(self) -> dict[str, Tenant]:
        """The configured tenants' settings, by name."""
        return self._tenants.configured()

    def tenant_statistics(
        self, now: float | None = None
    ) -> dict[str, TenantStatistics]:
        """Each named tenant's share at ``now`` (default: the latest time told).

        The tenants configured, and those with a slot held or a request
        waiting; not the default tenant (``None``).
        """
        return self._tenants.statistics(
            self._now if now is None else max(now, self._now)
        )

    def model_budget_statistics(
        self, now: float | None = None
    ) -> dict[str, BudgetStatistics]:
        """Each model's budgets at ``now`` (default: the latest time told).

        Not those of learned budgets forgotten by then (see ``_budgets``).
        """
        return self._models.statistics(now)

    def observe_rate_limits(
        self, now: float, info: RateLimitInfo, model: str | None = None
    ) -> list[Ticket]:
        """Learn from the rate-limit figures of an answer that arrived at ``now``.

        Creates the throttle if there is none, so a provider that was never
        given a budget is paced by what it reports. The figures of an answer
        for ``model`` go to that model's throttle (created learning), those
        of an answer for none to the provider's.
        """
        if model is None:
            gate = self._gate
            if gate is None:
                gate = self._gate = self._expecting(Throttle(learn=True, now=now))
        else:
            self._models.advance(now)
            gate = self._models.get(model)
            if gate is None:
                check_text(model, "model")
                gate = self._add_model(model, Throttle(learn=True, now=now))
        gate.advance(now)
        gate.observe(info)
        if model is not None:
            # Idle, it is forgotten once full: these figures may move that.
            self._models.observed(model)
        return []

    def pause(self, until: float) -> None:
        """Grant nothing before ``until``; a pause is never shortened.

        The raw instrument, taken as given: ``max_pause`` bounds the pauses
        of ``report_rate_limit``, and ``resume`` ends any pause.
        """
        until = check_deadline(until, "until")
        if self._paused_until is None or until > self._paused_until:
            self._paused_until = until

    def report_rate_limit(self, now: float, retry_after: float | None = None) -> None:
        """Pause grants after a rate-limit answer that arrived at ``now``.

        With ``retry_after``, the server's delay in seconds, grants pause
        that long; without, or with one that is not positive (which names
        no delay, ``server_delay``), for the backoff of the streak's
        current round (see the module's docstring). Either way for at most ``max_pause``,
        and never less than a pause already running.
        """
        now = check_instant(now, "now")
        delay = server_delay(check_optional_seconds(retry_after, "retry_after"))
        if not self._streak or self._granted_total != self._granted_at_report:
            # A new round. The step doubles as a float held at max_pause,
            # so no streak, however long, can overflow it.
            self._step = (
                min(2.0 * self._step, self._max_pause)
                if self._streak
                else self._default_pause
            )
            self._streak += 1
            self._granted_at_report = self._granted_total
            self._reported = set(self._holders)
        seconds = self._step if delay is None else min(delay, self._max_pause)
        self.pause(now + seconds)
        gate = self._gate
        if gate is not None:
            limit = gate.rate_limited(self._holders)
            if limit is not None:
                self._limit = limit

    def resume(self) -> list[Ticket]:
        """End the pause and the backoff streak now; waiters go in ticket order."""
        self._paused_until = None
        self._streak = 0
        self._reported = set()
        return self._fill()

    def tick(self, now: float) -> list[Ticket]:
        """Tell the policy the time; a pause that has run out ends and grants resume.

        So do grants the budget held back, once it holds the oldest waiter.
        """
        self.advance(now)
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            return self._fill()
        return self._refill()

    def _refill(self) -> list[Ticket]:
        """Fill again if a budget holds a head back, which may pass now; else none."""
        gate = self._gate
        if (gate is not None and gate.blocked) or self._held_back:
            return self._fill()
        return []

    def _end_streak_if_success(self, ticket: Ticket) -> None:
        reported = self._reported
        if ticket in reported:
            reported.remove(ticket)  # held across a report: not a success
        elif ticket in self._holders:
            # Granted after the latest report and released, with no report
            # while it was held (it would be in ``reported``): a success.
            self._streak = 0
            reported.clear()

    def _release(self, ticket: Ticket, *, success: bool) -> list[Ticket]:
        try:
            self._holders.remove(ticket)
        except KeyError:
            return []
        self._tenants.release(ticket, self._now)
        if ticket.model is not None:
            self._models.release(ticket, success=success)
        gate = self._gate
        if gate is not None:
            limit = gate.release(ticket, success=success)
            if limit is not None:
                self._limit = limit
        if not self._waiting:
            return []
        return self._fill()

    def _unblock(self) -> None:
        """Forget what the budgets held back: the fill looks again."""
        if self._gate is not None:
            self._gate.unblock()
        held_back = self._held_back
        if held_back:
            models = self._models
            for model in held_back:
                models[model].unblock()
            self._held_back = []

    def _fill(self) -> list[Ticket]:
        """Grant free slots to the waiters, one choice at a time (see the module notes)."""
        grants: list[Ticket] = []
        waiting = self._waiting
        limit = self._limit
        gate = self._gate
        if gate is not None or self._held_back:
            self._unblock()
        if not waiting or (limit is not None and self._paused_until is not None):
            return grants
        models = self._models
        tenants = self._tenants
        holders = self._holders
        estimates = self._estimates
        server = self._server
        now = self._now
        held = len(holders)
        blocked: list[str] = []  # models held back in this fill
        # The server's own load, once read, may hold grants back too: no
        # grant it would queue (see observe_server_load).
        while (
            waiting
            and (limit is None or held < limit)
            and (server is None or server.holds(held))
        ):
            chosen = tenants.select(now, waiting, blocked)
            if chosen is None:
                break
            state, ticket = chosen
            model = ticket.model
            model_gate = None if model is None else models.get(model)
            if gate is not None and not gate.holds(ticket):
                break  # oldest first: nobody passes what the provider holds back
            if model_gate is not None and not model_gate.holds(ticket):
                assert model is not None  # it has a throttle
                blocked.append(model)  # nobody of this model passes its head
                continue
            if gate is not None:
                gate.take(ticket, held, limit)
            if model_gate is not None:
                model_gate.take(ticket, held, None)
            waiting.remove(ticket)
            estimates.pop(ticket, None)
            tenants.grant(state, ticket, now)
            holders.add(ticket)
            grants.append(ticket)
            held += 1
        if blocked:
            if waiting and (limit is None or held < limit):
                self._held_back = blocked
            else:
                # No slot left to wait for: a release looks again.
                for name in blocked:
                    models[name].unblock()
        self._granted_total += len(grants)
        self._peak_in_flight = max(self._peak_in_flight, held)
        return grants
