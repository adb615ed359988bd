"""The ``trio-dispatch`` command.

::

    trio-dispatch demo         a fleet of agents through the dispatcher, over HTTP
    trio-dispatch simulate     one virtual-time simulation, policies side by side
    trio-dispatch bench NAME   the benchmarks: fairness, handoff, http, or all
    trio-dispatch serve-fake   the fake LLM server on its own

Bad options exit with status 2 and a one-line reason, before anything runs.
Files are written only when a run has finished, each one whole (written
beside its target, then renamed into place), so a failed or interrupted run
leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from rich.console import Console

    from ._demo import DemoReport, Progress
    from .testing import PolicyMetrics

_T = TypeVar("_T")

_POLICIES = ("oldest-first", "fifo", "random", "none")
_BENCHMARKS = ("fairness", "handoff", "http", "all")


# ------------------------------------------------------------------ options


def _parsed(
    text: str, convert: Callable[[str], _T], ok: Callable[[_T], bool], expected: str
) -> _T:
    """``convert(text)`` if it works and ``ok`` accepts it, else a usage error."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _parsed(text, int, lambda n: n >= 1, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _parsed(text, int, lambda n: n >= 0, "a non-negative integer")


def _load(text: str) -> float:
    return _parsed(
        text,
        float,
        lambda x: math.isfinite(x) and 0 < x <= 10,
        "a load above 0 and at most 10",
    )


def _fraction(text: str) -> float:
    return _parsed(text, float, lambda x: 0 <= x <= 1, "a number from 0 to 1")


def _calls_range(text: str) -> tuple[int, int]:
    def split(text: str) -> tuple[int, int]:
        low, _, high = text.partition("-")
        return int(low), int(high or low)

    return _parsed(
        text,
        split,
        lambda calls: 1 <= calls[0] <= calls[1],
        "calls per turn as LOW-HIGH with 1 <= LOW <= HIGH, such as 1-8",
    )


def _port(text: str) -> int:
    return _parsed(text, int, lambda n: 0 <= n <= 65535, "a port from 0 to 65535")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-dispatch",
        description="Oldest-agent-first concurrency limits for LLM providers, as trio actors.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a fleet of agents through the dispatcher against fake LLM servers",
        description=(
            "Start two fake LLM servers on loopback (OpenAI and Anthropic wire"
            " formats), run a fleet of agent conversations with tools through"
            " one dispatcher, show live progress, and end with a summary."
        ),
    )
    demo.add_argument(
        "--agents", type=_positive_int, default=60, help="conversations (default 60)"
    )
    demo.add_argument(
        "--turns", type=_positive_int, default=3, help="questions per agent (default 3)"
    )
    demo.add_argument(
        "--max-calls",
        type=_positive_int,
        default=4,
        help="longest tool loop, in LLM calls (default 4)",
    )
    demo.add_argument(
        "--limit-openai",
        type=_positive_int,
        default=4,
        help="concurrent streams to the OpenAI-style server (default 4)",
    )
    demo.add_argument(
        "--limit-anthropic",
        type=_positive_int,
        default=3,
        help="concurrent streams to the Anthropic-style server (default 3)",
    )
    demo.add_argument(
        "--load",
        type=_load,
        default=0.9,
        help="arrival rate as a fraction of capacity (default 0.9)",
    )
    demo.add_argument(
        "--rate-limits",
        type=_fraction,
        default=0.02,
        help="share of requests answered 429 (default 0.02)",
    )
    demo.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("demo-results"),
        help="folder for demo.json and demo.png (default demo-results)",
    )
    demo.add_argument(
        "--no-live", action="store_true", help="no live display, only the summary"
    )
    demo.set_defaults(run=_run_demo)

    simulate = commands.add_parser(
        "simulate",
        help="simulate agents in virtual time and compare scheduling policies",
        description=(
            "Run one seeded workload in virtual time through the real dispatcher"
            " under each policy, and print the metrics side by side."
        ),
    )
    simulate.add_argument(
        "--agents",
        type=_positive_int,
        default=2000,
        help="turns to simulate (default 2000)",
    )
    simulate.add_argument(
        "--load",
        type=_load,
        default=0.95,
        help="offered load, fraction of capacity (default 0.95)",
    )
    simulate.add_argument(
        "--calls",
        type=_calls_range,
        default=(1, 8),
        help="LLM calls per turn, LOW-HIGH (default 1-8)",
    )
    simulate.add_argument(
        "--limit",
        type=_positive_int,
        default=8,
        help="the provider's limit (default 8)",
    )
    simulate.add_argument(
        "--capacity",
        type=_positive_int,
        default=None,
        help="the provider's own capacity, past which it answers 429 (default: the limit)",
    )
    simulate.add_argument(
        "--policy",
        choices=_POLICIES,
        action="append",
        help="a policy to run; repeat for several (default: all)",
    )
    simulate.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    simulate.add_argument(
        "--json", type=Path, default=None, help="write the metrics as JSON here"
    )
    simulate.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a PNG of the latency distribution here",
    )
    simulate.set_defaults(run=_run_simulate)

    bench = commands.add_parser(
        "bench",
        help="run the benchmarks",
        description="Run a benchmark (or all of them) and write its results.",
    )
    bench.add_argument("name", choices=_BENCHMARKS, help="which benchmark")
    bench.add_argument(
        "--quick", action="store_true", help="smaller sizes, for a first look"
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        help="results folder (default bench/results)",
    )
    bench.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="processes for the fairness sweep (default 1)",
    )
    bench.set_defaults(run=_run_bench)

    serve = commands.add_parser(
        "serve-fake",
        help="serve the fake LLM server on loopback until interrupted",
        description="Serve the fake LLM server (both wire formats) until Ctrl+C.",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=_port, default=8000, help="port (default 8000; 0 picks one)"
    )
    serve.add_argument(
        "--api-key", default=None, help="the only key accepted (default: any)"
    )
    serve.set_defaults(run=_run_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except _UsageError as exc:
        parser.error(str(exc))  # exits 2


class _UsageError(Exception):
    """Options that parse but do not fit together."""


# ------------------------------------------------------------------ files


def _write_files(files: dict[Path, bytes]) -> None:
    """Write every file whole: each beside its target, then renamed in place."""
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp makes files private (0600); give them the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            staged.append((temporary, path))
            os.chmod(temporary, 0o666 & ~umask)
        for temporary, path in staged:
            os.replace(temporary, path)
        staged.clear()
    finally:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)


