"""The fairness benchmark: turn latency under load, policy against policy.

One sweep plays the same seeded workloads (one per load and turn shape)
under every policy with ``run_simulation``. The claim it tests: under load,
oldest-agent-first finishes agent turns sooner than per-call FIFO, because
a turn in progress is not sent to the back of the queue at every step of
its tool loop; what it gives up (a new turn's first call waits behind older
turns' next steps) is shown too.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, final

import attrs

from .._converter import structure, unstructure
from ._distributions import CallsPerTurn, Duration
from ._metrics import PolicyMetrics, percentile, versus
from ._plots import ordered, scale, style
from ._simulation import POLICIES, PolicyName, run_simulation
from ._workloads import (
    PoissonArrivals,
    SimProvider,
    Workload,
)

if TYPE_CHECKING:
    from collections.abc import Callable

_Row = TypeVar("_Row")

#: The mixed, heavy-tailed shape: chat turns of one or two calls beside
#: agent runs of twenty to forty.
MIXED = CallsPerTurn.mixture((0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(20, 40)))

#: The quantiles kept per run for the distribution plot: 0, 0.5, ..., 100.
FAIRNESS_QUANTILES: tuple[float, ...] = tuple(q / 2 for q in range(201))


@final
@attrs.frozen
class FairnessConfig:
    """What the fairness sweep runs.

    Each run has ``agents`` turns on one provider whose capacity is its
    ``limit``, at each of ``loads`` (fractions of the limit) and ``shapes``
    (calls per turn); the headline compares the policies at
    ``target_load`` and ``target_shape``, and holds them to the project's
    target only for the project's own sweep (``FairnessConfig()`` and
    ``quick()``).

    With a ``trace`` (the path of a JSON Lines trace file), every run plays
    the trace's turns instead, sped up or slowed to each load: a sweep of
    your own traffic (``shapes``, ``agents`` and the durations are not
    used).
    """

    loads: tuple[float, ...] = (0.5, 0.7, 0.85, 0.95, 1.1)
    shapes: tuple[CallsPerTurn, ...] = (
        CallsPerTurn(1, 1),
        CallsPerTurn(1, 8),
        CallsPerTurn(4, 16),
        MIXED,
    )
    policies: tuple[PolicyName, ...] = POLICIES
    agents: int = 10_000
    limit: int = 8
    call_duration: Duration = Duration.lognormal(2.0, 1.0)  # noqa: RUF009  # frozen value
    tool_duration: Duration = Duration.exponential(1.0)  # noqa: RUF009  # frozen value
    retry_after: float = 1.0
    max_attempts: int = 10
    seed: int = 20240501
    target_load: float = 0.95
    target_shape: str = "1-8"
    trace: str | None = None

    @classmethod
    def quick(cls) -> FairnessConfig:
        """A sweep that runs in well under a minute."""
        return cls(
            loads=(0.5, 0.85, 0.95, 1.1),
            shapes=(CallsPerTurn(1, 1), CallsPerTurn(1, 8), MIXED),
            agents=2_000,
        )

    @property
    def is_project(self) -> bool:
        """Whether this is the project's own sweep, which has a target."""
        return self in (FairnessConfig(), FairnessConfig.quick())

    @property
    def points(self) -> list[tuple[float, CallsPerTurn | None]]:
        """Every sweep point, ``(load, shape)``, a trace's with no shape."""
        shapes = (None,) if self.trace is not None else self.shapes
        return [(load, shape) for shape in shapes for load in self.loads]

    def workload(self, load: float, shape: CallsPerTurn | None) -> Workload:
        """The seeded workload of one sweep point (the same for every policy)."""
        if shape is None:
            return self.trace_workload().at_load(load)
        return _workload(
            self, load, shape, self.retry_after, max_attempts=self.max_attempts
        )

    def trace_workload(self) -> Workload:
        """The trace's turns as recorded; ``ValueError`` without a trace."""
        if self.trace is None:
            raise ValueError("this sweep has no trace")
        provider = SimProvider(
            "provider", self.limit, capacity=self.limit, retry_after=self.retry_after
        )
        return Workload.from_trace(
            self.trace, (provider,), seed=self.seed, max_attempts=self.max_attempts
        )

    def label(self, shape: CallsPerTurn | None) -> str:
        """How rows name a shape: ``"1-8"``, or the trace's file name."""
        return Path(self.trace or "").name if shape is None else shape.label


