"""``trio-dispatch demo``: the run, its live progress, its table and its plot."""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _groups
from ._common import (
    check_outputs,
    figure_png,
    json_bytes,
    require,
    rich_console,
    run_trio,
    write_files,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from rich.console import Console

    from ._demo import DemoReport, Progress


def demo_command(args: argparse.Namespace) -> int:
    outputs = (args.out / "demo.json", args.out / "demo.png")
    check_outputs(outputs)
    require("demo", ("rich", "matplotlib", "hypercorn"))

    from ._demo import RUNS, DemoOptions  # noqa: PLC0415

    options = DemoOptions(
        agents=args.agents,
        turns=args.turns,
        max_calls=args.max_calls,
        limit_openai=args.limit_openai,
        limit_anthropic=args.limit_anthropic,
        load=args.load,
        rate_limit_rate=args.rate_limits,
        seed=args.seed,
    )
    console = rich_console()
    console.print(
        f"[bold]trio-dispatch demo[/]: {options.agents} agents x {options.turns}"
        f" {'turn' if options.turns == 1 else 'turns'}"
        f" of 1-{options.max_calls} LLM calls, limits openai={options.limit_openai}"
        f" anthropic={options.limit_anthropic}, load {options.load:g},"
        f" seed {options.seed}"
    )
    console.print(
        f"Two runs of the same fleet, the same scripted provider: 1. {RUNS['oldest-first']},"
        f" 2. {RUNS['fifo']}."
    )
    finished: list[DemoReport] = []

    def on_run(report: DemoReport) -> None:
        finished[:] = [report]
        run = report.runs()[-1]
        console.print(
            f"{len(report.runs())}/2 {RUNS[run.name]}: {run.turns_completed} turns"
            f" completed, {run.turns_failed} failed, in {run.duration:.1f} s."
        )

    live = not (args.no_live or not console.is_terminal)
    try:
        report = _with_live_display(console, options, on_run, live=live)
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        if not finished or not _groups.only(exc, KeyboardInterrupt):
            raise
        # Interrupted during the FIFO run: what the first run measured stays.
        partial_report = finished[0]
        console.print(demo_table(partial_report))
        console.print(
            "Interrupted during the FIFO run: the comparison is incomplete;"
            " the oldest-first run's figures are kept."
        )
        _write_demo(console, outputs, partial_report)
        raise
    console.print(demo_table(report))
    console.print(verdict(report))
    failed = sum(run.turns_failed for run in report.runs())
    within = all(
        p.server_peak_in_flight <= p.limit
        for run in report.runs()
        for p in run.providers
    )
    console.print(
        "The servers' peak concurrency never exceeded the limits, in either run."
        if within
        else "[red]A server saw more concurrent requests than its limit.[/]"
    )
    _write_demo(console, outputs, report)
    ok = failed == 0 and within
    return 0 if ok else 1


def _write_demo(
    console: Console, outputs: tuple[Path, Path], report: DemoReport
) -> None:
    files = {
        outputs[0]: json_bytes(report.to_dict()),
        outputs[1]: figure_png(lambda figure: demo_plot(figure, report), (13, 7.5)),
    }
    write_files(files)
    for path in files:
        console.print(f"wrote {path}")


def _with_live_display(
    console: Console,
    options: Any,  # noqa: ANN401 (DemoOptions, imported lazily)
    on_run: Callable[[DemoReport], None],
    *,
    live: bool,
) -> DemoReport:
    from rich.live import Live  # noqa: PLC0415

    from ._demo import run_demo  # noqa: PLC0415

    if not live:
        return run_trio(partial(run_demo, options, on_run=on_run))
    with Live(console=console, refresh_per_second=10, transient=True) as display:

        def show(progress: Progress) -> None:
            display.update(progress_table(progress))

        return run_trio(partial(run_demo, options, on_progress=show, on_run=on_run))


def progress_table(progress: Progress) -> Any:  # noqa: ANN401 (a rich renderable)
    from rich.table import Table  # noqa: PLC0415

    from ._demo import ProviderRow  # noqa: PLC0415

    table = Table(
        title=f"{progress.phase}: turns {progress.turns_done}/{progress.turns_total}"
        f" (failed {progress.turns_failed}), LLM calls {progress.llm_calls}"
    )
    for column in (
        "provider",
        "limit",
        "in use",
        "waiting",
        "paused",
        "server in flight",
    ):
        table.add_column(column, justify="right" if column != "provider" else "left")
    rows = dict(progress.rows)
    stats = progress.statistics
    if not rows and stats is not None:
        rows = ProviderRow.rows_of(stats)
    for name, row in rows.items():
        table.add_row(
            name,
            "none" if row.limit is None else str(row.limit),
            "#" * row.in_use + f" {row.in_use}",
            str(row.waiting),
            "yes" if row.paused else "",
            str(progress.server_in_flight.get(name, 0)),
        )
    return table


# The summary's figures: (column, figure, percentile; None for the maximum).
_SUMMARY_FIGURES: tuple[tuple[str, str, float | None], ...] = (
    ("p50", "latency", 50),
    ("p95", "latency", 95),
    ("p99", "latency", 99),
    ("max", "latency", None),
    ("1st call\nwait p95", "first_call_wait", 95),
)


def _figure(values: Sequence[float], q: float | None) -> float:
    from ..testing._metrics import percentile  # noqa: PLC0415 (the demo's own import)

    if not values:
        return math.nan
    return max(values) if q is None else percentile(values, q)


def _run_figures(run: Any, provider: str | None) -> list[float]:  # noqa: ANN401 (RunReport)
    """The summary's figures of ``run``, for ``provider`` or pooled (``None``)."""
    out = []
    for _, figure, q in _SUMMARY_FIGURES:
        source = run.turn_latencies if figure == "latency" else run.first_call_waits
        if provider is None:
            values: Sequence[float] = run.pooled(figure)
        else:
            values = source.get(provider, ())
        out.append(_figure(values, q))
    return out


def demo_table(report: DemoReport) -> Any:  # noqa: ANN401 (a rich renderable)
    """Both runs side by side, per provider and pooled, with FIFO's ratio."""
    from rich import box  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from ._demo import RUNS  # noqa: PLC0415

    table = Table(
        title="turn latency and first-call wait (seconds), the same fleet",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("provider", no_wrap=True)
    table.add_column("run", no_wrap=True)
    table.add_column("turns", justify="right")
    for column, _, _ in _SUMMARY_FIGURES:
        table.add_column(column, justify="right", no_wrap=True)
    groups: list[tuple[str, str | None]] = [
        (p.provider, p.provider) for p in report.oldest_first.providers
    ]
    groups.append(("pooled", None))
    for label, provider in groups:
        rows = []
        for run in report.runs():
            turns = (
                run.turns_completed
                if provider is None
                else len(run.turn_latencies.get(provider, ()))
            )
            figures = _run_figures(run, provider)
            rows.append(figures)
            table.add_row(
                label if run is report.oldest_first else "",
                RUNS[run.name].split(",")[0],
                str(turns),
                *(f"{value:.2f}" for value in figures),
            )
        if len(rows) == 2:
            table.add_row(
                "",
                "ratio",
                "",
                *(_ratio(ours, fifo) for ours, fifo in zip(*rows, strict=True)),
                end_section=True,
            )
    if not report.complete:
        table.caption = "the FIFO run did not finish: no comparison"
    else:
        table.caption = "ratio: oldest-first / FIFO (below 1: oldest-first is faster)"
    return table


def _ratio(ours: float, fifo: float) -> str:
    if not (fifo > 0 and math.isfinite(ours)):
        return "-"
    return f"{ours / fifo:.2f}x"


def verdict(report: DemoReport) -> str:
    """One line: where oldest-first won and where it lost, pooled."""
    if report.fifo is None:
        return "The comparison is incomplete: the FIFO run did not finish."
    ours = _run_figures(report.oldest_first, None)
    fifo = _run_figures(report.fifo, None)
    won: list[str] = []
    lost: list[str] = []
    even: list[str] = []
    for (column, figure, _), a, b in zip(_SUMMARY_FIGURES, ours, fifo, strict=True):
        name = f"turn {column}" if figure == "latency" else "first-call wait p95"
        if not (b > 0 and math.isfinite(a)):
            continue
        ratio = a / b
        text = f"{name} {ratio:.2f}x"
        (won if ratio < 0.98 else lost if ratio > 1.02 else even).append(text)
    parts = [
        f"{title} {', '.join(items)}"
        for title, items in (("won on", won), ("lost on", lost), ("even on", even))
        if items
    ]
    return f"Oldest-first against FIFO, pooled: {'; '.join(parts)}."


_RUN_COLOURS = {"oldest-first": "tab:blue", "fifo": "tab:orange"}


def demo_plot(figure: Any, report: DemoReport) -> None:  # noqa: ANN401 (matplotlib Figure)
    """Both runs on the same axes: slots and queues over time, then latencies."""
    from ._demo import RUNS  # noqa: PLC0415

    runs = report.runs()
    names = [p.provider for p in report.oldest_first.providers]
    limits = {p.provider: p.limit for p in report.oldest_first.providers}
    outer = figure.add_gridspec(1, 2, width_ratios=(1.6, 1), wspace=0.2)
    left = outer[0].subgridspec(
        2 * len(names), 1, height_ratios=[1, 1.5] * len(names), hspace=0.3
    )
    right = outer[1].subgridspec(2, 1, hspace=0.45)
    end = max((run.duration for run in runs), default=0.0)
    width = max(0.2, end / 60)
    first: Any = None
    waiting: Any = None
    for row, name in enumerate(names):
        slots = figure.add_subplot(left[2 * row], sharex=first)
        first = first or slots
        waiting = figure.add_subplot(left[2 * row + 1], sharex=first)
        for run in runs:
            points = run.timeline.get(name, ())
            colour = _RUN_COLOURS[run.name]
            for axes, column in ((slots, 1), (waiting, 2)):
                times, means = binned(points, column, width, run.duration)
                axes.step(
                    times,
                    means,
                    where="post",
                    color=colour,
                    linewidth=1.4,
                    label=RUNS[run.name],
                )
        _mark_pauses(slots, waiting, runs, name)
        slots.axhline(limits[name], color="black", linestyle="--", linewidth=1)
        slots.set_ylim(0, limits[name] * 1.3)
        slots.set_ylabel(f"{name}\nslots in use", fontsize="small")
        slots.text(
            0.005,
            limits[name] * 1.02,
            f"limit {limits[name]}",
            transform=slots.get_yaxis_transform(),
            ha="left",
            va="bottom",
            fontsize="small",
        )
        waiting.set_ylabel(f"{name}\ncalls waiting", fontsize="small")
        waiting.set_ylim(bottom=0)
        for axes in (slots, waiting):
            axes.grid(axis="y", alpha=0.3)
            axes.tick_params(labelbottom=False)
        if row == 0:
            slots.set_title(
                f"slots in use and calls waiting (means over {width:.2g} s);"
                " shaded: paused after a 429",
                loc="left",
            )
            waiting.legend(loc="upper left", fontsize="small", ncols=2)
        paused = [p for p in slots.patches if not p.get_label().startswith("_")]
        if paused:
            slots.legend(handles=paused, loc="upper right", fontsize="small", ncols=2)
    if waiting is not None:
        waiting.tick_params(labelbottom=True)
        waiting.set_xlabel("seconds since the run started")

    _latency_cdf(figure.add_subplot(right[0]), report)
    _latency_bars(figure.add_subplot(right[1]), report)
    options = report.options
    turns = "turn" if options.turns == 1 else "turns"
    title = (
        f"trio-dispatch demo: {options.agents} agents x {options.turns} {turns} of"
        f" 1-{options.max_calls} LLM calls, load {options.load:g}, seed {options.seed}"
    )
    if not report.complete:
        title += " (FIFO run interrupted: no comparison)"
    figure.suptitle(title, fontweight="bold")
    figure.subplots_adjust(left=0.07, right=0.98, top=0.9, bottom=0.08)


def _mark_pauses(slots: Any, waiting: Any, runs: Sequence[Any], name: str) -> None:  # noqa: ANN401 (matplotlib Axes)
    """Shade each run's 429 pauses of ``name``: a dip in slots reads as a pause.

    While paused, nothing is granted, so the slots in use fall and calls
    wait; shaded, that reads as the provider's ``Retry-After``, not as
    waste. Each run in its colour, hatched apart, named once in a legend.
    """
    from ._demo import RUNS  # noqa: PLC0415

    for run, hatch in zip(runs, ("//", "\\\\"), strict=False):
        colour = _RUN_COLOURS[run.name]
        for index, (start, end) in enumerate(run.pauses.get(name, ())):
            for axes in (slots, waiting):
                axes.axvspan(
                    start,
                    max(end, start + 1e-3),
                    facecolor=colour,
                    alpha=0.18,
                    hatch=hatch,
                    edgecolor=colour,
                    linewidth=0,
                    label=f"429 pause, {RUNS[run.name].split(',')[0]}"
                    if index == 0 and axes is slots
                    else None,
                )


def binned(
    points: Sequence[tuple[float, int, int]], column: int, width: float, end: float
) -> tuple[list[float], list[float]]:
    """The time-weighted mean of ``column`` over bins of ``width`` seconds.

    ``points`` hold the values after each change, in time order; the last
    value lasts until ``end``. Returns the bins' starts and means.
    """
    count = max(1, math.ceil(end / width))
    sums = [0.0] * count
    for (changed, *values), following in zip(
        points, [*points[1:], (end, 0, 0)], strict=True
    ):
        start, stop = changed, min(following[0], end)
        value = values[column - 1]
        index = min(int(start / width), count - 1)
        while start < stop:
            # The bin's end; the last bin takes whatever rounding leaves.
            edge = stop if index == count - 1 else min(stop, (index + 1) * width)
            sums[index] += value * max(0.0, edge - start)
            start = edge
            index += 1
    times = [index * width for index in range(count)]
    return [*times, count * width], [
        *(total / width for total in sums),
        sums[-1] / width,
    ]


def _latency_cdf(axes: Any, report: DemoReport) -> None:  # noqa: ANN401 (matplotlib Axes)
    """The pooled turn latency distributions of both runs, p95 marked."""
    from ._demo import RUNS  # noqa: PLC0415

    p95 = {}
    for run in report.runs():
        values = run.pooled("latency")
        if not values:
            continue
        # Counted over every turn, so a run that lost turns stops short of 1.
        total = max(len(values), run.turns_completed + run.turns_failed)
        fractions = [(i + 1) / total for i in range(len(values))]
        colour = _RUN_COLOURS[run.name]
        # What each run completed, beside its latency.
        done = f"{run.turns_completed}/{run.turns_completed + run.turns_failed} turns"
        axes.step(
            values,
            fractions,
            where="post",
            color=colour,
            label=f"{RUNS[run.name]} ({done} done)",
        )
        p95[run.name] = _figure(values, 95)
        axes.axvline(p95[run.name], color=colour, linestyle=":", linewidth=1.2)
    axes.axhline(0.95, color="gray", linewidth=0.6)
    axes.set_xlim(left=0)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("turn latency (s), both providers")
    axes.set_ylabel("share of turns done within")
    axes.set_title("turn latency distribution", loc="left")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    if len(p95) == 2:
        ours, fifo = p95["oldest-first"], p95["fifo"]
        axes.text(
            0.03,
            0.97,
            f"p95: {ours:.2f} s vs {fifo:.2f} s\noldest-first = {ours / fifo:.2f}x FIFO",
            transform=axes.transAxes,
            va="top",
            fontsize="medium",
            fontweight="bold",
            bbox={"facecolor": "white", "edgecolor": "gray", "alpha": 0.9},
        )


def _latency_bars(axes: Any, report: DemoReport) -> None:  # noqa: ANN401 (matplotlib Axes)
    """Pooled figures of both runs, side by side, the ratio above each pair."""
    from ._demo import RUNS  # noqa: PLC0415

    labels = [
        "turn\n" + column if figure == "latency" else "first-call\nwait p95"
        for column, figure, _ in _SUMMARY_FIGURES
    ]
    width = 0.38
    heights: dict[str, list[float]] = {}
    runs = report.runs()
    for offset, run in enumerate(runs):
        heights[run.name] = _run_figures(run, None)
        positions = [
            i + (offset - (len(runs) - 1) / 2) * width for i in range(len(labels))
        ]
        axes.bar(
            positions,
            [0.0 if math.isnan(h) else h for h in heights[run.name]],
            width=width,
            color=_RUN_COLOURS[run.name],
            label=RUNS[run.name],
        )
    if len(heights) == 2:
        for index, (ours, fifo) in enumerate(
            zip(heights["oldest-first"], heights["fifo"], strict=True)
        ):
            ratio = _ratio(ours, fifo)
            top = max(ours, fifo)
            axes.text(
                index,
                top,
                ratio,
                ha="center",
                va="bottom",
                fontsize="small",
                fontweight="bold",
                color="tab:green" if ours < fifo else "tab:red",
            )
    # Room above the tallest bar for its ratio, and above that for the
    # legend, so neither ever covers a bar or a ratio.
    tallest = max(
        (h for figures in heights.values() for h in figures if not math.isnan(h)),
        default=1.0,
    )
    axes.set_ylim(0.0, tallest * 1.45 or 1.0)
    axes.set_xticks(range(len(labels)), labels, fontsize="small")
    axes.set_ylabel("seconds, both providers")
    axes.set_title("pooled figures, oldest-first / FIFO above", loc="left")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(loc="upper center", fontsize="small", ncols=2)


# ------------------------------------------------------------------ simulate
