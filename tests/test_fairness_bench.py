"""The fairness sweep of ``trio_dispatch.testing``, small enough for the suite."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import attrs
import pytest

from trio_dispatch.testing import (
    FAIRNESS_QUANTILES,
    CallsPerTurn,
    FairnessConfig,
    FairnessReport,
    FairnessRow,
    run_fairness_sweep,
)

if TYPE_CHECKING:
    from pathlib import Path

    from trio_dispatch.testing import PolicyMetrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report() -> FairnessReport:
    config = FairnessConfig(
        loads=(0.5, 0.95),
        shapes=(CallsPerTurn(1, 1), CallsPerTurn(1, 3)),
        agents=60,
        seed=5,
        target_shape="1-3",
    )
    return run_fairness_sweep(config)


def test_the_sweep_runs_every_policy_at_every_point(report: FairnessReport) -> None:
    points = {(row.load, row.shape, row.policy) for row in report.rows}
    assert len(points) == len(report.rows) == 2 * 2 * 4
    for row in report.rows:
        assert row.metrics.turns == 60
        assert isinstance(row, FairnessRow)
        assert len(row.latency_quantiles) == len(FAIRNESS_QUANTILES)
        assert list(row.latency_quantiles) == sorted(row.latency_quantiles)


def test_one_call_per_turn_oldest_first_and_fifo_tie(report: FairnessReport) -> None:
    for load in report.config.loads:
        ours = report.row(load, "1", "oldest-first").metrics
        fifo = report.row(load, "1", "fifo").metrics
        assert attrs_without_policy(ours) == attrs_without_policy(fifo)


def attrs_without_policy(metrics: PolicyMetrics) -> dict[str, object]:
    fields = attrs.asdict(metrics)
    del fields["policy"]
    return fields


def test_the_report_writes_json_markdown_and_plots(
    report: FairnessReport, tmp_path: Path
) -> None:
    paths = report.write(tmp_path / "out")
    names = sorted(path.name for path in paths)
    assert names == [
        "fairness.json",
        "fairness.md",
        "latency_distribution.png",
        "latency_vs_load.png",
    ]
    text = (tmp_path / "out" / "fairness.json").read_text(encoding="utf-8")
    assert FairnessReport.from_json(text) == report
    assert json.loads(text)["config"]["agents"] == 60
    markdown = (tmp_path / "out" / "fairness.md").read_text(encoding="utf-8")
    assert markdown.startswith("# Fairness benchmark\n")
    assert "## 1-3 calls per turn" in markdown
    assert "| 95% | oldest-first |" in markdown
    assert "At 95% load with 1-3 calls per turn" in markdown
    for name in ("latency_vs_load.png", "latency_distribution.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 10_000


def test_the_report_is_the_same_in_parallel(report: FairnessReport) -> None:
    again = run_fairness_sweep(report.config, jobs=2)
    assert again.to_json() == report.to_json()


def test_row_lookup_names_a_missing_point(report: FairnessReport) -> None:
    with pytest.raises(KeyError):
        report.row(0.7, "1", "fifo")


def test_the_sweep_reports_its_progress_point_by_point(report: FairnessReport) -> None:
    calls: list[tuple[int, int]] = []
    again = run_fairness_sweep(report.config, progress=lambda *done: calls.append(done))
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert again == report
