"""Policies side by side on one workload: the references and your configurations.

``compare`` (inside a trio run on a ``MockClock``) and ``run_comparison``
(a fresh run each) play one workload under FIFO and oldest-first, and under
each configuration of your own (a ``DispatcherConfig``: the real dispatcher
opened with your ``open_dispatcher`` options, and an order of your own if
it has a ``key``). The ``Comparison`` shows them side by side: every table
and plot puts each policy's completed turns beside its latency (a policy
that dropped turns cannot look fastest), splits short turns from long ones,
and says where each does worse than FIFO as plainly as where it does better.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import attrs
import trio
import trio.testing

from ._metrics import PolicyMetrics, versus
from ._plots import ordered, scale, style
from ._simulation import (
    POLICIES,
    DispatcherConfig,
    PolicyName,
    SimulationResult,
    check_policy,
    simulate,
)
from ._workloads import Scenario, Trace, Workload

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

#: The references every comparison runs unless told otherwise.
REFERENCES: tuple[PolicyName, ...] = ("fifo", "oldest-first")


def _to_results(values: Sequence[SimulationResult]) -> tuple[SimulationResult, ...]:
    return tuple(values)


@final
@attrs.frozen
class Comparison:
    """Several policies' runs of one workload, and how to read them.

    ``results`` are in the order they ran: the references, then your
    configurations. ``description`` says what was simulated, in one line.
    """

    description: str
    results: tuple[SimulationResult, ...] = attrs.field(converter=_to_results)

    @property
    def names(self) -> list[str]:
        """The runs' names, in order."""
        return [result.policy for result in self.results]

    def result(self, name: str) -> SimulationResult:
        """The run named ``name``; ``KeyError`` if there is none."""
        for result in self.results:
            if result.policy == name:
                return result
        raise KeyError(name)

    def metrics(self) -> dict[str, PolicyMetrics]:
        """Every run's metrics, by name."""
        return {result.policy: result.metrics() for result in self.results}

    def versus(self, name: str, base: str = "fifo") -> tuple[list[str], list[str]]:
        """Where run ``name`` does better than ``base``, and where worse."""
        return versus(self.result(name).metrics(), self.result(base).metrics())

    def table(self) -> tuple[str, tuple[str, ...], list[tuple[str, ...]]]:
        """The metrics as a table: its title, columns and rows (text cells)."""
        metrics = self.metrics()
        first = next(iter(metrics.values()))
        title = (
            f"{self.description}; short turns: at most {first.short_calls} calls"
            f" ({first.short_turns} of {first.turns}) (virtual seconds)"
        )
        return title, TABLE_COLUMNS, [_table_row(m) for m in metrics.values()]

    def to_markdown(self) -> str:
        """The comparison as markdown: the table, then each run against FIFO."""
        title, columns, rows = self.table()
        out = [
            f"# {self.description}",
            "",
            f"{title}. Latency figures cover completed turns: read them"
            " beside `done`. A turn is short if it makes at most the median"
            " number of calls; `first wait` is the wait of a turn's first"
            " call, `slowdown` its latency over its latency on an idle system.",
            "",
            "| " + " | ".join(columns) + " |",
            "|" + "---|" * len(columns),
            *("| " + " | ".join(row) + " |" for row in rows),
            "",
        ]
        base = "fifo" if "fifo" in self.names else self.names[0]
        for name in self.names:
            if name == base:
                continue
            wins, losses = self.versus(name, base)
            out += [f"## {name} against {base}", ""]
            out += [f"- better: {line}" for line in wins] or ["- better: nowhere"]
            out += [f"- worse: {line}" for line in losses] or ["- worse: nowhere"]
            out.append("")
        return "\n".join(out)

    def to_json(self) -> str:
        """The description and every run's metrics, as JSON."""
        return json.dumps(
            {
                "description": self.description,
                "metrics": {
                    name: attrs.asdict(m) for name, m in self.metrics().items()
                },
            },
            indent=1,
            sort_keys=True,
        )

    def draw(self, fig: Any) -> None:  # noqa: ANN401 (a matplotlib Figure)
        """Turn latency distributions (all, short, long turns), and turns done."""
        draw_comparison(fig, self)

    def plot(self, path: str | Path) -> Path:
        """Write the plot as a PNG at ``path``; returns it."""
        import matplotlib as mpl  # noqa: PLC0415  # optional dependency

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415  # after choosing the backend

        fig = plt.figure(figsize=(17, 5.2))
        try:
            self.draw(fig)
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
        return Path(path)


