"""``trio-dispatch simulate``, ``bench`` and ``serve-fake``."""

from __future__ import annotations

import tempfile
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _groups
from ._common import (
    UsageError,
    check_outputs,
    json_bytes,
    maybe_console,
    png,
    print_table,
    require,
    run_trio,
    say,
    spinner,
    write_files,
)

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from rich.console import Console

    from ..testing import PolicyMetrics

POLICIES = ("oldest-first", "fifo", "random", "none")
"""The policies ``simulate`` compares, in its default order."""


def simulate_command(args: argparse.Namespace) -> int:
    check_outputs(path for path in (args.json, args.plot) if path is not None)
    if args.plot is not None:
        require("simulate --plot", ("matplotlib",))

    import trio.testing  # noqa: PLC0415

    from ..testing import (  # noqa: PLC0415
        CallsPerTurn,
        PoissonArrivals,
        SimProvider,
        Workload,
        simulate,
    )

    capacity = args.capacity if args.capacity is not None else args.limit
    policies: list[str] = args.policy or list(POLICIES)
    workload = Workload(
        agents=args.agents,
        arrivals=PoissonArrivals(args.load),
        providers=(SimProvider("provider", args.limit, capacity=capacity),),
        calls=CallsPerTurn(*args.calls),
        seed=args.seed,
    )
    console = maybe_console()
    results = {}
    for policy in dict.fromkeys(policies):
        with spinner(console, f"simulating {policy}"):
            # What run_simulation does, with Ctrl+C as a cancellation.
            results[policy] = run_trio(
                partial(simulate, workload, policy),  # type: ignore[arg-type]  # argparse choices
                clock=trio.testing.MockClock(autojump_threshold=0),
            )
    metrics = {policy: result.metrics() for policy, result in results.items()}
    print_table(console, *_metrics_table(metrics, args))
    files: dict[Path, bytes] = {}
    if args.json is not None:
        files[args.json] = json_bytes(
            {policy: _plain(m) for policy, m in metrics.items()}
        )
    if args.plot is not None:
        latencies = {
            policy: sorted(t.latency for t in result.turns if t.completed)
            for policy, result in results.items()
        }
        files[args.plot] = png(lambda axes: _cdf_plot(axes, latencies, args))
    write_files(files)
    for path in files:
        say(console, f"wrote {path}")
    return 0


def _plain(metrics: PolicyMetrics) -> dict[str, Any]:
    from .._converter import unstructure  # noqa: PLC0415

    data: dict[str, Any] = unstructure(metrics)
    return data


def _metrics_table(
    metrics: dict[str, PolicyMetrics], args: argparse.Namespace
) -> tuple[str, tuple[str, ...], list[tuple[str, ...]]]:
    """The metrics as a table's title, columns and rows."""
    low, high = args.calls
    title = (
        f"{args.agents} turns, {low}-{high} calls each, load {args.load:g},"
        f" limit {args.limit}, seed {args.seed} (virtual seconds)"
    )
    columns: tuple[str, ...] = (
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
    rows: list[tuple[str, ...]] = [
        (
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
        for policy, m in metrics.items()
    ]
    return title, columns, rows


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


def bench_command(args: argparse.Namespace) -> int:
    out: Path = args.out / args.name
    check_outputs(folders=[out])
    require(f"bench {args.name}", ("matplotlib",))

    from ..testing import FairnessConfig, run_fairness_sweep  # noqa: PLC0415

    console = maybe_console()
    config = FairnessConfig.quick() if args.quick else FairnessConfig()
    points = len(config.loads) * len(config.shapes)
    with _bench_progress(console) as bar:
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
    say(console, report.to_markdown())
    # Render into a scratch folder first, then move each file whole.
    with tempfile.TemporaryDirectory() as scratch:
        written = report.write(scratch)
        write_files({out / path.name: path.read_bytes() for path in written})
        for path in written:
            say(console, f"wrote {out / path.name}")
    return 0


def _bench_progress(console: Console | None) -> Any:  # noqa: ANN401 (a rich Progress)
    """A live progress line: a bar with counts."""
    if console is None:
        return _NoProgress()
    from rich.progress import (  # noqa: PLC0415 (the demo extra, loaded when used)
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


class _NoProgress:
    """What the benchmark uses of rich's ``Progress``, showing nothing."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def add_task(self, description: str, **fields: object) -> int:
        return 0

    def update(self, task: int, **fields: object) -> None:
        return None


# ------------------------------------------------------------------ serve-fake


def serve_command(args: argparse.Namespace) -> int:
    require("serve-fake", ("hypercorn",))

    import trio  # noqa: PLC0415

    from ..testing import open_fake_llm_server  # noqa: PLC0415

    async def serve() -> None:
        async with open_fake_llm_server(
            host=args.host, port=args.port, api_key=args.api_key
        ) as server:
            # Plain text, flushed: whoever started it may wait for this line.
            print(
                f"fake LLM server at {server.base_url}\n"
                f"  OpenAI-compatible:  base_url={server.openai_base_url}\n"
                f"  Anthropic Messages: base_url={server.anthropic_base_url}\n"
                "Ctrl+C to stop.",
                flush=True,
            )
            await trio.sleep_forever()

    try:
        run_trio(serve)
    except (OSError, BaseExceptionGroup) as exc:
        error = _groups.first(exc, OSError)
        if error is None:
            raise
        raise UsageError(
            f"cannot serve on {args.host}:{args.port}: {error.strerror}"
        ) from None
    return 0
