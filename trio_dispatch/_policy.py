"""The scheduling policy: who gets a provider's next free slot.

A plain synchronous state machine with no I/O and no trio (sans-IO, like
h11), so it can be tested exhaustively and driven in virtual time. The
scheduler actor feeds it messages and delivers the grants it returns.

Invariants, after every call:

1. ``in_flight <= limit``, except that lowering the limit lets the holders
   above it finish: nothing is granted until ``in_flight < limit``.
2. Work-conserving: while not paused, ``waiting > 0`` implies
   ``in_flight >= limit``.
3. Grants go in ticket order (``rank``: the turn's start less its priority
   class's credit; then arrival); a newcomer never takes a free slot while
   anyone waits.
4. Every ticket ends exactly once: granted then released, cancelled while
   waiting, or refused. Cancelling a granted ticket releases it; releasing or
   cancelling an unknown or finished ticket does nothing, so a grant racing
   a cancellation never leaks.
5. A pause never ends before its time, whatever is reported later; only
   ``resume`` ends it early. Holders are never touched by a pause.

Rate-limit reports pause grants, each for at most ``max_pause``. A report
that names the server's delay (``Retry-After``) pauses for that delay. One
that does not, or names one that is not positive (``Retry-After: 0``, a
date in the past: ``server_delay``), backs off: ``default_pause`` for the first report of a
streak, doubling with each later round, up to ``max_pause``. A report opens
a new round when it starts a streak or when a slot was granted since the
previous report (its request may be the one refused); reports with no grant
between them come from requests already in flight together, so they share a
round and its pause. Every round counts towards the streak, a server's
delay or not: a rate limit is never a success. The streak ends on a success,
a slot granted after the latest report and released with no report while it
was held; the policy needs no per-slot record for that, only the set of
holders at the latest report. ``resume`` ends the pause and the streak.

Budgets and an adaptive limit live in an optional ``Throttle`` (see
``_budgets``), asked before each grant: a ticket whose budget is not there
yet holds back every ticket behind it (``wake_at`` says when to look
again), and the throttle may move the limit after a release or a
rate-limit report. Invariant 2 then reads: while not paused and not held
back by the budget.

Waiting tickets queue in two sorted structures: a deque for those that
arrive in ticket order (the common case, since a turn starts when its
first request is made), O(1) each way, and a binary heap for the others
(an older turn's retry, a higher class); the next grant is the smaller of their heads. A ticket cancelled
while waiting is only forgotten by the set of waiters and skipped when it
surfaces; both are rebuilt when such dead entries outnumber the living.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, final

import attrs

from ._budgets import AdaptiveLimit, Budget, Throttle
from ._exceptions import QueueFull
from ._ratelimits import server_delay
from ._validation import (
    check_deadline,
    check_instant,
    check_max_waiting,
    check_optional_seconds,
    check_pauses,
    check_slot_limit,
    check_tenant_name,
    check_text,
)
from .messages._limits import Tenant

if TYPE_CHECKING:
    from ._backend import TenantStatistics
    from ._budgets import BudgetStatistics
    from ._ratelimits import RateLimitInfo
    from .messages._scheduling import Ticket

_COMPACT_SLACK = 64


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
    """Oldest-first admission of tickets under a concurrency limit.

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
    """

    __slots__ = (
        "_default_pause",
        "_fifo",
        "_gate",
        "_granted_at_report",
        "_granted_total",
        "_heap",
        "_holders",
        "_limit",
        "_max_pause",
        "_max_waiting",
        "_paused_until",
        "_peak_in_flight",
        "_peak_waiting",
        "_rejected_total",
        "_released_total",
        "_reported",
        "_step",
        "_streak",
        "_waiting",
        "_withdrawn_total",
    )

    def __init__(
        self,
        limit: int | None,
        *,
        max_waiting: int | None = None,
        default_pause: float = 1.0,
        max_pause: float = 60.0,
        throttle: Throttle | None = None,
    ) -> None:
        if limit is not None:
            check_slot_limit(limit)
        # Budgets and the adaptive limit, when there are any (see _budgets).
        self._gate = throttle
        if throttle is not None and throttle.limit is not None:
            limit = throttle.limit
        check_max_waiting(max_waiting)
        self._default_pause, self._max_pause = check_pauses(default_pause, max_pause)
        self._limit = limit
        self._max_waiting = max_waiting
        self._holders: set[Ticket] = set()
        self._waiting: set[Ticket] = set()
        # Waiting tickets: those that arrived in ticket order (the common
        # case: started_at defaults to now) queue in a sorted deque, O(1);
        # the others (an older turn's retry) go to a heap, O(log n).
        self._fifo: deque[Ticket] = deque()
        self._heap: list[Ticket] = []
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
        self._released_total = 0
        self._withdrawn_total = 0
        self._rejected_total = 0
        self._peak_in_flight = 0
        self._peak_waiting = 0

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
    def throttle(self) -> Throttle | None:
        """The budgets and adaptive limit asked before each grant, or ``None``."""
        return self._gate

    @property
    def wake_at(self) -> float | None:
        """When the policy must be ticked next: a pause ends or budget is back."""
        paused_until = self._paused_until
        gate = self._gate
        if gate is None or not self._waiting or not gate.blocked:
            return paused_until
        if paused_until is not None and self._limit is not None:
            return paused_until
        return gate.ready_at()

    def budget_statistics(self, now: float | None = None) -> BudgetStatistics | None:
        """The budgets at ``now`` (default: the latest time told), or ``None``."""
        return None if self._gate is None else self._gate.statistics(now)

    def holders(self) -> frozenset[Ticket]:
        """The tickets that hold a slot."""
        return frozenset(self._holders)

    def waiters(self) -> list[Ticket]:
        """The waiting tickets, in the order they will be granted."""
        return sorted(self._waiting)

    def statistics(self) -> PolicyStatistics:
        """A frozen snapshot of the state and the lifetime counters."""
        return PolicyStatistics(
            limit=self._limit,
            in_flight=len(self._holders),
            waiting=len(self._waiting),
            paused_until=self._paused_until,
            granted_total=self._granted_total,
            released_total=self._released_total,
            withdrawn_total=self._withdrawn_total,
            rejected_total=self._rejected_total,
            peak_in_flight=self._peak_in_flight,
            peak_waiting=self._peak_waiting,
        )

    def acquire(self, ticket: Ticket, tokens: int = 0) -> list[Ticket]:
        """Admit ``ticket``: grant it at once if a slot is free, else queue it.

        ``tokens`` is its estimated cost for a token budget (0: none).

        Raises:
            QueueFull: It would have to wait and ``max_waiting`` tickets
                already do. Nothing changed.
            ValueError: The ticket is already holding or waiting.
        """
        holders = self._holders
        waiting = self._waiting
        if ticket in holders or ticket in waiting:
            raise ValueError(f"ticket {ticket!r} is already known")
        limit = self._limit
        gate = self._gate
        if gate is not None:
            gate.expect(ticket, tokens)
        if (
            not waiting
            and (limit is None or (self._paused_until is None and len(holders) < limit))
            and (gate is None or gate.admit(ticket, len(holders), limit))
        ):
            holders.add(ticket)
            self._granted_total += 1
            self._peak_in_flight = max(self._peak_in_flight, len(holders))
            return [ticket]
        if self._max_waiting is not None and len(self._waiting) >= self._max_waiting:
            self._rejected_total += 1
            if gate is not None:
                gate.forget(ticket)
            raise QueueFull(
                f"{len(self._waiting)} requests already wait"
                f" (max_waiting={self._max_waiting})"
            )
        self._waiting.add(ticket)
        fifo = self._fifo
        if not fifo or ticket > fifo[-1]:
            fifo.append(ticket)
        else:
            heapq.heappush(self._heap, ticket)
        self._peak_waiting = max(self._peak_waiting, len(self._waiting))
        if gate is not None and gate.blocked:
            # It may go before the head the budget holds back, and fit.
            return self._fill()
        return []

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
        if ticket in self._waiting:
            self._waiting.discard(ticket)
            self._withdrawn_total += 1
            gate = self._gate
            if gate is not None:
                gate.forget(ticket)
                if gate.blocked:
                    # It may have been the head the budget held back.
                    self._compact()
                    return self._fill()
            self._compact()
            return []
        # A grant that raced a cancellation: never sent, so not a success.
        if self._streak:
            self._reported.discard(ticket)
        return self._release(ticket, success=False)

    def _compact(self) -> None:
        if len(self._heap) + len(self._fifo) > 2 * len(self._waiting) + _COMPACT_SLACK:
            self._fifo = deque(sorted(self._waiting))
            self._heap = []

    def set_limit(self, limit: int | AdaptiveLimit | None) -> list[Ticket]:
        """Change the limit.

        Raising it grants at once; lowering it lets the holders finish. An
        ``AdaptiveLimit`` starts at its ``initial`` value and moves on its
        own from there; an int or ``None`` replaces it.
        """
        if isinstance(limit, AdaptiveLimit):
            if self._gate is None:
                self._gate = Throttle()
            self._limit = self._gate.adapt(limit)
            return self._fill()
        if limit is not None:
            check_slot_limit(limit)
        if self._gate is not None:
            self._gate.adapt(None)
        self._limit = limit
        return self._fill()

    def advance(self, now: float) -> None:
        """Tell the budgets the time, before handling what arrived at ``now``."""
        if self._gate is not None:
            self._gate.advance(now)

    def report_usage(self, ticket: Ticket, tokens: int) -> list[Ticket]:
        """The request of held ``ticket`` used ``tokens`` in all: correct its charge."""
        gate = self._gate
        if gate is None or not gate.report_usage(ticket, tokens) or not gate.blocked:
            return []
        return self._fill()

    def answered(self, ticket: Ticket) -> None:
        """The answer of held ``ticket`` started: the server has counted it."""
        if self._gate is not None:
            self._gate.answered(ticket)

    def set_tenant(self, tenant: str, settings: Tenant | None) -> list[Ticket]:
        """Give ``tenant`` a weight and a cap; ``None``: back to the defaults.

        Returns the tickets the change lets through (a cap raised).

        Raises:
            TypeError: ``tenant`` is not a string, or ``settings`` not a
                ``Tenant`` or ``None``.
            ValueError: ``tenant`` is empty or too long.
        """
        check_tenant_name(tenant)
        if settings is not None and not isinstance(settings, Tenant):
            raise TypeError(f"settings must be a Tenant or None, got {settings!r}")
        return []

    def set_model_budget(self, model: str, budget: Budget) -> list[Ticket]:
        """Give ``model`` a budget of its own, asked beside the provider's.

        Returns the tickets the change lets through.

        Raises:
            TypeError: ``model`` is not a string or ``budget`` not a ``Budget``.
            ValueError: ``model`` is empty.
        """
        check_text(model, "model")
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        return []

    def tenant_statistics(
        self, now: float | None = None
    ) -> dict[str, TenantStatistics]:
        """Each named tenant's share at ``now`` (default: the latest time told)."""
        return {}

    def model_budget_statistics(
        self, now: float | None = None
    ) -> dict[str, BudgetStatistics]:
        """Each model's budgets at ``now`` (default: the latest time told)."""
        return {}

    def observe_rate_limits(
        self, now: float, info: RateLimitInfo, model: str | None = None
    ) -> list[Ticket]:
        """Learn from the rate-limit figures of an answer that arrived at ``now``.

        Creates the throttle if there is none, so a provider that was never
        given a budget is paced by what it reports.
        """
        gate = self._gate
        if gate is None:
            gate = self._gate = Throttle(learn=True, now=now)
        gate.advance(now)
        gate.observe(info)
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
        gate = self._gate
        if gate is not None:
            gate.advance(now)
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            return self._fill()
        if gate is not None and gate.blocked:
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
        self._released_total += 1
        gate = self._gate
        if gate is not None:
            limit = gate.release(ticket, success=success)
            if limit is not None:
                self._limit = limit
        if not self._waiting:
            return []
        return self._fill()

    def _fill(self) -> list[Ticket]:
        grants: list[Ticket] = []
        waiting = self._waiting
        limit = self._limit
        gate = self._gate
        if gate is not None:
            gate.unblock()
        if not waiting or (limit is not None and self._paused_until is not None):
            return grants
        fifo = self._fifo
        heap = self._heap
        holders = self._holders
        heappop = heapq.heappop
        held = len(holders)  # kept in step with holders, one len less a grant
        while waiting and (limit is None or held < limit):
            if heap and (not fifo or heap[0] < fifo[0]):
                ticket = heappop(heap)
            else:
                ticket = fifo.popleft()
            if ticket in waiting:
                if gate is not None and not gate.admit(ticket, held, limit):
                    # Oldest first: nobody passes a head the budget holds back.
                    fifo.appendleft(ticket)
                    break
                waiting.remove(ticket)
                holders.add(ticket)
                grants.append(ticket)
                held += 1
        self._granted_total += len(grants)
        self._peak_in_flight = max(self._peak_in_flight, held)
        if not waiting:
            fifo.clear()
            heap.clear()
        return grants
