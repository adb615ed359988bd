"""Seeded, pre-generated agent workloads for the simulation harness.

A ``Workload`` describes agent turns statistically; ``Workload.scenario()``
draws every number from one ``random.Random(seed)`` up front and returns a
``Scenario``, the concrete list of turns (which can also be written by
hand). Nothing is drawn while the simulation runs, so trio's scheduling
order cannot change the workload, and every policy compared on one seed
sees the same turns.

Load is a fraction of the client-side capacity: a Poisson workload at load
``rho`` on providers whose limits sum to ``L`` has arrival rate
``rho * L / d``, where ``d`` is the mean slot time a turn needs (mean calls
per turn times mean call duration). With provider weights proportional to
their limits, every provider sees the same load.

Turns arrive by ``PoissonArrivals``, ``BurstArrivals``, a ``RateCurve`` (a
load that changes over time), or as a ``Trace`` recorded them: a trace's
turns keep their own calls, tools, tenant, priority and model
(``Workload.from_trace`` reads one from a JSON Lines file).
"""

from __future__ import annotations

import collections
import itertools
import math
import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

import attrs

from .._dispatch._pools import check_pools
from .._validation import (
    check_count,
    check_number,
    check_optional_model,
    check_optional_tenant,
    check_positive_number,
    check_priority,
    check_seconds,
    check_text,
    non_negative_number,
    non_negative_seconds,
    positive_int,
    positive_number,
    positive_seconds,
    validator,
)
from ._distributions import CallsPerTurn, Duration

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

#: Turns of one burst arrive this far apart, in workload order, so that their
#: order is part of the workload rather than of trio's scheduler.
BURST_SPACING = 1e-6

_Name = Any  # a priority class (int) or a name (str)


@final
@attrs.frozen
class PoissonArrivals:
    """Turns arrive as a Poisson process at ``load`` times the capacity.

    ``load`` is offered slot time per second over the summed limits: 1.0
    keeps every slot busy on average, above it the queue grows.
    """

    load: float = attrs.field(validator=positive_number)


@final
@attrs.frozen
class BurstArrivals:
    """Turns arrive in bursts of ``size``, one burst every ``interval`` seconds.

    The first burst arrives at time 0; turns of one burst ``BURST_SPACING``
    apart, in order.
    """

    size: int = attrs.field(validator=positive_int)
    interval: float = attrs.field(validator=positive_seconds)


def _to_points(
    values: Iterable[tuple[float, float]],
) -> tuple[tuple[float, float], ...]:
    return tuple((at, load) for at, load in values)


@final
@attrs.frozen
class RateCurve:
    """Poisson arrivals whose load follows a curve over time.

    ``points`` are ``(seconds, load)`` pairs, the first at 0 and the times
    increasing; the load goes linearly from one point to the next and
    stays at the last one's after it (which must be above 0, so every turn
    arrives). Loads are fractions of the capacity, as ``PoissonArrivals``'.
    """

    points: tuple[tuple[float, float], ...] = attrs.field(converter=_to_points)

    def __attrs_post_init__(self) -> None:
        points = self.points
        if not points:
            raise ValueError("a rate curve needs at least one (seconds, load) point")
        for at, load in points:
            check_seconds(at, "a rate curve's time")
            check_number(load, "a rate curve's load")
        if points[0][0] != 0:
            raise ValueError(f"a rate curve starts at 0 s, got {points[0][0]!r}")
        times = [at for at, _ in points]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError(f"a rate curve's times must increase, got {times!r}")
        if points[-1][1] <= 0:
            raise ValueError("a rate curve's last load must be above 0")

    def load_at(self, seconds: float) -> float:
        """The load ``seconds`` after the start."""
        points = self.points
        for (t0, l0), (t1, l1) in itertools.pairwise(points):
            if seconds < t1:
                return l0 + (l1 - l0) * (seconds - t0) / (t1 - t0)
        return points[-1][1]

    @property
    def mean_load(self) -> float:
        """The time-weighted mean load up to the last point (its load if only one)."""
        points = self.points
        if len(points) == 1:
            return points[0][1]
        area = math.fsum(
            (t1 - t0) * (l0 + l1) / 2
            for (t0, l0), (t1, l1) in itertools.pairwise(points)
        )
        return area / points[-1][0]

    @property
    def peak(self) -> float:
        """The highest load on the curve."""
        return max(load for _, load in self.points)

    def scaled(self, factor: float) -> RateCurve:
        """The same curve with every load times ``factor``."""
        return RateCurve(tuple((at, load * factor) for at, load in self.points))


