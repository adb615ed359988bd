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
"""

from __future__ import annotations

import itertools
import math
import random
from typing import TYPE_CHECKING, Literal, final

import attrs

from .._validation import (
    check_positive_number,
    check_priority,
    check_text,
    non_negative_number,
    non_negative_seconds,
    one_of,
    positive_int,
    positive_number,
    positive_seconds,
    validator,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

#: Turns of one burst arrive this far apart, in workload order, so that their
#: order is part of the workload rather than of trio's scheduler.
BURST_SPACING = 1e-6


DurationKind = Literal["constant", "exponential", "lognormal", "uniform"]


@final
@attrs.frozen
class Duration:
    """A distribution of durations, in seconds; build one with the classmethods.

    ``spread`` is the lognormal's shape (the standard deviation of its
    logarithm) or the uniform's half-width; the other kinds ignore it.
    """

    kind: DurationKind = attrs.field(
        validator=one_of("constant", "exponential", "lognormal", "uniform")
    )
    mean: float = attrs.field(validator=non_negative_seconds)
    spread: float = attrs.field(default=0.0, validator=non_negative_number)

    def __attrs_post_init__(self) -> None:
        if self.kind in ("exponential", "lognormal") and self.mean == 0:
            raise ValueError(f"a {self.kind} duration needs a positive mean, got 0")
        if self.kind == "uniform" and self.spread > self.mean:
            raise ValueError(
                f"a uniform duration's spread must not exceed its mean,"
                f" got spread={self.spread!r} > mean={self.mean!r}"
            )

    @classmethod
    def constant(cls, seconds: float) -> Duration:
        """Always ``seconds``."""
        return cls("constant", seconds)

    @classmethod
    def exponential(cls, mean: float) -> Duration:
        """Exponentially distributed with the given mean."""
        return cls("exponential", mean)

    @classmethod
    def lognormal(cls, mean: float, sigma: float = 1.0) -> Duration:
        """Lognormal with the given mean; ``sigma`` is the log's deviation."""
        return cls("lognormal", mean, sigma)

    @classmethod
    def uniform(cls, low: float, high: float) -> Duration:
        """Uniform between ``low`` and ``high``."""
        if high < low:
            raise ValueError(f"high must be >= low, got low={low!r} high={high!r}")
        return cls("uniform", (low + high) / 2, (high - low) / 2)

    def sample(self, rng: random.Random) -> float:
        """One draw from ``rng``."""
        kind = self.kind
        if kind == "constant":
            return self.mean
        if kind == "exponential":
            return rng.expovariate(1.0 / self.mean)
        if kind == "lognormal":
            sigma = self.spread
            return rng.lognormvariate(math.log(self.mean) - sigma * sigma / 2, sigma)
        return rng.uniform(self.mean - self.spread, self.mean + self.spread)


@final
@attrs.frozen
class CallsPerTurn:
    """How many LLM calls a turn makes: uniform from ``low`` to ``high``."""

    low: int = attrs.field(validator=positive_int)
    high: int = attrs.field(validator=positive_int)

    def __attrs_post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(
                f"high must be >= low, got low={self.low!r} high={self.high!r}"
            )

    @property
    def mean(self) -> float:
        """The mean number of calls."""
        return (self.low + self.high) / 2

    @property
    def label(self) -> str:
        """A short name such as ``"1-8"`` or ``"1"``."""
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    def sample(self, rng: random.Random) -> int:
        """One draw from ``rng``."""
        if self.low == self.high:
            return self.low
        return rng.randint(self.low, self.high)


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


Arrivals = PoissonArrivals | BurstArrivals


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


# Each call's or tool step's duration, checked like any number of seconds.
_durations = attrs.validators.deep_iterable(non_negative_seconds)


