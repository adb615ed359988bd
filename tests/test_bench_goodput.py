"""Smoke test of ``bench/goodput.py``: a short run of every scheme.

Virtual time and seeded workloads make the figures exact and repeatable,
so the targets of the learned budgets and the adaptive limit are checked
too, on a short run.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ._bench import load_bench_script

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
