"""Request and token budgets, and an adaptive concurrency limit: the pure core.

Providers limit requests and tokens per minute, not concurrent streams. A
``Throttle`` is what a provider's ``SlotPolicy`` asks, beside its
concurrency limit, before it grants a slot: whether the budget holds the
request, and how the limit should move. Like the policy, it is a plain
synchronous state machine with no I/O and no trio: time comes in through
``advance(now)``, and everything else is a method call.

Budgets. Each budget (requests, tokens) is a bucket that refills
continuously, ``per_minute / 60`` per second, up to ``per_minute``. A grant
takes 1 from the request bucket and the request's estimated tokens (its
prompt estimate plus ``max_tokens``) from the token bucket; when the answer
reports its usage, the difference is given back or taken too. One
request's charge, estimated or reported, is at most the bucket's capacity
(a whole minute's budget): one larger goes when the bucket is full, and
empties it. A charge takes the level down to zero at most, so no estimate
or usage report, however absurd, makes a budget wait longer than one full
refill; the level never leaves ``[-capacity, capacity]`` (learning may
lower it below zero, for requests the provider has not counted yet). The
Redis ledger's scripts apply the same rules to the fleet's buckets.

Grants stay oldest-first: when the oldest waiter's cost is not there yet,
nobody passes it, not even a request small enough to fit. That keeps the
order the dispatcher promises, and a large old request cannot be starved by
a stream of small new ones; what it costs is head-of-line blocking: while
the head waits for its tokens, the smaller requests behind it wait too, at
most ``cost / rate`` seconds, the time the bucket takes to hold the head's
cost. The policy is told when that is (``ready_at``), so the scheduler
wakes at that exact instant.

Learned budgets. Every answer's rate-limit figures (``RateLimitInfo``)
teach the throttle the provider's own budgets, so a fleet whose code never
configured one stays below the provider's limits. For requests and for
tokens (``tokens``: Anthropic sends its most restrictive token limit there)
the figures become a bucket state:

* ``limit`` is the capacity, and ``limit / 60`` per second the refill,
  lowered to ``(limit - remaining) / reset`` when the server says it takes
  longer than that to refill (a window longer than a minute). What a reset
  can claim is bounded: the pace never drops below ``limit / 3600`` per
  second (``SLOWEST_REFILL``: the whole limit back within an hour), so a
  server that says one request of 100 comes back in a day slows the fleet
  down, never stalls it;
* ``remaining`` is what the server had left when it counted the request
  it answers; less ``unseen``, what it has not counted yet, it is the
  level. A server counts a request when it arrives, before it answers, and
  requests arrive in the order they were granted, so ``unseen`` is the
  charge of the slots held whose answer has not started and that were
  granted since the latest one whose answer did (at the same instant
  too: which of those arrived first, nobody knows), and of the slots
  whose answer started since figures were last learned from, all but the
  last, whose figures these are (the others may have reached the server
  after it: several answers reported at once). Those granted before
  it are in its ``remaining`` already: taking them again would waste as
  much of the budget as there are requests in flight. The figures of the
  newest answer (its slot's answer started just before them, and it was
  granted after every slot whose answer had started when figures were
  last learned from) set the level, up to the capacity: a later answer
  lowers it or raises it again. Other
  figures (an older request answered late, or figures reported with no
  answer) only lower it. A slot's answer starts when the transport or
  ``wrap_provider`` gets its headers, or when its usage is reported (which
  makes no figures the newest). The charges of the slots answered before
  the newest figures are in them, as the server made them (its estimate
  may not be ours): a usage report then takes what was used beyond the
  charge and gives nothing back; what the server gave back, its next
  figures say.

A configured ``Budget`` keeps its own rates, and its own count beside the
level: the level is charged and refilled with it, lowered by any figures,
and raised by the newest answer's figures up to that count, never above.
Until the first figures arrive, nothing is paced by a budget that is
only learned. Malformed figures (a zero or enormous limit) are ignored.

Forgetting. A model's budget learned from its figures (never a configured
one) is forgotten once nothing of the model waits or holds a slot, its
buckets are full again (within the slack of ``Bucket.need``), and
``FORGET_AFTER`` seconds have passed since the model's last request
ended (``forgets``): a full bucket says nothing that the next answer's
figures will not say again, and a model seen once (a fine-tune per
customer) costs nothing for good. Its next figures learn it afresh. The
Redis ledger forgets a learned model's budgets by the same rule.

The adaptive limit. AIMD on the honest signals, as TCP's congestion
control and Netflix's concurrency-limits do it: every round of rate-limit
reports (reports with no grant between them come from requests in flight
together, so they share a round, as the policy's pauses do) multiplies the
limit by ``backoff``; every success of a request granted while the limit
was in use (at least half of it held, counting that request) adds to it: 1
per success until the first rate limit (a slow start, so that a limit set
far too low catches up in a few round trips), then ``1 / limit`` per
success, about 1 per round trip of the whole limit. A success is a slot
given back with no rate-limit report while it was held. The limit never
leaves ``[minimum, maximum]``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, final

import attrs

from .._validation import check_provider, check_slot_limit

# The values the rules act on, defined with the messages; still importable
# from here, beside their rules.
from ..messages._limits import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS  # noqa: PLC0414  # re-exported
from ..messages._limits import AdaptiveLimit as AdaptiveLimit  # noqa: PLC0414  # re-exported
from ..messages._limits import Budget as Budget  # noqa: PLC0414  # re-exported
from ._latency import LatencySignal

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..messages._protocol import Ticket
    from ._ratelimits import Quota, RateLimitInfo

MAX_TOKENS = 10**15
"""The most tokens one estimate or usage report counts for.

