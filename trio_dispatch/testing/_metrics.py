"""What a simulation measured, and the metrics, pure functions of it.

Definitions, over the turns that completed:

- *latency*: the turn's end minus its start, in (virtual) seconds;
- *slowdown*: latency over the same turn's latency on an idle system (the
  sum of its call and tool durations); 1.0 means it never waited;
- *Jain's fairness index* of the slowdowns: ``(sum x)**2 / (n * sum x**2)``,
  1.0 when every turn is slowed down alike, down to ``1/n``;
- *percentiles*: linear interpolation between closest ranks (numpy's
  default, "type 7");
- *slot utilisation*: the slot time spent on calls the provider served,
  over the summed limits times the makespan (first start to last end);
- *short* and *long turns*: a turn is short if it planned at most the
  median number of calls of all the run's turns (the lower median), long
  otherwise. Where turns are mixed (chat turns of one or two calls beside
  agent runs of tens) this splits them, so that what one kind of turn
  gains is never hidden by what the other loses.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Sequence


@final
@attrs.frozen
class TurnRecord:
    """What happened to one turn in a simulation (times from its start).

    Attributes:
        index: The turn's position in the scenario.
        end: When it ended (completed or gave up).
        calls: How many LLM calls it made successfully.
        ideal: Its latency on an idle system.
        slot_wait: Total time its calls waited for a slot.
        max_slot_wait: The longest single wait for a slot.
        first_slot_wait: How long its first call waited for a slot.
        rejections: How many 429 answers it received.
        completed: ``False`` if a call ran out of attempts.
        priority: Its priority class.
        planned: How many calls it meant to make (0: as many as ``calls``).
    """

    index: int
    provider: str
    start: float
    end: float
    calls: int
    ideal: float
    slot_wait: float
    max_slot_wait: float
    first_slot_wait: float
    rejections: int
    completed: bool
    priority: int = 0
    planned: int = 0

    @property
    def latency(self) -> float:
        """End minus start."""
        return self.end - self.start

    @property
    def slowdown(self) -> float:
        """Latency over the idle-system latency (1.0 for an instant turn)."""
        return slowdown(self.latency, self.ideal)


@final
@attrs.frozen
class ProviderRecord:
    """What one simulated provider saw.

    Attributes:
        limit: The client-side limit.
        capacity: Its own capacity, or ``None``.
        rejected: Calls it answered 429.
        busy: Seconds of call time it served, summed over calls.
        held_at_end: Slots still held when the simulation ended (0 unless a
            limiter leaked), as ``waiting_at_end`` the requests still waiting.
    """

    name: str
    limit: int
    capacity: int | None
    peak_in_flight: int
    served: int
    rejected: int
    busy: float
    held_at_end: int
    waiting_at_end: int


@final
@attrs.frozen
class PolicyMetrics:
    """The summary of one simulation run; see the module doc for definitions.

    Latency (mean, p50, p95, p99, max), slowdown and wait figures cover
    completed turns only, and are ``nan`` when none completed.

    Attributes:
        completed: Turns whose every call succeeded, of ``turns``.
        fairness: Jain's index of the slowdowns.
        first_wait_p95: 95th percentile wait of a turn's first call.
        max_slot_wait: The longest any single call waited for a slot.
        utilisation: Slot utilisation over the makespan.
        makespan: First start to last end.
        rejections: 429 answers received.
        short_calls: The most calls a short turn makes (see the module
            doc); ``short_p50``... are the latency percentiles of the
            completed short and long turns, ``None`` where there are none.
        first_wait_p50: Median wait of a turn's first call (``None``
            where no turn completed).
    """

    policy: str
    turns: int
    completed: int
    latency_mean: float
    latency_p50: float
    latency_p95: float
    latency_p99: float
    latency_max: float
    slowdown_mean: float
    slowdown_p95: float
    fairness: float
    first_wait_p95: float
    max_slot_wait: float
    utilisation: float
    makespan: float
    rejections: int
    short_calls: int = 0
    short_turns: int = 0
    short_p50: float | None = None
    short_p95: float | None = None
    long_turns: int = 0
    long_p50: float | None = None
    long_p95: float | None = None
    first_wait_p50: float | None = None


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean (``nan`` for no values), summed exactly."""
    if not values:
        return math.nan
    return math.fsum(values) / len(values)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), numpy's default method; ``nan`` for none."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be between 0 and 100, got {q!r}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def _percentile_or_none(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal; ``nan`` for none."""
    if not values:
        return math.nan
    total = math.fsum(values)
    squares = math.fsum(x * x for x in values)
    if squares == 0:
        return 1.0
    return total * total / (len(values) * squares)


def slowdown(latency: float, ideal: float) -> float:
    """``latency / ideal``; an instant turn (``ideal == 0``) counts 1.0."""
    if ideal <= 0:
        return 1.0
    return latency / ideal