@final
@attrs.frozen
class FairnessRow:
    """One policy at one sweep point.

    ``shape`` reads as ``"1-8"``; ``latency_quantiles`` is the turn latency
    at each of ``FAIRNESS_QUANTILES``.
    """

    load: float
    shape: str
    metrics: PolicyMetrics
    latency_quantiles: tuple[float, ...]

    @property
    def policy(self) -> str:
        """The policy simulated."""
        return self.metrics.policy


@final
@attrs.frozen
class FairnessReport:
    """The sweep's results, with renderers."""

    config: FairnessConfig
    rows: tuple[FairnessRow, ...]

    def row(self, load: float, shape: str, policy: str) -> FairnessRow:
        """The row of one sweep point and policy; ``KeyError`` if there is none."""
        for row in self.rows:
            if row.load == load and row.shape == shape and row.policy == policy:
                return row
        raise KeyError((load, shape, policy))

    def to_json(self) -> str:
        """The report as JSON (``NaN`` where nothing completed)."""
        return json.dumps(unstructure(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> FairnessReport:
        """Read a report written by ``to_json``."""
        return structure(json.loads(text), cls)

    def headline(self) -> str:
        """Oldest-first against FIFO at the target point, in one paragraph.

        The project's own sweep is held to its target (p95 at most 0.8x
        FIFO's, mean below); a sweep of your own gets its figures and
        ratios, for every shape, and no target.
        """
        config = self.config
        shapes = list(dict.fromkeys(row.shape for row in self.rows))
        if config.is_project:
            shapes = [config.target_shape]
        load = config.target_load
        if load not in config.loads:
            load = max((x for x in config.loads if x <= 1), default=max(config.loads))
        out = []
        for shape in shapes:
            try:
                ours = self.row(load, shape, "oldest-first").metrics
                fifo = self.row(load, shape, "fifo").metrics
            except KeyError:
                out.append("The sweep does not include the target point.")
                continue
            ratio = ours.latency_p95 / fifo.latency_p95
            mean_ratio = ours.latency_mean / fifo.latency_mean
            where = (
                f"the trace {shape}"
                if config.trace is not None
                else f"{_calls(shape)} per turn"
            )
            text = (
                f"At {load:.0%} load with {where}, oldest-first's"
                f" p95 turn latency is {ratio:.2f}x FIFO's"
                f" ({ours.latency_p95:.1f} s against {fifo.latency_p95:.1f} s) and"
                f" its mean {mean_ratio:.2f}x ({ours.latency_mean:.1f} s against"
                f" {fifo.latency_mean:.1f} s)"
            )
            if ours.short_p50 is not None and fifo.short_p50:
                text += (
                    f"; its short turns' median is {ours.short_p50 / fifo.short_p50:.2f}x"
                    f" FIFO's ({ours.short_p50:.1f} s against {fifo.short_p50:.1f} s)"
                )
            text += "."
            if config.is_project:
                passed = ratio <= 0.8 and mean_ratio < 1
                text += (
                    " Target (p95 <= 0.8x, mean below):"
                    f" {'met' if passed else 'NOT met'}."
                )
            out.append(text)
        return "\n\n".join(out)

    def versus_fifo(self) -> list[tuple[str, list[str], list[str]]]:
        """Per sweep point, where oldest-first does better than FIFO and where worse.

        ``(point, wins, losses)``, the point as ``"95% load, 1-8"``.
        """
        out = []
        for row in self.rows:
            if row.policy != "oldest-first":
                continue
            try:
                fifo = self.row(row.load, row.shape, "fifo").metrics
            except KeyError:
                continue
            wins, losses = versus(row.metrics, fifo)
            out.append((f"{row.load:.0%} load, {row.shape}", wins, losses))
        return out

    def losses(self) -> list[str]:
        """Where oldest-first does worse than FIFO, one line per sweep point."""
        return [
            f"- {point}: " + "; ".join(losses)
            for point, _, losses in self.versus_fifo()
            if losses
        ]

    def wins(self) -> list[str]:
        """Where oldest-first does better than FIFO, one line per sweep point."""
        return [
            f"- {point}: " + "; ".join(wins)
            for point, wins, _ in self.versus_fifo()
            if wins
        ]

    def to_markdown(self) -> str:
        """The report as markdown: headline, one table per shape, wins and losses."""
        config = self.config
        if config.trace is not None:
            what = (
                f"The turns of the trace `{config.label(None)}`, as recorded but"
                " sped up or slowed to each load, on one provider with limit"
                f" {config.limit} (and the same capacity)"
            )
        else:
            what = (
                f"{config.agents} agent turns per run, one provider with limit"
                f" {config.limit} (and the same capacity), calls"
                f" {_describe(config.call_duration)}, tools"
                f" {_describe(config.tool_duration)}"
            )
        out = [
            "# Fairness benchmark",
            "",
            f"{what}, seed {config.seed}. Times in virtual seconds; latency"
            " figures cover completed turns: read them beside `done`. A turn is"
            " short if it makes at most the median number of calls of its run,"
            " long otherwise.",
            "",
        ]
        if "none" in config.policies:
            out += [
                "`none` has no client-side limit: calls beyond the provider's"
                f" capacity get 429 and are retried after {config.retry_after:g} s,"
                f" at most {config.max_attempts} attempts. Turns that run out of"
                " attempts fail and drop out of its latency figures, which"
                " flatters it: read them with its `done` column.",
                "",
            ]
        out += [self.headline(), ""]
        header = (
            "| load | policy | done | mean | p50 | p95 | p99 | short p50 | long p95"
            " | slowdown | Jain | first wait p50 | first wait p95 | max wait | util"
            " | 429s |"
        )
        rule = "|" + "---|" * 16
        for shape in dict.fromkeys(row.shape for row in self.rows):
            title = shape if config.trace is not None else f"{_calls(shape)} per turn"
            out += [f"## {title}", "", header, rule]
            for row in self.rows:
                if row.shape != shape:
                    continue
                m = row.metrics
                out.append(
                    f"| {row.load:.0%} | {m.policy} | {m.completed}/{m.turns}"
                    f" | {m.latency_mean:.1f} | {m.latency_p50:.1f}"
                    f" | {m.latency_p95:.1f} | {m.latency_p99:.1f}"
                    f" | {_maybe(m.short_p50)} | {_maybe(m.long_p95)}"
                    f" | {m.slowdown_mean:.2f} | {m.fairness:.2f}"
                    f" | {_maybe(m.first_wait_p50)} | {m.first_wait_p95:.1f}"
                    f" | {m.max_slot_wait:.1f} | {m.utilisation:.2f}"
                    f" | {m.rejections} |"
                )
            out.append("")
        out += ["## Where oldest-first does better than FIFO", ""]
        out += self.wins() or ["Nowhere in this sweep."]
        out += ["", "## Where oldest-first does worse than FIFO", ""]
        out += self.losses() or ["Nowhere in this sweep."]
        out += [
            "",
            "A turn's calls can only be overtaken by calls of turns that started"
            " earlier, so oldest-first never starves a turn while the load is"
            " below capacity: its wait is bounded by the remaining work of the"
            " older turns. That is also what short turns pay where turns are"
            " mixed: a new short turn waits behind the long turns already"
            " running. Priority classes for the short, interactive turns are"
            " the remedy (see the manual's fairness section). Under overload"
            " the older turns' work grows without bound, and so does a new"
            " turn's first wait; `max_waiting` (QueueFull) is the bound to set"
            " there."
            + (
                " Random order has no such bound."
                if "random" in config.policies
                else ""
            ),
            "",
        ]
        return "\n".join(out)

    def plot(self, out_dir: Path) -> list[Path]:
        """Write the PNG plots into ``out_dir``; returns their paths."""
        import matplotlib as mpl  # noqa: PLC0415  # optional dependency

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415  # after choosing the backend

        shapes = len(dict.fromkeys(row.shape for row in self.rows))
        paths = []
        for name, size, draw in (
            (
                "latency_vs_load.png",
                (4 * len(VS_LOAD_PANELS), 3.8 * shapes),
                draw_vs_load,
            ),
            ("latency_distribution.png", (6 * shapes, 4.6), draw_distribution),
        ):
            fig = plt.figure(figsize=size)
            draw(fig, self)
            paths.append(out_dir / name)
            fig.savefig(paths[-1], dpi=100)
            plt.close(fig)
        return paths

    def write(self, out_dir: Path | str) -> list[Path]:
        """Write ``fairness.json``, ``fairness.md`` and the plots; returns paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path = out / "fairness.json"
        json_path.write_text(self.to_json() + "\n", encoding="utf-8")
        md_path = out / "fairness.md"
        md_path.write_text(self.to_markdown(), encoding="utf-8")
        return [json_path, md_path, *self.plot(out)]


def _maybe(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _calls(shape: str) -> str:
    return f"{shape} call" if shape == "1" else f"{shape} calls"


def _per_turn(report: FairnessReport, shape: str) -> str:
    """A shape's name in a title: ``"1-8 calls per turn"``, or the trace's name."""
    return shape if report.config.trace is not None else f"{_calls(shape)} per turn"


def _legend(policy: str) -> str:
    return "none (completed turns only)" if policy == "none" else policy


def _describe(duration: Duration) -> str:
    return duration.label


#: The panels of ``latency_vs_load.png``: (title, field, unit). The work
#: each policy finished first, so that a policy cannot look fast by
#: dropping turns; then where oldest-first wins (the tail), and where it can
#: lose (short turns among long ones, new turns' first calls, slowdown).
VS_LOAD_PANELS: tuple[tuple[str, str, str], ...] = (
    ("turns completed", "completed", "% of turns"),
    ("p95 turn latency", "latency_p95", "seconds"),
    ("p99 turn latency", "latency_p99", "seconds"),
    ("short turns' median latency", "short_p50", "seconds"),
    ("first-call wait p95", "first_wait_p95", "seconds"),
    ("longest single wait", "max_slot_wait", "seconds"),
    ("mean slowdown", "slowdown_mean", "x its idle latency"),
)


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def _completed_share(metrics: PolicyMetrics) -> float:
    return 100 * metrics.completed / metrics.turns if metrics.turns else math.nan


def draw_vs_load(fig: Any, report: FairnessReport) -> None:  # noqa: ANN401 (a matplotlib Figure)
    """Each policy's ``VS_LOAD_PANELS`` against the load, a row per turn shape."""
    rows = report.rows
    shapes = list(dict.fromkeys(row.shape for row in rows))
    policies = ordered(list(dict.fromkeys(row.policy for row in rows)))
    axes = fig.subplots(len(shapes), len(VS_LOAD_PANELS), squeeze=False)
    for i, shape in enumerate(shapes):
        for j, (title, field, unit) in enumerate(VS_LOAD_PANELS):
            ax = axes[i][j]
            lines: dict[str, list[tuple[float, float]]] = {}
            for policy in policies:
                points = sorted(
                    (
                        100 * row.load,
                        _completed_share(row.metrics)
                        if field == "completed"
                        else _number(getattr(row.metrics, field)),
                    )
                    for row in rows
                    if row.shape == shape and row.policy == policy
                )
                lines[policy] = points
                ax.plot(
                    [x for x, _ in points],
                    [y for _, y in points],
                    label=_legend(policy),
                    **style(policy),
                )
            ax.set_title(f"{title},\n{_per_turn(report, shape)}", fontsize="medium")
            ax.set_xlabel("load (% of capacity)")
            ax.set_ylabel(unit)
            completed = field == "completed"
            if completed:
                low = min((y for p in lines.values() for _, y in p), default=100.0)
                ax.set_ylim(min(90.0, math.floor(low / 5) * 5), 101)
            else:
                scale(ax, "y", [y for p in lines.values() for _, y in p])
            ax.grid(visible=True, alpha=0.3)
            ours = lines.get("oldest-first")
            if (
                ours
                and ours == lines.get("fifo")
                and any(math.isfinite(y) for _, y in ours)
            ):
                ax.text(
                    0.03,
                    0.03 if completed else 0.97,
                    "oldest-first = fifo here\n(the dashed line on the thick one)",
                    transform=ax.transAxes,
                    va="bottom" if completed else "top",
                    fontsize="small",
                )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncols=len(labels),
        bbox_to_anchor=(0.5, 0.965),
    )
    fig.suptitle(
        "Fairness sweep: the turns each policy completed, where oldest-first"
        " wins (tail latency), and where it can lose (short turns, first"
        " calls, slowdown)",
        fontweight="bold",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))