More than any budget holds (a charge is at most its budget's capacity
anyway), and exact in a double, the only number of Redis' Lua.
"""

SLOWEST_REFILL = 3600.0
"""Seconds a learned budget takes at most to refill whole, whatever a reset says.

The Redis ledger's ``learn`` holds the same figure (in milliseconds).
"""


FORGET_AFTER = 60.0
"""Seconds a learned model budget outlives its model's last request, at least.

It is forgotten then if its buckets are full, else once they are (see the
module notes); at most ``2 * SLOWEST_REFILL`` later: a level refills from
minus to plus the capacity within that. The Redis ledger's step holds the
same figure (in milliseconds).
"""


def is_full(level: float, capacity: float) -> bool:
    """Whether a bucket at ``level`` is full: within ``Bucket.need``'s slack."""
    return capacity - level <= 1e-9 * max(1.0, capacity)


def full_in(level: float, capacity: float, rate: float) -> float:
    """Seconds until a bucket at ``level``, refilling ``rate`` a second, is full."""
    missing = capacity - 1e-9 * max(1.0, capacity) - level
    return missing / rate if missing > 0 else 0.0


def forgets(idle: float, buckets: Iterable[tuple[float, float]]) -> bool:
    """Whether a learned model budget is forgotten now (see the module notes).

    ``idle`` is how long, in seconds, nothing of its model has waited or
    held a slot, and ``buckets`` its buckets' ``(level, capacity)`` now.
    """
    return idle >= FORGET_AFTER and all(
        is_full(level, capacity) for level, capacity in buckets
    )


def check_limit_value(limit: object, name: str = "limit") -> int | AdaptiveLimit:
    """A positive ``int`` or an ``AdaptiveLimit``."""
    if isinstance(limit, AdaptiveLimit):
        return limit
    return check_slot_limit(limit, name)


@final
@attrs.frozen
class BudgetStatistics:
    """A provider's budgets as its scheduler sees them now.

    Attributes:
        requests_per_minute: The request budget in use (configured, else
            learned), or ``None``.
        tokens_per_minute: The token budget in use, or ``None``.
        requests_available: Requests the budget holds now, or ``None``:
            from minus to plus a minute's budget (below 0 for a while only
            when the provider's figures say it counted requests not yet
            answered).
        tokens_available: Tokens the budget holds now, likewise, or
            ``None``. A request's charge is at most a minute's budget, so no
            estimate or usage report takes it below 0.
        learned: Whether figures from the provider's answers were used.
        waiting_for_budget: Whether the oldest waiter waits for budget, not
            for a slot.
    """

    requests_per_minute: float | None
    tokens_per_minute: float | None
    requests_available: float | None
    tokens_available: float | None
    learned: bool
    waiting_for_budget: bool


def refilled(level: float, capacity: float, rate: float, seconds: float) -> float:
    """A bucket's level ``seconds`` later, refilling ``rate`` per second."""
    if seconds <= 0 or level >= capacity:
        return level
    # min(capacity, ...), spelled out: a grant's path.
    level = level + rate * seconds
    return level if level < capacity else capacity


def charged(value: float, amount: float, capacity: float) -> float:
    """``value`` less a charge of ``amount``, as a bucket counts it.

    A charge takes it down to 0 at most (one request's charge is at most
    the capacity, so nothing makes a budget wait longer than one full
    refill); a negative one gives back, up to ``capacity``. The Redis
    ledger's ``charged`` is the same rule.
    """
    # max(min(value, 0.0), rest) and min(capacity, rest), spelled out: a
    # grant's path.
    rest = value - amount
    if amount > 0:
        least = 0.0 if value > 0.0 else value
        return rest if rest > least else least
    return rest if rest < capacity else capacity


