"""The ``trio-dispatch`` command.

::

    trio-dispatch demo         a fleet of agents through the dispatcher, over HTTP
    trio-dispatch simulate     one virtual-time simulation, policies side by side
    trio-dispatch bench NAME   a benchmark: fairness (policies under load, swept)
    trio-dispatch serve-fake   the fake LLM server on its own

Bad options exit with status 2 and a one-line reason, before anything runs:
sizes have upper bounds (shown in ``--help``), and every output path is
checked (a folder that exists or can be made, writable, and not a folder
where a file goes) without creating anything. Files are written only when
a run has finished, each one whole (written beside its target, then renamed
into place), so a failed or interrupted run leaves nothing half-written; the
demo interrupted during its second (FIFO) run writes what its first run
measured, and says the comparison is incomplete.

Ctrl+C stops any command with status 130 and one line on stderr.

``demo`` needs the ``demo`` extra (rich, matplotlib, hypercorn), and so do
plots (``simulate --plot``, ``bench fairness``); ``serve-fake`` needs the
``testing`` extra (hypercorn). Without rich, the others print plain text. A
command missing a package it needs says, in one line and before it starts,
which extra to install (status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import signal
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from . import __version__, _groups
from ._util import needs_extra
from ._validation import (
    check_count,
    check_fraction,
    check_limit,
    check_positive_number,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    import trio
    from rich.console import Console

    from ._demo import DemoReport, Progress
    from .testing import PolicyMetrics

_T = TypeVar("_T")

_POLICIES = ("oldest-first", "fifo", "random", "none")
_BENCHMARKS = ("fairness",)

# Upper bounds for sizes: far past what a demo or a simulation is for, yet
# small enough that a slip of the keyboard fails at once instead of building
# a billion-entry list. The demo runs in real time over real sockets, and
# its providers' HTTP clients pool at most 100 connections, so a limit past
# that would only queue inside the client.
_MAX_DEMO_AGENTS = 1000
_MAX_DEMO_TURNS = 100
_MAX_DEMO_CALLS = 20
_MAX_DEMO_LIMIT = 100
_MAX_SIM_AGENTS = 100_000
_MAX_SIM_CALLS = 100
_MAX_SIM_LIMIT = 10_000
_MAX_JOBS = 64


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


def _accepted(
    check: Callable[[float, str], object], high: float = math.inf
) -> Callable[[float], bool]:
    """An ``ok`` for ``_parsed``: the API's own ``check`` passes, and ``<= high``.

    The same rules as the Python API, so the command line and the classes
    it builds cannot disagree; the usage error says it in option terms.
    """

    def ok(value: float) -> bool:
        try:
            check(value, "value")
        except ValueError:
            return False
        return value <= high

    return ok


def _count(high: int) -> Callable[[str], int]:
    """An option type: an integer from 1 to ``high``."""

    def count(text: str) -> int:
        return _parsed(
            text, int, _accepted(check_limit, high), f"an integer from 1 to {high}"
        )

    return count


def _non_negative_int(text: str) -> int:
    return _parsed(text, int, _accepted(check_count), "a non-negative integer")


def _load(text: str) -> float:
    return _parsed(
        text,
        float,
        _accepted(check_positive_number, 10),
        "a load above 0 and at most 10",
    )


def _fraction(text: str) -> float:
    return _parsed(text, float, _accepted(check_fraction), "a number from 0 to 1")


def _calls_range(text: str) -> tuple[int, int]:
    def split(text: str) -> tuple[int, int]:
        low, _, high = text.partition("-")
        return int(low), int(high or low)

    return _parsed(
        text,
        split,
        lambda calls: 1 <= calls[0] <= calls[1] <= _MAX_SIM_CALLS,
        f"calls per turn as LOW-HIGH with 1 <= LOW <= HIGH <= {_MAX_SIM_CALLS},"
        " such as 1-8",
    )


def _port(text: str) -> int:
    return _parsed(text, int, lambda n: 0 <= n <= 65535, "a port from 0 to 65535")


def _api_key(text: str) -> str:
    # Clients' keys are stripped and must be non-empty, so such a key would
    # answer every request 401. The message never repeats the key.
    if not text or text != text.strip():
        raise argparse.ArgumentTypeError(
            "expected a non-empty key without leading or trailing whitespace"
        )
    return text


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in one line: the reason, and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trio-dispatch",
        description="Oldest-agent-first concurrency limits for LLM providers, as trio actors.",
    )
    parser.add_argument(
        "--version", action="version", version=f"trio-dispatch {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a fleet of agents through the dispatcher against fake LLM servers",
        description=(
            "Start two fake LLM servers on loopback (OpenAI and Anthropic wire"
            " formats), run a fleet of agent conversations with tools through"
            " one dispatcher (oldest-first), then the same fleet behind a plain"
            " FIFO limiter against the same scripted servers; show live"
            " progress, and end with both runs side by side."
        ),
    )
    demo.add_argument(
        "--agents",
        type=_count(_MAX_DEMO_AGENTS),
        default=100,
        help=f"conversations, 1 to {_MAX_DEMO_AGENTS} (default 100)",
    )
    demo.add_argument(
        "--turns",
        type=_count(_MAX_DEMO_TURNS),
        default=1,
        help=f"questions per agent, 1 to {_MAX_DEMO_TURNS} (default 1)",
    )
    demo.add_argument(
        "--max-calls",
        type=_count(_MAX_DEMO_CALLS),
        default=8,
        help=f"longest tool loop, in LLM calls, 1 to {_MAX_DEMO_CALLS} (default 8)",
    )
    demo.add_argument(
        "--limit-openai",
        type=_count(_MAX_DEMO_LIMIT),
        default=6,
        help="concurrent streams to the OpenAI-style server,"
        f" 1 to {_MAX_DEMO_LIMIT} (default 6)",
    )
    demo.add_argument(
        "--limit-anthropic",
        type=_count(_MAX_DEMO_LIMIT),
        default=4,
        help="concurrent streams to the Anthropic-style server,"
        f" 1 to {_MAX_DEMO_LIMIT} (default 4)",
    )
    demo.add_argument(
        "--load",
        type=_load,
        default=1.0,
        help="arrival rate as a fraction of capacity (default 1)",
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
        type=_count(_MAX_SIM_AGENTS),
        default=2000,
        help=f"turns to simulate, 1 to {_MAX_SIM_AGENTS} (default 2000)",
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
        help=f"LLM calls per turn, LOW-HIGH, at most {_MAX_SIM_CALLS} (default 1-8)",
    )
    simulate.add_argument(
        "--limit",
        type=_count(_MAX_SIM_LIMIT),
        default=8,
        help=f"the provider's limit, 1 to {_MAX_SIM_LIMIT} (default 8)",
    )
    simulate.add_argument(
        "--capacity",
        type=_count(_MAX_SIM_LIMIT),
        default=None,
        help="the provider's own capacity, past which it answers 429,"
        f" 1 to {_MAX_SIM_LIMIT} (default: the limit)",
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
        help="benchmark fairness under load, policy against policy",
        description=(
            "Run the fairness sweep: seeded workloads at several loads and"
            " turn shapes, in virtual time, under every policy; write its"
            " report (JSON, markdown, plots)."
        ),
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
        type=_count(_MAX_JOBS),
        default=1,
        help=f"processes to run sweep points in, 1 to {_MAX_JOBS} (default 1)",
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
        "--api-key",
        type=_api_key,
        default=None,
        help="the only key accepted, non-empty (default: any non-empty key)",
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
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        # trio.run raises Ctrl+C's KeyboardInterrupt inside an exception
        # group when it unwinds nurseries; anything else in the group is a
        # real error, and keeps its traceback.
        if not _groups.only(exc, KeyboardInterrupt):
            raise
        print("trio-dispatch: interrupted", file=sys.stderr)
        return 130
    except _UsageError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except _Failure as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except _MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 1


class _UsageError(Exception):
    """Options that parse but cannot work: nothing has run yet (status 2)."""


class _Failure(Exception):
    """A run that could not finish its job, such as writing its files (status 1)."""


class _MissingExtra(Exception):
    """A package the command needs is not installed (status 1)."""


def _run_trio(
    async_fn: Callable[[], Awaitable[_T]], *, clock: trio.abc.Clock | None = None
) -> _T:
    """``trio.run(async_fn)``, where Ctrl+C cancels the run.

    trio's own Ctrl+C raises KeyboardInterrupt in whatever code happens to
    be running, and code we do not own may take it for something else:
    hypercorn takes one in its tasks as its cue to stop, and swallows it,
    so ``serve-fake`` slept on with no server left, and the demo lost one
    in a request's handler and went on. Here SIGINT arrives as a message
    instead and cancels the run, which every task knows how to end; once
    everything has unwound, KeyboardInterrupt is raised from here. Pressing
    Ctrl+C again while the run unwinds changes nothing.

    If SIGINT is not Python's default handler (ignored, as in a background
    job, or taken by whoever called us), it is left alone, as trio does.

    Raises:
        KeyboardInterrupt: Ctrl+C came while ``async_fn`` ran.
    """
    import trio  # noqa: PLC0415

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return trio.run(async_fn, clock=clock)
    interrupted = False

    async def cancelled_by_ctrl_c() -> _T:
        # The receiver is open before anything else starts, so that no
        # task of the run ever sees a KeyboardInterrupt of its own.
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def cancel_on_ctrl_c() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        nursery.cancel_scope.cancel()

                nursery.start_soon(cancel_on_ctrl_c)
                result = await async_fn()
                nursery.cancel_scope.cancel()
        # Even if async_fn finished in the same moment: the user asked to
        # stop, and must not see the command go on to write its files.
        if interrupted:
            raise KeyboardInterrupt
        return result

    return trio.run(cancelled_by_ctrl_c, clock=clock)


# Which extra brings each optional package; ``demo`` includes ``testing``.
_EXTRAS = {"hypercorn": "testing", "matplotlib": "demo", "rich": "demo"}


def _require(what: str, modules: Sequence[str]) -> None:
    """Refuse to start ``what`` unless every one of ``modules`` imports.

    The message names the one extra that brings all of them.
    """
    if not all(map(_importable, modules)):
        extra = "demo" if any(_EXTRAS[m] == "demo" for m in modules) else "testing"
        raise _MissingExtra(needs_extra(f"trio-dispatch {what}", extra))


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ files


def _check_outputs(files: Iterable[Path] = (), folders: Iterable[Path] = ()) -> None:
    """Refuse, before any work, outputs that could not be written.

    A file must not be a folder, nor named twice; its folder (and each
    output folder) must be a writable directory, or else missing with its
    nearest existing ancestor a writable directory, so it can be made.
    Nothing is created here.
    """
    seen: set[Path] = set()
    for path in files:
        if path.is_dir():
            raise _UsageError(f"cannot write {path}: it is a directory")
        if (resolved := path.resolve()) in seen:
            raise _UsageError(f"cannot write {path} twice")
        seen.add(resolved)
        _check_folder(path.parent, path)
    for folder in folders:
        _check_folder(folder, folder)


def _check_folder(folder: Path, target: Path) -> None:
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise _UsageError(f"cannot write {target}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _UsageError(f"cannot write {target}: {existing} is not writable")


def _write_files(files: dict[Path, bytes]) -> None:
    """Write every file whole: each beside its target, then renamed in place.

    If one cannot be written, the run fails with one line, and what was
    staged and the folders made for it are removed again.
    """
    # mkstemp makes files private (0600); give them the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    made: list[Path] = []
    staged: list[tuple[str, Path]] = []
    path = Path()
    try:
        for path in files:
            _make_folders(path.parent, made)
        for path, data in files.items():
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            staged.append((temporary, path))
            os.chmod(temporary, 0o666 & ~umask)
        for temporary, path in staged:
            os.replace(temporary, path)
        staged.clear()
        made.clear()
    except OSError as exc:
        raise _Failure(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)
        for folder in reversed(made):
            # Only if still empty: a file renamed into it before the failure stays.
            with contextlib.suppress(OSError):
                folder.rmdir()


def _make_folders(folder: Path, made: list[Path]) -> None:
    """Make ``folder`` and its missing parents, adding each one made to ``made``."""
    missing: list[Path] = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        each.mkdir()
        made.append(each)


def _json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def _console() -> Console:
    from rich.console import Console  # noqa: PLC0415 (the demo extra, loaded when used)

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped or captured: tables as wide as they need, not 80 columns.
        console.width = 160
    return console


def _maybe_console() -> Console | None:
    """rich's console if rich is installed, else ``None``: plain output."""
    return _console() if _importable("rich") else None