def _json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def _console() -> Console:
    from rich.console import Console  # noqa: PLC0415 (the demo extra, loaded when used)

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped or captured: tables as wide as they need, not 80 columns.
        console.width = 160
    return console


def _png(draw: Callable[[Any], None]) -> bytes:
    """Draw with matplotlib on a fresh figure and return the PNG bytes."""
    import io  # noqa: PLC0415

    import matplotlib  # noqa: PLC0415 (the demo extra, loaded when used)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(8, 4.5))
    try:
        draw(axes)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(figure)


# ------------------------------------------------------------------ demo


def _run_demo(args: argparse.Namespace) -> int:
    import trio  # noqa: PLC0415

    from ._demo import DemoOptions, run_demo  # noqa: PLC0415

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
    console = _console()
    console.print(
        f"[bold]trio-dispatch demo[/]: {options.agents} agents x {options.turns} turns,"
        f" limits openai={options.limit_openai} anthropic={options.limit_anthropic},"
        f" load {options.load:g}, seed {options.seed}"
    )
    if args.no_live or not console.is_terminal:
        report = trio.run(run_demo, options)
    else:
        report = _with_live_display(console, options)
    console.print(_demo_table(report))
    failed = report.turns_failed
    within = all(p.server_peak_in_flight <= p.limit for p in report.providers)
    console.print(
        f"{report.turns_completed} turns completed, {failed} failed,"
        f" in {report.duration:.1f} s."
    )
    console.print(
        "The servers' peak concurrency never exceeded the limits."
        if within
        else "[red]A server saw more concurrent requests than its limit.[/]"
    )
    files = {
        args.out / "demo.json": _json_bytes(report.to_dict()),
        args.out / "demo.png": _png(lambda axes: _demo_plot(axes, report)),
    }
    _write_files(files)
    for path in files:
        console.print(f"wrote {path}")
    ok = failed == 0 and within
    return 0 if ok else 1


def _with_live_display(console: Console, options: Any) -> DemoReport:  # noqa: ANN401 (DemoOptions, imported lazily)
    import trio  # noqa: PLC0415
    from rich.live import Live  # noqa: PLC0415

    from ._demo import run_demo  # noqa: PLC0415

    with Live(console=console, refresh_per_second=10, transient=True) as live:

        def show(progress: Progress) -> None:
            live.update(_progress_table(progress))

        return trio.run(lambda: run_demo(options, on_progress=show))


def _progress_table(progress: Progress) -> Any:  # noqa: ANN401 (a rich renderable)
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        title=f"turns {progress.turns_done}/{progress.turns_total}"
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
    stats = progress.statistics
    if stats is not None:
        for name, provider in stats.providers.items():
            table.add_row(
                name,
                "none" if provider.limit is None else str(provider.limit),
                "#" * provider.in_flight + f" {provider.in_flight}",
                str(provider.waiting),
                "yes" if provider.paused else "",
                str(progress.server_in_flight.get(name, 0)),
            )
    return table


