"""Smoke test of ``bench/mixed_classes.py``: a small run, its report, its trace."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from trio_dispatch.testing import Workload

from .._bench import load_bench_script

if TYPE_CHECKING:
    import pathlib

    import pytest


def test_a_small_run_reports_both_tables(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench_script("mixed_classes")
    assert bench.main(["--agents", "150", "--seed", "3", "--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "mixed_classes.md").read_text(encoding="utf-8")
    assert markdown.strip() == capsys.readouterr().out.strip()
    assert "| uniform 1-8 | " in markdown
    assert "| 80% 1-2, 20% 20-40 | " in markdown
    assert "| short turns class 1, aging 60 s | " in markdown
    report = json.loads((tmp_path / "mixed_classes.json").read_text(encoding="utf-8"))
    assert (report["agents"], report["seed"]) == (150, 3)
    classes = report["runs"]["classes"]
    assert list(classes) == [
        "fifo",
        "oldest-first",
        "short turns class 1, aging 10 s",
        "short turns class 1, aging 60 s",
        "short turns class 1, aging 600 s",
        "short turns class 1, aging strict",
    ]
    assert all(run["completed"] == run["turns"] == 150 for run in classes.values())


def test_it_writes_the_mixed_trace(tmp_path: pathlib.Path) -> None:
    bench = load_bench_script("mixed_classes")
    path = tmp_path / "mixed.jsonl"
    assert bench.main(["--agents", "100", "--write-trace", str(path)]) == 0
    turns = Workload.from_trace(path).scenario().turns
    assert len(turns) == 100
    assert {t.tenant for t in turns} == {"chat", "agents"}
    assert all((t.tenant == "chat") == (len(t.calls) <= 2) for t in turns)