@final
class Bucket:
    """A budget that refills continuously: ``rate`` per second, up to ``capacity``.

    The level, and a configured budget's own count, stay within
    ``[-capacity, capacity]``: the setters clamp, and what ``refilled`` and
    ``charged`` make of a count within it is within it, so the hot paths
    (``refill``, ``take``) store their results as they are. Only a learned
    bucket's capacity moves, and it keeps no own count.
    """

    __slots__ = ("_level", "_own", "capacity", "configured", "per_minute", "rate")

    def __init__(self, per_minute: float, *, configured: bool) -> None:
        self.capacity = per_minute
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self._level = per_minute
        # A configured budget's own count, charged and refilled as the
        # level is but never moved by figures: what they may raise it to.
        # A learned one has none (it stays at the first capacity, unread).
        self._own = per_minute
        self.configured = configured

    @property
    def level(self) -> float:
        """What the bucket holds now, within ``[-capacity, capacity]``."""
        return self._level

    @level.setter
    def level(self, value: float) -> None:
        capacity = self.capacity
        self._level = max(-capacity, min(capacity, value))

    @property
    def own(self) -> float:
        """A configured budget's own count, within ``[-capacity, capacity]``."""
        return self._own

    @own.setter
    def own(self, value: float) -> None:
        capacity = self.capacity
        self._own = max(-capacity, min(capacity, value))

    def __repr__(self) -> str:
        return f"<Bucket {self.level}/{self.capacity} +{self.rate}/s>"

    def need(self, cost: float) -> float:
        """How much is missing before ``cost`` may be charged (0: nothing)."""
        amount = self.charge_of(cost)
        missing = amount - self._level
        if missing <= 0:
            return 0.0
        # A hair of float error must not keep a request out for good.
        return missing if missing > 1e-9 * max(1.0, amount) else 0.0

    def refill(self, seconds: float) -> None:
        """Add what ``seconds`` bring, up to the capacity."""
        if seconds > 0:
            capacity, rate = self.capacity, self.rate
            self._level = refilled(self._level, capacity, rate, seconds)
            if self.configured:
                self._own = refilled(self._own, capacity, rate, seconds)

    def at(self, seconds: float) -> float:
        """The level ``seconds`` from now, if nothing is charged meanwhile."""
        return refilled(self.level, self.capacity, self.rate, seconds)

    def charge_of(self, tokens: float) -> float:
        """What a request of ``tokens`` is charged: at most the capacity."""
        return min(tokens, self.capacity)

    def take(self, amount: float) -> None:
        """Charge ``amount``, down to a level of 0 at most (see ``charged``).

        A negative amount gives back, up to the capacity. A charge never
        deepens a debt: only learning sets the level below 0. The own count
        is charged alike.
        """
        capacity = self.capacity
        self._level = charged(self._level, amount, capacity)
        if self.configured:
            self._own = charged(self._own, amount, capacity)

    def settle(self, amount: float) -> None:
        """Correct a charge the server's figures already counted, by ``amount``.

        The level only takes: what the server gives back for it, its next
        figures will say (it may have charged another estimate). The own
        count is corrected in full.
        """
        self.level = charged(self._level, max(0.0, amount), self.capacity)
        if self.configured:
            self.own = charged(self._own, amount, self.capacity)

    def learn(self, quota: Quota, unseen: float, *, newest: bool) -> bool:
        """Take a quota's figures into account; ``False`` if they say nothing usable.

        ``unseen`` is what was charged for the requests the server may not
        have counted yet, and ``newest`` whether the figures are those of
        the newest answer, which may raise the level (see the module notes).
        """
        limit = quota.limit
        usable = limit is not None and 0 < limit < 1e15
        if usable and not self.configured:
            assert limit is not None
            self.capacity = float(limit)
            rate = self.capacity / 60.0
            remaining, reset = quota.remaining, quota.reset
            if remaining is not None and reset and remaining < limit:
                rate = min(rate, (limit - remaining) / reset)
            self.rate = max(rate, self.capacity / SLOWEST_REFILL)
            self.per_minute = 60.0 * self.rate
            self.level = min(self.level, self.capacity)
        remaining = quota.remaining
        if remaining is None or remaining >= 1e15:
            return usable
        told = remaining - unseen
        if not newest:
            # Figures that may be older than what the bucket knows.
            self.level = min(self.level, told)
        else:
            # The server's count now; a configured budget's own count stays
            # a ceiling, which the server's may lower but never lift.
            self.level = min(self.own if self.configured else self.capacity, told)
        return True


def _learned_bucket(quota: Quota | None) -> Bucket | None:
    """A new bucket for a quota with a usable limit, else ``None``."""
    if quota is None or quota.limit is None or not 0 < quota.limit < 1e15:
        return None
    return Bucket(float(quota.limit), configured=False)