@final
@attrs.frozen
class TurnSpec:
    """One agent turn, fully drawn: when it starts and what it does.

    It starts ``arrival`` seconds into the simulation and makes
    ``len(calls)`` calls to ``provider``, each holding a slot for its
    duration, with ``tools[i]`` seconds of tool work after call ``i`` (none
    after the last). ``priority`` is its class (higher goes first).
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

    def __attrs_post_init__(self) -> None:
        if not self.calls:
            raise ValueError("a turn makes at least one call")
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

    A call answered 429 is sent at most ``max_attempts`` times.
    """

    providers: tuple[SimProvider, ...] = attrs.field(converter=_to_provider_tuple)
    turns: tuple[TurnSpec, ...] = attrs.field(converter=_to_turn_tuple)
    max_attempts: int = attrs.field(default=10, validator=positive_int)

    def __attrs_post_init__(self) -> None:
        names = [p.name for p in self.providers]
        if not names:
            raise ValueError("a scenario needs at least one provider")
        if len(set(names)) != len(names):
            raise ValueError(f"provider names must be unique, got {names!r}")
        known = set(names)
        for turn in self.turns:
            if turn.provider not in known:
                raise ValueError(f"turn uses unknown provider {turn.provider!r}")


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


@final
@attrs.frozen
class Workload:
    """A seeded description of agent turns; ``scenario()`` draws them.

    ``agents`` turns (one per agent) arrive by ``arrivals``, each on a
    provider picked by ``weight``, with ``calls`` LLM calls of
    ``call_duration`` and tool steps of ``tool_duration`` between them.

    Attributes:
        classes: Priority classes and their shares of the turns, as
            ``(priority, weight)`` pairs; empty, every turn is of class 0.
            Classes are drawn from a generator of their own, so the turns
            are the same whatever the classes.
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

    def __attrs_post_init__(self) -> None:
        if not self.providers:
            raise ValueError("a workload needs at least one provider")
        if self.call_duration.mean <= 0:
            raise ValueError("call_duration must have a positive mean")

    @property
    def mean_demand(self) -> float:
        """The mean slot time one turn needs, in seconds."""
        return self.calls.mean * self.call_duration.mean

    @property
    def capacity(self) -> int:
        """The summed client-side limits of the providers."""
        return sum(p.limit for p in self.providers)

    @property
    def arrival_rate(self) -> float:
        """Mean turns per second."""
        arrivals = self.arrivals
        if isinstance(arrivals, PoissonArrivals):
            return arrivals.load * self.capacity / self.mean_demand
        return arrivals.size / arrivals.interval

    @property
    def load(self) -> float:
        """Offered slot time per second over the summed limits."""
        return self.arrival_rate * self.mean_demand / self.capacity

    def scenario(self) -> Scenario:
        """Draw every turn from ``random.Random(seed)``, deterministically."""
        rng = random.Random(self.seed)
        providers = self.providers
        names = [p.name for p in providers]
        cumulative = list(itertools.accumulate(p.weight for p in providers))
        arrivals = self.arrivals
        poisson = isinstance(arrivals, PoissonArrivals)
        rate = self.arrival_rate
        calls_dist = self.calls
        call_sample = self.call_duration.sample
        tool_sample = self.tool_duration.sample
        turns: list[TurnSpec] = []
        now = 0.0
        classes = self.classes
        class_rng = random.Random(f"trio_dispatch classes {self.seed}")
        priorities = [priority for priority, _ in classes]
        class_weights = [weight for _, weight in classes]
        for index in range(self.agents):
            if poisson:
                now += rng.expovariate(rate)
                arrival = now
            else:
                assert isinstance(arrivals, BurstArrivals)
                burst, position = divmod(index, arrivals.size)
                arrival = burst * arrivals.interval + position * BURST_SPACING
            provider = rng.choices(names, cum_weights=cumulative)[0]
            count = calls_dist.sample(rng)
            calls = tuple(call_sample(rng) for _ in range(count))
            tools = tuple(tool_sample(rng) for _ in range(count - 1))
            priority = class_rng.choices(priorities, class_weights)[0] if classes else 0
            turns.append(TurnSpec(arrival, provider, calls, tools, priority))
        return Scenario(providers, turns, self.max_attempts)
