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

Members and pools. Everything above that is a provider's (its limit,
throttle, models' throttles, pause and backoff, the server's load) is a
member's: the policy has one member at first, the provider itself, and
``add_member`` adds more; ``set_pool`` names groups of them. A waiting
ticket is in a lane: its model (for any member), ``(model, member)`` (that
member alone: asked for directly, or preferred, below) or ``(model,
pool)`` (any member of the pool); ``Tenants`` queues by lane as it queues
by model. The fill is the rule above, with "may take" per member: the
head chosen goes to a member of its lane with room whose budgets hold it,
trying the member it prefers first, then those with the most free slots
(ties in the order they were added), so the load spreads; a lane with no
such member is held back for the rest of the fill, as a model is. A
member's own budget holding a head back closes that member for the rest
of the fill, as it stops a lone provider's. So the invariants hold per
member (1, 2, 5; a member never idles while a ticket it may take waits),
and 3 across members: with the default tenant alone, each grant goes to
the oldest waiting ticket some member with room may take.

Affinity. A ticket that could go to several members and ``prefer``s one
of them (the member of its conversation's previous call, whose prompt
cache it would use) waits in that member's lane, at most
``affinity_wait`` seconds from its arrival; then (at the ``tick`` that
``wake_at`` asks for) it moves to its pool's lane, in its place, still
trying its member first. With affinity on, the order is exact but for
this: a ticket waiting for the member it prefers may be passed, on the
other members, by younger tickets, for at most ``affinity_wait``.

Members that fail. A call that failed before its answer started (its
connection refused or reset, no first byte in time, a server error) ends
with ``fail`` instead of ``release``: its slot goes back, and its member
counts one failure more in a row; any ``release`` (a call that got its
answer) ends the row. At ``failure_threshold`` failures in a row the member
is out of service: it takes nothing for ``failure_cooldown`` seconds (its
holders keep their slots), and the tickets waiting for it because they
prefer it wait for their pool. Then it is half-open: it takes one ticket,
its probe (tried first among the members that may take a ticket, so that
it is tried at once), and nothing more until the probe ends. A probe released is a
success: the member is back in service, its full limit open again; a
probe failed takes it out for another cooldown; a probe withdrawn unused
leaves it half-open for the next. While out, a member is no member for
the invariants: a ticket that only it may take waits, and so does every
ticket while all the members it may take are out. A ticket that failed on
some members (a fallback) may ``avoid`` them: it waits in a lane of its
pool without them, unless that leaves none (then it may take any).
Rate-limit answers are no failures: they pause the member (above). A
policy of one member (a provider alone) counts its failures but never
takes it out of service: with nowhere else to send them, its requests
go on, and their callers meet the failures.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Literal, TypeAlias, final

import attrs

from .._exceptions import QueueFull, queue_full
from .._validation import (
    check_deadline,
    check_instant,
    check_limit,
    check_max_waiting,
    check_optional_seconds,
    check_pauses,
    check_provider,
    check_seconds,
    check_slot_limit,
    check_text,
)
from ..messages._limits import Tenant, check_tenant
from ._budgets import AdaptiveLimit, Budget, ModelThrottles, Throttle
from ._ratelimits import server_delay
from ._server import ServerGate
from ._tenants import Tenants

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable, Mapping

    from .._server_load._load import ServerLoad
    from ..messages._protocol import Ticket
    from ._budgets import BudgetStatistics
    from ._ratelimits import RateLimitInfo
    from ._tenants import Lane, TenantStatistics

#: ``affinity_wait``'s default: how long a request waits for the member
#: its conversation's previous call used while another member could serve it.
DEFAULT_AFFINITY_WAIT = 2.0

#: A member's service: out of service, half-open (its probe), or in service.
ServiceState: TypeAlias = Literal["out", "half_open", "in"]

#: ``failure_threshold``'s default: a member's failures in a row that take
#: it out of service.
DEFAULT_FAILURE_THRESHOLD = 3

#: ``failure_cooldown``'s default: how long a member that failed stays out
#: of service before its probe, in seconds.
DEFAULT_FAILURE_COOLDOWN = 30.0


@final
@attrs.frozen
class MemberState:
    """What a provider learned and holds, to carry into another policy (``member_state``).

    Its budgets and adaptive limit (``throttle``), its models' budgets,
    its pause and its holders, as they are: ``add_member`` takes them on.

    Attributes:
        throttle: Its budgets and adaptive limit, or ``None``.
        models: Its models' budgets, by model.
        paused_until: The end of its pause, or ``None``.
        holders: The tickets holding its slots (their budgets charged
            already, in ``throttle``).
        waiting: The tickets waiting for it, in ticket order, each with
            its estimate of tokens: the caller asks for them again.
        streak: Its backoff: rounds of rate-limit reports since its last
            success (0: none).
        step: The pause of the streak's current round without a delay.
        reported: The holders at its latest report (their release is no
            success).
        granted_since_report: Whether it granted anything since its
            latest report (the next report starts a new round).
        server: Its server's load as last read, and the slots learned
            from it (``observe_server_load``), or ``None``.
        failures: Its calls failed in a row (``fail``).
        out_until: The end of its cooldown while out of service, or
            ``None`` (a member of a pool only).
        half_open: Whether it is back from a cooldown, taking one probe.
        probe: The holder that is its probe while half-open, or ``None``.
        granted_total: Slots granted on it so far (its holders among
            them), for its statistics to go on from.
        peak_in_flight: The most slots it held at once.
        affinity_hits: Requests that preferred it and were granted on it.
        affinity_moves: Requests that preferred it and went elsewhere.
        outages_total: How many times it was taken out of service.
        withdrawn_total: A provider alone: the requests its queue
            withdrew, for the queue it joins to count on from (a group's
            are its ``GroupState``'s).
        rejected_total: Likewise, the requests its queue refused.
        peak_waiting: Likewise, the most that waited in its queue at once.
    """

    throttle: Throttle | None
    models: Mapping[str, Throttle]
    paused_until: float | None
    holders: tuple[Ticket, ...] = ()
    waiting: tuple[tuple[Ticket, int], ...] = ()
    streak: int = 0
    step: float = 0.0
    reported: tuple[Ticket, ...] = ()
    granted_since_report: bool = False
    server: ServerGate | None = None
    failures: int = 0
    out_until: float | None = None
    half_open: bool = False
    probe: Ticket | None = None
    granted_total: int = 0
    peak_in_flight: int = 0
    affinity_hits: int = 0
    affinity_moves: int = 0
    outages_total: int = 0
    withdrawn_total: int = 0
    rejected_total: int = 0
    peak_waiting: int = 0


@final
@attrs.frozen
class WaitingState:
    """A ticket waiting in a pooled policy, to queue in another in its place (``group_state``).

    Attributes:
        ticket: The ticket.
        tokens: Its estimate of tokens (0: none).
        lane: The lane it waits in, as the queue keeps it: its model
            alone (any member), ``(model, member or pool)``, or ``(model,
            pool or None, members avoided)``.
        home: Its lane once its wait for the member it prefers ends, or
            ``None`` if it does not wait for that member alone.
        preferred: The member it prefers (tried first), or ``None``.
        until: When its wait for ``preferred`` ends (with ``home``).
    """

    ticket: Ticket
    tokens: int
    lane: Lane
    home: Lane = None
    preferred: str | None = None
    until: float | None = None


@final
@attrs.frozen
class GroupState:
    """What a pooled policy holds, to carry into another (``group_state``, ``merge``).

    Attributes:
        members: Each member's name and what it learned and holds
            (``MemberState``, its ``waiting`` empty), in their order.
        pools: Each pool's members, by pool name.
        waiting: The tickets waiting, in ticket order, each with its lane.
        withdrawn_total: The requests its queue withdrew, for the queue
            it joins to count on from.
        rejected_total: The requests its queue refused.
        peak_waiting: The most that waited in its queue at once.
    """

    members: tuple[tuple[str, MemberState], ...]
    pools: Mapping[str, tuple[str, ...]]
    waiting: tuple[WaitingState, ...]
    withdrawn_total: int = 0
    rejected_total: int = 0
    peak_waiting: int = 0


@final
@attrs.frozen
class PolicyStatistics:
    """A snapshot of one policy's state and lifetime counters.

    For a pool, ``limit`` is the members' limits added up (``None`` if any
    is unlimited), ``paused_until`` the earliest end of the members'
    pauses while every limited member is paused (``None`` otherwise), and
    the counts are over all members; ``member_statistics`` tells each.
    """

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
@attrs.frozen
class MemberStatistics:
    """One member of a policy's pool, as its policy sees it.

    Attributes:
        member: The member's name.
        limit: Its limit, or ``None`` for unlimited.
        in_flight: Slots it holds now.
        waiting: Requests waiting for it alone now: asked of it directly,
            or preferring it (affinity) for less than ``affinity_wait``.
        paused_until: When its pause ends, or ``None``.
        granted_total: Slots granted on it.
        released_total: Slots it gave back.
        peak_in_flight: The most slots it ever held at once.
        affinity_hits: Requests that preferred it and were granted on it.
        affinity_moves: Requests that preferred it and were granted on
            another member (it could not take them in time).
        failures: Its calls failed in a row, before their answer.
        out_of_service_until: When its cooldown ends, while it is out of
            service; ``None`` otherwise.
        half_open: Whether it is back from a cooldown, taking one request
            (its probe) until that request succeeds.
        outages_total: How many times it was taken out of service.
    """

    member: str
    limit: int | None
    in_flight: int
    waiting: int
    paused_until: float | None
    granted_total: int
    released_total: int
    peak_in_flight: int
    affinity_hits: int
    affinity_moves: int
    failures: int = 0
    out_of_service_until: float | None = None
    half_open: bool = False
    outages_total: int = 0


