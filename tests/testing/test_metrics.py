"""The simulation metrics, against small cases computed by hand."""

from __future__ import annotations

import math

import pytest

from trio_dispatch.testing._metrics import (
    ProviderRecord,
    TurnRecord,
    compute_metrics,
    jain_index,
    mean,
    percentile,
    slowdown,
    utilisation,
)


def turn(
    index: int,
    start: float,
    end: float,
    ideal: float,
    *,
    wait: float = 0.0,
    first_wait: float = 0.0,
    rejections: int = 0,
    completed: bool = True,
) -> TurnRecord:
    return TurnRecord(
        index=index,
        provider="p",
        start=start,
        end=end,
        calls=1,
        ideal=ideal,
        slot_wait=wait,
        max_slot_wait=wait,
        first_slot_wait=first_wait,
        rejections=rejections,
        completed=completed,
    )


def test_mean_sums_exactly() -> None:
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert mean([0.1] * 10) == 0.1
    assert math.isnan(mean([]))


def test_percentile_at_exact_ranks() -> None:
    values = [40.0, 0.0, 30.0, 10.0, 20.0]
    assert percentile(values, 0) == 0.0
    assert percentile(values, 25) == 10.0
    assert percentile(values, 50) == 20.0
    assert percentile(values, 100) == 40.0


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    # rank 0.95 * 3 = 2.85: 3 + 0.85 * (4 - 3)
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85, rel=1e-12)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_percentile_rejects_q_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"^q must be between 0 and 100, got 101$"):
        percentile([1.0], 101)


def test_jain_index() -> None:
    assert jain_index([2.0, 2.0, 2.0, 2.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == 0.25
    # (1 + 2 + 3)**2 / (3 * (1 + 4 + 9)) = 36 / 42
    assert jain_index([1.0, 2.0, 3.0]) == 36 / 42
    assert jain_index([0.0, 0.0]) == 1.0
    assert math.isnan(jain_index([]))


def test_slowdown_and_utilisation() -> None:
    assert slowdown(6.0, 4.0) == 1.5
    assert slowdown(0.0, 0.0) == 1.0
    assert utilisation(6.0, 2, 4.0) == 0.75
    assert utilisation(6.0, 2, 0.0) == 0.0


def test_turn_record_latency_and_slowdown() -> None:
    record = turn(0, 1.0, 4.0, 2.0)
    assert record.latency == 3.0
    assert record.slowdown == 1.5


def test_compute_metrics_on_a_hand_built_run() -> None:
    turns = [
        turn(0, 0.0, 2.0, 2.0),  # latency 2, slowdown 1
        turn(1, 1.0, 5.0, 2.0, wait=2.0, first_wait=2.0),  # latency 4, slowdown 2
        turn(2, 2.0, 8.0, 1.5, wait=4.0, first_wait=1.0, rejections=1),  # 6, 4
        turn(3, 3.0, 6.0, 1.0, wait=5.0, rejections=2, completed=False),
    ]
    providers = [
        ProviderRecord(
            name="p",
            limit=2,
            capacity=None,
            peak_in_flight=2,
            served=4,
            rejected=3,
            busy=12.0,
            held_at_end=0,
            waiting_at_end=0,
        )
    ]
    m = compute_metrics("oldest-first", turns, providers)
    assert m.policy == "oldest-first"
    assert (m.turns, m.completed) == (4, 3)
    assert m.latency_mean == 4.0
    assert m.latency_p50 == 4.0
    # rank 0.95 * 2 = 1.9 between 4 and 6
    assert m.latency_p95 == pytest.approx(5.8, rel=1e-12)
    assert m.latency_p99 == pytest.approx(5.96, rel=1e-12)
    assert m.latency_max == 6.0
    assert m.slowdown_mean == 7 / 3
    assert m.slowdown_p95 == pytest.approx(3.8, rel=1e-12)
    # (1 + 2 + 4)**2 / (3 * (1 + 4 + 16)) = 49 / 63
    assert m.fairness == 49 / 63
    assert m.first_wait_p95 == pytest.approx(1.9, rel=1e-12)
    # the turn that gave up waited longest, and still counts for waits
    assert m.max_slot_wait == 5.0
    assert m.makespan == 8.0
    assert m.utilisation == 12.0 / (2 * 8.0)
    assert m.rejections == 3


def test_compute_metrics_when_nothing_completed() -> None:
    m = compute_metrics("none", [turn(0, 0.0, 1.0, 1.0, completed=False)], [])
    assert (m.turns, m.completed) == (1, 0)
    assert math.isnan(m.latency_mean)
    assert math.isnan(m.latency_p95)
    assert math.isnan(m.fairness)
    assert m.utilisation == 0.0
    assert m.makespan == 1.0