def _say(console: Console | None, text: str) -> None:
    """Print ``text`` as it is (never as markup), with rich or without."""
    if console is None:
        print(text, flush=True)
    else:
        console.print(text, markup=False)


def _print_table(
    console: Console | None,
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
) -> None:
    """A table, first column to the left and the rest to the right."""
    rows = list(rows)
    if console is not None:
        from rich.table import Table  # noqa: PLC0415 (the demo extra, loaded when used)

        table = Table(title=title)
        for index, column in enumerate(columns):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    widths = [max(map(len, cells)) for cells in zip(columns, *rows, strict=True)]
    lines = [title]
    for first, *rest in (columns, *rows):
        cells = [first.ljust(widths[0])]
        cells += [
            cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    print("\n".join(lines), flush=True)


def _status(
    console: Console | None, text: str
) -> contextlib.AbstractContextManager[object]:
    """rich's spinner with ``text`` while the block runs; nothing without rich."""
    return contextlib.nullcontext() if console is None else console.status(text)


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


def _figure_png(
    draw: Callable[[Any], None], size: tuple[float, float] = (12, 6.5)
) -> bytes:
    """Draw with matplotlib on a fresh, empty figure; return the PNG bytes."""
    import io  # noqa: PLC0415

    import matplotlib  # noqa: PLC0415 (the demo extra, loaded when used)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure = plt.figure(figsize=size)
    try:
        draw(figure)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()
    finally:
        plt.close(figure)


# ------------------------------------------------------------------ demo


def _run_demo(args: argparse.Namespace) -> int:
    outputs = (args.out / "demo.json", args.out / "demo.png")
    _check_outputs(outputs)
    _require("demo", ("rich", "matplotlib", "hypercorn"))

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
    console = _console()
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
        console.print(_demo_table(partial_report))
        console.print(
            "Interrupted during the FIFO run: the comparison is incomplete;"
            " the oldest-first run's figures are kept."
        )
        _write_demo(console, outputs, partial_report)
        raise
    console.print(_demo_table(report))
    console.print(_verdict(report))
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
        outputs[0]: _json_bytes(report.to_dict()),
        outputs[1]: _figure_png(lambda figure: _demo_plot(figure, report), (13, 7.5)),
    }
    _write_files(files)
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
        return _run_trio(partial(run_demo, options, on_run=on_run))
    with Live(console=console, refresh_per_second=10, transient=True) as display:

        def show(progress: Progress) -> None:
            display.update(_progress_table(progress))

        return _run_trio(partial(run_demo, options, on_progress=show, on_run=on_run))


