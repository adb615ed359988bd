"""Mixed, heavy-tailed turns: where oldest-first loses, and priority classes as the fix.

Usage::

    python bench/mixed_classes.py [--agents N] [--seed S] [--out DIR] [--write-trace PATH]

Real agent traffic is mixed: chat turns of one or two LLM calls beside
agent runs of twenty to forty. One provider of 16 slots at 95% load, calls
lognormal (mean 2 s), tool steps exponential (mean 1 s), seed 20240501 (or
``--seed``; heavy tails make the figures vary from seed to seed), in
virtual time through the real dispatcher (``run_comparison``):

1. oldest-first against FIFO on uniform turns (1 to 8 calls) and on the
   mixed ones (80% of 1 to 2 calls, 20% of 20 to 40): turn p50, p95, p99
   and mean slowdown, as ratios to FIFO's;
2. on the mixed turns, the short turns (at most 2 calls) in priority class
   1 (what an application gives its interactive turns), at several
   ``priority_aging``: the short turns' median and the long turns' p95
   against FIFO's.

Prints the markdown report and writes it, and the JSON, to
``DIR/mixed_classes.md`` and ``DIR/mixed_classes.json`` (``bench/reports``
by default). With ``--write-trace PATH`` it only writes the mixed turns as
a JSON Lines trace (short turns of tenant ``chat``, long ones of tenant
``agents``), for ``trio-dispatch simulate --trace``. Virtual time: the same
figures on any machine.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from typing import TYPE_CHECKING, Any

import attrs

from trio_dispatch.testing import (
    CallsPerTurn,
    DispatcherConfig,
    PoissonArrivals,
    Scenario,
    SimProvider,
    Workload,
    run_comparison,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trio_dispatch.testing import Comparison, PolicyMetrics, TurnSpec

MIXED = CallsPerTurn.mixture((0.8, CallsPerTurn(1, 2)), (0.2, CallsPerTurn(20, 40)))
UNIFORM = CallsPerTurn(1, 8)
SHORT = 2  # calls: a chat turn
AGINGS = (10.0, 60.0, 600.0, 1e9)


def workload(calls: CallsPerTurn, agents: int, seed: int = 20240501) -> Workload:
    """The seeded workload of one shape: 16 slots, 95% load."""
    return Workload(
        agents=agents,
        arrivals=PoissonArrivals(0.95),
        providers=(SimProvider("provider", 16, capacity=16),),
        calls=calls,
        seed=seed,
    )


def short_first(turn: TurnSpec) -> int:
    """Class 1 for the short turns, as an application would mark its chat turns."""
    return 1 if len(turn.calls) <= SHORT else 0


def chat_or_agents(scenario: Scenario) -> Scenario:
    """The same turns, the short ones of tenant ``chat``, the rest ``agents``."""
    return attrs.evolve(
        scenario,
        turns=[
            attrs.evolve(t, tenant="chat" if short_first(t) else "agents")
            for t in scenario.turns
        ],
    )


def _aging(seconds: float) -> str:
    return "strict" if seconds >= 1e9 else f"{seconds:g} s"


def _ratio(ours: float | None, fifo: float | None) -> float:
    if ours is None or not fifo:
        return float("nan")
    return ours / fifo


def run(agents: int, seed: int = 20240501) -> dict[str, Any]:
    """Both parts of the benchmark; the report as plain data."""
    shapes = {}
    for label, calls in (("uniform 1-8", UNIFORM), ("80% 1-2, 20% 20-40", MIXED)):
        comparison = run_comparison(workload(calls, agents, seed))
        shapes[label] = comparison
    classes = run_comparison(
        workload(MIXED, agents, seed),
        {
            f"short turns class 1, aging {_aging(aging)}": DispatcherConfig(
                {"priority_aging": aging}, priority=short_first
            )
            for aging in AGINGS
        },
    )
    return {"agents": agents, "seed": seed, "shapes": shapes, "classes": classes}


def _figures(m: PolicyMetrics) -> dict[str, Any]:
    return {
        "completed": m.completed,
        "turns": m.turns,
        "p50": m.latency_p50,
        "p95": m.latency_p95,
        "p99": m.latency_p99,
        "short_p50": m.short_p50,
        "long_p95": m.long_p95,
        "first_wait_p95": m.first_wait_p95,
        "slowdown_mean": m.slowdown_mean,
    }


def to_json(report: dict[str, Any]) -> str:
    """The report's figures as JSON."""
    comparisons: dict[str, Comparison] = {
        **report["shapes"],
        "classes": report["classes"],
    }
    return json.dumps(
        {
            "agents": report["agents"],
            "seed": report["seed"],
            "runs": {
                label: {n: _figures(m) for n, m in c.metrics().items()}
                for label, c in comparisons.items()
            },
        },
        indent=1,
        sort_keys=True,
    )