@final
class Adaptive:
    """The state of an ``AdaptiveLimit``: AIMD between its bounds.

    With the latency signal, ``latency`` judges each round of calls and
    ``move`` applies its verdict; successes move nothing.
    """

    __slots__ = ("latency", "maximum", "minimum", "slow_start", "spec", "value")

    def __init__(self, spec: AdaptiveLimit) -> None:
        self.spec = spec
        self.minimum = spec.minimum
        self.maximum = spec.maximum
        self.value = float(spec.initial)
        self.slow_start = True
        self.latency = LatencySignal() if spec.signal == "latency" else None

    def move(self, change: int) -> None:
        """A round's verdict of the latency signal: up (doubled in the slow start), down, or hold."""
        if change > 0:
            step = self.limit if self.slow_start else change
            self.value = min(float(self.maximum), self.limit + step)
        elif change < 0:
            self.slow_start = False
            self.value = max(float(self.minimum), float(self.limit + change))

    @property
    def limit(self) -> int:
        """The current limit: the value rounded down, within the bounds."""
        return min(self.maximum, max(self.minimum, int(self.value)))

    def increase(self) -> None:
        """One success with the limit in use."""
        step = 1.0 if self.slow_start else 1.0 / self.limit
        self.value = min(float(self.maximum), self.value + step)

    def decrease(self) -> None:
        """One round of rate-limit reports."""
        self.slow_start = False
        self.value = max(float(self.minimum), self.limit * self.spec.backoff)