def draw_distribution(fig: Any, report: FairnessReport) -> None:  # noqa: ANN401 (a matplotlib Figure)
    """Turn latency CDFs at the target load, one panel per turn shape.

    The curves count every turn, so one of a policy that dropped turns
    (``none``) never reaches 100%.
    """
    config = report.config
    high = [row for row in report.rows if row.load == config.target_load] or list(
        report.rows
    )
    shapes = list(dict.fromkeys(row.shape for row in high))
    axes = fig.subplots(1, len(shapes), squeeze=False)
    fractions = [q / 100 for q in FAIRNESS_QUANTILES]
    for j, shape in enumerate(shapes):
        ax = axes[0][j]
        here = {row.policy: row for row in high if row.shape == shape}
        policies = ordered(list(here))
        for policy in policies:
            row = here[policy]
            done = row.metrics.completed / row.metrics.turns if row.metrics.turns else 0
            # What each completed, beside its latency.
            label = f"{policy} ({done:.0%} of turns done)"
            # Markers every 10 points, so that curves on one another show.
            ax.plot(
                row.latency_quantiles,
                [f * done for f in fractions],
                label=label,
                markevery=(policies.index(policy) * 3, 20),
                **style(policy),
            )
        curves = {policy: row.latency_quantiles for policy, row in here.items()}
        if "oldest-first" in curves and curves["oldest-first"] == curves.get("fifo"):
            ax.text(
                0.03,
                0.97,
                "oldest-first = fifo here",
                transform=ax.transAxes,
                va="top",
                fontsize="small",
            )
        ax.set_title(
            f"turn latency, {_per_turn(report, shape)}, load {high[0].load:.0%}",
            fontsize="medium",
        )
        ax.set_xlabel("turn latency, seconds")
        ax.set_ylabel("share of all turns done within")
        ax.set_ylim(0, 1.02)
        scale(ax, "x", [x for row in here.values() for x in row.latency_quantiles])
        ax.grid(visible=True, alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()


def run_point(
    config: FairnessConfig, load: float, shape: CallsPerTurn | None
) -> list[FairnessRow]:
    """Every policy on the workload of one sweep point."""
    workload = config.workload(load, shape)
    rows = []
    for policy in config.policies:
        result = run_simulation(workload, policy)
        latencies = [t.latency for t in result.turns if t.completed]
        rows.append(
            FairnessRow(
                load=load,
                shape=config.label(shape),
                metrics=result.metrics(),
                latency_quantiles=tuple(
                    percentile(latencies, q) if latencies else math.nan
                    for q in FAIRNESS_QUANTILES
                ),
            )
        )
    return rows


def run_fairness_sweep(
    config: FairnessConfig,
    *,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> FairnessReport:
    """Run the sweep; ``jobs > 1`` runs sweep points in that many processes.

    The report is the same whatever ``jobs`` is. ``progress(done, total)`` is
    called as sweep points finish.
    """
    points = [(config, load, shape) for load, shape in config.points]
    return FairnessReport(config, _run_points(run_point, points, jobs, progress))


def _run_points(
    run: Callable[..., list[_Row]],
    points: list[tuple[Any, ...]],
    jobs: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[_Row, ...]:
    """The rows of ``run(*point)`` for every point, in the order of ``points``."""
    results: list[list[_Row]] = [[] for _ in points]

    def finished(index: int, rows: list[_Row]) -> None:
        results[index] = rows
        if progress is not None:
            progress(sum(1 for done in results if done), len(points))

    if jobs > 1:
        # spawn: no fork of a process that may hold threads, on any platform.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {
                pool.submit(run, *point): index for index, point in enumerate(points)
            }
            for future in as_completed(futures):
                finished(futures[future], future.result())
    else:
        for index, point in enumerate(points):
            finished(index, run(*point))
    return tuple(row for rows in results for row in rows)


@final
@attrs.frozen
class PriorityClassesConfig:
    """What the priority classes sweep runs: classes under load, aging varied.

    Every run plays the seeded workload of its load under ``"oldest-first"``,
    once per ``priority_aging`` of ``agings``; ``classes`` are
    ``(priority, weight)`` pairs, as ``Workload.classes``.
    """

    loads: tuple[float, ...] = (0.95, 1.1)
    agings: tuple[float, ...] = (10.0, 60.0, 600.0, 1e9)
    classes: tuple[tuple[int, float], ...] = ((1, 0.2), (0, 0.8))
    agents: int = 10_000
    limit: int = 8
    calls: CallsPerTurn = CallsPerTurn(1, 8)  # noqa: RUF009  # frozen value
    call_duration: Duration = Duration.lognormal(2.0, 1.0)  # noqa: RUF009  # frozen value
    tool_duration: Duration = Duration.exponential(1.0)  # noqa: RUF009  # frozen value
    seed: int = 20240501

    def workload(self, load: float) -> Workload:
        """The seeded workload of one load (the same for every aging)."""
        return _workload(self, load, self.calls, classes=self.classes)


def _workload(
    config: FairnessConfig | PriorityClassesConfig,
    load: float,
    calls: CallsPerTurn,
    retry_after: float = 1.0,
    **more: Any,  # noqa: ANN401 (Workload's other fields)
) -> Workload:
    """A Poisson workload on one provider whose capacity is its limit."""
    provider = SimProvider(
        "provider", config.limit, capacity=config.limit, retry_after=retry_after
    )
    return Workload(
        agents=config.agents,
        arrivals=PoissonArrivals(load),
        providers=(provider,),
        calls=calls,
        call_duration=config.call_duration,
        tool_duration=config.tool_duration,
        seed=config.seed,
        **more,
    )


@final
@attrs.frozen
class PriorityClassRow:
    """One priority class in one run at ``load`` with ``aging``.

    ``wait_p95`` and ``wait_max`` are of a turn's total wait for slots,
    ``call_wait_max`` the longest single wait, ``latency_p95`` of the
    completed turns.
    """

    load: float
    aging: float
    priority: int
    turns: int
    completed: int
    wait_p95: float
    wait_max: float
    call_wait_max: float
    latency_p95: float


@final
@attrs.frozen
class PriorityClassesReport:
    """The priority classes sweep's results, with a markdown renderer."""

    config: PriorityClassesConfig
    rows: tuple[PriorityClassRow, ...]

    def to_json(self) -> str:
        """The report as JSON."""
        return json.dumps(unstructure(self), indent=1, sort_keys=True)

    def to_markdown(self) -> str:
        """The report as one markdown table, lowest load and aging first."""
        config = self.config
        shares = ", ".join(
            f"class {priority}: {weight:g}" for priority, weight in config.classes
        )
        out = [
            "# Priority classes",
            "",
            f"{config.agents} agent turns per run ({shares}), one provider with"
            f" limit {config.limit} (and the same capacity), {config.calls.label}"
            f" calls per turn of {_describe(config.call_duration)}, tools"
            f" {_describe(config.tool_duration)}, seed {config.seed}, policy"
            " oldest-first. A turn's wait is the sum of its calls' waits for a"
            " slot; virtual seconds. An aging of 1e9 s is, over these runs,"
            " strict classes with no aging. A class-0 turn is passed only by"
            " class-1 turns that began less than `priority_aging` after it, so"
            " the classes' waits differ by about that much at most.",
            "",
            "| load | priority_aging | class | turns | wait p95 | wait max"
            " | longest call wait | latency p95 |",
            "|" + "---|" * 8,
        ]
        for row in self.rows:
            out.append(
                f"| {row.load:.0%} | {_aging(row.aging)} | {row.priority}"
                f" | {row.completed}/{row.turns} | {row.wait_p95:.1f}"
                f" | {row.wait_max:.1f} | {row.call_wait_max:.1f}"
                f" | {row.latency_p95:.1f} |"
            )
        out.append("")
        return "\n".join(out)


def _aging(seconds: float) -> str:
    return "1e9 s (strict)" if seconds >= 1e9 else f"{seconds:g} s"


def run_priority_point(
    config: PriorityClassesConfig, load: float, aging: float
) -> list[PriorityClassRow]:
    """One run: every class's row at ``load`` with ``aging``, highest class first."""
    result = run_simulation(config.workload(load), "oldest-first", priority_aging=aging)
    rows = []
    for priority in sorted({p for p, _ in config.classes}, reverse=True):
        turns = [t for t in result.turns if t.priority == priority]
        waits = [t.slot_wait for t in turns]
        latencies = [t.latency for t in turns if t.completed]
        rows.append(
            PriorityClassRow(
                load=load,
                aging=aging,
                priority=priority,
                turns=len(turns),
                completed=sum(t.completed for t in turns),
                wait_p95=percentile(waits, 95) if waits else math.nan,
                wait_max=max(waits, default=math.nan),
                call_wait_max=max((t.max_slot_wait for t in turns), default=math.nan),
                latency_p95=percentile(latencies, 95) if latencies else math.nan,
            )
        )
    return rows


def run_priority_classes(
    config: PriorityClassesConfig, *, jobs: int = 1
) -> PriorityClassesReport:
    """Run the priority classes sweep; ``jobs > 1`` runs points in processes."""
    points = [(config, load, aging) for load in config.loads for aging in config.agings]
    return PriorityClassesReport(config, _run_points(run_priority_point, points, jobs))