@final
@attrs.frozen
class PoolStatistics:
    """One pool: its members, and the requests waiting for it.

    Attributes:
        pool: The pool's name.
        members: Its members, in the order they were named.
        limit: Their limits added up, or ``None`` if one is unlimited.
        in_flight: The slots its members hold now (for any request: a
            member may be asked for directly, or be in several pools).
        waiting: The requests waiting for the pool now, those waiting for
            the member they prefer included.
        affinity_hits: Requests granted on the member they preferred,
            over its members.
        affinity_moves: Requests that preferred one of its members and
            were granted on another.
    """

    pool: str
    members: tuple[str, ...]
    limit: int | None
    in_flight: int
    waiting: int
    affinity_hits: int
    affinity_moves: int


@final
class _Member:
    """One member's limit, holders, budgets, pause and backoff."""

    __slots__ = (
        "affinity_hits",
        "affinity_moves",
        "failures",
        "gate",
        "granted_at_report",
        "granted_total",
        "half_open",
        "held_back",
        "holders",
        "limit",
        "models",
        "name",
        "out_until",
        "outages_total",
        "paused_until",
        "peak_in_flight",
        "probe",
        "reported",
        "server",
        "step",
        "streak",
    )

    def __init__(
        self,
        name: str,
        limit: int | None,
        throttle: Throttle | None,
        models: ModelThrottles,
        step: float,
    ) -> None:
        self.name = name
        # Budgets and the adaptive limit, when there are any (see _budgets).
        self.gate = throttle
        if throttle is not None and throttle.limit is not None:
            limit = throttle.limit
        self.limit = limit
        self.holders: set[Ticket] = set()
        self.models = models
        self.paused_until: float | None = None
        # The backoff: rounds of rate-limit reports since the last success
        # (0: no streak), the pause of the current round without a delay,
        # granted_total at the latest report, and the holders at the latest
        # report that still hold (their release is not a success).
        self.streak = 0
        self.step = step
        self.granted_at_report = 0
        self.reported: set[Ticket] = set()
        self.granted_total = 0
        self.peak_in_flight = 0
        self.affinity_hits = 0
        self.affinity_moves = 0
        # The models whose throttle held their head back at the end of the
        # latest fill, with a slot still free: wake_at watches them.
        self.held_back: list[str] = []
        # The server's own load, once it is read (observe_server_load).
        self.server: ServerGate | None = None
        # Its health (see the module notes): failures in a row; the end of
        # its cooldown while out of service; whether it is half-open, and
        # its probe then, while one holds.
        self.failures = 0
        self.out_until: float | None = None
        self.half_open = False
        self.probe: Ticket | None = None
        self.outages_total = 0

    def __repr__(self) -> str:
        return (
            f"<member {self.name!r} limit={self.limit} in_flight={len(self.holders)}"
            f" paused_until={self.paused_until}>"
        )

    def has_slot(self) -> bool:
        """Whether a slot is free under its limit, it is not paused, and in service.

        Half-open, its one slot is its probe's.
        """
        # One method, no call of another: every grant asks it.
        if self.out_until is not None or (self.half_open and self.probe is not None):
            return False
        limit = self.limit
        return limit is None or (
            self.paused_until is None and len(self.holders) < limit
        )

    def room(self) -> bool:
        """Whether it may take a grant now, budgets aside.

        A slot free, not paused, and its server's load (once read) holding
        one more.
        """
        if not self.has_slot():
            return False
        server = self.server
        return server is None or server.holds(len(self.holders))

    def free(self) -> float:
        """Its free slots (unlimited: infinitely many), for the choice between members."""
        limit = self.limit
        return float("inf") if limit is None else limit - len(self.holders)

    def wake_at(self, waiting: bool) -> float | None:
        """When this member must be looked at again: its pause or cooldown ends, budget is back."""
        out_until = self.out_until
        if out_until is not None:
            # Half-open at the cooldown's end, for statistics too.
            at = self._wake_at(waiting)
            return out_until if at is None else min(at, out_until)
        return self._wake_at(waiting)

    def _wake_at(self, waiting: bool) -> float | None:
        """``wake_at`` but for a cooldown."""
        paused_until = self.paused_until
        gate = self.gate
        if gate is None or not waiting or not gate.blocked:
            # Read per wake-up: a model held back is looked for only here.
            return self._wake_at_held_back(waiting) if self.held_back else paused_until
        if self.held_back:
            return self._wake_at_held_back(waiting)
        if paused_until is not None and self.limit is not None:
            return paused_until
        return gate.ready_at()

    def _wake_at_held_back(self, waiting: bool) -> float | None:
        """``wake_at`` when some model's throttle holds its head back."""
        paused_until = self.paused_until
        if not waiting or (paused_until is not None and self.limit is not None):
            return paused_until
        models = self.models
        times = [models[model].ready_at() for model in self.held_back]
        gate = self.gate
        if gate is not None and gate.blocked:
            times.append(gate.ready_at())
        ready = [time for time in times if time is not None]
        return min(ready) if ready else paused_until

    def unblock(self) -> None:
        """Forget what the budgets held back: the fill looks again."""
        if self.gate is not None:
            self.gate.unblock()
        held_back = self.held_back
        if held_back:
            models = self.models
            for model in held_back:
                models[model].unblock()
            self.held_back = []

    def forget(self, ticket: Ticket) -> None:
        """Waiting ``ticket`` is no longer this member's to take: its estimates and use go."""
        gate = self.gate
        if gate is not None:
            gate.forget(ticket)
        model = ticket.model
        if model is not None:
            models = self.models
            model_gate = models.get(model)
            if model_gate is not None:
                model_gate.forget(ticket)
            models.use(model, -1)

    def blocked(self) -> bool:
        """Whether a budget holds back a head it may let through later."""
        gate = self.gate
        return bool(self.held_back) or (gate is not None and gate.blocked)

    def statistics(self, waiting: int) -> MemberStatistics:
        return MemberStatistics(
            member=self.name,
            limit=self.limit,
            in_flight=len(self.holders),
            waiting=waiting,
            paused_until=self.paused_until,
            granted_total=self.granted_total,
            released_total=self.granted_total - len(self.holders),
            peak_in_flight=self.peak_in_flight,
            affinity_hits=self.affinity_hits,
            affinity_moves=self.affinity_moves,
            failures=self.failures,
            out_of_service_until=self.out_until,
            half_open=self.half_open,
            outages_total=self.outages_total,
        )