@final
class Throttle:
    """Budgets and an adaptive limit for one provider's policy.

    Args:
        budget: The configured budget, or ``None``.
        adaptive: The adaptive limit, or ``None`` for a fixed one.
        learn: Whether ``observe`` learns from rate-limit figures.
        now: The time of creation, on the policy's clock.
    """

    __slots__ = (
        "_adaptive",
        "_blocked",
        "_configured",
        "_costs",
        "_granted",
        "_granted_at_round",
        "_held",
        "_in_use",
        "_learn",
        "_learned",
        "_newest",
        "_now",
        "_reported",
        "_requests",
        "_seen",
        "_seen_learned",
        "_settled",
        "_since",
        "_tokens",
        "_unanswered",
        "default_max_tokens",
    )

    def __init__(
        self,
        budget: Budget | None = None,
        adaptive: AdaptiveLimit | None = None,
        *,
        learn: bool = True,
        now: float = 0.0,
    ) -> None:
        self._now = now
        self._learn = learn
        self._learned = False
        self._requests: Bucket | None = None
        self._tokens: Bucket | None = None
        self.default_max_tokens = DEFAULT_MAX_TOKENS
        # Whether a Budget was given: then it is never forgotten.
        self._configured = False
        if budget is not None:
            self.configure(budget)
        self._adaptive = None if adaptive is None else Adaptive(adaptive)
        # Estimated tokens of waiting tickets, and the charge of each holder.
        self._costs: dict[Ticket, int] = {}
        self._held: dict[Ticket, float] = {}
        # The holders whose answer has not started, with the time of their
        # grant (in grant order), and the latest grant time of a holder
        # whose answer started.
        self._unanswered: dict[Ticket, float] = {}
        self._seen = -math.inf
        # ...and what it was when figures were last learned from.
        self._seen_learned = -math.inf
        # The holders whose answer started since figures were last learned
        # from, in order: all but the last (whose figures come next) may
        # have reached the server after it.
        self._since: dict[Ticket, None] = {}
        # Holders whose answer started before the newest figures set the
        # level: those figures counted their charge, as the server made it.
        self._settled: set[Ticket] = set()
        # Whether the latest answer to start was the newest so far: its
        # figures, observed next, may raise the budgets' level.
        self._newest = False
        # The cost the oldest waiter waits for, if the budget holds it back.
        self._blocked: int | None = None
        # The adaptive limit's bookkeeping: holders granted with the limit in
        # use, holders at the latest rate-limit report (not a success when
        # they end), and grants since the latest round of reports.
        self._in_use: set[Ticket] = set()
        self._reported: set[Ticket] = set()
        self._granted = 0
        self._granted_at_round = -1

    def __repr__(self) -> str:
        return (
            f"<Throttle requests={self._requests!r} tokens={self._tokens!r}"
            f" limit={None if self._adaptive is None else self._adaptive.limit}>"
        )

    @property
    def adaptive(self) -> AdaptiveLimit | None:
        """The adaptive limit in use, or ``None``."""
        return None if self._adaptive is None else self._adaptive.spec

    @property
    def limit(self) -> int | None:
        """The adaptive limit's current value, or ``None`` for a fixed limit."""
        return None if self._adaptive is None else self._adaptive.limit

    @property
    def learns(self) -> bool:
        """Whether rate-limit figures are learned."""
        return self._learn

    @property
    def configured(self) -> bool:
        """Whether a ``Budget`` was given (``configure``): never forgotten then."""
        return self._configured

    def levels(self, now: float) -> list[tuple[float, float]]:
        """Each bucket's ``(level, capacity)`` at ``now``, if nothing is charged meanwhile."""
        seconds = now - self._now
        return [
            (bucket.at(seconds), bucket.capacity)
            for bucket in (self._requests, self._tokens)
            if bucket is not None
        ]

    def full_at(self) -> float:
        """The first instant its buckets are all full (``is_full``), if nothing is charged."""
        seconds = 0.0
        for bucket in (self._requests, self._tokens):
            if bucket is not None:
                seconds = max(
                    seconds, full_in(bucket.level, bucket.capacity, bucket.rate)
                )
        return self._now + seconds

    def adapt(self, adaptive: AdaptiveLimit | None) -> int | None:
        """Use ``adaptive`` from now on (``None``: a fixed limit); its first value."""
        self._adaptive = None if adaptive is None else Adaptive(adaptive)
        self._in_use.clear()
        self._reported.clear()
        return None if self._adaptive is None else self._adaptive.limit

    def configure(self, budget: Budget) -> None:
        """Use ``budget`` from now on: its budgets start full.

        A kind ``budget`` leaves out (``None``) keeps a learned bucket and
        drops a configured one.
        """
        self._configured = True
        rpm, tpm = budget.requests_per_minute, budget.tokens_per_minute
        requests, tokens = self._requests, self._tokens
        if rpm is not None:
            self._requests = Bucket(rpm, configured=True)
        elif requests is not None and requests.configured:
            self._requests = None
        if tpm is not None:
            self._tokens = Bucket(tpm, configured=True)
        elif tokens is not None and tokens.configured:
            self._tokens = None
        self.default_max_tokens = budget.default_max_tokens

    def advance(self, now: float) -> None:
        """The time is ``now``: the buckets refill."""
        seconds = now - self._now
        if seconds <= 0:
            return
        self._now = now
        if self._requests is not None:
            self._requests.refill(seconds)
        if self._tokens is not None:
            self._tokens.refill(seconds)

    def expect(self, ticket: Ticket, tokens: int) -> None:
        """``ticket`` asks for a slot and is estimated at ``tokens``."""
        if tokens:
            self._costs[ticket] = min(tokens, MAX_TOKENS)

    def forget(self, ticket: Ticket) -> None:
        """``ticket`` stopped waiting."""
        self._costs.pop(ticket, None)

    def holds(self, ticket: Ticket) -> bool:
        """Whether the budgets hold ``ticket`` now; charges nothing.

        When they do not, ``ready_at`` says when they will (``blocked``
        until the policy looks again).
        """
        cost = self._costs.get(ticket, 0)
        if self._short(cost):
            self._blocked = cost
            return False
        self._blocked = None
        return True

    def fits(self, tokens: int) -> bool:
        """Whether the budgets hold a request of ``tokens`` now; changes nothing."""
        return not self._short(min(tokens, MAX_TOKENS))

    def _short(self, cost: int) -> bool:
        """Whether a budget lacks what a request of ``cost`` tokens is charged."""
        requests, tokens = self._requests, self._tokens
        return bool(
            (requests is not None and requests.need(1))
            or (tokens is not None and cost and tokens.need(cost))
        )

    def take(self, ticket: Ticket, in_flight: int, limit: int | None) -> None:
        """Charge ``ticket``, which the budgets hold (``holds``), for its grant.

        ``in_flight`` is how many hold a slot before this grant, and
        ``limit`` the limit it is granted under.
        """
        cost = self._costs.get(ticket, 0)
        requests, tokens = self._requests, self._tokens
        if requests is not None:
            requests.take(1)
        charge: float = cost
        if cost:
            del self._costs[ticket]
            if tokens is not None:
                # One request's charge is at most the capacity.
                charge = tokens.charge_of(cost)
                tokens.take(charge)
        self._held[ticket] = charge
        self._granted += 1
        self._unanswered[ticket] = self._now
        if (
            self._adaptive is not None
            and limit is not None
            and 2 * (in_flight + 1) >= limit
        ):
            self._in_use.add(ticket)

    def unblock(self) -> None:
        """Forget what the oldest waiter waited for: the policy looks again."""
        self._blocked = None

    @property
    def blocked(self) -> bool:
        """Whether the oldest waiter waits for budget."""
        return self._blocked is not None

    def ready_at(self) -> float | None:
        """When the budgets will hold the oldest waiter, if they hold it back."""
        cost = self._blocked
        if cost is None:
            return None
        seconds = 0.0
        for bucket, amount in ((self._requests, 1), (self._tokens, cost)):
            if bucket is not None and amount:
                missing = bucket.need(amount)
                if missing:
                    seconds = max(seconds, missing / bucket.rate)
        ready = self._now + seconds
        # At least one float step ahead, so that waking there makes progress.
        return ready if ready > self._now else math.nextafter(self._now, math.inf)

    def release(self, ticket: Ticket, *, success: bool) -> int | None:
        """``ticket`` gave its slot back; the new adaptive limit, if it changed."""
        cost = self._held.pop(ticket, None)
        if cost is None:
            return None
        # Gone: whether the server saw it no longer matters.
        self._unanswered.pop(ticket, None)
        self._settled.discard(ticket)
        self._since.pop(ticket, None)
        in_use = ticket in self._in_use
        self._in_use.discard(ticket)
        if ticket in self._reported:
            self._reported.discard(ticket)
            return None
        adaptive = self._adaptive
        if (
            not success
            or not in_use
            or adaptive is None
            or adaptive.latency is not None
        ):
            return None
        before = adaptive.limit
        adaptive.increase()
        return adaptive.limit if adaptive.limit != before else None

    def observe_latency(  # one call's figures (LatencySignal.observe)
        self,
        first_token: float,
        between_tokens: float | None,
        duration: float,
        prompt_tokens: int,
        in_flight: int,
    ) -> int | None:
        """A call ended with these timings; the new adaptive limit, if it changed.

        Only a latency-signal adaptive limit learns from them.
        """
        adaptive = self._adaptive
        if adaptive is None or adaptive.latency is None:
            return None
        change = adaptive.latency.observe(
            self._now,
            first_token,
            between_tokens,
            duration,
            prompt_tokens,
            in_flight,
            adaptive.limit,
        )
        return self.apply_latency_verdict(change) if change else None

    def apply_latency_verdict(self, change: int) -> int | None:
        """A round's verdict of a latency signal (``Adaptive.move``); the new limit, if it changed.

        The verdict of this throttle's own signal (``observe_latency``), or
        of a signal kept elsewhere: with ``redis_url`` each process judges
        its own calls, and the ledger applies their verdicts to the
        fleet's limit by this same rule. Only a latency-signal adaptive
        limit moves.
        """
        adaptive = self._adaptive
        if adaptive is None or adaptive.latency is None:
            return None
        before = adaptive.limit
        adaptive.move(change)
        return adaptive.limit if adaptive.limit != before else None

    def report_usage(self, ticket: Ticket, tokens: int) -> bool:
        """The request of held ``ticket`` used ``tokens`` in all.

        Its charge becomes ``tokens`` (at most the capacity): the difference
        is given back or taken. Returns whether that gave tokens back (the
        head may fit now).
        """
        charged = self._held.get(ticket)
        if charged is None:
            return False
        # The answer is in, but no figures come with a usage report.
        self._see(ticket, newest=False)
        used: float = min(tokens, MAX_TOKENS)
        if self._tokens is not None:
            # One request's charge is at most the capacity, its usage too.
            used = self._tokens.charge_of(used)
            if ticket in self._settled:
                self._tokens.settle(used - charged)
            else:
                self._tokens.take(used - charged)
        self._held[ticket] = used
        return used < charged

    def answered(self, ticket: Ticket) -> None:
        """The answer of held ``ticket`` started: the server has counted it.

        The figures observed next are its answer's: the newest if it was
        granted after every slot whose answer had started when figures were
        last learned from (see the module notes).
        """
        self._see(ticket, newest=True)

    def _see(self, ticket: Ticket, *, newest: bool) -> None:
        granted_at = self._unanswered.pop(ticket, None)
        if granted_at is None:
            return
        self._since[ticket] = None
        self._newest = newest and granted_at > self._seen_learned
        self._seen = max(self._seen, granted_at)

    def _unseen(self) -> tuple[int, float]:
        """Requests and tokens the server may not have counted in the next figures.

        The holders unanswered granted since the latest answered (at the
        same instant too: which of them reached the server first, nobody
        knows), and those whose answer started since figures were last
        learned from, but the last, whose figures these are.
        """
        requests = 0
        tokens = 0.0
        # Latest first: the unseen are at the end, in grant order.
        for ticket in reversed(self._unanswered):
            if self._unanswered[ticket] < self._seen:
                break
            requests += 1
            tokens += self._held[ticket]
        for ticket in list(self._since)[:-1]:
            requests += 1
            tokens += self._held[ticket]
        return requests, tokens

    def rate_limited(self, holders: frozenset[Ticket] | set[Ticket]) -> int | None:
        """A rate-limit answer arrived; the new adaptive limit, if it changed.

        Reports with no grant since the previous one share its round and its
        decrease. ``holders`` are the slots held now: none of them counts as
        a success when it ends.
        """
        self._reported = set(holders)
        adaptive = self._adaptive
        if adaptive is None or self._granted == self._granted_at_round:
            return None
        self._granted_at_round = self._granted
        before = adaptive.limit
        adaptive.decrease()
        return adaptive.limit if adaptive.limit != before else None

    def observe(self, info: RateLimitInfo) -> None:
        """Learn from the rate-limit figures of one answer (see the module notes)."""
        if not self._learn:
            return
        requests, tokens = self._unseen()
        newest, self._newest = self._newest, False
        self._seen_learned = self._seen
        self._since.clear()
        if info.requests is not None:
            if self._requests is None:
                self._requests = _learned_bucket(info.requests)
            if self._requests is not None and self._requests.learn(
                info.requests, float(requests), newest=newest
            ):
                self._learned = True
        if info.tokens is not None:
            if self._tokens is None:
                self._tokens = _learned_bucket(info.tokens)
            if self._tokens is not None and self._tokens.learn(
                info.tokens, float(tokens), newest=newest
            ):
                self._learned = True
            if newest and self._tokens is not None:
                # The charges of the holders answered so far are in them.
                unanswered = self._unanswered
                self._settled.update(t for t in self._held if t not in unanswered)

    def statistics(self, now: float | None = None) -> BudgetStatistics | None:
        """The budgets at ``now`` (default: the latest ``advance``), or ``None``."""
        requests, tokens = self._requests, self._tokens
        if requests is None and tokens is None:
            return None
        seconds = 0.0 if now is None else max(0.0, now - self._now)
        return BudgetStatistics(
            requests_per_minute=None if requests is None else requests.per_minute,
            tokens_per_minute=None if tokens is None else tokens.per_minute,
            requests_available=None if requests is None else requests.at(seconds),
            tokens_available=None if tokens is None else tokens.at(seconds),
            learned=self._learned,
            waiting_for_budget=self._blocked is not None,
        )


