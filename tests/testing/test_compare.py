"""Policies side by side: the references, your configurations, honest reports."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from trio_dispatch.testing import (
    CallsPerTurn,
    Comparison,
    DispatcherConfig,
    PoissonArrivals,
    Scenario,
    SimCall,
    SimProvider,
    TurnSpec,
    Workload,
    compare,
    run_comparison,
)
from trio_dispatch.testing._compare import TABLE_COLUMNS, draw_comparison

if TYPE_CHECKING:
    from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

MIXED = Workload(
    agents=120,
    arrivals=PoissonArrivals(1.0),
    providers=(SimProvider("p", 2, capacity=2),),
    calls=CallsPerTurn.mixture((0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(8, 12))),
    seed=3,
)


def least_served(call: SimCall) -> float:
    return call.received


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    return run_comparison(
        MIXED,
        {
            "classes": DispatcherConfig(
                {"priority_aging": 600.0},
                priority=lambda turn: 1 if len(turn.calls) <= 2 else 0,
            ),
            "least served": DispatcherConfig(key=least_served),
            "no limit": "none",
        },
    )


def test_the_references_run_first_then_each_configuration(
    comparison: Comparison,
) -> None:
    assert comparison.names == [
        "fifo",
        "oldest-first",
        "classes",
        "least served",
        "no limit",
    ]
    assert comparison.description == (
        "120 turns of 80% 1-2, 20% 8-12 calls, load 1.00, limit 2, seed 3"
    )
    metrics = comparison.metrics()
    assert {m.turns for m in metrics.values()} == {120}
    # Every run played the same turns.
    ideal = {
        name: [t.ideal for t in r.turns]
        for name, r in zip(comparison.names, comparison.results, strict=True)
    }
    assert len({tuple(v) for v in ideal.values()}) == 1
    assert comparison.result("classes").policy == "classes"
    with pytest.raises(KeyError):
        comparison.result("lifo")


def test_the_table_puts_what_each_completed_beside_its_latency(
    comparison: Comparison,
) -> None:
    title, columns, rows = comparison.table()
    assert columns == TABLE_COLUMNS
    assert columns[:3] == ("policy", "done", "mean")
    assert "short turns: at most 2 calls" in title
    by_name = {row[0]: row for row in rows}
    assert by_name["fifo"][1] == "120/120"
    # No limit on a provider that refuses past 2: some turns ran out of
    # retries, and the table says so next to its (flattering) latency.
    done, total = map(int, by_name["no limit"][1].split("/"))
    assert done < total == 120
    assert int(by_name["no limit"][-1]) > 0


def test_the_markdown_says_where_each_does_worse_as_plainly_as_better(
    comparison: Comparison,
) -> None:
    markdown = comparison.to_markdown()
    assert markdown.startswith(f"# {comparison.description}\n")
    for name in ("oldest-first", "classes", "least served", "no limit"):
        assert f"## {name} against fifo" in markdown
    wins, losses = comparison.versus("oldest-first")
    for line in wins:
        assert f"- better: {line}" in markdown
    for line in losses:
        assert f"- worse: {line}" in markdown
    # Oldest-first on mixed turns: new turns' first calls pay.
    assert any(line.startswith("first-call wait p95") for line in losses)
    _, dropped = comparison.versus("no limit")
    assert dropped[0].startswith("turns completed ")
    assert dropped[0].endswith(" vs 120/120")


def test_the_json_holds_every_runs_metrics(comparison: Comparison) -> None:
    data = json.loads(comparison.to_json())
    assert data["description"] == comparison.description
    assert sorted(data["metrics"]) == sorted(comparison.names)
    assert data["metrics"]["fifo"]["completed"] == 120


def drawn(comparison: Comparison) -> Any:  # noqa: ANN401 (a matplotlib Figure)
    import matplotlib  # noqa: PLC0415  # optional dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = plt.figure(figsize=(17, 5.2))
    draw_comparison(figure, comparison)
    figure.canvas.draw()
    plt.close(figure)
    return figure


def test_the_plot_shows_every_policy_and_what_it_completed(
    comparison: Comparison,
) -> None:
    figure = drawn(comparison)
    every, short, long, done = figure.axes
    assert [a.get_title() for a in (every, short, long, done)] == [
        "turn latency, all turns",
        "turn latency, short turns (at most 2 calls)",
        "turn latency, long turns (more than 2 calls)",
        "turns completed",
    ]
    for axes in (every, short, long):
        lines = axes.get_lines()
        labels = [line.get_label() for line in lines]
        assert sorted(label.split(" (")[0] for label in labels) == sorted(
            comparison.names
        )
        assert "fifo (100% done)" in labels
        # Each has a marker and a dash pattern, so that one on another shows.
        assert len(
            {
                (line.get_marker(), line.get_linestyle(), line.get_color())
                for line in lines
            }
        ) == len(lines)
        assert all(line.get_marker() not in ("None", "", None) for line in lines)
        assert axes.get_xlabel() == "turn latency, virtual seconds (log scale)"
        assert axes.get_ylabel() == "share of the turns done within"
    # A CDF counts every turn: the one that dropped turns stays below 1.
    no_limit = next(
        line for line in every.get_lines() if line.get_label().startswith("no limit")
    )
    assert max(no_limit.get_ydata()) < 1
    assert [t.get_text() for t in done.get_xticklabels()] == [
        "classes",
        "least served",
        "no limit",
        "fifo",
        "oldest-first",
    ]


def test_the_plot_is_written(comparison: Comparison, tmp_path: Path) -> None:
    path = comparison.plot(tmp_path / "c.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_compare_runs_inside_a_trio_run() -> None:
    scenario = Scenario(
        (SimProvider("p", 1),),
        [TurnSpec(0.0, "p", (1.0, 1.0), (0.5,)), TurnSpec(0.25, "p", (1.0,))],
    )
    seen: list[str] = []

    async def main() -> Comparison:
        return await compare(
            scenario, {"mine": DispatcherConfig()}, progress=seen.append
        )

    result = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen == ["fifo", "oldest-first", "mine"]
    assert result.description == "2 turns"
    ends = {
        name: [t.end for t in r.turns]
        for name, r in zip(result.names, result.results, strict=True)
    }
    assert ends == {"fifo": [3.0, 2.0], "oldest-first": [3.0, 2.0], "mine": [3.0, 2.0]}


def test_a_configuration_cannot_hide_a_reference() -> None:
    with pytest.raises(
        ValueError, match=r"^a configuration named 'fifo' would hide the reference$"
    ):
        run_comparison(MIXED, {"fifo": DispatcherConfig()})
    with pytest.raises(
        TypeError,
        match=r"^configs must map names to DispatcherConfig or a policy name, got 3 for 'x'$",
    ):
        run_comparison(MIXED, {"x": 3})  # type: ignore[dict-item]  # wrong on purpose