@final
class SlotPolicy:
    """Oldest-first admission of tickets under concurrency limits, shared by tenants.

    Every method that can free a slot returns the tickets granted by that
    call, in grant order; the caller must deliver them (``member_of`` says
    on which member each was granted). ``limit=None`` means unlimited:
    every ticket is granted at once and pauses have no effect.

    The policy has one member at first, the provider itself (named
    ``provider``, or ``""`` without one), with ``limit``, ``throttle`` and
    ``models``; ``add_member`` makes it a pool (see the module notes). The
    methods that concern one member take ``member=``, its name; ``None``
    is the first member.

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
        affinity_wait: In a pool, the longest a ticket that prefers a
            member waits for it while another member could take it, in
            seconds; ``0``: preferences are ignored.
        failure_threshold: A member's calls failed in a row (``fail``)
            that take it out of service.
        failure_cooldown: How long a member stays out of service before
            its probe, in seconds.
        now: The time it starts at (its budgets', its models'), as
            ``advance`` would tell it; ``0.0`` by default.

    Attributes:
        needs_clock: Whether grants and releases need the time: true once
            a tenant was configured or a ticket with a tenant seen, or a
            ticket preferred a member. The caller then calls
            ``advance(now)`` before each call (a plain attribute, read on
            every hand-off).
        service_changes: Each member's moves out of service, to half-open
            and back in, in order, since the caller last cleared it: ``(member,
            state, until)``, ``state`` one of ``"out"`` (``until``: its
            cooldown's end), ``"half_open"`` and ``"in"`` (``until``:
            ``None``). The caller tells them, and clears the list.
    """

    __slots__ = (
        "_affinity_wait",
        "_counting",
        "_default_pause",
        "_estimates",
        "_expiring",
        "_failure_cooldown",
        "_failure_threshold",
        "_first",
        "_granted_total",
        "_held_by",
        "_homes",
        "_max_pause",
        "_max_waiting",
        "_members",
        "_moved",
        "_now",
        "_peak_in_flight",
        "_peak_waiting",
        "_pools",
        "_preferred",
        "_provider",
        "_rejected_total",
        "_tenants",
        "_waiting",
        "_withdrawn_total",
        "needs_clock",
        "service_changes",
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
        affinity_wait: float = DEFAULT_AFFINITY_WAIT,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        failure_cooldown: float = DEFAULT_FAILURE_COOLDOWN,
        now: float = 0.0,
    ) -> None:
        if limit is not None:
            check_slot_limit(limit)
        if provider is not None:
            check_provider(provider)
        configured = {} if tenants is None else dict(tenants)
        for name, settings in configured.items():
            check_tenant(name, settings)
        throttles = _check_models(models)
        now = check_instant(now, "now")
        check_max_waiting(max_waiting)
        self._default_pause, self._max_pause = check_pauses(default_pause, max_pause)
        self._affinity_wait = check_seconds(affinity_wait, "affinity_wait")
        self._failure_threshold = check_limit(failure_threshold, "failure_threshold")
        self._failure_cooldown = check_seconds(
            failure_cooldown, "failure_cooldown", positive=True
        )
        self._max_waiting = max_waiting
        self._provider = provider
        self._first = _Member(
            "" if provider is None else provider,
            limit,
            throttle,
            ModelThrottles(throttles, now),
            self._default_pause,
        )
        self._members: dict[str, _Member] = {self._first.name: self._first}
        # Each holder's member; a removed member's holders keep theirs.
        self._held_by: dict[Ticket, _Member] = {}
        # The waiting tickets, each with its lane (see the module notes).
        self._waiting: dict[Ticket, Lane] = {}
        # The estimates of the waiting tickets that have one, so that a
        # throttle made while they wait (the first figures, an adaptive
        # limit, a model's first budget, a member added) charges them as
        # one made before.
        self._estimates: dict[Ticket, int] = {}
        # The member each waiting ticket prefers (affinity), and when each
        # waiting only for it stops: a heap of (instant, ticket).
        self._preferred: dict[Ticket, _Member] = {}
        self._expiring: list[tuple[float, Ticket]] = []
        # The lane each ticket waiting only for the member it prefers goes
        # to when that wait ends: its pool's, or any member's.
        self._homes: dict[Ticket, Lane] = {}
        # Whether a wait for a preferred member ended since the last tick.
        self._moved = False
        # The named pools: each a list of members (see set_pool).
        self._pools: dict[str, list[_Member]] = {}
        self._granted_total = 0
        self._withdrawn_total = 0
        self._rejected_total = 0
        self._peak_in_flight = 0
        self._peak_waiting = 0
        # The latest time told (advance, tick, a report): tenants' service
        # accrues in it.
        self._now = now
        # The queue: every waiting ticket, by its tenant and lane (see
        # _tenants); service and models' use are counted from the first
        # tenant or model on.
        self._tenants = Tenants()
        self._counting = False
        self.needs_clock = False
        self.service_changes: list[tuple[str, ServiceState, float | None]] = []
        if configured:
            self.needs_clock = True
            self._count()
            for name, settings in configured.items():
                self._tenants.configure(name, settings, self._now)
        elif throttles:
            self._count()

    def __repr__(self) -> str:
        return (
            f"<SlotPolicy limit={self.limit} in_flight={len(self._held_by)}"
            f" waiting={len(self._waiting)} paused_until={self.paused_until}>"
        )

    def _member(self, name: str | None) -> _Member:
        """The member named ``name`` (``None``: the first)."""
        if name is None:
            return self._first
        member = self._members.get(name)
        if member is None:
            raise ValueError(f"no member {name!r} in this policy")
        return member

    @property
    def limit(self) -> int | None:
        """The limit: the members' limits added up, ``None`` if any is unlimited."""
        members = self._members
        if len(members) == 1:
            return self._first.limit
        total = 0
        for member in members.values():
            if member.limit is None:
                return None
            total += member.limit
        return total

    @property
    def in_flight(self) -> int:
        """How many tickets hold a slot."""
        return len(self._held_by)

    @property
    def waiting(self) -> int:
        """How many tickets wait for a slot."""
        return len(self._waiting)

    @property
    def paused_until(self) -> float | None:
        """Until when grants are paused, or ``None``: in a pool, while every limited member is."""
        members = self._members
        if len(members) == 1:
            return self._first.paused_until
        ends = []
        for member in members.values():
            if member.limit is None:
                continue
            if member.paused_until is None:
                return None
            ends.append(member.paused_until)
        return min(ends) if ends else None

    @property
    def members(self) -> list[str]:
        """The members' names, the first first, then in the order they were added."""
        return list(self._members)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a member or a pool of this policy (no copy made)."""
        return name in self._members or name in self._pools

    @property
    def affinity_wait(self) -> float:
        """The longest a ticket waits for the member it prefers (see ``acquire``)."""
        return self._affinity_wait

    @property
    def counts_tenants(self) -> bool:
        """Whether service and models' use are counted: from the first tenant or model on."""
        return self._counting

    @property
    def throttle(self) -> Throttle | None:
        """The first member's budgets and adaptive limit, or ``None``."""
        return self._first.gate

    @property
    def throttled(self) -> bool:
        """Whether any budget is asked: a member's or a model's."""
        return any(
            member.gate is not None or bool(member.models)
            for member in self._members.values()
        )

    @property
    def wake_at(self) -> float | None:
        """When the policy must be ticked next: a pause ends, budget is back, a preference ends."""
        if self._moved:
            return self._now  # waits for a preferred member ended: due now
        waiting = bool(self._waiting)
        members = self._members
        if len(members) == 1:
            wake_at = self._first.wake_at(waiting)
        else:
            wake_at = None
            for member in members.values():
                at = member.wake_at(waiting)
                if at is not None and (wake_at is None or at < wake_at):
                    wake_at = at
        expiring = self._expiring
        if expiring:
            at = self._expiry()
            if at is not None and (wake_at is None or at < wake_at):
                wake_at = at
        return wake_at

    def _expiry(self) -> float | None:
        """When the first ticket still waiting only for the member it prefers stops."""
        expiring = self._expiring
        homes = self._homes
        while expiring:
            if expiring[0][1] in homes:
                return expiring[0][0]
            heapq.heappop(expiring)  # granted, withdrawn or moved since
        return None

    def budget_statistics(
        self, now: float | None = None, *, member: str | None = None
    ) -> BudgetStatistics | None:
        """A member's budgets at ``now`` (default: the latest time told), or ``None``."""
        gate = self._member(member).gate
        return None if gate is None else gate.statistics(now)

    def holders(self) -> frozenset[Ticket]:
        """The tickets that hold a slot."""
        return frozenset(self._held_by)

    def member_of(self, ticket: Ticket) -> str | None:
        """The member on which ``ticket`` holds its slot, or ``None`` if it holds none."""
        member = self._held_by.get(ticket)
        return None if member is None else member.name

    def waiters(self) -> list[Ticket]:
        """The waiting tickets in ticket order: the grant order without tenants."""
        return sorted(self._waiting)

    def statistics(self) -> PolicyStatistics:
        """A frozen snapshot of the state and the lifetime counters."""
        in_flight = len(self._held_by)
        return PolicyStatistics(
            limit=self.limit,
            in_flight=in_flight,
            waiting=len(self._waiting),
            paused_until=self.paused_until,
            granted_total=self._granted_total,
            # Every grant is held until released: the released ones are
            # those granted that no longer hold.
            released_total=self._granted_total - in_flight,
            withdrawn_total=self._withdrawn_total,
            rejected_total=self._rejected_total,
            peak_in_flight=self._peak_in_flight,
            peak_waiting=self._peak_waiting,
        )

    def member_pauses(self) -> dict[str, float | None]:
        """When each member's pause ends, by name: ``None`` if not paused, or unlimited."""
        return {
            name: None if member.limit is None else member.paused_until
            for name, member in self._members.items()
        }

    def member_limits(self) -> dict[str, int | None]:
        """Each member's limit, by name."""
        return {name: member.limit for name, member in self._members.items()}

    def member_budgets(
        self, member: str, now: float | None = None
    ) -> tuple[bool, BudgetStatistics | None]:
        """Whether ``member``'s limit is adaptive, and its budgets at ``now``."""
        gate = self._member(member).gate
        if gate is None:
            return False, None
        return gate.adaptive is not None, gate.statistics(now)

    def member_state(self) -> MemberState:
        """What this one provider learned and holds, to carry into another policy.

        Its budgets, adaptive limit and pause, its holders, and the tickets
        waiting, for a provider that joins a pool: the other policy takes
        them on (``add_member``) and the waiting tickets are asked for
        again there, in their place. This policy is left as it is, for
        the caller to drop.

        Raises:
            ValueError: The policy has several members or a pool.
        """
        if len(self._members) > 1 or self._pools:
            raise ValueError("a pooled policy's members are not carried elsewhere")
        estimates = self._estimates
        return attrs.evolve(
            self._state_of(
                self._first,
                tuple((ticket, estimates.get(ticket, 0)) for ticket in self.waiters()),
            ),
            withdrawn_total=self._withdrawn_total,
            rejected_total=self._rejected_total,
            peak_waiting=self._peak_waiting,
        )

    def group_state(self) -> GroupState:
        """What this policy learned and holds, members, pools and queue, to carry into another.

        For a group that joins another at run time: the other policy takes
        it all in at once (``merge``), the waiting tickets in their lanes
        and their place, each still preferring its member until its wait
        for it ends. This policy is left as it is, for the caller to drop.
        """
        homes = self._homes
        until = {ticket: at for at, ticket in self._expiring if ticket in homes}
        estimates = self._estimates
        preferred = self._preferred
        waiting = []
        for ticket in self.waiters():
            prefers = preferred.get(ticket)
            waiting.append(
                WaitingState(
                    ticket,
                    estimates.get(ticket, 0),
                    self._waiting[ticket],
                    homes.get(ticket),
                    None if prefers is None else prefers.name,
                    until.get(ticket),
                )
            )
        return GroupState(
            tuple(
                (name, self._state_of(member)) for name, member in self._members.items()
            ),
            {
                name: tuple(member.name for member in members)
                for name, members in self._pools.items()
            },
            tuple(waiting),
            self._withdrawn_total,
            self._rejected_total,
            self._peak_waiting,
        )

    @staticmethod
    def _state_of(
        member: _Member, waiting: tuple[tuple[Ticket, int], ...] = ()
    ) -> MemberState:
        """``member``'s learned and held state (``MemberState``), with ``waiting``."""
        return MemberState(
            member.gate,
            member.models.throttles(),
            member.paused_until,
            tuple(sorted(member.holders)),
            waiting,
            member.streak,
            member.step,
            tuple(sorted(member.reported)),
            member.granted_total != member.granted_at_report,
            member.server,
            member.failures,
            member.out_until,
            member.half_open,
            member.probe,
            member.granted_total,
            member.peak_in_flight,
            member.affinity_hits,
            member.affinity_moves,
            member.outages_total,
        )

    def member_server_load(self, member: str) -> tuple[ServerLoad | None, int | None]:
        """``member``'s latest reading of its server's load and its slots learned, if any."""
        server = self._member(member).server
        return (None, None) if server is None else (server.load, server.slots)

    def pool_statistics(self) -> dict[str, PoolStatistics]:
        """Each pool's snapshot, by name."""
        waiting: dict[str, int] = {}
        homes = self._homes
        for ticket, lane in self._waiting.items():
            name = _named(homes.get(ticket, lane))
            if name is not None:
                waiting[name] = waiting.get(name, 0) + 1
        found = {}
        for name, members in self._pools.items():
            limits = [member.limit for member in members]
            found[name] = PoolStatistics(
                pool=name,
                members=tuple(member.name for member in members),
                limit=None if None in limits else sum(limits),  # type: ignore[arg-type]  # no None
                in_flight=sum(len(member.holders) for member in members),
                waiting=waiting.get(name, 0),
                affinity_hits=sum(member.affinity_hits for member in members),
                affinity_moves=sum(member.affinity_moves for member in members),
            )
        return found

    def member_statistics(self) -> dict[str, MemberStatistics]:
        """Each member's snapshot, by name, in ``members`` order."""
        alone: dict[str, int] = {}
        for lane in self._waiting.values():
            name = _named(lane)
            if name is not None:
                alone[name] = alone.get(name, 0) + 1
        return {
            name: member.statistics(alone.get(name, 0))
            for name, member in self._members.items()
        }

    def acquire(
        self,
        ticket: Ticket,
        tokens: int = 0,
        *,
        member: str | None = None,
        prefer: str | None = None,
        avoid: Collection[str] = (),
    ) -> list[Ticket]:
        """Admit ``ticket``: grant it at once if a member can take it, else queue it.

        ``tokens`` is its estimated cost for a token budget (0: none).
        ``member`` asks for that member alone; ``prefer`` prefers one (the
        member of its conversation's previous call): while that member
        cannot take it and another could, it waits for it at most
        ``affinity_wait`` seconds, then goes to any. A ``prefer`` that is
        not a member, or in a policy of one member, changes nothing.
        ``avoid`` names members it must not go to (those its call already
        failed on, a fallback): it waits for the others of its pool (or of
        the policy), unless that leaves none; ignored for a ticket that asks
        for one member. Returns the tickets granted by this call, in grant order:
        ``[ticket]`` when it goes at once, but also, when a budget held the
        head back and is back by now, others before it, or instead of it.

        Raises:
            QueueFull: It would have to wait and ``max_waiting`` tickets
                already do. Nothing changed.
            ValueError: The ticket is already holding or waiting, or
                ``member`` is not a member.
            TypeError: ``avoid`` is a string, not a collection of names.
        """
        waiting = self._waiting
        if ticket in self._held_by or ticket in waiting:
            raise ValueError(f"ticket {ticket!r} is already known")
        model = ticket.model
        lane: Lane = model
        preferred = None
        # Its lane once its wait for the member it prefers ends: none unless
        # it waits for that member first (then ``lane`` is that member's).
        home: Lane = model
        if member is not None or prefer is not None or avoid:
            lane, preferred, home = self._lane(model, member, prefer, avoid)
        if ticket.tenant is not None and not self._counting:
            # The first ticket with a tenant.
            self.needs_clock = True
            self._count()
        if preferred is not None:
            # Before the choice of a member: it is tried first.
            self._preferred[ticket] = preferred
        max_waiting = self._max_waiting
        full = max_waiting is not None and len(waiting) >= max_waiting
        taker = self._taker(ticket, tokens, lane) if full or not waiting else None
        if full and taker is None:
            self._preferred.pop(ticket, None)
            raise self._refused()
        if waiting:
            taker = None  # it goes with the others, by the fill
        if tokens:
            self._expect(ticket, tokens)
        if model is not None:
            self._use(model)
        if taker is not None:
            return self._grant_at_once(taker, ticket)
        if tokens:
            self._estimates[ticket] = tokens
        waiting[ticket] = lane
        self._tenants.queue(ticket, self._now, lane)
        if lane is not home:
            self._homes[ticket] = home
            heapq.heappush(self._expiring, (self._now + self._affinity_wait, ticket))
        grants = self._fill() if self._open() else []
        if len(waiting) > self._peak_waiting:  # noqa: PLR1730  # no call on the hot path
            self._peak_waiting = len(waiting)
        return grants

    def _grant_at_once(self, member: _Member, ticket: Ticket) -> list[Ticket]:
        """Grant arriving ``ticket`` on ``member``, nobody waiting: what a fill would do."""
        # A fill would choose it, alone, and grant it. So it is, here, as
        # the fill grants, with no queue to pass through.
        self._take(member, ticket)
        self._tenants.grant_at_once(ticket, self._now)
        self._granted_total += 1
        held = len(self._held_by)
        if held > self._peak_in_flight:  # noqa: PLR1730  # no call on the hot path
            self._peak_in_flight = held
        return [ticket]

    def _lane(
        self,
        model: str | None,
        member: str | None,
        prefer: str | None,
        avoid: Collection[str] = (),
    ) -> tuple[Lane, _Member | None, Lane]:
        """A new ticket's lane, the member it prefers, and its lane after its wait for it.

        A preference counts for a ticket that may go to several members,
        the preferred one among them and not avoided, while
        ``affinity_wait`` is not 0; it waits for that member first (in its
        lane) unless that member is paused or out of service. Without such
        a wait, the first and the last are the same. Members avoided make
        the lane of the others (the pool's, or any member's), if any is left.
        """
        home: Lane = model
        choices: list[_Member] = list(self._members.values())
        if member is not None:
            pool = self._pools.get(member)
            if pool is None:
                lane = (model, self._member(member).name)
                return lane, None, lane
            home, choices = (model, member), pool
        if avoid:
            if isinstance(avoid, str):
                raise TypeError(
                    f"avoid must be a collection of member names, got {avoid!r}"
                )
            avoided = frozenset(avoid) & {each.name for each in choices}
            if avoided and len(avoided) < len(choices):
                home = (model, member, avoided)
                choices = [each for each in choices if each.name not in avoided]
        if prefer is None or not self._affinity_wait or len(choices) < 2:
            return home, None, home
        preferred = self._members.get(prefer)
        if preferred is None or preferred not in choices:
            return home, None, home
        self.needs_clock = True
        if (
            preferred.paused_until is not None
            or preferred.out_until is not None
            or preferred.half_open
        ):
            # Preferred, first among those that can take it, but not
            # waited for: a paused member takes nothing until its pause
            # ends, one out of service nothing until its probe succeeds.
            return home, preferred, home
        return (model, prefer), preferred, home

    def _open(self) -> bool:
        """Whether some member has a free slot and is not paused: a fill may grant."""
        first = self._first
        if len(self._members) == 1:
            return first.has_slot()
        return any(member.has_slot() for member in self._members.values())

    def _use(self, model: str) -> None:
        """A ticket of ``model`` more waits: it counts as every member's use of it."""
        for member in self._members.values():
            member.models.use(model, 1)

    def _expect(self, ticket: Ticket, tokens: int) -> None:
        """Every member's budgets, and its model's, expect ``ticket`` at ``tokens``."""
        model = ticket.model
        for member in self._members.values():
            if member.gate is not None:
                member.gate.expect(ticket, tokens)
            if model is not None:
                model_gate = member.models.get(model)
                if model_gate is not None:
                    model_gate.expect(ticket, tokens)

    def _refused(self) -> QueueFull:
        """Count a ticket refused for a full queue; the error to raise."""
        self._rejected_total += 1
        assert self._max_waiting is not None  # only a bounded queue refuses
        return queue_full(self._provider, len(self._waiting), self._max_waiting)

    def _candidates(self, lane: Lane, ticket: Ticket) -> Iterable[_Member]:
        """The members that may take a ticket of ``lane``, in the order they are tried.

        A member's lane: that member. The lane of any member: the one
        the ticket prefers first, then those with the most free slots
        (ties in ``members`` order), so the load spreads.
        """
        members = self._members
        if lane.__class__ is tuple:
            name = lane[1]  # a member's or a pool's lane
            pool = self._pools.get(name) if name is not None else list(members.values())
            if pool is None:
                return (members[name],)  # type: ignore[index]  # a member's name
            ordered = sorted(pool, key=_member_key)
            if len(lane) == 3:
                # A fallback's: its pool but the members it avoids, if any is left.
                avoided = lane[2]
                kept = [member for member in ordered if member.name not in avoided]
                if kept:
                    ordered = kept
        elif len(members) == 1:
            return (self._first,)
        else:
            ordered = sorted(members.values(), key=_member_key)
        preferred = self._preferred.get(ticket)
        if preferred is not None and preferred in ordered:
            ordered.remove(preferred)
            ordered.insert(0, preferred)
        return ordered

    def _taker(self, ticket: Ticket, tokens: int, lane: Lane) -> _Member | None:
        """The member a fill now would grant ``ticket``, a newcomer, on, or ``None``.

        Every other waiter may not take a free slot (invariant 2), so the
        newcomer goes if it may: a member of its lane has room, its tenant
        is below its cap, and no budget holds it back. With nobody waiting,
        no budget holds anyone back, and the fill would choose it: then
        this is exactly whether, and where, the fill grants it.
        """
        state = self._tenants.get(ticket.tenant)
        if state is not None and state.limit is not None and state.held >= state.limit:
            return None
        model = ticket.model
        for member in self._candidates(lane, ticket):
            if not member.room() or (model is not None and model in member.held_back):
                continue
            gate = member.gate
            if gate is not None and (gate.blocked or not gate.fits(tokens)):
                continue
            model_gate = None if model is None else member.models.get(model)
            if model_gate is None or model_gate.fits(tokens):
                return member
        return None

    def _take(self, member: _Member, ticket: Ticket) -> None:
        """Grant ``ticket`` on ``member``: charge its budgets, forget it elsewhere."""
        holders = member.holders
        held = len(holders)
        gate = member.gate
        if gate is not None:
            gate.take(ticket, held, member.limit)
        model = ticket.model
        models = member.models
        if model is not None:
            model_gate = models.get(model)
            if model_gate is not None:
                model_gate.take(ticket, held, None)
        members = self._members
        if len(members) > 1:
            for other in members.values():
                if other is not member:
                    other.forget(ticket)
        preferred = self._preferred
        if preferred:
            self._homes.pop(ticket, None)
            prefers = preferred.pop(ticket, None)
            if prefers is member:
                member.affinity_hits += 1
            elif prefers is not None:
                prefers.affinity_moves += 1
        if member.half_open:
            member.probe = ticket  # its one slot until the probe ends
        holders.add(ticket)
        self._held_by[ticket] = member
        member.granted_total += 1
        if held >= member.peak_in_flight:  # no call on the hot path
            member.peak_in_flight = held + 1

    def _count(self) -> None:
        """Count service and models' use from now on (see the module notes)."""
        if self._counting:
            return
        self._counting = True
        self._tenants.restart(self._now)
        for member in self._members.values():
            member.models.count(member.holders, self._waiting)

    def release(self, ticket: Ticket) -> list[Ticket]:
        """Give back a held slot; does nothing for an unknown or finished ticket.

        Raises:
            RuntimeError: The ticket is still waiting; cancel it instead.
        """
        if ticket in self._waiting:
            raise RuntimeError(f"ticket {ticket!r} is waiting, not holding a slot")
        member = self._held_by.get(ticket)
        if member is None:
            return []
        if member.streak:
            _end_streak_if_success(member, ticket)
        if member.failures:
            member.failures = 0  # its call got its answer: the row ends
        return self._release(member, ticket, success=True)

    def fail(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Give back held ``ticket``, whose call failed before its answer started.

        Its member counts a failure in a row; at ``failure_threshold`` (or
        its probe's, half-open) it is out of service for
        ``failure_cooldown`` from ``now`` (see the module notes), and the
        tickets waiting for it because they prefer it wait for their pool.
        Nothing for an unknown or finished ticket. Returns the tickets
        granted by the change.

        Raises:
            RuntimeError: The ticket is still waiting; cancel it instead.
        """
        now = check_instant(now, "now")
        if ticket in self._waiting:
            raise RuntimeError(f"ticket {ticket!r} is waiting, not holding a slot")
        member = self._held_by.get(ticket)
        if member is None:
            return []
        if member.streak:
            member.reported.discard(ticket)  # no answer: no success
        alone = len(self._members) == 1
        if member.half_open:
            if member.probe == ticket and not alone:
                self._out_of_service(member, now)
        elif member.out_until is None:
            member.failures += 1
            if member.failures >= self._failure_threshold and not alone:
                self._out_of_service(member, now)
        return self._release(member, ticket, success=False)

    def _back_in_service(self, member: _Member) -> None:
        """``member`` takes its full share again, whether out or half-open."""
        if member.out_until is None and not member.half_open:
            return
        member.out_until = None
        member.half_open = False
        member.probe = None
        self.service_changes.append((member.name, "in", None))

    def _out_of_service(self, member: _Member, now: float) -> None:
        """``member`` failed too often: it takes nothing until its cooldown ends."""
        until = member.out_until = now + self._failure_cooldown
        member.half_open = False
        member.outages_total += 1
        self.service_changes.append((member.name, "out", until))
        if self._homes:
            self._rehome(lambda ticket: self._preferred.get(ticket) is member)

    def cancel(self, ticket: Ticket) -> list[Ticket]:
        """Withdraw a waiting ticket, or release it if it was already granted."""
        waiting = self._waiting
        if ticket not in waiting:
            member = self._held_by.get(ticket)
            if member is None:
                return []
            # A grant that raced a cancellation: never sent, so not a success.
            if member.streak:
                member.reported.discard(ticket)
            return self._release(member, ticket, success=False)
        self._withdraw(ticket)
        self._withdrawn_total += 1
        # It may have been a head a budget held back.
        return self._refill()

    def _withdraw(self, ticket: Ticket) -> None:
        """Waiting ``ticket`` stops waiting, ungranted."""
        waiting = self._waiting
        del waiting[ticket]
        self._estimates.pop(ticket, None)
        if self._preferred:
            self._preferred.pop(ticket, None)
            self._homes.pop(ticket, None)
        self._tenants.withdraw(ticket, self._now, waiting)
        for member in self._members.values():
            member.forget(ticket)

    def set_limit(
        self, limit: int | AdaptiveLimit | None, *, member: str | None = None
    ) -> list[Ticket]:
        """Change a member's limit.

        Raising it grants at once; lowering it lets the holders finish. An
        ``AdaptiveLimit`` starts at its ``initial`` value and moves on its
        own from there; an int or ``None`` replaces it.

        Raises:
            ValueError: ``member`` is not a member, or the limit is not
                a positive integer.
        """
        chosen = self._member(member)
        if isinstance(limit, AdaptiveLimit):
            if chosen.gate is None:
                chosen.gate = self._expecting(Throttle(now=self._now))
            chosen.limit = chosen.gate.adapt(limit)
            return self._fill()
        if limit is not None:
            check_slot_limit(limit)
        if chosen.gate is not None:
            chosen.gate.adapt(None)
        chosen.limit = limit
        return self._fill()

    def advance(self, now: float) -> None:
        """Tell the policy the time, before handling what arrived at ``now``.

        The budgets refill; tenants' service accrues up to it; a member
        whose cooldown has run out is half-open (what arrives now may be
        its probe; the next ``tick`` grants the waiting).
        """
        if now > self._now:  # noqa: PLR1730  # no call on the hot path
            self._now = now
        for member in self._members.values():
            if member.gate is not None:
                member.gate.advance(now)
            # A model's throttle is brought to the time when its model is
            # used (ModelThrottles.get): idle models cost a grant nothing.
            member.models.advance(now)
            if member.out_until is not None and now >= member.out_until:
                # The cooldown ended: it takes its probe, from what arrives
                # now on; ``_moved`` has the next tick fill for the waiting.
                member.out_until = None
                member.half_open = True
                self._moved = True
                self.service_changes.append((member.name, "half_open", None))
        expiring = self._expiring
        if expiring and expiring[0][0] <= now:
            # The waits for a preferred member that ran out end before what
            # arrives now is handled: its fill sees them in their pool's lane.
            self._expire(now)

    def report_usage(self, ticket: Ticket, tokens: int) -> list[Ticket]:
        """The request of held ``ticket`` used ``tokens`` in all: correct its charge."""
        member = self._held_by.get(ticket)
        if member is None:
            return []
        model_gate = member.models.get(ticket.model)
        if model_gate is not None:
            model_gate.report_usage(ticket, tokens)
        if member.gate is not None:
            member.gate.report_usage(ticket, tokens)
        # Tokens given back may let a held-back head through.
        return self._refill()

    def answered(self, ticket: Ticket) -> None:
        """The answer of held ``ticket`` started: the server has counted it."""
        member = self._held_by.get(ticket)
        if member is None:
            return
        if member.gate is not None:
            member.gate.answered(ticket)
        if member.models:
            model_gate = member.models.get(ticket.model)
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

        A latency-signal adaptive limit of its member learns from them,
        with the slots the member holds now as the call's company; the
        tickets its rise lets through are returned. Nothing for a ticket
        that holds no slot.
        """
        member = self._held_by.get(ticket)
        if member is None or member.gate is None:
            return []
        return self._latency_moved(
            member,
            member.gate.observe_latency(
                first_token,
                between_tokens,
                duration,
                prompt_tokens,
                len(member.holders),
            ),
        )

    def apply_latency_verdict(
        self, change: int, *, member: str | None = None
    ) -> list[Ticket]:
        """A latency signal's verdict of a round: a member's limit moves by ``Adaptive.move``.

        What the Redis ledger does with the verdicts each process's own
        signal sends (the differential test holds it to this). Returns the
        tickets a rise lets through; nothing but for a latency-signal
        adaptive limit.
        """
        chosen = self._member(member)
        gate = chosen.gate
        return self._latency_moved(
            chosen, None if gate is None else gate.apply_latency_verdict(change)
        )

    def _latency_moved(self, member: _Member, limit: int | None) -> list[Ticket]:
        """The latency signal moved ``member``'s limit to ``limit`` (``None``: it did not)."""
        if limit is None:
            return []
        member.limit = limit
        return self._fill()

    def observe_server_load(
        self, load: ServerLoad | None, *, member: str | None = None
    ) -> list[Ticket]:
        """A member's server said its ``load`` (``None``: reading it failed).

        From the first reading on, a grant keeps our requests out of the
        server's own queue (``_server``): none while requests wait there,
        and, once its slots are learned, none beyond them. Returns the
        tickets a reading with room lets through.
        """
        chosen = self._member(member)
        server = chosen.server
        if server is None:
            server = chosen.server = ServerGate()
        server.observe(load, len(chosen.holders))
        return self._fill() if self._waiting else []

    @property
    def server_load(self) -> tuple[ServerLoad | None, int | None]:
        """The first member's latest reading of its server's load and its slots learned, if any."""
        server = self._first.server
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
        self,
        model: str,
        budget: Budget,
        *,
        learn: bool = True,
        member: str | None = None,
    ) -> list[Ticket]:
        """Give ``model`` a budget of its own on a member, asked beside the member's.

        A model that has a throttle already (learned from its figures, or
        configured) keeps it and takes the new budget, which starts full;
        else it gets ``Throttle(budget, learn=learn)``. Returns the tickets
        the change lets through.

        Raises:
            TypeError: ``model`` is not a string or ``budget`` not a ``Budget``.
            ValueError: ``model`` is empty, or ``member`` not a member.
        """
        check_text(model, "model")
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        chosen = self._member(member)
        if model not in chosen.models:
            self._add_model(chosen, model, Throttle(budget, learn=learn, now=self._now))
        else:
            chosen.models.configure(model, budget)
        return self._fill()

    def _add_model(self, member: _Member, model: str, throttle: Throttle) -> Throttle:
        """Give ``model``, which has none on ``member``, ``throttle``, new; returns it."""
        member.models.add(model, self._expecting(throttle, model))
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
        self, now: float | None = None, *, member: str | None = None
    ) -> dict[str, BudgetStatistics]:
        """Each model's budgets on a member at ``now`` (default: the latest time told).

        Not those of learned budgets forgotten by then (see ``_budgets``).
        """
        return self._member(member).models.statistics(now)

    def observe_rate_limits(
        self,
        now: float,
        info: RateLimitInfo,
        model: str | None = None,
        *,
        member: str | None = None,
    ) -> list[Ticket]:
        """Learn from the rate-limit figures of a member's answer that arrived at ``now``.

        Creates the throttle if there is none, so a member that was never
        given a budget is paced by what it reports. The figures of an answer
        for ``model`` go to that model's throttle (created learning), those
        of an answer for none to the member's.
        """
        chosen = self._member(member)
        if model is None:
            gate = chosen.gate
            if gate is None:
                gate = chosen.gate = self._expecting(Throttle(learn=True, now=now))
        else:
            chosen.models.advance(now)
            gate = chosen.models.get(model)
            if gate is None:
                check_text(model, "model")
                gate = self._add_model(chosen, model, Throttle(learn=True, now=now))
        gate.advance(now)
        gate.observe(info)
        if model is not None:
            # Idle, it is forgotten once full: these figures may move that.
            chosen.models.observed(model)
        return []

    def pause(self, until: float, *, member: str | None = None) -> list[Ticket]:
        """Grant nothing on a member before ``until``; a pause is never shortened.

        The raw instrument, taken as given: ``max_pause`` bounds the pauses
        of ``report_rate_limit``, and ``resume`` ends any pause. The tickets
        waiting only for the member they prefer, this one, wait for any
        member of their pool now: returned are those granted at once.
        """
        until = check_deadline(until, "until")
        chosen = self._member(member)
        if chosen.paused_until is None or until > chosen.paused_until:
            chosen.paused_until = until
        if not self._homes:
            return []
        homes = len(self._homes)
        self._rehome(lambda ticket: self._preferred.get(ticket) is chosen)
        return self._fill() if len(self._homes) < homes else []

    def report_rate_limit(
        self, now: float, retry_after: float | None = None, *, member: str | None = None
    ) -> list[Ticket]:
        """Pause a member's grants after a rate-limit answer that arrived at ``now``.

        With ``retry_after``, the server's delay in seconds, grants pause
        that long; without, or with one that is not positive (which names
        no delay, ``server_delay``), for the backoff of the streak's
        current round (see the module's docstring). Either way for at most
        ``max_pause``, and never less than a pause already running. Returns
        the tickets granted because they no longer wait for this member
        (see ``pause``).
        """
        now = check_instant(now, "now")
        delay = server_delay(check_optional_seconds(retry_after, "retry_after"))
        chosen = self._member(member)
        if not chosen.streak or chosen.granted_total != chosen.granted_at_report:
            # A new round. The step doubles as a float held at max_pause,
            # so no streak, however long, can overflow it.
            chosen.step = (
                min(2.0 * chosen.step, self._max_pause)
                if chosen.streak
                else self._default_pause
            )
            chosen.streak += 1
            chosen.granted_at_report = chosen.granted_total
            chosen.reported = set(chosen.holders)
        seconds = chosen.step if delay is None else min(delay, self._max_pause)
        gate = chosen.gate
        if gate is not None:
            limit = gate.rate_limited(chosen.holders)
            if limit is not None:
                chosen.limit = limit
        return self.pause(now + seconds, member=chosen.name)

    def resume(self, *, member: str | None = None) -> list[Ticket]:
        """End a member's pause and backoff streak now; waiters go in ticket order."""
        chosen = self._member(member)
        chosen.paused_until = None
        chosen.streak = 0
        chosen.reported = set()
        return self._fill()

    def tick(self, now: float) -> list[Ticket]:
        """Tell the policy the time; a pause that has run out ends and grants resume.

        So do grants the budget held back, once it holds the oldest waiter,
        and a ticket's wait for the member it prefers, once ``affinity_wait``
        has passed: any member may take it then.
        """
        self.advance(now)
        ended = self._moved
        self._moved = False
        for member in self._members.values():
            if member.paused_until is not None and now >= member.paused_until:
                member.paused_until = None
                ended = True
        return self._fill() if ended else self._refill()

    def _expire(self, now: float) -> None:
        """Move the tickets whose wait for their preferred member ended to their pool's lane.

        ``_moved`` says so until the next ``tick``, which fills: they may
        take a free slot of another member now.
        """
        expiring = self._expiring
        homes = self._homes
        while expiring and expiring[0][0] <= now:
            ticket = heapq.heappop(expiring)[1]
            if ticket in homes:  # else granted, withdrawn or moved since
                self._relane(ticket, homes.pop(ticket))
                self._moved = True

    def _relane(self, ticket: Ticket, lane: Lane) -> None:
        """Waiting ``ticket`` goes to ``lane``; its entry in its old lane is dead."""
        self._waiting[ticket] = lane
        self._tenants.relane(ticket, self._now, lane, self._waiting)

    def _refill(self) -> list[Ticket]:
        """Fill again if a budget holds a head back, which may pass now; else none."""
        members = self._members
        if len(members) == 1:
            blocked = self._first.blocked()
        else:
            blocked = any(member.blocked() for member in members.values())
        return self._fill() if blocked else []

    def _release(
        self, member: _Member, ticket: Ticket, *, success: bool
    ) -> list[Ticket]:
        """``ticket`` gives its slot on ``member`` back; a fill grants what may go.

        ``success``: its call got its answer.
        """
        probe = member.probe
        if probe is not None and probe == ticket:
            member.probe = None
            if success:
                member.failures = 0
                self._back_in_service(member)  # its limit open again
        member.holders.remove(ticket)
        del self._held_by[ticket]
        self._tenants.release(ticket, self._now)
        if ticket.model is not None:
            member.models.release(ticket, success=success)
        gate = member.gate
        if gate is not None:
            limit = gate.release(ticket, success=success)
            if limit is not None:
                member.limit = limit
        if not self._waiting:
            return []
        return self._fill()

    def add_member(
        self,
        name: str,
        limit: int | AdaptiveLimit | None,
        *,
        throttle: Throttle | None = None,
        models: Mapping[str, Throttle] | None = None,
        carried: MemberState | None = None,
        waiting: Iterable[tuple[Ticket, int]] = (),
    ) -> list[Ticket]:
        """Make ``name`` a member: the tickets waiting for any member may go to it.

        ``carried``: what it brings from a policy of its own (``carry``),
        and ``waiting``, the tickets that waited for it there, each with
        its estimate (``requeue``): all in place before anything is
        granted on it. Returns the tickets granted then.

        Raises:
            ValueError: ``name`` is a member already, or empty, or the
                limit is not a positive integer.
            TypeError: A model's throttle is not a ``Throttle``.
        """
        check_provider(name)
        if name in self._members:
            raise ValueError(f"{name!r} is a member already")
        if name in self._pools:
            raise ValueError(f"{name!r} is a pool's name")
        self._join(name, limit, throttle, models, carried)
        self._queue_moved(waiting, name)
        return self._fill()

    def _join(
        self,
        name: str,
        limit: int | AdaptiveLimit | None,
        throttle: Throttle | None,
        models: Mapping[str, Throttle] | None,
        carried: MemberState | None,
    ) -> None:
        """Make ``name``, new, a member with what ``carried`` brings; grant nothing (``add_member``)."""
        if isinstance(limit, AdaptiveLimit):
            throttle = Throttle(now=self._now) if throttle is None else throttle
            throttle.adapt(limit)
            limit = throttle.limit
        elif limit is not None:
            check_slot_limit(limit)
        throttles = _check_models(models)
        member = _Member(
            name,
            limit,
            None if throttle is None else self._expecting(throttle),
            ModelThrottles(
                {
                    model: self._expecting(each, model)
                    for model, each in throttles.items()
                },
                self._now,
            ),
            self._default_pause,
        )
        self._members[name] = member
        if self._counting:
            member.models.count((), self._waiting)
        elif throttles:
            self._count()  # every member's, this one's too
        if carried is not None:
            self.carry(carried, member=name)

    def carry(self, state: MemberState, *, member: str | None = None) -> None:
        """Give ``member`` (``None``: the first) what it brings from a policy of its own.

        Its pause, its backoff's streak, its server's load, its failures
        in a row and its service (out, half-open), its counts, and its holders, counted as holding its slots (granted,
        as far as the counts go): slots taken under the other policy, their
        budgets charged there, in the throttles it brings
        (``state.throttle``, given to ``add_member`` or the constructor);
        they are released here as any holder. Its waiting tickets are the
        caller's to ``requeue``. Grants nothing.

        Raises:
            ValueError: ``member`` is not a member, or holds a slot or a
                ticket is known here already.
        """
        chosen = self._member(member)
        tickets = list(state.holders)
        known = [t for t in tickets if t in self._held_by or t in self._waiting]
        if chosen.holders or known or len(set(tickets)) != len(tickets):
            raise ValueError(
                f"{chosen.name!r} cannot take holders over: it holds"
                f" {len(chosen.holders)} slots, tickets known here {known!r}"
            )
        if state.paused_until is not None:
            until = check_deadline(state.paused_until, "paused_until")
            if chosen.paused_until is None or until > chosen.paused_until:
                chosen.paused_until = until
        if not self._counting and any(t.tenant is not None for t in tickets):
            # The first tickets with a tenant, as an arrival's would be.
            self.needs_clock = True
            self._count()
        now = self._now
        for ticket in tickets:
            chosen.holders.add(ticket)
            self._held_by[ticket] = chosen
            self._tenants.hold(ticket, now)
            if ticket.model is not None:
                chosen.models.use(ticket.model, 1)
        # Granted here, as far as the counts go: released_total is what
        # was granted less what holds. Its own counts go on from its own.
        chosen.granted_total += max(state.granted_total, len(tickets))
        self._granted_total += len(tickets)
        held = len(chosen.holders)
        chosen.peak_in_flight = max(chosen.peak_in_flight, held, state.peak_in_flight)
        self._peak_in_flight = max(self._peak_in_flight, len(self._held_by))
        chosen.affinity_hits += state.affinity_hits
        chosen.affinity_moves += state.affinity_moves
        chosen.outages_total += state.outages_total
        self._count_on(state.withdrawn_total, state.rejected_total, state.peak_waiting)
        if state.server is not None:
            chosen.server = state.server
        chosen.failures = state.failures
        if state.out_until is not None or state.half_open:
            chosen.out_until = state.out_until
            chosen.half_open = state.half_open
            chosen.probe = state.probe if state.probe in chosen.holders else None
        if state.streak:
            chosen.streak = state.streak
            chosen.step = state.step
            chosen.reported = set(state.reported) & chosen.holders
            since = 1 if state.granted_since_report else 0
            chosen.granted_at_report = chosen.granted_total - since

    def requeue(
        self, waiting: Iterable[tuple[Ticket, int]], *, member: str | None = None
    ) -> list[Ticket]:
        """Queue tickets that waited for ``member`` under a policy of their own, in their place.

        Each with its estimate of tokens, waiting for ``member`` alone (as
        asked there); never refused for a full queue (they were admitted
        already). Returns the tickets granted then.

        Raises:
            ValueError: ``member`` is not a member, or a ticket is known here.
        """
        self._queue_moved(waiting, self._member(member).name)
        return self._fill() if self._open() else []

    def _queue_moved(self, waiting: Iterable[tuple[Ticket, int]], member: str) -> None:
        """Queue ``waiting`` for ``member`` alone, granting nothing yet (``requeue``)."""
        self._queue_carried(
            WaitingState(ticket, tokens, self._lane(ticket.model, member, None)[0])
            for ticket, tokens in waiting
        )

    def _queue_carried(self, waiting: Iterable[WaitingState]) -> None:
        """Queue tickets carried from another policy in their lanes, granting nothing yet."""
        queue = self._waiting
        for each in waiting:
            ticket, tokens, lane = each.ticket, each.tokens, each.lane
            if ticket in self._held_by or ticket in queue:
                raise ValueError(f"ticket {ticket!r} is already known")
            model = ticket.model
            if ticket.tenant is not None and not self._counting:
                self.needs_clock = True
                self._count()
            if tokens:
                self._expect(ticket, tokens)
                self._estimates[ticket] = tokens
            if model is not None:
                self._use(model)
            if each.preferred is not None:
                self._preferred[ticket] = self._members[each.preferred]
            if each.home is not None and each.until is not None:
                self.needs_clock = True
                self._homes[ticket] = each.home
                heapq.heappush(self._expiring, (each.until, ticket))
            queue[ticket] = lane
            self._tenants.queue(ticket, self._now, lane)
        self._peak_waiting = max(self._peak_waiting, len(queue))

    def merge(
        self,
        group: GroupState,
        limits: Mapping[str, int | AdaptiveLimit | None],
    ) -> list[Ticket]:
        """Take in another pooled policy's members, pools and waiting tickets (``group_state``).

        Each member with its limit in ``limits`` (as ``add_member`` takes
        it; none named: unlimited) and what it learned and holds; each
        pool over the same members; the waiting tickets in their lanes and
        their place, never refused for a full queue (they were admitted
        already). All of it is in place before anything is granted; then
        the tickets waiting here and there take the free slots of every
        member, oldest first. Returns the tickets granted then.

        Raises:
            ValueError: A member's or pool's name of ``group`` is taken here,
                or a ticket of it is known here. Nothing changed.
        """
        taken = self._members.keys() | self._pools.keys()
        clash = [
            name
            for name in [*(name for name, _ in group.members), *group.pools]
            if name in taken
        ]
        if clash:
            raise ValueError(f"names taken here already: {sorted(clash)!r}")
        tickets = [
            *(ticket for _, state in group.members for ticket in state.holders),
            *(each.ticket for each in group.waiting),
        ]
        known = [t for t in tickets if t in self._held_by or t in self._waiting]
        if known:
            raise ValueError(f"tickets known here already: {known!r}")
        for name, state in group.members:
            self._join(name, limits.get(name), state.throttle, state.models, state)
        members = self._members
        for pool, names in group.pools.items():
            self._pools[pool] = [members[name] for name in names]
        self._queue_carried(group.waiting)
        self._count_on(group.withdrawn_total, group.rejected_total, group.peak_waiting)
        return self._fill() if self._open() else []

    def _count_on(self, withdrawn: int, rejected: int, peak_waiting: int) -> None:
        """The queue counts on from another's totals, as that queue joins it."""
        self._withdrawn_total += withdrawn
        self._rejected_total += rejected
        self._peak_waiting = max(self._peak_waiting, peak_waiting)

    def remove_member(self, name: str) -> tuple[list[Ticket], list[Ticket]]:
        """Take ``name`` out of the policy and its pools; its holders keep their slots.

        The tickets waiting because they prefer it go to their pool's lane
        now, in their place. Returns the tickets granted by the change
        (none: no slot is freed) and the tickets that asked for it alone,
        withdrawn: the caller fails them.

        Raises:
            ValueError: ``name`` is not a member, or the last one, or the
                last member of a pool.
        """
        member = self._member(name)
        if len(self._members) == 1:
            raise ValueError(f"{name!r} is the last member")
        for pool, members in self._pools.items():
            if members == [member]:
                raise ValueError(f"{name!r} is the last member of pool {pool!r}")
        del self._members[name]
        for members in self._pools.values():
            if member in members:
                members.remove(member)
        if member is self._first:
            self._first = next(iter(self._members.values()))
        if len(self._members) == 1:
            # Alone now, it is never out of service (see the module notes).
            self._back_in_service(self._first)
        self._rehome(lambda ticket: self._preferred.get(ticket) is member)
        orphans = self._withdraw_lane(name)
        return self._fill(), orphans

    def set_pool(self, name: str, members: Iterable[str]) -> list[Ticket]:
        """Make ``name`` a pool of ``members``, or change its members.

        A ticket acquired with ``member=name`` goes to whichever of them
        can take it first (see the module notes). The tickets waiting for
        the pool stay in their place; those that prefer a member no longer
        in it wait for any of its members now. Returns the tickets granted
        by the change.

        Raises:
            ValueError: ``name`` is a member's, or ``members`` is empty,
                names one twice or names one that is not a member.
        """
        check_provider(name)
        if name in self._members:
            raise ValueError(f"pool {name!r} has the name of a member")
        chosen = [self._member(check_provider(each)) for each in members]
        if not chosen:
            raise ValueError(f"pool {name!r} must have a member")
        if len({id(each) for each in chosen}) != len(chosen):
            raise ValueError(f"pool {name!r} names a member twice")
        self._pools[name] = chosen
        self._rehome(
            lambda ticket: (
                _named(self._homes[ticket]) == name
                and self._preferred[ticket] not in chosen
            )
        )
        return self._fill()

    def remove_pool(self, name: str) -> tuple[list[Ticket], list[Ticket]]:
        """Forget pool ``name``: its members stay members.

        Returns the tickets granted by the change (a withdrawn head may let
        others through) and the tickets that waited for the pool,
        withdrawn: the caller fails them.

        Raises:
            ValueError: There is no pool ``name``.
        """
        if name not in self._pools:
            raise ValueError(f"no pool {name!r} in this policy")
        del self._pools[name]
        self._rehome(lambda ticket: _named(self._homes[ticket]) == name)
        orphans = self._withdraw_lane(name)
        return self._refill(), orphans

    @property
    def pools(self) -> dict[str, list[str]]:
        """The pools' members, by pool name."""
        return {
            name: [member.name for member in members]
            for name, members in self._pools.items()
        }

    def _rehome(self, stops: Callable[[Ticket], bool]) -> None:
        """The tickets waiting only for the member they prefer that ``stops``: to their pool's lane."""
        homes = self._homes
        for ticket in [ticket for ticket in homes if stops(ticket)]:
            self._relane(ticket, homes.pop(ticket))

    def _withdraw_lane(self, name: str) -> list[Ticket]:
        """Withdraw every ticket waiting for member or pool ``name``, which is gone; they are refused."""
        orphans = [
            ticket for ticket, lane in self._waiting.items() if _named(lane) == name
        ]
        for ticket in orphans:
            self._withdraw(ticket)
        self._rejected_total += len(orphans)
        return orphans

    def _open_members(self) -> list[_Member]:
        """The members with room, at a fill's start, what budgets held back forgotten."""
        members = self._members
        if len(members) == 1:
            first = self._first
            if first.gate is not None or first.held_back:
                first.unblock()
            return [first] if self._waiting and first.room() else []
        for member in members.values():
            member.unblock()
        if not self._waiting:
            return []
        return [member for member in members.values() if member.room()]

    def _placer(
        self,
        ticket: Ticket,
        lane: Lane,
        open_members: list[_Member],
        held_back: list[tuple[_Member, str]],
    ) -> _Member | None:
        """The member a fill grants ``ticket``, its choice, on; ``None``: it waits.

        A member whose own budget holds the ticket back closes for the
        rest of the fill (oldest first: nobody passes what it holds back,
        on that member); one whose budget of the ticket's model holds it
        back is passed over for that model (``held_back``).
        """
        model = ticket.model
        closed: list[_Member] = []  # by their budget, for this ticket
        passed: list[tuple[_Member, str]] = []  # by their model's, for it
        for member in self._candidates(lane, ticket):
            if member not in open_members:
                continue
            gate = member.gate
            if gate is not None and not gate.holds(ticket):
                open_members.remove(member)
                closed.append(member)
                continue
            if model is not None and (member, model) in held_back:
                continue
            model_gate = None if model is None else member.models.get(model)
            if model_gate is not None and not model_gate.holds(ticket):
                assert model is not None  # it has a throttle
                held_back.append((member, model))
                passed.append((member, model))
                continue
            # It goes here: what held it back elsewhere holds nobody back
            # there, since nobody older waits for it.
            for other in closed:
                other.unblock()
                open_members.append(other)
            for pair in passed:
                held_back.remove(pair)
                pair[0].models[pair[1]].unblock()
            return member
        return None

    def _fill(self) -> list[Ticket]:
        """Grant free slots to the waiters, one choice at a time (see the module notes)."""
        grants: list[Ticket] = []
        open_members = self._open_members()
        waiting = self._waiting
        tenants = self._tenants
        now = self._now
        blocked: list[Lane] = []  # lanes held back in this fill
        held_back: list[tuple[_Member, str]] = []  # (member, model) held back
        while waiting and open_members:
            chosen = tenants.select(now, waiting, blocked)
            if chosen is None:
                break
            state, ticket = chosen
            lane = waiting[ticket]
            taker = self._placer(ticket, lane, open_members, held_back)
            if taker is None:
                blocked.append(lane)  # nobody of this lane passes its head
                continue
            self._take(taker, ticket)
            del waiting[ticket]
            self._estimates.pop(ticket, None)
            tenants.grant(state, ticket, now, lane)
            grants.append(ticket)
            if not taker.room():
                open_members.remove(taker)
        for member, model in held_back:
            if waiting and member.has_slot():
                member.held_back.append(model)
            else:
                # No slot left to wait for: a release looks again.
                member.models[model].unblock()
        self._granted_total += len(grants)
        held = len(self._held_by)
        if held > self._peak_in_flight:  # noqa: PLR1730  # no call on the hot path
            self._peak_in_flight = held
        return grants


def _named(lane: Lane) -> str | None:
    """The member or pool a lane is for, or ``None``: any member."""
    return lane[1] if isinstance(lane, tuple) else None


def _member_key(member: _Member) -> float:
    """The choice between members: one half-open awaiting its probe, then the most free slots.

    The probe goes first so that a member back from its cooldown is tried
    at once, not when the others happen to be full.
    """
    if member.half_open and member.probe is None:
        return -math.inf
    return -member.free()


def _end_streak_if_success(member: _Member, ticket: Ticket) -> None:
    reported = member.reported
    if ticket in reported:
        reported.remove(ticket)  # held across a report: not a success
    elif ticket in member.holders:
        # Granted after the latest report and released, with no report
        # while it was held (it would be in ``reported``): a success.
        member.streak = 0
        reported.clear()


def _check_models(models: Mapping[str, Throttle] | None) -> dict[str, Throttle]:
    """``models``, checked: model names and their throttles."""
    throttles = {} if models is None else dict(models)
    for model, model_throttle in throttles.items():
        check_text(model, "model")
        if not isinstance(model_throttle, Throttle):
            raise TypeError(
                f"throttle of {model!r} must be a Throttle, got {model_throttle!r}"
            )
    return throttles
