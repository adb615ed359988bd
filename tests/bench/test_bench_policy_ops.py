"""Smoke test of the scheduling core's benchmark (``bench/policy_ops.py``), tiny.

Its structure and its own checks, never its figures: timings on a shared
machine are not a test.
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    # mypy reads bench/policy_ops.py itself (bench/ is among its files).
    import policy_ops
else:
    policy_ops = load_bench_script("policy_ops")


def test_the_policy_benchmark_times_every_scenario_in_every_repeat() -> None:
    report = policy_ops.run_policy_ops(rounds=50, repeats=2)
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert (data["rounds"], data["repeats"]) == (50, 2)
    assert [m["key"] for m in data["measurements"]] == list(policy_ops.SCENARIOS)
    assert len(policy_ops.SCENARIOS) == 6
    for measurement in report.measurements:
        assert len(measurement.samples) == 2
        assert all(sample >= 0 for sample in measurement.samples)
        assert measurement.median == statistics.median(measurement.samples)
        assert measurement.best == min(measurement.samples)
    table = report.to_markdown().splitlines()
    assert table[-7:-6] == ["|---|--:|--:|"]
    assert [row.split(" | ")[0] for row in table[-6:]] == [
        f"| {label}" for label, _run, _kind in policy_ops.SCENARIOS.values()
    ]


@pytest.mark.parametrize("kind", policy_ops.KINDS)
def test_each_scenario_drives_the_policy_as_it_says(kind: str) -> None:
    # The runs check their own outcome (grants, holders and waiters at the
    # end) and raise if it is not what they meant to measure.
    assert policy_ops.uncontended(kind, 30) >= 0
    assert policy_ops.contended(kind, 30, limit=2, waiters=5) >= 0


def test_the_policy_benchmark_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^rounds must be a positive integer, got 0$"):
        policy_ops.run_policy_ops(rounds=0)
    with pytest.raises(
        ValueError, match=r"^repeats must be a positive integer, got 0$"
    ):
        policy_ops.run_policy_ops(repeats=0)
