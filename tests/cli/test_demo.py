"""The demo: a fair comparison of oldest-first and FIFO, told at a glance."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from typing import TYPE_CHECKING

import attrs
import pytest

from trio_dispatch._cli._common import figure_png
from trio_dispatch._cli._demo import (
    PROVIDERS,
    DemoOptions,
    DemoReport,
    Progress,
    ProviderRow,
    ProviderSummary,
    RunReport,
    ScriptedAnswer,
    run_demo,
)
from trio_dispatch._cli._demo_command import (
    binned,
    demo_plot,
    demo_table,
    progress_table,
    verdict,
)
from trio_dispatch._cli._main import build_parser

from .._helpers import PNG_MAGIC, cli_argv

if TYPE_CHECKING:
    from pathlib import Path

    from trio_dispatch._cli._demo import RunName

# Small enough for the suite, busy enough that 429s and queues happen.
SMALL = DemoOptions(
    agents=8,
    turns=2,
    max_calls=3,
    limit_openai=2,
    limit_anthropic=1,
    load=2.0,
    rate_limit_rate=0.2,
    seed=3,
)


async def test_both_runs_meet_the_same_scripted_provider() -> None:
    # The same calls answered 429 at the same points of the schedule, the
    # same durations, whatever order each limiter served them in.
    report = await run_demo(SMALL)
    first, fifo = report.oldest_first, report.fifo
    assert fifo is not None
    assert report.complete
    for run in (first, fifo):
        assert run.turns_completed == 16
        assert run.turns_failed == 0
        for summary in run.providers:
            answers = run.answers[summary.provider]
            # What the servers counted is what their scripts answered.
            assert summary.server_requests == len(answers)
            assert summary.rate_limited == sum(a.status == 429 for a in answers)
            assert summary.server_peak_in_flight <= summary.limit
    for provider in PROVIDERS:
        assert first.answers[provider] == fifo.answers[provider]
    every = [a for provider in PROVIDERS for a in first.answers[provider]]
    assert any(a.status == 429 for a in every)
    assert any(a.call > 0 for a in every), "multi-call tool loops"
    # Each retry after a 429 is the next attempt at the same call.
    for a in every:
        if a.attempt:
            assert (
                ScriptedAnswer(a.agent, a.turn, a.call, a.attempt - 1, 429, 0.0)
                in every
            )
    # The FIFO baseline honours Retry-After as the dispatcher does.
    assert sum(map(len, fifo.pauses.values())) > 0


def summary(provider: str, limit: int) -> ProviderSummary:
    return ProviderSummary(
        provider=provider,
        limit=limit,
        turns=2,
        turn_latency_p50=0.0,
        turn_latency_p95=0.0,
        turn_latency_p99=0.0,
        turn_latency_max=0.0,
        first_call_wait_p50=0.0,
        first_call_wait_p95=0.0,
        first_call_wait_max=0.0,
        llm_calls=4,
        retries=0,
        server_requests=4,
        server_peak_in_flight=limit,
        rate_limited=0,
        longest_pause=0.0,
    )


def fixed_run(name: RunName, scale: float) -> RunReport:
    """Two turns per provider; FIFO's turns take ``scale`` times as long."""
    return RunReport(
        name=name,
        providers=(summary("openai", 4), summary("anthropic", 3)),
        turns_completed=4,
        turns_failed=0,
        duration=10.0,
        turn_latencies={"openai": (1.0 * scale, 4.0 * scale), "anthropic": (2.0, 3.0)},
        first_call_waits={"openai": (0.5 / scale, 0.5), "anthropic": (0.25, 0.25)},
        timeline={
            "openai": ((0.0, 0, 0), (1.0, 4, 3), (9.0, 0, 0)),
            "anthropic": ((0.0, 0, 0), (2.0, 3, 5), (8.0, 0, 0)),
        },
        pauses={"openai": ((3.0, 3.25),), "anthropic": ()},
        answers={"openai": (), "anthropic": ()},
    )


FIXED = DemoReport(
    options=DemoOptions(),
    oldest_first=fixed_run("oldest-first", 1.0),
    fifo=fixed_run("fifo", 2.0),
)


def rendered(renderable: object, width: int = 80) -> list[str]:
    from rich.console import Console  # noqa: PLC0415 (the demo extra)

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_summary_shows_both_runs_side_by_side_within_80_columns() -> None:
    lines = rendered(demo_table(FIXED))
    assert max(map(len, lines)) <= 80
    rows = [line.split() for line in lines]
    # Per provider and pooled: oldest-first, FIFO and the ratio of the two.
    assert [
        "openai",
        "oldest-first",
        "2",
        "2.50",
        "3.85",
        "3.97",
        "4.00",
        "0.50",
    ] in rows
    assert ["FIFO", "2", "5.00", "7.70", "7.94", "8.00", "0.49"] in rows
    assert ["ratio", "0.50x", "0.50x", "0.50x", "0.50x", "1.03x"] in rows
    assert [
        "anthropic",
        "oldest-first",
        "2",
        "2.50",
        "2.95",
        "2.99",
        "3.00",
        "0.25",
    ] in rows
    assert ["ratio", "1.00x", "1.00x", "1.00x", "1.00x", "1.00x"] in rows
    assert [
        "pooled",
        "oldest-first",
        "4",
        "2.50",
        "3.85",
        "3.97",
        "4.00",
        "0.50",
    ] in rows
    assert ["FIFO", "4", "2.50", "7.25", "7.85", "8.00", "0.46"] in rows
    assert ["ratio", "1.00x", "0.53x", "0.51x", "0.50x", "1.08x"] in rows
    assert "ratio: oldest-first / FIFO (below 1: oldest-first is faster)" in lines[-1]


