"""Smoke test of ``bench/pools.py``: its ``--quick`` run, its report and its bars.

The benchmark runs in virtual time on seeded turns, so its figures are the
same on any machine but for trio's shuffling of tasks woken together.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_the_turns_offer_the_load_asked() -> None:
    bench = load_bench_script("pools")
    turns = bench.turns_of(1, 3600.0, bench.LOAD)
    calls = sum(len(turn.holds) for turn in turns)
    held = sum(sum(turn.holds) for turn in turns)
    assert all(bench.CALLS[0] <= len(turn.holds) <= bench.CALLS[1] for turn in turns)
    # Slot-seconds offered per second, over two members' slots.
    assert held / 3600.0 / (2 * bench.MEMBER) == pytest.approx(bench.LOAD, rel=0.03)
    assert calls > 0
    assert turns == bench.turns_of(1, 3600.0, bench.LOAD)  # seeded


def test_the_quick_run_reports_every_arm(tmp_path: pathlib.Path) -> None:
    bench = load_bench_script("pools")
    path = tmp_path / "pools.json"
    bench.main(["--quick", "--json", str(path)])
    report = json.loads(path.read_text(encoding="utf-8"))
    rows = {row["arm"]: row for row in report["rows"]}
    assert list(rows) == [arm.name for arm in bench.ARMS]
    bars = report["bars"]
    # The bars the pool meets whatever the arrivals' draw: none above its
    # limit, as many turns as one provider of its slots, its order, its
    # affinity, and no wait for a paused member.
    for bar in (
        "no member above its limit",
        "pool's turns per minute within 1% of one provider of 8's",
        "pool turn p95 within 10% of one provider of 8",
        ">= 95% of later calls on the first call's member at half load",
        "key-b >= 95% busy during key-a's pause",
        "no request waits while key-b has a free slot",
    ):
        assert bars[bar], bar
    pool, alone = rows["pool 4+4"], rows["one member alone"]
    assert pool["turns_per_minute"] > 1.6 * alone["turns_per_minute"]
    assert rows["pool 4+4, affinity off"]["affinity_hits"] == 0
    assert 0 < pool["p50"] <= pool["p95"]
