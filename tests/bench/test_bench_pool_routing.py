"""Smoke test of ``bench/pool_routing.py``: a small run, its report and its figures.

Virtual time on seeded turns: the figures do not depend on the machine.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib


def test_a_small_run_reports_every_policy_at_every_load(tmp_path: pathlib.Path) -> None:
    bench = load_bench_script("pool_routing")
    path = tmp_path / "routing.json"
    assert bench.main(["--turns", "200", "--json", str(path)]) == 0
    report = json.loads(path.read_text(encoding="utf-8"))
    rows = {(row["load"], row["policy"]): row for row in report["rows"]}
    policies = ["oldest-first", "fifo", "none", "oldest-first, one provider of 8"]
    assert list(rows) == [(load, p) for load in bench.LOADS for p in policies]
    for (_, policy), row in rows.items():
        assert row["turns"] == 200
        assert 0 < row["p50"] <= row["p95"] <= row["p99"]
        if policy != "none":
            # A client-side limit at the capacity: no 429, every turn done.
            assert (row["completed"], row["rejections"]) == (200, 0)
    # No client-side limit at 110% load: the members refuse, turns give up.
    assert rows[(1.1, "none")]["rejections"] > 0


def test_the_pool_and_one_provider_of_its_slots_are_drawn_alike() -> None:
    bench = load_bench_script("pool_routing")
    pooled = bench.workload(50, 0.95, 7, pooled=True).scenario()
    single = bench.workload(50, 0.95, 7, pooled=False).scenario()
    assert [t.calls for t in pooled.turns] == [t.calls for t in single.turns]
    assert [t.arrival for t in pooled.turns] == [t.arrival for t in single.turns]
    assert {t.provider for t in pooled.turns} == {"gpt"}