def check_limit_mapping(
    limits: object, name: str = "limits"
) -> dict[str, int | AdaptiveLimit]:
    """A mapping of provider names to limits (ints or adaptive), checked whole."""
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise TypeError(
            f"{name} must be a mapping of provider to limit, got {limits!r}"
        )
    return {
        check_provider(provider): check_limit_value(limit, f"limit for {provider!r}")
        for provider, limit in limits.items()
    }


def check_budgets(budgets: object, name: str = "budgets") -> dict[str, Budget]:
    """A mapping of budget keys to ``Budget`` values, checked whole.

    A key is a provider's name (its budget over all its models) or
    ``"provider/model"`` (one model's own budget), split at the first
    ``/`` with both parts non-empty (see ``split_budget_key``).
    """
    if budgets is None:
        return {}
    if not isinstance(budgets, Mapping):
        raise TypeError(
            f"{name} must be a mapping of provider to Budget, got {budgets!r}"
        )
    checked: dict[str, Budget] = {}
    for key, budget in budgets.items():
        if not isinstance(budget, Budget):
            raise TypeError(f"budget for {key!r} must be a Budget, got {budget!r}")
        split_budget_key(key)
        checked[key] = budget
    return checked


def split_budget_key(key: object) -> tuple[str, str | None]:
    """A ``budgets`` key: ``"provider"``, or ``"provider/model"`` split at its first ``/``.

    Returns the provider and the model (``None`` for a provider's own
    budget, over all its models). Both parts of a key with a slash must be
    non-empty; the model keeps any later slash (``"vllm/org/model"``).
    """
    check_provider(key)
    assert isinstance(key, str)  # checked just above
    provider, slash, model = key.partition("/")
    if slash and not (provider and model):
        raise ValueError(
            "budget key must be 'provider' or 'provider/model', both parts"
            f" non-empty, got {key!r}"
        )
    return provider, model if slash else None


