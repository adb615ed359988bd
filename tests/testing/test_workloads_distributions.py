"""Workloads of one's own: distributions, mixtures, arrivals, who asks."""

from __future__ import annotations

import math
import random
import re

import attrs
import pytest

from trio_dispatch.testing import (
    BurstArrivals,
    CallsPerTurn,
    Duration,
    FairnessConfig,
    FairnessReport,
    PoissonArrivals,
    RateCurve,
    SimProvider,
    Workload,
)

MIXED = CallsPerTurn.mixture((0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(20, 40)))


def draws(distribution: CallsPerTurn | Duration, n: int = 20_000) -> list[float]:
    rng = random.Random(11)
    return [distribution.sample(rng) for _ in range(n)]


def test_a_mixture_of_counts_draws_each_part_by_weight() -> None:
    assert (MIXED.low, MIXED.high, MIXED.kind) == (1, 40, "mixture")
    assert MIXED.label == "80% 1-2, 20% 20-40"
    assert MIXED.mean == pytest.approx(0.8 * 1.5 + 0.2 * 30)
    counts = draws(MIXED)
    assert set(counts) <= set(range(1, 3)) | set(range(20, 41))
    short = sum(c <= 2 for c in counts) / len(counts)
    assert short == pytest.approx(0.8, abs=0.01)
    assert sum(counts) / len(counts) == pytest.approx(MIXED.mean, rel=0.02)


def test_a_geometric_count_has_its_mean_and_its_cap() -> None:
    geometric = CallsPerTurn.geometric(5, high=40)
    assert geometric.p == pytest.approx(0.2)
    assert geometric.label == "geometric mean 5 (max 40)"
    # The cap takes the tail: a little below 5.
    assert 4.9 < geometric.mean < 5
    counts = draws(geometric)
    assert min(counts) == 1
    assert max(counts) == 40
    assert sum(counts) / len(counts) == pytest.approx(geometric.mean, rel=0.02)
    assert CallsPerTurn.geometric(1).sample(random.Random(0)) == 1


def test_empirical_counts_and_durations_draw_their_values() -> None:
    counts = CallsPerTurn.empirical([1, 1, 2, 30])
    assert (counts.low, counts.high, counts.mean) == (1, 30, 8.5)
    assert set(draws(counts, 2000)) == {1, 2, 30}
    weighted = Duration.empirical([1.0, 3.0], weights=[3, 1])
    assert weighted.mean == 1.5
    assert weighted.label == "empirical(2 values, mean 1.5 s)"
    values = draws(weighted)
    assert values.count(1.0) / len(values) == pytest.approx(0.75, abs=0.01)


def test_a_weighted_mean_stays_within_the_bounds_despite_rounding() -> None:
    # fsum(7 * 0.1 three times) / fsum(0.1 three times) is 6.999999999999999.
    counts = CallsPerTurn.empirical([7, 7, 7], weights=[0.1, 0.1, 0.1])
    assert (counts.low, counts.mean, counts.high) == (7, 7.0, 7)
    mixed = CallsPerTurn.mixture((0.1, counts), (0.1, counts), (0.1, counts))
    assert mixed.low <= mixed.mean <= mixed.high


def test_a_mixture_of_durations_is_heavy_tailed_with_its_mean() -> None:
    mixed = Duration.mixture(
        (0.9, Duration.lognormal(1.0, 0.5)), (0.1, Duration.exponential(20.0))
    )
    assert mixed.mean == pytest.approx(0.9 * 1.0 + 0.1 * 20.0)
    assert mixed.label == (
        "90% lognormal(mean 1 s, sigma 0.5) + 10% exponential(mean 20 s)"
    )
    values = draws(mixed)
    assert sum(values) / len(values) == pytest.approx(mixed.mean, rel=0.05)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: CallsPerTurn.empirical([]),
            "an empirical count needs at least one value",
        ),
        (
            lambda: Duration.empirical([1.0, -1.0]),
            "an empirical duration's value must be a non-negative number of"
            " seconds, got -1.0",
        ),
        (
            lambda: Duration.empirical([1.0], weights=[1, 2]),
            "an empirical duration needs one weight per value or none, got 2"
            " weights for 1 values",
        ),
        (
            CallsPerTurn.mixture,
            "a mixture needs at least one (weight, part) pair",
        ),
        (
            lambda: CallsPerTurn.mixture((0, CallsPerTurn(1, 2))),
            "a weight must be a positive number, got 0",
        ),
        (lambda: CallsPerTurn.geometric(0.5), "mean must be at least low=1, got 0.5"),
        (
            lambda: CallsPerTurn(1, 8, "geometric", p=1.5),
            "a geometric count's p must be in (0, 1], got 1.5",
        ),
        (
            lambda: CallsPerTurn(1, 8, p=0.5),
            "only a geometric count takes p, not a uniform one",
        ),
        (
            lambda: CallsPerTurn(1, 9, "empirical", values=(1, 8)),
            "an empirical count's low and high must be 1 and 8, got 1 and 9"
            " (build it with the classmethod)",
        ),
        (
            lambda: Duration("empirical", 5.0, values=(1.0, 2.0)),
            "an empirical's mean must be that of its values, 1.5; got 5.0 (build it"
            " with the classmethod)",
        ),
        (
            lambda: Duration("constant", 1.0, values=(1.0,)),
            "a constant duration takes no values, weights or parts",
        ),
    ],
)
def test_a_bad_distribution_is_refused_at_once(build: object, message: str) -> None:
    assert callable(build)
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        build()


