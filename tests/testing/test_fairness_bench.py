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
from trio_dispatch.testing._fairness import (
    VS_LOAD_PANELS,
    draw_distribution,
    draw_vs_load,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

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
    # The same report back (NaN, where a group has no turns, is never equal
    # to itself: compared as JSON).
    back = FairnessReport.from_json(text)
    assert back.to_json() == report.to_json()
    assert back.config == report.config
    assert len(back.rows) == len(report.rows)
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


# ------------------------------------------------------------------ plots


def fixed_metrics(policy: str, load: float, shape: str) -> PolicyMetrics:
    """Made-up figures.

    Oldest-first and fifo tie on one call per turn, and ``none`` drops a
    fifth of its turns at the high load.
    """
    from trio_dispatch.testing import PolicyMetrics  # noqa: PLC0415

    scale = {"oldest-first": 0.7, "fifo": 1.0, "none": 0.4}[policy]
    if shape == "1" and policy == "oldest-first":
        scale = 1.0
    high = load > 0.9
    base = (30.0 if high else 3.0) * scale
    return PolicyMetrics(
        policy=policy,
        turns=100,
        completed=80 if policy == "none" and high else 100,
        latency_mean=base,
        latency_p50=base / 2,
        latency_p95=base * 2,
        latency_p99=base * 3,
        latency_max=base * 4,
        slowdown_mean=1.0 + scale,
        slowdown_p95=1.0,
        fairness=0.5,
        first_wait_p95=0.0 if policy == "none" else (2.0 if high else 0.5) / scale,
        max_slot_wait=0.0 if policy == "none" else (20.0 if high else 4.0) / scale,
        utilisation=0.9,
        makespan=100.0,
        rejections=0,
        short_p50=base / 3,
    )


@pytest.fixture
def fixed_report() -> FairnessReport:
    rows = []
    for shape in ("1", "1-3"):
        for load in (0.5, 0.95):
            for policy in ("oldest-first", "fifo", "none"):
                metrics = fixed_metrics(policy, load, shape)
                quantiles = tuple(
                    metrics.latency_p50 * (0.2 + q / 50) for q in FAIRNESS_QUANTILES
                )
                rows.append(FairnessRow(load, shape, metrics, quantiles))
    config = FairnessConfig(
        loads=(0.5, 0.95),
        shapes=(CallsPerTurn(1, 1), CallsPerTurn(1, 3)),
        target_shape="1-3",
    )
    return FairnessReport(config, tuple(rows))


def drawn(draw: Callable[[Any, FairnessReport], None], report: FairnessReport) -> Any:  # noqa: ANN401 (a matplotlib Figure)
    import matplotlib  # noqa: PLC0415  # optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = plt.figure(figsize=(20, 8))
    draw(figure, report)
    figure.canvas.draw()  # so that the tick labels are made
    plt.close(figure)
    return figure


def lines_by_label(axes: Any) -> dict[str, Any]:  # noqa: ANN401 (a matplotlib Axes)
    return {line.get_label(): line for line in axes.get_lines()}


def test_the_load_plot_shows_wins_losses_and_completed_turns(
    fixed_report: FairnessReport,
) -> None:
    figure = drawn(draw_vs_load, fixed_report)
    axes = figure.axes
    assert [a.get_title() for a in axes] == [
        f"{title},\n{calls} per turn"
        for calls in ("1 call", "1-3 calls")
        for title, _, _ in VS_LOAD_PANELS
    ]
    assert [title for title, _, _ in VS_LOAD_PANELS] == [
        "turns completed",
        "p95 turn latency",
        "p99 turn latency",
        "short turns' median latency",
        "first-call wait p95",
        "longest single wait",
        "mean slowdown",
    ]
    for each in axes:
        assert set(lines_by_label(each)) == {
            "oldest-first",
            "fifo",
            "none (completed turns only)",
        }
    # The completion rate: no limit drops a fifth of its turns at 95%.
    completed = lines_by_label(axes[0])
    assert list(completed["none (completed turns only)"].get_ydata()) == [100.0, 80.0]
    assert list(completed["oldest-first"].get_ydata()) == [100.0, 100.0]
    assert axes[0].get_ylabel() == "% of turns"
    # Where the lines coincide (one call per turn), a note says so, and
    # oldest-first's line is drawn on top of FIFO's, thinner.
    panels = len(VS_LOAD_PANELS)
    first_row, second_row = axes[:panels], axes[panels:]
    notes = "oldest-first = fifo here\n(the dashed line on the thick one)"
    assert all(notes in [t.get_text() for t in a.texts] for a in first_row[1:3])
    assert not any(len(a.texts) for a in second_row[1:])
    p95 = lines_by_label(first_row[1])
    assert p95["oldest-first"].get_zorder() >= p95["fifo"].get_zorder()
    assert list(first_row[1].get_lines()).index(p95["oldest-first"]) > list(
        first_row[1].get_lines()
    ).index(p95["fifo"])
    assert p95["oldest-first"].get_linewidth() < p95["fifo"].get_linewidth()
    # Where it loses: its first-call wait above FIFO's on multi-call turns.
    waits = lines_by_label(second_row[4])
    assert list(waits["oldest-first"].get_ydata()) > list(waits["fifo"].get_ydata())
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "none (completed turns only)",
        "fifo",
        "oldest-first",
    ]


def test_plots_have_plain_tick_labels(fixed_report: FairnessReport) -> None:
    for draw in (draw_vs_load, draw_distribution):
        figure = drawn(draw, fixed_report)
        for each in figure.axes:
            labels = [t.get_text() for t in each.get_yticklabels()]
            labels += [t.get_text() for t in each.get_xticklabels()]
            assert labels
            for label in labels:
                assert "times" not in label
                assert "^" not in label
                assert "$" not in label
        assert not any("1 calls" in a.get_title() for a in figure.axes)


def test_the_distribution_counts_dropped_turns(fixed_report: FairnessReport) -> None:
    figure = drawn(draw_distribution, fixed_report)
    one, many = figure.axes
    assert one.get_title() == "turn latency, 1 call per turn, load 95%"
    assert many.get_title() == "turn latency, 1-3 calls per turn, load 95%"
    assert one.get_ylabel() == "share of all turns done within"
    lines = lines_by_label(many)
    assert set(lines) == {
        "oldest-first (100% of turns done)",
        "fifo (100% of turns done)",
        "none (80% of turns done)",
    }
    assert max(lines["none (80% of turns done)"].get_ydata()) == pytest.approx(0.8)
    assert max(lines["fifo (100% of turns done)"].get_ydata()) == 1.0
    assert [t.get_text() for t in one.texts] == ["oldest-first = fifo here"]
    assert len(many.texts) == 0