@final
class ModelThrottles:
    """The throttles of a provider's models, by model, for its ``SlotPolicy``.

    Counts, per model, the tickets that wait or hold a slot (``use``, from
    the moment the policy counts models), and forgets an idle model's
    learned throttle once it may be (``forgets``, see the module notes).
    An idle model's throttle is watched in a heap by the instant it may be
    forgotten, so ``advance`` costs nothing until then, and a throttle is
    brought to the time only when its model is used (``get``): a grant
    costs the same however many models are idle.
    """

    __slots__ = (
        "_busy",
        "_counting",
        "_forgetting",
        "_idle",
        "_now",
        "_throttles",
        "_uncounted",
    )

    def __init__(self, throttles: Mapping[str, Throttle], now: float = 0.0) -> None:
        self._throttles = dict(throttles)
        self._now = now
        # Tickets of each model that wait or hold a slot; holders from
        # before models were counted are not (the Redis ledger cannot tell
        # their model), and their release counts nothing.
        self._busy: dict[str, int] = {}
        self._uncounted: set[Ticket] = set()
        self._counting = False
        # Each idle model with a learned throttle: since when it is idle,
        # and when it may be forgotten; the heap holds the latter (an entry
        # whose instant is no longer its model's is skipped).
        self._idle: dict[str, tuple[float, float]] = {}
        self._forgetting: list[tuple[float, str]] = []
        for model, throttle in self._throttles.items():
            if not throttle.configured:
                self._watch(model, throttle, now)

    def __repr__(self) -> str:
        return f"<ModelThrottles models={len(self._throttles)} idle={len(self._idle)}>"

    def __bool__(self) -> bool:
        return bool(self._throttles)

    def __len__(self) -> int:
        return len(self._throttles)

    def __contains__(self, model: object) -> bool:
        return model in self._throttles

    def __getitem__(self, model: str) -> Throttle:
        """``model``'s throttle as it is (``get`` brings it to the time)."""
        return self._throttles[model]

    def get(self, model: str | None) -> Throttle | None:
        """``model``'s throttle, if it has one, brought to the latest time told."""
        if model is None:
            return None
        throttle = self._throttles.get(model)
        if throttle is not None:
            throttle.advance(self._now)
        return throttle

    def add(self, model: str, throttle: Throttle) -> Throttle:
        """Give ``model``, which has none, ``throttle``; returns it."""
        self._throttles[model] = throttle
        if not throttle.configured and model not in self._busy:
            self._watch(model, throttle, self._now)
        return throttle

    def configure(self, model: str, budget: Budget) -> None:
        """``model``'s throttle takes ``budget`` (``Throttle.configure``): kept for good."""
        throttle = self.get(model)
        assert throttle is not None  # the policy makes one first
        throttle.configure(budget)
        self._idle.pop(model, None)

    def observed(self, model: str) -> None:
        """``model``'s throttle learned from figures: if idle, it may be forgotten later."""
        state = self._idle.get(model)
        if state is not None:
            self._watch(model, self._throttles[model], state[0])

    def count(self, holders: Iterable[Ticket], waiting: Iterable[Ticket]) -> None:
        """Count the tickets of each model from now on: those waiting now too."""
        self._counting = True
        for ticket in holders:
            if ticket.model is not None:
                self._uncounted.add(ticket)
        for ticket in waiting:
            if ticket.model is not None:
                self.use(ticket.model, 1)

    def use(self, model: str, delta: int) -> None:
        """One ticket of ``model`` more (``1``) or less (``-1``) waits or holds a slot.

        Nothing is counted before ``count``.
        """
        if not self._counting:
            return
        busy = self._busy
        count = busy.get(model, 0) + delta
        if count > 0:
            busy[model] = count
            if count == delta:
                self._idle.pop(model, None)
            return
        busy.pop(model, None)
        throttle = self._throttles.get(model)
        if throttle is not None and not throttle.configured:
            self._watch(model, throttle, self._now)

    def release(self, ticket: Ticket, *, success: bool) -> None:
        """Held ``ticket``, of a model, gave its slot back."""
        model = ticket.model
        assert model is not None  # called for those only
        throttle = self._throttles.get(model)
        if throttle is not None:
            throttle.release(ticket, success=success)
        if ticket in self._uncounted:
            self._uncounted.discard(ticket)
        else:
            self.use(model, -1)

    def advance(self, now: float) -> None:
        """The time is ``now``: the idle models' learned throttles that may be go."""
        if now > self._now:  # noqa: PLR1730  # no call on the hot path
            self._now = now
        forgetting = self._forgetting
        if forgetting and forgetting[0][0] <= now:
            self._forget(now)

    def _forget(self, now: float) -> None:
        forgetting = self._forgetting
        idle = self._idle
        while forgetting and forgetting[0][0] <= now:
            at, model = heapq.heappop(forgetting)
            state = idle.get(model)
            if state is None or state[1] != at:
                continue  # in use again since, or watched anew
            since = state[0]
            throttle = self._throttles[model]
            if forgets(now - since, throttle.levels(now)):
                del idle[model]
                del self._throttles[model]
            else:
                # A hair short of full (a float's last digit): looked at
                # again at the next instant told.
                later = max(throttle.full_at(), math.nextafter(now, math.inf))
                idle[model] = (since, later)
                heapq.heappush(forgetting, (later, model))

    def throttles(self) -> dict[str, Throttle]:
        """The throttles, by model (a copy of the mapping; the throttles themselves)."""
        return dict(self._throttles)

    def _watch(self, model: str, throttle: Throttle, since: float) -> None:
        at = max(since + FORGET_AFTER, throttle.full_at())
        self._idle[model] = (since, at)
        heapq.heappush(self._forgetting, (at, model))

    def statistics(self, now: float | None = None) -> dict[str, BudgetStatistics]:
        """Each model's budgets at ``now`` (default: the latest time told).

        Not those forgotten by then.
        """
        when = self._now if now is None else now
        idle = self._idle
        found: dict[str, BudgetStatistics] = {}
        for model, throttle in self._throttles.items():
            state = idle.get(model)
            if state is not None and forgets(when - state[0], throttle.levels(when)):
                continue
            stats = throttle.statistics(when)
            if stats is not None:
                found[model] = stats
        return found