def to_markdown(report: dict[str, Any]) -> str:
    """The two tables, then the classes' full comparison."""
    out = [
        "# Mixed turns and priority classes",
        "",
        f"{report['agents']} agent turns per run, one provider with limit 16 (and"
        " the same capacity), 95% load, calls lognormal (mean 2 s), tools"
        f" exponential (mean 1 s), seed {report['seed']}. Virtual seconds.",
        "",
        "| workload (calls per turn) | oldest-first vs FIFO: turn p50 | p95 | p99"
        " | mean slowdown | short turns' p50 | done (both) |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for label, comparison in report["shapes"].items():
        metrics = comparison.metrics()
        ours, fifo = metrics["oldest-first"], metrics["fifo"]
        out.append(
            f"| {label} | {ours.latency_p50 / fifo.latency_p50:.2f}"
            f" | {ours.latency_p95 / fifo.latency_p95:.2f}"
            f" | {ours.latency_p99 / fifo.latency_p99:.2f}"
            f" | {ours.slowdown_mean / fifo.slowdown_mean:.2f}"
            f" | {_ratio(ours.short_p50, fifo.short_p50):.2f}"
            f" | {ours.completed}/{ours.turns}, {fifo.completed}/{fifo.turns} |"
        )
    classes: Comparison = report["classes"]
    metrics = classes.metrics()
    fifo = metrics["fifo"]
    out += [
        "",
        "On the mixed turns, the short ones (at most 2 calls) in priority class 1:",
        "",
        "| run | short turns' p50 (vs FIFO) | long turns' p95 (vs FIFO) | turn p95"
        " | first-call wait p95 | mean slowdown | done |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for name, m in metrics.items():
        out.append(
            f"| {name} | {m.short_p50:.1f} s ({_ratio(m.short_p50, fifo.short_p50):.2f}x)"
            f" | {m.long_p95:.1f} s ({_ratio(m.long_p95, fifo.long_p95):.2f}x)"
            f" | {m.latency_p95:.1f} s | {m.first_wait_p95:.1f} s"
            f" | {m.slowdown_mean:.2f} | {m.completed}/{m.turns} |"
        )
    out += ["", classes.to_markdown().replace("# ", "## ", 1)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or write the trace) and write its report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--agents", type=int, default=10_000, help="turns per run (default 10000)"
    )
    parser.add_argument(
        "--seed", type=int, default=20240501, help="the workloads' seed"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(__file__).parent / "reports",
        help="where to write the report",
    )
    parser.add_argument(
        "--write-trace",
        type=pathlib.Path,
        default=None,
        help="only write the mixed turns as a JSON Lines trace here",
    )
    args = parser.parse_args(argv)
    if args.write_trace is not None:
        scenario = chat_or_agents(workload(MIXED, args.agents, args.seed).scenario())
        scenario.write_trace(args.write_trace)
        print(f"wrote {len(scenario.turns)} turns to {args.write_trace}")
        return 0
    report = run(args.agents, args.seed)
    markdown = to_markdown(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mixed_classes.md").write_text(markdown, encoding="utf-8")
    (args.out / "mixed_classes.json").write_text(
        to_json(report) + "\n", encoding="utf-8"
    )
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