def _demo_table(report: DemoReport) -> Any:  # noqa: ANN401 (a rich renderable)
    from rich.table import Table  # noqa: PLC0415

    table = Table(title="turn latency (seconds) and what the servers saw")
    table.add_column("provider", no_wrap=True)
    for column in ("turns", "p50", "p95", "p99", "max", "calls", "retries", "429s"):
        table.add_column(column, justify="right")
    table.add_column("peak/limit", justify="right", no_wrap=True)
    for p in report.providers:
        table.add_row(
            p.provider,
            str(p.turns),
            f"{p.turn_latency_p50:.2f}",
            f"{p.turn_latency_p95:.2f}",
            f"{p.turn_latency_p99:.2f}",
            f"{p.turn_latency_max:.2f}",
            str(p.llm_calls),
            str(p.retries),
            str(p.rate_limited),
            f"{p.server_peak_in_flight}/{p.limit}",
        )
    return table


def _demo_plot(axes: Any, report: DemoReport) -> None:  # noqa: ANN401 (matplotlib Axes)
    for name, values in report.turn_latencies.items():
        if values:
            axes.hist(values, bins=20, alpha=0.6, label=f"{name} ({len(values)} turns)")
    axes.set_xlabel("turn latency (s)")
    axes.set_ylabel("turns")
    axes.set_title("trio-dispatch demo: turn latency per provider")
    axes.legend()


# ------------------------------------------------------------------ simulate


def _run_simulate(args: argparse.Namespace) -> int:
    from .testing import (  # noqa: PLC0415
        CallsPerTurn,
        PoissonArrivals,
        SimProvider,
        Workload,
        run_simulation,
    )

    capacity = args.capacity if args.capacity is not None else args.limit
    policies: list[str] = args.policy or list(_POLICIES)
    workload = Workload(
        agents=args.agents,
        arrivals=PoissonArrivals(args.load),
        providers=(SimProvider("provider", args.limit, capacity=capacity),),
        calls=CallsPerTurn(*args.calls),
        seed=args.seed,
    )
    console = _console()
    results = {}
    for policy in dict.fromkeys(policies):
        with console.status(f"simulating {policy}"):
            results[policy] = run_simulation(workload, policy)  # type: ignore[arg-type]  # argparse choices
    metrics = {policy: result.metrics() for policy, result in results.items()}
    console.print(_metrics_table(metrics, args))
    files: dict[Path, bytes] = {}
    if args.json is not None:
        files[args.json] = _json_bytes(
            {policy: _plain(m) for policy, m in metrics.items()}
        )
    if args.plot is not None:
        latencies = {
            policy: sorted(t.latency for t in result.turns if t.completed)
            for policy, result in results.items()
        }
        files[args.plot] = _png(lambda axes: _cdf_plot(axes, latencies, args))
    _write_files(files)
    for path in files:
        console.print(f"wrote {path}")
    return 0


def _plain(metrics: PolicyMetrics) -> dict[str, Any]:
    from ._converter import unstructure  # noqa: PLC0415

    data: dict[str, Any] = unstructure(metrics)
    return data


