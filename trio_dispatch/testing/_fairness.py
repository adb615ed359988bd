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
from ._metrics import PolicyMetrics, percentile
from ._plots import ordered, scale, style
from ._simulation import POLICIES, PolicyName, run_simulation
from ._workloads import (
    CallsPerTurn,
    Duration,
    PoissonArrivals,
    SimProvider,
    Workload,
)

if TYPE_CHECKING:
    from collections.abc import Callable

_Row = TypeVar("_Row")

#: The quantiles kept per run for the distribution plot: 0, 0.5, ..., 100.
FAIRNESS_QUANTILES: tuple[float, ...] = tuple(q / 2 for q in range(201))


@final
@attrs.frozen
class FairnessConfig:
    """What the fairness sweep runs.

    Each run has ``agents`` turns on one provider whose capacity is its
    ``limit``, at each of ``loads`` (fractions of the limit) and ``shapes``
    (calls per turn); the headline compares the policies at
    ``target_load`` and ``target_shape``.
    """

    loads: tuple[float, ...] = (0.5, 0.7, 0.85, 0.95, 1.1)
    shapes: tuple[CallsPerTurn, ...] = (
        CallsPerTurn(1, 1),
        CallsPerTurn(1, 8),
        CallsPerTurn(4, 16),
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

    @classmethod
    def quick(cls) -> FairnessConfig:
        """A sweep that runs in well under a minute."""
        return cls(
            loads=(0.5, 0.85, 0.95, 1.1),
            shapes=(CallsPerTurn(1, 1), CallsPerTurn(1, 8)),
            agents=2_000,
        )

    def workload(self, load: float, shape: CallsPerTurn) -> Workload:
        """The seeded workload of one sweep point (the same for every policy)."""
        return _workload(
            self, load, shape, self.retry_after, max_attempts=self.max_attempts
        )


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
        """The target comparison: oldest-first against FIFO, in one paragraph."""
        config = self.config
        try:
            ours = self.row(config.target_load, config.target_shape, "oldest-first")
            fifo = self.row(config.target_load, config.target_shape, "fifo")
        except KeyError:
            return "The sweep does not include the target point."
        ratio = ours.metrics.latency_p95 / fifo.metrics.latency_p95
        mean_ratio = ours.metrics.latency_mean / fifo.metrics.latency_mean
        passed = ratio <= 0.8 and mean_ratio < 1
        return (
            f"At {config.target_load:.0%} load with {config.target_shape} calls per"
            f" turn, oldest-first's p95 turn latency is {ratio:.2f}x FIFO's"
            f" ({ours.metrics.latency_p95:.1f} s against"
            f" {fifo.metrics.latency_p95:.1f} s) and its mean {mean_ratio:.2f}x"
            f" ({ours.metrics.latency_mean:.1f} s against"
            f" {fifo.metrics.latency_mean:.1f} s). Target (p95 <= 0.8x, mean"
            f" below): {'met' if passed else 'NOT met'}."
        )

    def losses(self) -> list[str]:
        """Where oldest-first does worse than FIFO, one line per sweep point."""
        lines = []
        for row in self.rows:
            if row.policy != "oldest-first":
                continue
            try:
                fifo = self.row(row.load, row.shape, "fifo").metrics
            except KeyError:
                continue
            worse = []
            for label, field in _LOSSES:
                a, b = getattr(row.metrics, field), getattr(fifo, field)
                if field == "fairness":  # higher is better
                    if a < b * 0.95:
                        worse.append(f"{label} {a:.2f} vs {b:.2f}")
                elif a > b * 1.05:
                    worse.append(f"{label} {a:.1f} s vs {b:.1f} s")
            if worse:
                lines.append(f"- {row.load:.0%} load, {row.shape}: " + "; ".join(worse))
        return lines

    def to_markdown(self) -> str:
        """The report as markdown: headline, one table per shape, the losses."""
        config = self.config
        out = [
            "# Fairness benchmark",
            "",
            f"{config.agents} agent turns per run, one provider with limit"
            f" {config.limit} (and the same capacity), calls"
            f" {_describe(config.call_duration)}, tools"
            f" {_describe(config.tool_duration)}, seed {config.seed}. Times in"
            " virtual seconds; latency figures cover completed turns.",
            "",
            "`none` has no client-side limit: calls beyond the provider's capacity"
            f" get 429 and are retried after {config.retry_after:g} s, at most"
            f" {config.max_attempts} attempts. Turns that run out of attempts"
            " fail and drop out of its latency figures, which flatters it:"
            " read them with its `done` column.",
            "",
            self.headline(),
            "",
        ]
        header = (
            "| load | policy | mean | p50 | p95 | p99 | max | slowdown | Jain"
            " | first wait p95 | max wait | util | done | 429s |"
        )
        rule = "|" + "---|" * 14
        for shape in dict.fromkeys(row.shape for row in self.rows):
            out += [f"## {_calls(shape)} per turn", "", header, rule]
            for row in self.rows:
                if row.shape != shape:
                    continue
                m = row.metrics
                out.append(
                    f"| {row.load:.0%} | {m.policy} | {m.latency_mean:.1f}"
                    f" | {m.latency_p50:.1f} | {m.latency_p95:.1f}"
                    f" | {m.latency_p99:.1f} | {m.latency_max:.1f}"
                    f" | {m.slowdown_mean:.2f} | {m.fairness:.2f}"
                    f" | {m.first_wait_p95:.1f} | {m.max_slot_wait:.1f}"
                    f" | {m.utilisation:.2f} | {m.completed}/{m.turns}"
                    f" | {m.rejections} |"
                )
            out.append("")
        losses = self.losses()
        out += ["## Where oldest-first does worse than FIFO", ""]
        out += losses or ["Nowhere in this sweep."]
        out += [
            "",
            "A turn's calls can only be overtaken by calls of turns that started"
            " earlier, so oldest-first never starves a turn while the load is"
            " below capacity: its wait is bounded by the remaining work of the"
            " older turns. Under overload that work grows without bound, and"
            " so does a new turn's first wait; `max_waiting` (QueueFull) is"
            " the bound to set there. Random order has no such bound.",
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


#: What ``losses`` compares: (label, ``PolicyMetrics`` field).
_LOSSES = (
    ("first-call wait p95", "first_wait_p95"),
    ("longest slot wait", "max_slot_wait"),
    ("Jain index of slowdowns", "fairness"),
    ("p95 latency", "latency_p95"),
)


def _calls(shape: str) -> str:
    return f"{shape} call" if shape == "1" else f"{shape} calls"


def _legend(policy: str) -> str:
    return "none (completed turns only)" if policy == "none" else policy


def _describe(duration: Duration) -> str:
    if duration.kind == "lognormal":
        return f"lognormal(mean {duration.mean:g} s, sigma {duration.spread:g})"
    if duration.kind == "uniform":
        return f"uniform({duration.mean:g} ± {duration.spread:g} s)"
    return f"{duration.kind}(mean {duration.mean:g} s)"


#: The panels of ``latency_vs_load.png``: (title, field, unit). Where
#: oldest-first wins, where it loses, then the work each policy finished, so
#: a policy cannot look fast by dropping turns.
VS_LOAD_PANELS: tuple[tuple[str, str, str], ...] = (
    ("p95 turn latency", "latency_p95", "seconds"),
    ("p99 turn latency", "latency_p99", "seconds"),
    ("first-call wait p95", "first_wait_p95", "seconds"),
    ("longest single wait", "max_slot_wait", "seconds"),
    ("turns completed", "completed", "% of turns"),
)


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
                        else getattr(row.metrics, field),
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
            ax.set_title(f"{title}, {_calls(shape)} per turn", fontsize="medium")
            ax.set_xlabel("load (% of capacity)")
            ax.set_ylabel(unit)
            completed = field == "completed"
            if completed:
                low = min((y for p in lines.values() for _, y in p), default=100.0)
                ax.set_ylim(min(90.0, math.floor(low / 5) * 5), 101)
            else:
                scale(ax, "y", [y for p in lines.values() for _, y in p])
            ax.grid(visible=True, alpha=0.3)
            if lines.get("oldest-first") and lines["oldest-first"] == lines.get("fifo"):
                ax.text(
                    0.03,
                    0.03 if completed else 0.97,
                    "oldest-first = fifo here\n(the dashed line on the thick one)",
                    transform=ax.transAxes,
                    va="bottom" if completed else "top",
                    fontsize="small",
                )
    axes[0][0].legend(fontsize="small")
    fig.suptitle(
        "Fairness sweep: where oldest-first wins (turn latency), where it loses"
        " (single waits), and the work each policy completed",
        fontweight="bold",
    )
    fig.tight_layout()


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
            label = _legend(policy)
            if done < 1:
                label = f"{policy} ({1 - done:.0%} of turns dropped)"
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
            f"turn latency, {_calls(shape)} per turn, load {high[0].load:.0%}",
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
    config: FairnessConfig, load: float, shape: CallsPerTurn
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
                shape=shape.label,
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
    points = [(config, load, shape) for shape in config.shapes for load in config.loads]
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