def test_the_verdict_says_where_oldest_first_won_and_lost() -> None:
    lost = DemoReport(
        options=FIXED.options,
        oldest_first=fixed_run("oldest-first", 1.0),
        fifo=fixed_run("fifo", 1.0),
    )
    assert verdict(FIXED) == (
        "Oldest-first against FIFO, pooled: won on turn p95 0.53x, turn p99"
        " 0.51x, turn max 0.50x; lost on first-call wait p95 1.08x; even on"
        " turn p50 1.00x."
    )
    assert verdict(lost) == (
        "Oldest-first against FIFO, pooled: even on turn p50 1.00x, turn p95"
        " 1.00x, turn p99 1.00x, turn max 1.00x, first-call wait p95 1.00x."
    )
    incomplete = DemoReport(options=FIXED.options, oldest_first=FIXED.oldest_first)
    assert verdict(incomplete) == (
        "The comparison is incomplete: the FIFO run did not finish."
    )


def test_an_incomplete_summary_shows_the_first_run_and_says_so() -> None:
    incomplete = DemoReport(options=FIXED.options, oldest_first=FIXED.oldest_first)
    lines = rendered(demo_table(incomplete))
    text = "\n".join(lines)
    assert "FIFO" not in text.replace("the FIFO run did not finish", "")
    assert "ratio" not in text
    assert "the FIFO run did not finish: no comparison" in text
    assert ["pooled", "oldest-first", "4", "2.50", "3.85", "3.97", "4.00", "0.50"] in [
        line.split() for line in lines
    ]


def test_the_live_display_names_the_run_going_on() -> None:
    progress = Progress(
        turns_total=10,
        turns_done=3,
        phase="FIFO, same fleet",
        rows={"openai": ProviderRow(limit=4, in_use=4, waiting=7, paused=True)},
        server_in_flight={"openai": 4},
    )
    lines = rendered(progress_table(progress), width=100)
    assert "FIFO, same fleet: turns 3/10 (failed 0), LLM calls 0" in lines[0]
    cells = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in lines
        if "openai" in line
    ]
    assert cells == [["openai", "4", "#### 4", "7", "yes", "4"]]


def texts(axes: object) -> list[str]:
    return [text.get_text() for text in axes.texts]  # type: ignore[attr-defined]


def legend(axes: object) -> list[str]:
    found = axes.get_legend()  # type: ignore[attr-defined]
    return [] if found is None else [text.get_text() for text in found.get_texts()]


def drawn_figure(report: DemoReport) -> object:
    import matplotlib  # noqa: PLC0415 (the demo extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = plt.figure(figsize=(13, 7.5))
    demo_plot(figure, report)
    plt.close(figure)
    return figure


def test_the_plot_draws_both_runs_on_the_same_axes_with_the_ratio() -> None:
    figure = drawn_figure(FIXED)
    axes = figure.axes  # type: ignore[attr-defined]
    labels = [a.get_ylabel() for a in axes]
    assert labels == [
        "openai\nslots in use",
        "openai\ncalls waiting",
        "anthropic\nslots in use",
        "anthropic\ncalls waiting",
        "share of turns done within",
        "seconds, both providers",
    ]
    timelines, cdf, bars = axes[:4], axes[4], axes[5]
    for each in timelines:
        assert len(each.lines) >= 2, "one line per run"
        assert each.get_shared_x_axes().joined(each, timelines[0])
    assert legend(timelines[1]) == ["oldest-first", "FIFO, same fleet"]
    assert "limit 4" in texts(timelines[0])
    assert "limit 3" in texts(timelines[2])
    assert legend(cdf) == [
        "oldest-first (4/4 turns done)",
        "FIFO, same fleet (4/4 turns done)",
    ]
    assert texts(cdf) == ["p95: 3.85 s vs 7.25 s\noldest-first = 0.53x FIFO"]
    assert legend(bars) == ["oldest-first", "FIFO, same fleet"]
    assert texts(bars) == ["1.00x", "0.53x", "0.51x", "0.50x", "1.08x"]
    ticks = [t.get_text() for t in bars.get_xticklabels()]
    assert ticks == [
        "turn\np50",
        "turn\np95",
        "turn\np99",
        "turn\nmax",
        "first-call\nwait p95",
    ]
    assert "interrupted" not in figure._suptitle.get_text()  # type: ignore[attr-defined]