#: The columns of ``Comparison.table``: what each policy completed first.
TABLE_COLUMNS: tuple[str, ...] = (
    "policy",
    "done",
    "mean",
    "p50",
    "p95",
    "p99",
    "short p50",
    "long p95",
    "first wait p50",
    "first wait p95",
    "slowdown",
    "429s",
)


def _seconds(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def _table_row(m: PolicyMetrics) -> tuple[str, ...]:
    return (
        m.policy,
        f"{m.completed}/{m.turns}",
        _seconds(m.latency_mean),
        _seconds(m.latency_p50),
        _seconds(m.latency_p95),
        _seconds(m.latency_p99),
        _seconds(m.short_p50),
        _seconds(m.long_p95),
        _seconds(m.first_wait_p50),
        _seconds(m.first_wait_p95),
        "-" if math.isnan(m.slowdown_mean) else f"{m.slowdown_mean:.2f}",
        str(m.rejections),
    )


def describe(workload: Workload | Scenario) -> str:
    """What a workload is, in one line."""
    if isinstance(workload, Scenario):
        return f"{len(workload.turns)} turns"
    providers = workload.providers
    if len(providers) == 1:
        limits = f"limit {providers[0].limit}"
    else:
        limits = "limits " + ", ".join(f"{p.name} {p.limit}" for p in providers)
    if isinstance(workload.arrivals, Trace):
        return f"{workload.agents} turns of a trace, load {workload.load:.2f}, {limits}"
    return (
        f"{workload.agents} turns of {workload.calls.label} calls, load"
        f" {workload.load:.2f}, {limits}, seed {workload.seed}"
    )


def _runs(
    configs: Mapping[str, DispatcherConfig | PolicyName] | None,
    references: Sequence[PolicyName],
) -> list[tuple[str, PolicyName | DispatcherConfig]]:
    runs: list[tuple[str, PolicyName | DispatcherConfig]] = [
        (policy, check_policy(policy)) for policy in dict.fromkeys(references)
    ]
    for name, config in (configs or {}).items():
        if name in {n for n, _ in runs}:
            raise ValueError(f"a configuration named {name!r} would hide the reference")
        if isinstance(config, DispatcherConfig):
            runs.append((name, attrs.evolve(config, name=name)))
        elif config in POLICIES:
            runs.append((name, config))
        else:
            raise TypeError(
                f"configs must map names to DispatcherConfig or a policy name,"
                f" got {config!r} for {name!r}"
            )
    return runs


async def compare(
    workload: Workload | Scenario,
    configs: Mapping[str, DispatcherConfig | PolicyName] | None = None,
    *,
    references: Sequence[PolicyName] = REFERENCES,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Simulate ``workload`` under the references and ``configs``, one after another.

    In the current trio run, which should use a ``MockClock(autojump_threshold=0)``.
    Every run plays the same turns (the workload is drawn once).

    Args:
        workload: What to play.
        configs: Your configurations by name: ``DispatcherConfig`` values,
            or a policy's name (``"random"``, ``"none"``).
        references: The policies to compare them with, first.
        progress: Called with each run's name as it starts.
    """
    scenario, seed, runs = _plan(workload, configs, references, progress)
    results = [
        (name, await simulate(scenario, policy, seed=seed)) for name, policy in runs
    ]
    return _comparison(workload, results)


def run_comparison(
    workload: Workload | Scenario,
    configs: Mapping[str, DispatcherConfig | PolicyName] | None = None,
    *,
    references: Sequence[PolicyName] = REFERENCES,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """``compare``, each run in a fresh trio run on a ``MockClock``.

    ``progress(name)`` is called as each run starts.
    """
    scenario, seed, runs = _plan(workload, configs, references, progress)
    results = [
        (
            name,
            trio.run(
                functools.partial(simulate, scenario, policy, seed=seed),
                clock=trio.testing.MockClock(autojump_threshold=0),
            ),
        )
        for name, policy in runs
    ]
    return _comparison(workload, results)


def _plan(
    workload: Workload | Scenario,
    configs: Mapping[str, DispatcherConfig | PolicyName] | None,
    references: Sequence[PolicyName],
    progress: Callable[[str], None] | None,
) -> tuple[Scenario, int | None, Iterator[tuple[str, PolicyName | DispatcherConfig]]]:
    """The turns every run plays (drawn once), the seed, and the runs.

    The runs are checked now, and ``progress`` hears of each as it starts.
    """
    runs = _runs(configs, references)
    if isinstance(workload, Workload):
        return workload.scenario(), workload.seed, _announced(runs, progress)
    return workload, None, _announced(runs, progress)


def _announced(
    runs: list[tuple[str, PolicyName | DispatcherConfig]],
    progress: Callable[[str], None] | None,
) -> Iterator[tuple[str, PolicyName | DispatcherConfig]]:
    for name, policy in runs:
        if progress is not None:
            progress(name)
        yield name, policy


def _comparison(
    workload: Workload | Scenario, results: list[tuple[str, SimulationResult]]
) -> Comparison:
    return Comparison(
        describe(workload),
        [attrs.evolve(result, policy=name) for name, result in results],
    )


def _latencies(
    result: SimulationResult, group: str, short_calls: int
) -> tuple[list[float], int]:
    """The sorted latencies of the completed turns of ``group``, and its size."""
    turns = [
        t
        for t in result.turns
        if group == "all"
        or ((t.planned or t.calls) <= short_calls) == (group == "short")
    ]
    return sorted(t.latency for t in turns if t.completed), len(turns)


def draw_comparison(fig: Any, comparison: Comparison) -> None:  # noqa: ANN401 (a matplotlib Figure)
    """Three latency CDFs (all, short and long turns) and the turns each completed.

    A CDF counts every turn of its group, so a policy that dropped turns
    never reaches 100%: it cannot look fastest by dropping the slow ones.
    """
    metrics = comparison.metrics()
    names = ordered(list(metrics))
    others = [
        n
        for n in comparison.names
        if n not in ("fifo", "oldest-first", "random", "none")
    ]
    short_calls = next(iter(metrics.values())).short_calls
    axes = fig.subplots(1, 4, gridspec_kw={"width_ratios": (1, 1, 1, 0.7)})
    titles = {
        "all": "all turns",
        "short": f"short turns (at most {short_calls} calls)",
        "long": f"long turns (more than {short_calls} calls)",
    }
    for ax, group in zip(axes[:3], titles, strict=True):
        values: list[float] = []
        for index, name in enumerate(names):
            latencies, size = _latencies(comparison.result(name), group, short_calls)
            if not size:
                continue
            done = len(latencies) / size
            values += latencies
            ax.step(
                latencies,
                [(i + 1) / size for i in range(len(latencies))],
                where="post",
                label=f"{name} ({done:.0%} done)",
                markevery=(index * 7, max(1, len(latencies) // 8)),
                **style(name, others),
            )
        ax.set_title(f"turn latency, {titles[group]}", fontsize="medium")
        ax.set_xlabel("turn latency, virtual seconds")
        ax.set_ylabel("share of the turns done within")
        ax.set_ylim(0, 1.02)
        if values:
            scale(ax, "x", values)
            ax.legend(fontsize="small", loc="lower right")
        else:
            ax.text(0.5, 0.5, "no such turns", transform=ax.transAxes, ha="center")
        ax.grid(visible=True, alpha=0.3)
    bars = axes[3]
    for index, name in enumerate(names):
        m = metrics[name]
        share = 100 * m.completed / m.turns if m.turns else 0.0
        colour = style(name, others).get("color")
        bars.bar(index, share, color=colour, label=name)
        bars.text(
            index, share, f"{share:.0f}%", ha="center", va="bottom", fontsize="small"
        )
    bars.set_xticks(range(len(names)), names, rotation=20, fontsize="small")
    bars.set_ylim(0, 110)
    bars.set_ylabel("turns completed, % of all")
    bars.set_title("turns completed", fontsize="medium")
    bars.grid(axis="y", alpha=0.3)
    fig.suptitle(comparison.description, fontweight="bold")
    fig.tight_layout()