def _metrics_table(metrics: dict[str, PolicyMetrics], args: argparse.Namespace) -> Any:  # noqa: ANN401 (a rich renderable)
    from rich.table import Table  # noqa: PLC0415

    low, high = args.calls
    table = Table(
        title=(
            f"{args.agents} turns, {low}-{high} calls each, load {args.load:g},"
            f" limit {args.limit}, seed {args.seed} (virtual seconds)"
        )
    )
    columns = (
        "policy",
        "mean",
        "p50",
        "p95",
        "p99",
        "max",
        "Jain",
        "max wait",
        "util",
        "done",
        "429s",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, m in metrics.items():
        table.add_row(
            policy,
            f"{m.latency_mean:.1f}",
            f"{m.latency_p50:.1f}",
            f"{m.latency_p95:.1f}",
            f"{m.latency_p99:.1f}",
            f"{m.latency_max:.1f}",
            f"{m.fairness:.2f}",
            f"{m.max_slot_wait:.1f}",
            f"{m.utilisation:.2f}",
            str(m.completed),
            str(m.rejections),
        )
    return table


def _cdf_plot(
    axes: Any,  # noqa: ANN401 (matplotlib Axes)
    latencies: dict[str, list[float]],
    args: argparse.Namespace,
) -> None:
    for policy, values in latencies.items():
        if values:
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            axes.plot(values, fractions, label=policy)
    axes.set_xscale("log")
    axes.set_xlabel("turn latency (virtual s, log scale)")
    axes.set_ylabel("fraction of completed turns")
    axes.set_title(f"turn latency CDF at load {args.load:g}")
    axes.grid(visible=True, alpha=0.3)
    axes.legend()


# ------------------------------------------------------------------ bench


def _run_bench(args: argparse.Namespace) -> int:
    names = ("handoff", "http", "fairness") if args.name == "all" else (args.name,)
    console = _console()
    ok = True
    for name in names:
        ok &= _BENCH_RUNNERS[name](args, console)
    return 0 if ok else 1


def _bench_progress(console: Console, *, counted: bool = False) -> Any:  # noqa: ANN401 (a rich Progress)
    """A live progress line: a bar with counts when the total is known."""
    from rich.progress import (  # noqa: PLC0415 (the demo extra, loaded when used)
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    counts = (BarColumn(), MofNCompleteColumn()) if counted else ()
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        *counts,
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _bench_handoff(args: argparse.Namespace, console: Console) -> bool:
    from .benchmarks import run_handoff_benchmarks  # noqa: PLC0415

    with _bench_progress(console) as bar:
        task = bar.add_task("hand-off benchmarks")
        report = run_handoff_benchmarks(
            quick=args.quick,
            progress=lambda message: bar.update(
                task, description=f"hand-off: {message}"
            ),
        )
    markdown = report.to_markdown()
    console.print(markdown, markup=False)
    out: Path = args.out / "handoff"
    _write_files(
        {
            out / "handoff.json": (report.to_json() + "\n").encode(),
            out / "handoff.md": markdown.encode(),
        }
    )
    console.print(f"wrote {out / 'handoff.json'} and {out / 'handoff.md'}")
    return report.all_met


def _bench_http(args: argparse.Namespace, console: Console) -> bool:
    from .benchmarks import run_http_benchmark  # noqa: PLC0415

    with _bench_progress(console) as bar:
        task = bar.add_task("HTTP benchmark")
        report = run_http_benchmark(
            calls=100 if args.quick else 400,
            progress=lambda message: bar.update(task, description=f"http: {message}"),
        )
    markdown = report.to_markdown()
    console.print(markdown, markup=False)
    out: Path = args.out / "http"
    _write_files(
        {
            out / "http.json": (report.to_json() + "\n").encode(),
            out / "http.md": markdown.encode(),
        }
    )
    console.print(f"wrote {out / 'http.json'} and {out / 'http.md'}")
    return True


def _bench_fairness(args: argparse.Namespace, console: Console) -> bool:
    from .benchmarks import FairnessConfig, run_fairness_sweep  # noqa: PLC0415

    config = FairnessConfig.quick() if args.quick else FairnessConfig()
    points = len(config.loads) * len(config.shapes)
    with _bench_progress(console, counted=True) as bar:
        task = bar.add_task(
            f"fairness sweep ({len(config.policies)} policies,"
            f" {config.agents} turns each): points",
            total=points,
        )
        report = run_fairness_sweep(
            config,
            jobs=args.jobs,
            progress=lambda done, _total: bar.update(task, completed=done),
        )
    console.print(report.to_markdown(), markup=False)
    out: Path = args.out / "fairness"
    # Render into a scratch folder first, then move each file whole.
    with tempfile.TemporaryDirectory() as scratch:
        written = report.write(scratch)
        _write_files({out / path.name: path.read_bytes() for path in written})
        for path in written:
            console.print(f"wrote {out / path.name}")
    return True


_BENCH_RUNNERS: dict[str, Callable[[argparse.Namespace, Console], bool]] = {
    "handoff": _bench_handoff,
    "http": _bench_http,
    "fairness": _bench_fairness,
}


# ------------------------------------------------------------------ serve-fake


def _run_serve(args: argparse.Namespace) -> int:
    import trio  # noqa: PLC0415

    from .testing import open_fake_llm_server  # noqa: PLC0415

    console = _console()

    async def serve() -> None:
        async with open_fake_llm_server(
            host=args.host, port=args.port, api_key=args.api_key
        ) as server:
            console.print(f"fake LLM server at {server.base_url}")
            console.print(f"  OpenAI-compatible:  base_url={server.openai_base_url}")
            console.print(f"  Anthropic Messages: base_url={server.anthropic_base_url}")
            console.print("Ctrl+C to stop.")
            await trio.sleep_forever()

    try:
        trio.run(serve)
    except (OSError, BaseExceptionGroup) as exc:
        error = _find(exc, OSError)
        if error is None:
            raise
        raise _UsageError(
            f"cannot serve on {args.host}:{args.port}: {error.strerror}"
        ) from None
    return 0


def _find(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first ``kind`` in ``exc``, looking inside exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _find(inner, kind)) is not None:
                return found
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
