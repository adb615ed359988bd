"""Smoke test of ``bench/goodput.py``: a short run of every scheme.

Virtual time and seeded workloads make the figures exact and repeatable,
so the targets of the learned budgets and the adaptive limit are checked
too, on a short run. The loopback mode runs in real time, so only its
shape and its counts are checked, on a fleet the quota does not hold back.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_every_scheme_is_measured_and_the_paced_ones_meet_their_targets(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("goodput")
    path = tmp_path / "goodput.json"
    assert bench.main(["--minutes", "3", "--agents", "30", "--json", str(path)]) == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    rows = {row["scheme"]: row for row in report["rows"]}
    assert sorted(rows) == ["a", "b", "c", "d", "e", "f"]
    for row in rows.values():
        assert row["turns"] > 0
        assert 0 < row["latency_p50"] <= row["latency_p95"]
        assert row["answered_429"] <= row["requests"]
    # Too high a limit meets 429s; too low a limit leaves quota unused.
    assert rows["a"]["share_429"] > 0.1
    assert rows["b"]["share_429"] == 0
    assert rows["b"]["quota_share"] < 0.6
    # Learned budgets and the adaptive limit: the quota, without 429s.
    for scheme in ("d", "e"):
        assert rows[scheme]["quota_share"] >= 0.95
        assert rows[scheme]["share_429"] < 0.01


def test_the_ideal_end_of_a_closed_loop_fleet_under_a_request_quota() -> None:
    bench = load_bench_script("goodput")
    # The bucket's 240 and the 10 refilled meanwhile go in the first 2.5 s,
    # the last 50 at 4 a second; the last answer 0.3 s later.
    assert bench.ideal_end(
        agents=30, calls=10, per_minute=240, latency=0.3
    ) == pytest.approx(15.3)
    # Within the bucket, only the answers pace the agents.
    assert bench.ideal_end(
        agents=4, calls=3, per_minute=240, latency=0.05
    ) == pytest.approx(0.15)


def test_the_loopback_mode_sets_each_fleet_beside_the_ideal(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("goodput")
    path = tmp_path / "loopback.json"
    argv = ["--loopback", "--agents", "4", "--calls", "3", "--latency", "0.05"]
    assert bench.main([*argv, "--json", str(path)]) == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    assert (report["agents"], report["calls"], report["requests_per_minute"]) == (
        4,
        3,
        240,
    )
    rows = report["rows"]
    assert [row["setting"] for row in rows] == [
        "nothing",
        "Budget(requests_per_minute=240)",
    ]
    for row in rows:
        assert (row["requests"], row["answered_429"]) == (12, 0)
        assert row["ideal"] == pytest.approx(0.15)
        # No fleet ends before the ideal; the ratio is the one reported.
        assert row["end"] >= row["ideal"]
        assert row["ratio"] == pytest.approx(row["end"] / row["ideal"])