def _progress_table(progress: Progress) -> Any:  # noqa: ANN401 (a rich renderable)
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
        rows = {
            name: ProviderRow(
                limit=provider.limit,
                in_use=provider.in_flight,
                waiting=provider.waiting,
                paused=provider.paused,
            )
            for name, provider in stats.providers.items()
        }
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
    from .testing._metrics import percentile  # noqa: PLC0415 (the demo's own import)

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


def _demo_table(report: DemoReport) -> Any:  # noqa: ANN401 (a rich renderable)
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


def _verdict(report: DemoReport) -> str:
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


def _demo_plot(figure: Any, report: DemoReport) -> None:  # noqa: ANN401 (matplotlib Figure)
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
                times, means = _binned(points, column, width, run.duration)
                axes.step(
                    times,
                    means,
                    where="post",
                    color=colour,
                    linewidth=1.4,
                    label=RUNS[run.name],
                )
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
                f"slots in use and calls waiting (means over {width:.2g} s)",
                loc="left",
            )
            waiting.legend(loc="upper left", fontsize="small", ncols=2)
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


def _binned(
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
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        colour = _RUN_COLOURS[run.name]
        axes.step(values, fractions, where="post", color=colour, label=RUNS[run.name])
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


def _run_simulate(args: argparse.Namespace) -> int:
    _check_outputs(path for path in (args.json, args.plot) if path is not None)
    if args.plot is not None:
        _require("simulate --plot", ("matplotlib",))

    import trio.testing  # noqa: PLC0415

    from .testing import (  # noqa: PLC0415
        CallsPerTurn,
        PoissonArrivals,
        SimProvider,
        Workload,
        simulate,
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
    console = _maybe_console()
    results = {}
    for policy in dict.fromkeys(policies):
        with _status(console, f"simulating {policy}"):
            # What run_simulation does, with Ctrl+C as a cancellation.
            results[policy] = _run_trio(
                partial(simulate, workload, policy),  # type: ignore[arg-type]  # argparse choices
                clock=trio.testing.MockClock(autojump_threshold=0),
            )
    metrics = {policy: result.metrics() for policy, result in results.items()}
    _print_table(console, *_metrics_table(metrics, args))
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
        _say(console, f"wrote {path}")
    return 0


def _plain(metrics: PolicyMetrics) -> dict[str, Any]:
    from ._converter import unstructure  # noqa: PLC0415

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


def _run_bench(args: argparse.Namespace) -> int:
    out: Path = args.out / args.name
    _check_outputs(folders=[out])
    _require(f"bench {args.name}", ("matplotlib",))

    from .testing import FairnessConfig, run_fairness_sweep  # noqa: PLC0415

    console = _maybe_console()
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
    _say(console, report.to_markdown())
    # Render into a scratch folder first, then move each file whole.
    with tempfile.TemporaryDirectory() as scratch:
        written = report.write(scratch)
        _write_files({out / path.name: path.read_bytes() for path in written})
        for path in written:
            _say(console, f"wrote {out / path.name}")
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


def _run_serve(args: argparse.Namespace) -> int:
    _require("serve-fake", ("hypercorn",))

    import trio  # noqa: PLC0415

    from .testing import open_fake_llm_server  # noqa: PLC0415

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
        _run_trio(serve)
    except (OSError, BaseExceptionGroup) as exc:
        error = _groups.first(exc, OSError)
        if error is None:
            raise
        raise _UsageError(
            f"cannot serve on {args.host}:{args.port}: {error.strerror}"
        ) from None
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