def test_a_rate_curve_is_linear_between_its_points() -> None:
    curve = RateCurve(((0, 0.5), (100, 1.5), (200, 0.5)))
    assert [curve.load_at(t) for t in (0, 50, 100, 150, 200, 999)] == [
        0.5,
        1.0,
        1.5,
        1.0,
        0.5,
        0.5,
    ]
    assert curve.mean_load == pytest.approx(1.0)
    assert curve.peak == 1.5
    assert curve.scaled(2).points == ((0, 1.0), (100, 3.0), (200, 1.0))


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ((), "a rate curve needs at least one (seconds, load) point"),
        (((5, 1.0),), "a rate curve starts at 0 s, got 5"),
        (
            ((0, 1.0), (10, 1.0), (10, 2.0)),
            "a rate curve's times must increase, got [0, 10, 10]",
        ),
        (((0, 1.0), (10, 0.0)), "a rate curve's last load must be above 0"),
        (((0, -1.0),), "a rate curve's load must be a non-negative number, got -1.0"),
    ],
)
def test_a_bad_rate_curve_is_refused(
    points: tuple[tuple[float, float], ...], message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        RateCurve(points)


def test_turns_arrive_as_the_curve_says() -> None:
    # Quiet for 300 s, then three times as busy.
    curve = RateCurve(((0, 0.3), (300, 0.3), (300.001, 0.9)))
    workload = Workload(
        agents=3000,
        arrivals=curve,
        providers=(SimProvider("p", 8),),
        calls=CallsPerTurn(1, 1),
        call_duration=Duration.constant(1.0),
    )
    arrivals = [turn.arrival for turn in workload.scenario().turns]
    assert arrivals == sorted(arrivals)
    quiet = sum(a < 300 for a in arrivals)
    busy = sum(300 <= a < 600 for a in arrivals)
    # 0.3 * 8 turns a second, then 0.9 * 8.
    assert quiet == pytest.approx(300 * 2.4, rel=0.1)
    assert busy == pytest.approx(300 * 7.2, rel=0.1)


def test_tenants_models_and_tokens_are_drawn_apart_from_the_turns() -> None:
    plain = Workload(
        agents=200, arrivals=PoissonArrivals(0.9), providers=(SimProvider("p", 4),)
    )
    tagged = attrs.evolve(
        plain,
        tenants=(("acme", 3.0), ("globex", 1.0)),
        models=(("gpt-4o", 1.0),),
        tokens_per_second=100.0,
        classes=((1, 0.5), (0, 0.5)),
    )
    ours, theirs = plain.scenario().turns, tagged.scenario().turns
    assert [(t.arrival, t.calls, t.tools) for t in ours] == [
        (t.arrival, t.calls, t.tools) for t in theirs
    ]
    assert {t.tenant for t in ours} == {None}
    assert sum(t.tenant == "acme" for t in theirs) == pytest.approx(150, abs=20)
    assert {t.model for t in theirs} == {"gpt-4o"}
    assert {t.priority for t in theirs} == {0, 1}
    for turn in theirs:
        assert turn.tokens == tuple(round(c * 100) for c in turn.calls)


def test_names_are_checked() -> None:
    provider = (SimProvider("p", 4),)
    with pytest.raises(
        ValueError, match=r"^tenants must name each tenant once, got \['a', 'a'\]$"
    ):
        Workload(1, PoissonArrivals(1), provider, tenants=(("a", 1), ("a", 2)))
    with pytest.raises(
        ValueError, match=r"^a model's weight must be a positive number, got 0$"
    ):
        Workload(1, PoissonArrivals(1), provider, models=(("m", 0),))


def test_at_load_scales_the_arrivals_and_keeps_the_turns() -> None:
    provider = (SimProvider("p", 8),)
    poisson = Workload(100, PoissonArrivals(0.5), provider, calls=MIXED)
    assert poisson.at_load(0.9).arrivals == PoissonArrivals(0.9)
    curve = Workload(100, RateCurve(((0, 0.5), (10, 1.5))), provider)
    assert curve.at_load(2.0).load == pytest.approx(2.0)
    bursts = Workload(100, BurstArrivals(10, 60.0), provider)
    faster = bursts.at_load(bursts.load * 2)
    assert faster.arrivals == BurstArrivals(10, 30.0)
    assert [t.calls for t in faster.scenario().turns] == [
        t.calls for t in bursts.scenario().turns
    ]
    with pytest.raises(ValueError, match=r"^load must be a positive number, got 0$"):
        poisson.at_load(0)


def test_the_sweeps_config_with_a_mixture_reads_back_from_json() -> None:
    report = FairnessReport(FairnessConfig(), ())
    back = FairnessReport.from_json(report.to_json())
    assert back == report
    assert back.config.shapes[-1] == MIXED
    assert back.config.is_project
    assert not attrs.evolve(back.config, agents=5).is_project
    assert math.isclose(MIXED.mean, 7.2)
