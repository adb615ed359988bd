"""The distributions a workload draws from: durations and calls per turn.

Both are frozen values, tagged by their ``kind``, built with classmethods
(``Duration.lognormal(2.0)``, ``CallsPerTurn.geometric(5)``), and drawn from
a ``random.Random`` by ``sample``. Each can be a weighted ``mixture`` of
others of its type, and ``empirical``: drawn from observed values, such as
a trace's. Real agent traffic is mixed and heavy-tailed (chat turns of one
or two calls beside agent runs of tens), which one uniform range cannot
describe:

    CallsPerTurn.mixture((0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(20, 40)))

A value and its mean are checked together: ``mean`` is what loads are
computed from, so it must be the distribution's own.
"""

from __future__ import annotations

import math
import random  # noqa: TC003 (attrs resolves the annotations)
from typing import TYPE_CHECKING, Any, Literal, TypeVar, final

import attrs

from .._validation import (
    check_limit,
    check_positive_number,
    check_seconds,
    non_negative_number,
    non_negative_seconds,
    one_of,
    positive_int,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

DurationKind = Literal[
    "constant", "exponential", "lognormal", "uniform", "empirical", "mixture"
]
CountKind = Literal["uniform", "geometric", "empirical", "mixture"]

_T = TypeVar("_T")


def _floats(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(values)


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _durations(values: Iterable[Duration]) -> tuple[Duration, ...]:
    return tuple(values)


def _counts(values: Iterable[CallsPerTurn]) -> tuple[CallsPerTurn, ...]:
    return tuple(values)


def _check_weights(weights: Sequence[float], count: int, what: str) -> None:
    """Empty (all alike) or one positive weight per value."""
    if weights and len(weights) != count:
        raise ValueError(
            f"{what} needs one weight per value or none, got {len(weights)}"
            f" weights for {count} values"
        )
    for weight in weights:
        check_positive_number(weight, "a weight")


def _weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    if not weights:
        return math.fsum(values) / len(values)
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / math.fsum(
        weights
    )


def _pick(rng: random.Random, values: Sequence[_T], weights: Sequence[float]) -> _T:
    if not weights:
        return rng.choice(values)
    return rng.choices(values, weights)[0]


def _split(
    pairs: Iterable[tuple[float, _T]], what: str
) -> tuple[tuple[_T, ...], tuple[float, ...]]:
    """``(weight, part)`` pairs as parts and weights; a mixture has one at least."""
    pairs = tuple(pairs)
    if not pairs:
        raise ValueError(f"{what} needs at least one (weight, part) pair")
    return tuple(part for _, part in pairs), tuple(weight for weight, _ in pairs)


def _mixture_label(mixture: Duration | CallsPerTurn, separator: str) -> str:
    """Each part's share and label: ``"80% 1-2, 20% 20-40"``."""
    total = math.fsum(mixture.weights)
    parts: tuple[Duration | CallsPerTurn, ...] = mixture.parts
    return separator.join(
        f"{weight / total:.0%} {part.label}"
        for weight, part in zip(mixture.weights, parts, strict=True)
    )


@final
@attrs.frozen
class Duration:
    """A distribution of durations, in seconds; build one with the classmethods.

    ``spread`` is the lognormal's shape (the standard deviation of its
    logarithm) or the uniform's half-width; the other kinds ignore it.
    ``values`` and ``weights`` are an empirical distribution's (no weights:
    all alike), ``parts`` and ``weights`` a mixture's.
    """

    kind: DurationKind = attrs.field(
        validator=one_of(
            "constant", "exponential", "lognormal", "uniform", "empirical", "mixture"
        )
    )
    mean: float = attrs.field(validator=non_negative_seconds)
    spread: float = attrs.field(default=0.0, validator=non_negative_number)
    values: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    weights: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    parts: tuple[Duration, ...] = attrs.field(default=(), converter=_durations)

    def __attrs_post_init__(self) -> None:
        kind = self.kind
        if kind in ("exponential", "lognormal") and self.mean == 0:
            raise ValueError(f"a {kind} duration needs a positive mean, got 0")
        if kind == "uniform" and self.spread > self.mean:
            raise ValueError(
                f"a uniform duration's spread must not exceed its mean,"
                f" got spread={self.spread!r} > mean={self.mean!r}"
            )
        if kind in ("empirical", "mixture"):
            means = _check_composite(self, "duration", check_seconds)
            _check_mean(self.mean, means, kind)
        elif self.values or self.weights or self.parts:
            raise ValueError(f"{_a(kind)} duration takes no values, weights or parts")

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

    @classmethod
    def empirical(
        cls, values: Iterable[float], weights: Iterable[float] = ()
    ) -> Duration:
        """One of ``values`` (observed durations), by ``weights`` or all alike."""
        values, weights = tuple(values), tuple(weights)
        mean = _lenient(lambda: _weighted_mean(values, weights), 0.0)
        return cls("empirical", mean, values=values, weights=weights)

    @classmethod
    def mixture(cls, *pairs: tuple[float, Duration]) -> Duration:
        """A part drawn by weight, then a duration from it: ``(weight, part)`` pairs."""
        parts, weights = _split(pairs, "a mixture")
        mean = _lenient(lambda: _weighted_mean([p.mean for p in parts], weights), 0.0)
        return cls("mixture", mean, weights=weights, parts=parts)

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
        if kind == "uniform":
            return rng.uniform(self.mean - self.spread, self.mean + self.spread)
        if kind == "empirical":
            return _pick(rng, self.values, self.weights)
        return _pick(rng, self.parts, self.weights).sample(rng)

    @property
    def label(self) -> str:
        """A short description, such as ``"lognormal(mean 2 s, sigma 1)"``."""
        kind = self.kind
        if kind == "lognormal":
            return f"lognormal(mean {self.mean:g} s, sigma {self.spread:g})"
        if kind == "uniform":
            return (
                f"uniform({self.mean - self.spread:g} to {self.mean + self.spread:g} s)"
            )
        if kind == "constant":
            return f"{self.mean:g} s"
        if kind == "empirical":
            return f"empirical({len(self.values)} values, mean {self.mean:.3g} s)"
        if kind == "mixture":
            return _mixture_label(self, " + ")
        return f"{kind}(mean {self.mean:g} s)"


def _a(word: str) -> str:
    """``word`` with its article: "an empirical", "a mixture"."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _lenient(compute: Callable[[], _T], fallback: _T) -> _T:
    """``compute()``, or ``fallback`` where the values are wrong.

    A classmethod computes a mean or bounds before the values are checked;
    with the fallback, the constructor's checks say what is wrong with them.
    """
    try:
        result = compute()
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        return fallback
    if isinstance(result, float) and not (math.isfinite(result) and result >= 0):
        return fallback
    return result


def _check_composite(
    value: Duration | CallsPerTurn, what: str, check: Callable[[Any, str], object]
) -> float:
    """An empirical's values, or a mixture's parts, with their weights.

    Each value passes ``check``; returns their (weighted) mean.
    """
    if value.kind == "empirical":
        if not value.values:
            raise ValueError(f"an empirical {what} needs at least one value")
        for each in value.values:
            check(each, f"an empirical {what}'s value")
        _check_weights(value.weights, len(value.values), f"an empirical {what}")
        return _weighted_mean(value.values, value.weights)
    if not value.parts:
        raise ValueError("a mixture needs at least one part")
    if len(value.weights) != len(value.parts):
        raise ValueError("a mixture needs one weight per part")
    _check_weights(value.weights, len(value.parts), "a mixture")
    return _weighted_mean([part.mean for part in value.parts], value.weights)


def _check_mean(mean: float, expected: float, kind: str) -> None:
    if not math.isclose(mean, expected, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(
            f"{_a(kind)}'s mean must be that of its values, {expected!r}; got {mean!r}"
            " (build it with the classmethod)"
        )


def _geometric_mean(low: int, high: int, p: float) -> float:
    """The mean of ``low + Geometric(p) - 1``, capped at ``high``."""
    if p == 1:
        return float(low)
    q = 1 - p
    # P(k) = q**(k - low) * p below the cap; the cap takes the rest.
    below = math.fsum(k * q ** (k - low) * p for k in range(low, high))
    return below + high * q ** (high - low)


@final
@attrs.frozen
class CallsPerTurn:
    """How many LLM calls a turn makes: ``CallsPerTurn(low, high)`` is uniform.

    The classmethods build the other kinds: ``geometric`` (many short turns
    and a long tail, ``p`` the chance that a turn stops after each call,
    capped at ``high``), ``empirical`` (observed counts) and ``mixture``.
    ``low`` and ``high`` are always the least and the most calls a turn
    can make.
    """

    low: int = attrs.field(validator=positive_int)
    high: int = attrs.field(validator=positive_int)
    kind: CountKind = attrs.field(
        default="uniform",
        validator=one_of("uniform", "geometric", "empirical", "mixture"),
    )
    p: float = attrs.field(default=0.0, validator=non_negative_number)
    values: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    weights: tuple[float, ...] = attrs.field(default=(), converter=_floats)
    parts: tuple[CallsPerTurn, ...] = attrs.field(default=(), converter=_counts)

    def __attrs_post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(
                f"high must be >= low, got low={self.low!r} high={self.high!r}"
            )
        kind = self.kind
        if kind == "geometric":
            if not 0 < self.p <= 1:
                raise ValueError(
                    f"a geometric count's p must be in (0, 1], got {self.p!r}"
                )
        elif self.p:
            raise ValueError(f"only a geometric count takes p, not a {kind} one")
        if kind in ("empirical", "mixture"):
            _check_composite(self, "count", check_limit)
            if kind == "empirical":
                bounds = (min(self.values), max(self.values))
            else:
                bounds = (
                    min(p.low for p in self.parts),
                    max(p.high for p in self.parts),
                )
        else:
            if self.values or self.weights or self.parts:
                raise ValueError(f"{_a(kind)} count takes no values, weights or parts")
            bounds = (self.low, self.high)
        if bounds != (self.low, self.high):
            raise ValueError(
                f"{_a(kind)} count's low and high must be {bounds[0]} and {bounds[1]},"
                f" got {self.low} and {self.high} (build it with the classmethod)"
            )

    @classmethod
    def uniform(cls, low: int, high: int) -> CallsPerTurn:
        """Uniform from ``low`` to ``high``, as ``CallsPerTurn(low, high)``."""
        return cls(low, high)

    @classmethod
    def geometric(cls, mean: float, *, low: int = 1, high: int = 100) -> CallsPerTurn:
        """``low`` calls or more, geometric with ``mean`` (before the cap at ``high``)."""
        check_limit(low, "low")
        check_positive_number(mean, "mean")
        if mean < low:
            raise ValueError(f"mean must be at least low={low!r}, got {mean!r}")
        return cls(low, high, "geometric", p=1 / (mean - low + 1))

    @classmethod
    def empirical(
        cls, values: Iterable[int], weights: Iterable[float] = ()
    ) -> CallsPerTurn:
        """One of ``values`` (observed counts), by ``weights`` or all alike."""
        values = tuple(values)
        low, high = _lenient(lambda: (min(values), max(values)), (1, 1))
        return cls(low, high, "empirical", values=values, weights=weights)

    @classmethod
    def mixture(cls, *pairs: tuple[float, CallsPerTurn]) -> CallsPerTurn:
        """A part drawn by weight, then a count from it: ``(weight, part)`` pairs."""
        parts, weights = _split(pairs, "a mixture")
        low, high = _lenient(
            lambda: (min(p.low for p in parts), max(p.high for p in parts)), (1, 1)
        )
        return cls(low, high, "mixture", weights=weights, parts=parts)

    @property
    def mean(self) -> float:
        """The mean number of calls, from ``low`` to ``high``."""
        kind = self.kind
        if kind == "uniform":
            return (self.low + self.high) / 2
        if kind == "geometric":
            mean = _geometric_mean(self.low, self.high, self.p)
        elif kind == "empirical":
            mean = _weighted_mean(self.values, self.weights)
        else:
            mean = _weighted_mean([part.mean for part in self.parts], self.weights)
        # A weighted sum's rounding may step just outside the bounds the
        # true mean lies within (7 * 0.3 / 0.30000000000000004).
        return min(max(mean, self.low), self.high)

    @property
    def label(self) -> str:
        """A short name such as ``"1-8"``, ``"1"`` or ``"80% 1-2, 20% 20-40"``."""
        kind = self.kind
        if kind == "geometric":
            return f"geometric mean {self.low - 1 + 1 / self.p:g} (max {self.high})"
        if kind == "empirical":
            return f"empirical {self.low}-{self.high} (mean {self.mean:.3g})"
        if kind == "mixture":
            return _mixture_label(self, ", ")
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    def sample(self, rng: random.Random) -> int:
        """One draw from ``rng``."""
        kind = self.kind
        if kind == "uniform":
            if self.low == self.high:
                return self.low
            return rng.randint(self.low, self.high)
        if kind == "geometric":
            if self.p == 1:
                return self.low
            extra = math.floor(math.log(1.0 - rng.random()) / math.log(1.0 - self.p))
            return min(self.high, self.low + extra)
        if kind == "empirical":
            return _pick(rng, self.values, self.weights)
        return _pick(rng, self.parts, self.weights).sample(rng)