def utilisation(busy: float, limit: int, makespan: float) -> float:
    """Busy slot time over ``limit * makespan`` (0.0 for an empty makespan)."""
    if makespan <= 0:
        return 0.0
    return busy / (limit * makespan)


def compute_metrics(
    policy: str,
    turns: Sequence[TurnRecord],
    providers: Sequence[ProviderRecord],
) -> PolicyMetrics:
    """Summarise one run's records; see the module doc for definitions."""
    done = [t for t in turns if t.completed]
    latencies = [t.latency for t in done]
    slowdowns = [t.slowdown for t in done]
    makespan = max(t.end for t in turns) - min(t.start for t in turns) if turns else 0.0
    busy = math.fsum(p.busy for p in providers)
    limit = sum(p.limit for p in providers)
    plans = sorted(t.planned or t.calls for t in turns)
    short_calls = plans[(len(plans) - 1) // 2] if plans else 0
    short = [t.latency for t in done if (t.planned or t.calls) <= short_calls]
    long = [t.latency for t in done if (t.planned or t.calls) > short_calls]
    return PolicyMetrics(
        policy=policy,
        turns=len(turns),
        completed=len(done),
        latency_mean=mean(latencies),
        latency_p50=percentile(latencies, 50),
        latency_p95=percentile(latencies, 95),
        latency_p99=percentile(latencies, 99),
        latency_max=max(latencies, default=math.nan),
        slowdown_mean=mean(slowdowns),
        slowdown_p95=percentile(slowdowns, 95),
        fairness=jain_index(slowdowns),
        first_wait_p95=percentile([t.first_slot_wait for t in done], 95),
        max_slot_wait=max((t.max_slot_wait for t in turns), default=math.nan),
        utilisation=utilisation(busy, limit, makespan) if limit else 0.0,
        makespan=makespan,
        rejections=sum(t.rejections for t in turns),
        short_calls=short_calls,
        short_turns=sum((t.planned or t.calls) <= short_calls for t in turns),
        short_p50=_percentile_or_none(short, 50),
        short_p95=_percentile_or_none(short, 95),
        long_turns=sum((t.planned or t.calls) > short_calls for t in turns),
        long_p50=_percentile_or_none(long, 50),
        long_p95=_percentile_or_none(long, 95),
        first_wait_p50=_percentile_or_none([t.first_slot_wait for t in done], 50),
    )


#: What ``versus`` compares: (label, ``PolicyMetrics`` field, unit, whether
#: higher is better). Where oldest-first wins (the tail of turn latency) and
#: where it can lose (short turns, a new turn's first call, slowdown), with
#: the work finished first: a policy cannot look fast by dropping turns.
VERSUS: tuple[tuple[str, str, str, bool], ...] = (
    ("turns completed", "completed", "turns", True),
    ("turn p50", "latency_p50", "s", False),
    ("turn p95", "latency_p95", "s", False),
    ("turn p99", "latency_p99", "s", False),
    ("short turns' p50", "short_p50", "s", False),
    ("long turns' p95", "long_p95", "s", False),
    ("first-call wait p50", "first_wait_p50", "s", False),
    ("first-call wait p95", "first_wait_p95", "s", False),
    ("longest single wait", "max_slot_wait", "s", False),
    ("mean slowdown", "slowdown_mean", "x", False),
    ("Jain index of slowdowns", "fairness", "", True),
)

#: Differences smaller than this share (or than ``_NOISE`` seconds) are ties.
_TIE = 0.05
_NOISE = 0.05


def versus(ours: PolicyMetrics, base: PolicyMetrics) -> tuple[list[str], list[str]]:
    """Where ``ours`` does better than ``base``, and where worse: two lists of lines.

    Each line reads ``"turn p95 41.2 s vs 52.0 s (0.79x)"``; a difference
    within 5% (or 0.05 s) is a tie and is in neither list.
    """
    wins: list[str] = []
    losses: list[str] = []
    for label, field, unit, higher in VERSUS:
        a, b = getattr(ours, field), getattr(base, field)
        if a is None or b is None or math.isnan(a) or math.isnan(b):
            continue
        if unit == "s" and abs(a - b) < _NOISE:
            continue
        if abs(a - b) <= _TIE * abs(b):
            continue
        better = a > b if higher else a < b
        if unit == "turns":
            line = f"{label} {a}/{ours.turns} vs {b}/{base.turns}"
        else:
            ratio = f" ({a / b:.2f}x)" if b else ""
            shown = {"s": " s", "x": "x"}.get(unit, "")
            line = f"{label} {a:.2f}{shown} vs {b:.2f}{shown}{ratio}"
        (wins if better else losses).append(line)
    return wins, losses
