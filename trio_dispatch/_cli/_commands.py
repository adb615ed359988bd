"""``trio-dispatch simulate``, ``bench`` and ``serve-fake``."""

from __future__ import annotations

import tempfile
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from .. import _groups
from ._common import (
    UsageError,
    check_outputs,
    figure_png,
    json_bytes,
    maybe_console,
    print_table,
    require,
    run_trio,
    say,
    spinner,
    write_files,
)
from ._workloads import read_configs, read_trace

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from rich.console import Console

    from ..testing import PolicyMetrics, Workload

POLICIES = ("oldest-first", "fifo", "random", "none")
"""The policies ``simulate`` compares, in its default order."""

REFERENCES = ("fifo", "oldest-first")
"""The policies beside a trace or a configuration of one's own."""


def simulate_command(args: argparse.Namespace) -> int:
    check_outputs(path for path in (args.json, args.plot) if path is not None)
    if args.plot is not None:
        require("simulate --plot", ("matplotlib",))

    import trio.testing  # noqa: PLC0415

    from ..testing import compare  # noqa: PLC0415

    workload = simulated_workload(args)
    configs = read_configs(args.config or [])
    own = args.trace is not None or bool(configs)
    policies: list[str] = args.policy or list(REFERENCES if own else POLICIES)
    console = maybe_console()
    with spinner(console, "simulating") as shown:
        # compare in one trio run, where Ctrl+C is a cancellation.
        comparison = run_trio(
            partial(
                compare,
                workload,
                configs,
                references=list(dict.fromkeys(policies)),  # type: ignore[arg-type]  # argparse choices
                progress=lambda name: _show(shown, f"simulating {name}"),
            ),
            clock=trio.testing.MockClock(autojump_threshold=0),
        )
    print_table(console, *comparison.table())
    base = "fifo" if "fifo" in comparison.names else comparison.names[0]
    for name in comparison.names:
        if name != base:
            wins, losses = comparison.versus(name, base)
            say(console, f"{name} against {base}:")
            for word, lines in (("better", wins), ("worse", losses)):
                say(console, f"  {word}: " + ("; ".join(lines) or "nowhere"))
    files: dict[Path, bytes] = {}
    if args.json is not None:
        files[args.json] = json_bytes(
            {name: _plain(m) for name, m in comparison.metrics().items()}
        )
    if args.plot is not None:
        files[args.plot] = figure_png(comparison.draw, (17, 5.2))
    write_files(files)
    for path in files:
        say(console, f"wrote {path}")
    return 0


def _show(status: Any, text: str) -> None:  # noqa: ANN401 (rich's Status, or None)
    if status is not None:
        status.update(text)


def simulated_workload(args: argparse.Namespace) -> Workload:
    """The workload ``simulate`` plays: the trace's, or one drawn from the options."""
    from ..testing import (  # noqa: PLC0415
        CallsPerTurn,
        PoissonArrivals,
        SimProvider,
        Workload,
    )

    capacity = args.capacity if args.capacity is not None else args.limit
    provider = SimProvider("provider", args.limit, capacity=capacity)
    if args.trace is None:
        return Workload(
            agents=args.agents or 2000,
            arrivals=PoissonArrivals(args.load or 0.95),
            providers=(provider,),
            calls=CallsPerTurn(*(args.calls or (1, 8))),
            seed=args.seed,
        )
    if args.calls is not None:
        raise UsageError("--calls does not apply to a trace: its turns have their own")
    workload = read_trace(args.trace, (provider,), args.seed)
    if args.agents is not None:
        if args.agents > workload.agents:
            raise UsageError(
                f"--agents {args.agents}: the trace has only {workload.agents} turns"
            )
        workload = attrs.evolve(workload, agents=args.agents)
    if args.load is not None:
        try:
            workload = workload.at_load(args.load)
        except ValueError as exc:
            raise UsageError(f"--load: {exc}") from None
    return workload


def _plain(metrics: PolicyMetrics) -> dict[str, Any]:
    data: dict[str, Any] = attrs.asdict(metrics)
    return data


# ------------------------------------------------------------------ bench


def bench_command(args: argparse.Namespace) -> int:
    out: Path = args.out / args.name
    check_outputs(folders=[out])
    require(f"bench {args.name}", ("matplotlib",))

    from ..testing import FairnessConfig, SimProvider, run_fairness_sweep  # noqa: PLC0415

    console = maybe_console()
    config = FairnessConfig.quick() if args.quick else FairnessConfig()
    if args.limit is not None and args.trace is None:
        raise UsageError("--limit applies to a sweep of a trace (--trace)")
    if args.trace is not None:
        limit = args.limit or config.limit
        # Read and checked here, before anything runs.
        read_trace(args.trace, (SimProvider("provider", limit),), config.seed)
        config = attrs.evolve(
            config,
            trace=str(args.trace),
            limit=limit,
            policies=tuple(dict.fromkeys(args.policy or REFERENCES)),  # type: ignore[arg-type]  # argparse choices
        )
    elif args.policy:
        config = attrs.evolve(config, policies=tuple(dict.fromkeys(args.policy)))
    points = len(config.points)
    with _bench_progress(console) as bar:
        task = bar.add_task(
            f"fairness sweep ({len(config.policies)} policies): points",
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
