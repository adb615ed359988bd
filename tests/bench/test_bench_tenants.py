"""Smoke test of ``bench/tenants.py``: its ``--quick`` run, its report and its bar.

The benchmark runs in virtual time on a seeded workload, so its figures
are the same on any machine (trio's shuffling of tasks woken together
moves them a little): issue 21's bar is checked on the quick run itself.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_ideal_shares_are_weighted_max_min() -> None:
    bench = load_bench_script("tenants")
    ideal = bench.ideal_shares
    # Both ask for less than their share: each gets what it asks.
    assert ideal({"h": 0.85, "l": 0.1}, {"h": 1.0, "l": 1.0}) == pytest.approx(
        {"h": 0.85, "l": 0.1}
    )
    # The light one asks less than its half: the heavy one gets the rest.
    assert ideal({"h": 2.0, "l": 0.1}, {"h": 1.0, "l": 1.0}) == pytest.approx(
        {"h": 0.9, "l": 0.1}
    )
    # Both ask for more: split by weight.
    assert ideal({"h": 2.0, "l": 2.0}, {"h": 3.0, "l": 1.0}) == pytest.approx(
        {"h": 0.75, "l": 0.25}
    )
    # One sated at its demand, the rest split again by weight.
    assert ideal(
        {"a": 0.1, "b": 1.0, "c": 1.0}, {"a": 1.0, "b": 1.0, "c": 2.0}
    ) == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6})
    assert ideal({"a": 0.0, "b": 0.5}, {"a": 1.0, "b": 1.0}) == {"a": 0.0, "b": 0.5}


def test_the_workload_offers_95_percent_of_the_capacity() -> None:
    bench = load_bench_script("tenants")
    heavy, light = bench.TENANTS["heavy"], bench.TENANTS["light"]
    assert heavy.load + light.load == pytest.approx(0.95)
    for load in (heavy, light):
        # Each agent offers work / (busy + think) slot-seconds a second.
        per_agent = load.work / (load.busy + load.think(bench.LIMIT))
        assert load.agents * per_agent == pytest.approx(load.load * bench.LIMIT)
    assert heavy.closed
    assert not light.closed


def test_the_oldest_first_arm_alone_runs_and_measures_no_bar(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("tenants")
    path = tmp_path / "tenants.json"
    argv = ["--arm", "oldest-first", "--minutes", "5", "--json", str(path)]
    assert bench.main(argv) == 1  # no bar without the 1:1 arm
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["bar"] is None
    [arm] = report["arms"]
    assert arm["arm"] == "oldest-first"
    light = next(t for t in arm["tenants"] if t["tenant"] == "light")
    assert light["turns"] > 0
    assert 0 < light["latency_p50"] <= light["latency_p95"]


def test_the_quick_run_reports_every_arm_and_meets_the_bar(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("tenants")
    path = tmp_path / "tenants.json"
    assert bench.main(["--quick", "--json", str(path)]) == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    assert (report["minutes"], report["limit"], report["seed"]) == (15, 8, 1)
    arms = {arm["arm"]: arm for arm in report["arms"]}
    assert list(arms) == ["oldest-first", "1:1", "3:1", "1:3"]
    for arm in arms.values():
        assert 0.85 <= arm["utilisation"] <= 1.0
        tenants = {t["tenant"]: t for t in arm["tenants"]}
        assert sorted(tenants) == ["heavy", "light"]
        for figures in tenants.values():
            assert figures["turns"] > 0
            assert 0 < figures["latency_p50"] <= figures["latency_p95"]
            assert 0 < figures["share"] < 1
            # At 95% load every tenant gets about what it offers.
            assert figures["share"] == pytest.approx(figures["ideal_share"], abs=0.03)
        assert sum(t["ideal_share"] for t in tenants.values()) == pytest.approx(0.95)
    light = {name: arm["tenants"][1] for name, arm in arms.items()}
    heavy = {name: arm["tenants"][0] for name, arm in arms.items()}
    assert {t["tenant"] for t in light.values()} == {"light"}
    assert {t["tenant"] for t in heavy.values()} == {"heavy"}
    # Issue 21's bar, as the report computes it and from the figures.
    bar = report["bar"]
    assert bar["met"]
    assert bar["light_p95_ratio"] == pytest.approx(
        light["1:1"]["latency_p95"] / light["oldest-first"]["latency_p95"]
    )
    assert bar["light_p95_ratio"] <= 0.5
    change = (
        heavy["1:1"]["turns_per_minute"] / heavy["oldest-first"]["turns_per_minute"]
    )
    assert math.isclose(bar["heavy_throughput_change"], change - 1)
    assert abs(bar["heavy_throughput_change"]) <= 0.02


def test_the_scaling_run_reports_both_tenancies_at_n_and_4n(
    tmp_path: pathlib.Path,
) -> None:
    bench = load_bench_script("tenants")
    path = tmp_path / "scaling.json"
    assert bench.main(["--scaling", "--requests", "20", "--json", str(path)]) == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["limit"] == bench.SCALING_LIMIT
    rows = {row["tenants"]: row for row in report["rows"]}
    assert set(rows) == {"one tenant", "a tenant each"}
    for row in rows.values():
        assert row["requests"] == 20
        assert row["seconds"] > 0
        assert row["seconds_4x"] > 0
        assert report["growth"][row["tenants"]] == row["seconds_4x"] / row["seconds"]