def test_the_plot_marks_each_runs_429_pauses() -> None:
    figure = drawn_figure(FIXED)
    openai_slots, openai_waiting, anthropic_slots, anthropic_waiting = figure.axes[:4]  # type: ignore[attr-defined]
    # One paused span (3 s to 3.25 s) of openai in each run, on both axes.
    for axes in (openai_slots, openai_waiting):
        spans = [p.get_x() for p in axes.patches]
        widths = [round(p.get_width(), 6) for p in axes.patches]
        assert (spans, widths) == ([3.0, 3.0], [0.25, 0.25])
    assert legend(openai_slots) == ["429 pause, oldest-first", "429 pause, FIFO"]
    # anthropic was never paused: nothing shaded, no legend.
    assert len(anthropic_slots.patches) == len(anthropic_waiting.patches) == 0
    assert legend(anthropic_slots) == []
    assert "shaded: paused after a 429" in openai_slots.get_title(loc="left")


def test_the_latency_curve_counts_failed_turns() -> None:
    assert FIXED.fifo is not None
    failing = attrs.evolve(
        FIXED.fifo,
        turns_completed=3,
        turns_failed=1,
        turn_latencies={"openai": (2.0,), "anthropic": (2.0, 3.0)},
    )
    figure = drawn_figure(attrs.evolve(FIXED, fifo=failing))
    cdf = figure.axes[4]  # type: ignore[attr-defined]
    fifo = next(line for line in cdf.lines if line.get_label().startswith("FIFO"))
    assert max(fifo.get_ydata()) == 0.75
    assert legend(cdf)[1] == "FIFO, same fleet (3/4 turns done)"


def test_an_incomplete_plot_shows_the_first_run_and_says_so() -> None:
    incomplete = DemoReport(options=FIXED.options, oldest_first=FIXED.oldest_first)
    figure = drawn_figure(incomplete)
    title = figure._suptitle.get_text()  # type: ignore[attr-defined]
    assert title.endswith("(FIFO run interrupted: no comparison)")
    assert legend(figure.axes[4]) == ["oldest-first (4/4 turns done)"]  # type: ignore[attr-defined]
    assert texts(figure.axes[5]) == []  # type: ignore[attr-defined]
    png = figure_png(lambda f: demo_plot(f, incomplete))
    assert png.startswith(PNG_MAGIC)


def test_the_command_line_defaults_are_the_demo_options() -> None:
    args = build_parser().parse_args(["demo"])
    defaults = DemoOptions()
    assert (
        args.agents,
        args.turns,
        args.max_calls,
        args.limit_openai,
        args.limit_anthropic,
        args.load,
        args.rate_limits,
        args.seed,
    ) == (
        defaults.agents,
        defaults.turns,
        defaults.max_calls,
        defaults.limit_openai,
        defaults.limit_anthropic,
        defaults.load,
        defaults.rate_limit_rate,
        defaults.seed,
    )


def test_ctrl_c_in_the_fifo_run_keeps_the_first_runs_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = cli_argv(
        "demo",
        "--agents",
        "12",
        "--max-calls",
        "3",
        "--limit-openai",
        "2",
        "--limit-anthropic",
        "1",
        "--load",
        "0.3",
        "--no-live",
        "--out",
        str(out),
    )
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # The suite may run with SIGINT ignored; the child must not be.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 (no threads here)
    ) as process:
        try:
            assert process.stdout is not None
            lines: list[str] = []
            while not (line := process.stdout.readline()).startswith("1/2 "):
                assert line, f"the first run never ended: {lines}"
                lines.append(line)
            assert "oldest-first: 12 turns completed" in line
            time.sleep(0.3)  # well inside the FIFO run
            process.send_signal(signal.SIGINT)
            rest, err = process.communicate(timeout=60)
        finally:
            process.kill()
    assert err == "trio-dispatch: interrupted\n"
    assert process.returncode == 130
    assert "2/2" not in rest
    assert "the comparison is incomplete" in rest
    report = json.loads((out / "demo.json").read_text())
    assert report["complete"] is False
    assert report["fifo"] is None
    assert report["oldest_first"]["turns_completed"] == 12
    assert sum(p["turns"] for p in report["oldest_first"]["providers"]) == 12
    assert (out / "demo.png").read_bytes().startswith(PNG_MAGIC)
    assert sorted(path.name for path in out.iterdir()) == ["demo.json", "demo.png"]


def test_the_timeline_means_stay_within_what_was_drawn() -> None:
    # Changes on the bins' edges, where rounding once put a whole span
    # into one bin and drew more slots in use than the limit.
    points = [(k * 0.1, 4 - k % 2, k % 3) for k in range(100)]
    times, means = binned(points, 1, 0.2, 10.0)
    assert len(times) == len(means) == 51
    assert times[:3] == [0.0, 0.2, 0.4]
    assert means == pytest.approx([3.5] * 51)
    assert max(means) <= 4
    _, waiting = binned([(0.0, 0, 0), (0.1, 2, 1), (0.5, 0, 0)], 2, 0.2, 0.6)
    assert waiting == pytest.approx([0.5, 1.0, 0.5, 0.5])