@final
@attrs.frozen
class SimProvider:
    """A simulated LLM provider.

    Attributes:
        limit: The client-side concurrency limit.
        capacity: How many calls the provider itself serves at once; one
            more is answered 429 after ``reject_latency`` seconds, with
            ``retry_after``. ``None``: it never refuses.
        weight: How often agents pick this provider, relative to the others.
    """

    name: str = attrs.field(validator=validator(check_text))
    limit: int = attrs.field(validator=positive_int)
    capacity: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(positive_int),
    )
    retry_after: float = attrs.field(default=1.0, validator=non_negative_seconds)
    reject_latency: float = attrs.field(default=0.05, validator=non_negative_seconds)
    weight: float = attrs.field(default=1.0, validator=positive_number)


# One converter per type: mypy's attrs plugin cannot solve a generic one.
def _to_duration_tuple(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(values)


def _to_provider_tuple(values: Iterable[SimProvider]) -> tuple[SimProvider, ...]:
    return tuple(values)


def _to_turn_tuple(values: Iterable[TurnSpec]) -> tuple[TurnSpec, ...]:
    return tuple(values)


def _to_token_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


Pools = tuple[tuple[str, tuple[str, ...]], ...]


def _to_pools(values: Any) -> Pools:  # noqa: ANN401  # a mapping or pairs, checked by _targets
    """Pool names and their members, as pairs in order: from a mapping or pairs.

    Members given as a string stay one, for ``check_pools`` to refuse.
    """
    pairs = values.items() if isinstance(values, Mapping) else values
    return tuple(
        (name, members if isinstance(members, str) else tuple(members))  # type: ignore[misc]  # a string stays one, refused
        for name, members in pairs
    )


def _targets(providers: tuple[SimProvider, ...], pools: Pools) -> set[str]:
    """What a turn may name: a provider, or a pool of them (``pools`` checked).

    Raises:
        TypeError: A pool's members are not a tuple or list of names.
        ValueError: A pool is named twice or like a provider, has no
            member, names one twice, or names one that is no provider.
    """
    names = {p.name for p in providers}
    checked = check_pools(dict(pools))
    if len(checked) != len(pools):
        raise ValueError(
            f"pools must name each pool once, got {[n for n, _ in pools]!r}"
        )
    for pool, members in checked.items():
        if pool in names:
            raise ValueError(f"pool {pool!r} has the name of a provider")
        unknown = [member for member in members if member not in names]
        if unknown:
            raise ValueError(f"pool {pool!r} has unknown members {unknown!r}")
    return names | set(checked)


# Each call's or tool step's duration, checked like any number of seconds.
_durations = attrs.validators.deep_iterable(non_negative_seconds)
_token_counts = attrs.validators.deep_iterable(validator(check_count))


@final
@attrs.frozen
class TurnSpec:
    """One agent turn, fully drawn: when it starts and what it does.

    It starts ``arrival`` seconds into the simulation and makes
    ``len(calls)`` calls to ``provider``, each holding a slot for its
    duration, with ``tools[i]`` seconds of tool work after call ``i`` (none
    after the last). ``priority`` is its class (higher goes first).
    ``tenant`` and ``model`` are who it is for and what it asks for (a
    dispatcher configuration with tenants or model budgets sees them), and
    ``tokens`` each call's tokens, prompt and answer (empty: unknown).
    """

    arrival: float = attrs.field(validator=non_negative_seconds)
    provider: str
    calls: tuple[float, ...] = attrs.field(
        converter=_to_duration_tuple, validator=_durations
    )
    tools: tuple[float, ...] = attrs.field(
        converter=_to_duration_tuple, factory=tuple, validator=_durations
    )
    priority: int = attrs.field(default=0, validator=validator(check_priority))
    tenant: str | None = attrs.field(
        default=None, validator=validator(check_optional_tenant)
    )
    model: str | None = attrs.field(
        default=None, validator=validator(check_optional_model)
    )
    tokens: tuple[int, ...] = attrs.field(
        converter=_to_token_tuple, factory=tuple, validator=_token_counts
    )

    def __attrs_post_init__(self) -> None:
        if not self.calls:
            raise ValueError("a turn makes at least one call")
        if self.tokens and len(self.tokens) != len(self.calls):
            raise ValueError(
                f"a turn of {len(self.calls)} calls has {len(self.calls)} token"
                f" counts or none, got {len(self.tokens)}"
            )
        if len(self.tools) != len(self.calls) - 1:
            raise ValueError(
                f"a turn of {len(self.calls)} calls has {len(self.calls) - 1}"
                f" tool steps, got {len(self.tools)}"
            )

    @property
    def ideal(self) -> float:
        """The turn's latency on an idle system: its calls and tools end to end."""
        return math.fsum(self.calls) + math.fsum(self.tools)


@final
@attrs.frozen
class Scenario:
    """A concrete workload: providers (unique names) and every turn, in any order.

    A call answered 429 is sent at most ``max_attempts`` times. ``pools``:
    pool names and their members (providers), as a mapping or as pairs; a
    turn may name a pool, and each of its calls is served by the member
    its policy picks (see ``simulate``).
    """

    providers: tuple[SimProvider, ...] = attrs.field(converter=_to_provider_tuple)
    turns: tuple[TurnSpec, ...] = attrs.field(converter=_to_turn_tuple)
    max_attempts: int = attrs.field(default=10, validator=positive_int)
    pools: Pools = attrs.field(default=(), converter=_to_pools)

    def __attrs_post_init__(self) -> None:
        names = [p.name for p in self.providers]
        if not names:
            raise ValueError("a scenario needs at least one provider")
        if len(set(names)) != len(names):
            raise ValueError(f"provider names must be unique, got {names!r}")
        known = _targets(self.providers, self.pools)
        for turn in self.turns:
            if turn.provider not in known:
                raise ValueError(f"turn uses unknown provider {turn.provider!r}")

    def write_trace(self, path: str | Path) -> None:
        """Write the turns, by arrival, as a JSON Lines trace file (see ``Workload.from_trace``).

        Which provider each turn used is not written: the trace format has
        none (``from_trace`` puts a turn on the provider named like its
        model, else on the first).
        """
        from ._traces import write_trace  # noqa: PLC0415  # the trace format's module

        write_trace(self.turns, path)


def _to_classes(values: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    return tuple((priority, weight) for priority, weight in values)


def _check_classes(
    _instance: object, _attribute: object, value: tuple[tuple[int, float], ...]
) -> None:
    for priority, weight in value:
        check_priority(priority, "a class's priority")
        check_positive_number(weight, "a class's weight")
    priorities = [priority for priority, _ in value]
    if len(set(priorities)) != len(priorities):
        raise ValueError(f"classes must name each priority once, got {priorities!r}")


def _to_names(values: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    return tuple((name, weight) for name, weight in values)


def _check_names(
    _instance: object,
    attribute: attrs.Attribute[tuple[tuple[str, float], ...]],
    value: tuple[tuple[str, float], ...],
) -> None:
    what = attribute.name[:-1]  # "tenants" -> "tenant"
    for name, weight in value:
        check_text(name, f"a {what}'s name")
        check_positive_number(weight, f"a {what}'s weight")
    names = [name for name, _ in value]
    if len(set(names)) != len(names):
        raise ValueError(f"{attribute.name} must name each {what} once, got {names!r}")


@final
@attrs.frozen
class Trace:
    """Turns as they were recorded, played as they are.

    Each turn keeps its arrival (divided by ``speed``: 2.0 plays the trace
    twice as fast, at twice its load), its calls and tool steps, and its
    tenant, priority, model and tokens. ``Workload.from_trace`` reads one
    from a JSON Lines file.
    """

    turns: tuple[TurnSpec, ...] = attrs.field(converter=_to_turn_tuple)
    speed: float = attrs.field(default=1.0, validator=positive_number)

    def __attrs_post_init__(self) -> None:
        if not self.turns:
            raise ValueError("a trace needs at least one turn")


Arrivals = PoissonArrivals | BurstArrivals | RateCurve | Trace


@final
@attrs.frozen
class Workload:
    """A seeded description of agent turns; ``scenario()`` draws them.

    ``agents`` turns (one per agent) arrive by ``arrivals``, each on a
    provider picked by ``weight``, with ``calls`` LLM calls of
    ``call_duration`` and tool steps of ``tool_duration`` between them.
    With a ``Trace`` as ``arrivals``, its first ``agents`` turns (by
    arrival) are played as recorded, and the distributions, classes,
    tenants and models here are not used.

    Attributes:
        classes: Priority classes and their shares of the turns, as
            ``(priority, weight)`` pairs; empty, every turn is of class 0.
            Classes are drawn from a generator of their own, so the turns
            are the same whatever the classes.
        tenants: Tenants and their shares of the turns, as ``(name,
            weight)`` pairs; empty, no turn names a tenant. Drawn apart, as
            the classes.
        models: Models and their shares of the turns, likewise.
        tokens_per_second: Each call's tokens (prompt and answer), per
            second of its duration, rounded; 0, calls carry no token counts.
        pools: Pool names and their members (providers), as a mapping or
            as pairs. A pool takes the turns its members would: each turn
            goes to a pool, weighted by the sum of its members' weights (a
            provider in several pools shares its weight among them), or to
            a provider in no pool, weighted by its own.
    """

    agents: int = attrs.field(validator=positive_int)
    arrivals: Arrivals
    providers: tuple[SimProvider, ...] = attrs.field(converter=_to_provider_tuple)
    calls: CallsPerTurn = attrs.field(default=CallsPerTurn(1, 8))
    call_duration: Duration = attrs.field(default=Duration.lognormal(2.0, 1.0))
    tool_duration: Duration = attrs.field(default=Duration.exponential(1.0))
    seed: int = 0
    max_attempts: int = attrs.field(default=10, validator=positive_int)
    classes: tuple[tuple[int, float], ...] = attrs.field(
        default=(), converter=_to_classes, validator=_check_classes
    )
    tenants: tuple[tuple[str, float], ...] = attrs.field(
        default=(), converter=_to_names, validator=_check_names
    )
    models: tuple[tuple[str, float], ...] = attrs.field(
        default=(), converter=_to_names, validator=_check_names
    )
    tokens_per_second: float = attrs.field(default=0.0, validator=non_negative_number)
    pools: Pools = attrs.field(default=(), converter=_to_pools)

    def __attrs_post_init__(self) -> None:
        if not self.providers:
            raise ValueError("a workload needs at least one provider")
        known = _targets(self.providers, self.pools)
        if self.call_duration.mean <= 0:
            raise ValueError("call_duration must have a positive mean")
        arrivals = self.arrivals
        if isinstance(arrivals, Trace):
            if self.agents > len(arrivals.turns):
                raise ValueError(
                    f"a trace of {len(arrivals.turns)} turns cannot play"
                    f" {self.agents} agents"
                )
            for turn in arrivals.turns:
                if turn.provider not in known:
                    raise ValueError(f"turn uses unknown provider {turn.provider!r}")
            if self.mean_demand <= 0:
                raise ValueError("a trace's calls must take some time")

    @classmethod
    def from_trace(
        cls,
        path: str | Path,
        providers: Iterable[SimProvider] | None = None,
        *,
        seed: int = 0,
        max_attempts: int = 10,
    ) -> Workload:
        """The turns of a JSON Lines trace file, one turn a line.

        A line reads ``{"started_at": 12.5, "calls": [{"duration": 1.8,
        "tool_after": 0.4, "tokens": 900}], "tenant": "acme", "priority":
        0, "model": "gpt-4o"}``: ``started_at`` in seconds from the trace's
        start, ``duration`` the seconds the call holds its slot,
        ``tool_after`` the tool time before the next call (default 0; the
        last call's is not played: the turn ends with its last call);
        ``tokens``, ``tenant``, ``priority`` (default 0) and ``model`` are
        optional. Blank lines are skipped. A turn goes to the provider
        named like its model if there is one, else to the first of
        ``providers`` (by default one, ``"provider"``, of limit 8).

        Raises:
            ValueError: The file holds no turn, or a record is not one (the
                message names its line and field). Nothing has run yet.
            OSError: The file cannot be read.
        """
        from ._traces import read_trace  # noqa: PLC0415  # the trace format's module

        providers = (
            (SimProvider("provider", 8),) if providers is None else tuple(providers)
        )
        if not providers:
            raise ValueError("a workload needs at least one provider")
        names = {p.name for p in providers}
        turns = [
            TurnSpec(
                provider=turn["model"] if turn["model"] in names else providers[0].name,
                **turn,
            )
            for turn in read_trace(path)
        ]
        return cls(
            agents=len(turns),
            arrivals=Trace(turns),
            providers=providers,
            seed=seed,
            max_attempts=max_attempts,
        )

    def write_trace(self, path: str | Path) -> None:
        """Write the turns ``scenario()`` draws as a JSON Lines trace file."""
        self.scenario().write_trace(path)

    def _played(self) -> tuple[TurnSpec, ...]:
        """A trace's turns that are played, by arrival."""
        assert isinstance(self.arrivals, Trace)
        ordered = sorted(self.arrivals.turns, key=lambda turn: turn.arrival)
        return tuple(ordered[: self.agents])

    @property
    def mean_demand(self) -> float:
        """The mean slot time one turn needs, in seconds."""
        if isinstance(self.arrivals, Trace):
            played = self._played()
            return math.fsum(math.fsum(t.calls) for t in played) / len(played)
        return self.calls.mean * self.call_duration.mean

    @property
    def capacity(self) -> int:
        """The summed client-side limits of the providers."""
        return sum(p.limit for p in self.providers)

    @property
    def arrival_rate(self) -> float:
        """Mean turns per second (a trace's: its turns over its span)."""
        arrivals = self.arrivals
        if isinstance(arrivals, PoissonArrivals | RateCurve):
            load = (
                arrivals.load
                if isinstance(arrivals, PoissonArrivals)
                else arrivals.mean_load
            )
            return load * self.capacity / self.mean_demand
        if isinstance(arrivals, Trace):
            played = self._played()
            span = (played[-1].arrival - played[0].arrival) / arrivals.speed
            return math.inf if span <= 0 else (len(played) - 1) / span
        return arrivals.size / arrivals.interval

    @property
    def load(self) -> float:
        """Offered slot time per second over the summed limits."""
        return self.arrival_rate * self.mean_demand / self.capacity

    def at_load(self, load: float) -> Workload:
        """The same workload with its arrivals sped up or slowed to ``load``.

        The turns stay the same; only their arrival times scale (a
        ``RateCurve`` keeps its shape, at the new mean).
        """
        check_positive_number(load, "load")
        arrivals = self.arrivals
        new: Arrivals
        if isinstance(arrivals, PoissonArrivals):
            new = PoissonArrivals(load)
        elif isinstance(arrivals, RateCurve):
            new = arrivals.scaled(load / arrivals.mean_load)
        else:
            factor = load / self.load
            if not math.isfinite(factor) or factor <= 0:
                raise ValueError(
                    "a workload whose turns all arrive at once has no load to scale"
                )
            if isinstance(arrivals, Trace):
                new = Trace(arrivals.turns, arrivals.speed * factor)
            else:
                new = BurstArrivals(arrivals.size, arrivals.interval / factor)
        return attrs.evolve(self, arrivals=new)

    def scenario(self) -> Scenario:
        """Draw every turn from ``random.Random(seed)``, deterministically."""
        arrivals = self.arrivals
        if isinstance(arrivals, Trace):
            speed = arrivals.speed
            turns = [
                attrs.evolve(turn, arrival=turn.arrival / speed)
                for turn in self._played()
            ]
            return Scenario(self.providers, turns, self.max_attempts, self.pools)
        rng = random.Random(self.seed)
        providers = self.providers
        names, weights = self._weights()
        cumulative = list(itertools.accumulate(weights))
        rate = self.arrival_rate
        calls_dist = self.calls
        call_sample = self.call_duration.sample
        tool_sample = self.tool_duration.sample
        turns = []
        now = 0.0
        # Each of these is drawn from a generator of its own, so the turns
        # stay the same whatever they are.
        classes = _Shares(self.classes, f"trio_dispatch classes {self.seed}")
        tenants = _Shares(self.tenants, f"trio_dispatch tenants {self.seed}")
        models = _Shares(self.models, f"trio_dispatch models {self.seed}")
        per_second = self.tokens_per_second
        for index in range(self.agents):
            if isinstance(arrivals, PoissonArrivals):
                now += rng.expovariate(rate)
                arrival = now
            elif isinstance(arrivals, RateCurve):
                now = _next_arrival(rng, now, arrivals, rate / arrivals.mean_load)
                arrival = now
            else:
                burst, position = divmod(index, arrivals.size)
                arrival = burst * arrivals.interval + position * BURST_SPACING
            provider = rng.choices(names, cum_weights=cumulative)[0]
            count = calls_dist.sample(rng)
            calls = tuple(call_sample(rng) for _ in range(count))
            tools = tuple(tool_sample(rng) for _ in range(count - 1))
            turns.append(
                TurnSpec(
                    arrival,
                    provider,
                    calls,
                    tools,
                    classes.draw(0),
                    tenants.draw(None),
                    models.draw(None),
                    tuple(round(c * per_second) for c in calls) if per_second else (),
                )
            )
        return Scenario(providers, turns, self.max_attempts, self.pools)

    def _weights(self) -> tuple[list[str], list[float]]:
        """What turns go to, each with its weight: pools, then providers in none."""
        # A provider in several pools shares its weight among them.
        shares = collections.Counter(m for _, members in self.pools for m in members)
        weight = {p.name: p.weight for p in self.providers}
        pooled = set(shares)
        names = [pool for pool, _ in self.pools]
        weights = [
            math.fsum(weight[m] / shares[m] for m in members)
            for _, members in self.pools
        ]
        for p in self.providers:
            if p.name not in pooled:
                names.append(p.name)
                weights.append(p.weight)
        return names, weights


def _next_arrival(
    rng: random.Random, now: float, curve: RateCurve, rate_per_load: float
) -> float:
    """The next arrival after ``now`` under ``curve``, by thinning (Lewis-Shedler).

    Candidates come at the curve's peak rate; each is kept with the chance
    that the rate at its time bears to the peak.
    """
    peak = curve.peak
    while True:
        now += rng.expovariate(peak * rate_per_load)
        if rng.random() * peak < curve.load_at(now):
            return now


class _Shares:
    """Names drawn by weight from a generator of their own; none, a default."""

    def __init__(self, shares: tuple[tuple[_Name, float], ...], seed: str) -> None:
        self._names = [name for name, _ in shares]
        self._weights = [weight for _, weight in shares]
        self._rng = random.Random(seed)

    def draw(self, default: _Name) -> _Name:
        if not self._names:
            return default
        return self._rng.choices(self._names, self._weights)[0]
