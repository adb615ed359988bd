"""The parser of the ``trio-dispatch`` command, and its entry point."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from .. import __version__, _groups
from .._validation import check_fraction, check_limit, check_positive_number
from . import _commands, _demo_command
from ._common import Failure, MissingExtra, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_T = TypeVar("_T")

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


def _count_option(
    parser: argparse.ArgumentParser, flag: str, high: int, default: int, what: str
) -> None:
    """Add ``flag``, an integer from 1 to ``high``; its help says so."""
    parser.add_argument(
        flag,
        type=_count(high),
        default=default,
        help=f"{what}, 1 to {high} (default {default})",
    )


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


def build_parser() -> argparse.ArgumentParser:
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
    _count_option(demo, "--agents", _MAX_DEMO_AGENTS, 100, "conversations")
    _count_option(demo, "--turns", _MAX_DEMO_TURNS, 1, "questions per agent")
    _count_option(
        demo, "--max-calls", _MAX_DEMO_CALLS, 8, "longest tool loop, in LLM calls"
    )
    _count_option(
        demo,
        "--limit-openai",
        _MAX_DEMO_LIMIT,
        6,
        "concurrent streams to the OpenAI-style server",
    )
    _count_option(
        demo,
        "--limit-anthropic",
        _MAX_DEMO_LIMIT,
        4,
        "concurrent streams to the Anthropic-style server",
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
    demo.set_defaults(run=_demo_command.demo_command)

    simulate = commands.add_parser(
        "simulate",
        help="simulate agents in virtual time and compare scheduling policies",
        description=(
            "Run one seeded workload (or the turns of a trace) in virtual time"
            " through the real dispatcher under each policy and each"
            " configuration of your own, and print them side by side: the"
            " turns each completed beside its latency, and where each does"
            " worse than FIFO as plainly as where it does better."
        ),
    )
    simulate.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="play the turns of this JSON Lines trace file (see the manual)",
    )
    simulate.add_argument(
        "--config",
        action="append",
        metavar="SPEC",
        help="a dispatcher configuration of your own to run beside FIFO and"
        " oldest-first: a JSON file of open_dispatcher options, or FILE.py:NAME"
        " or MODULE:NAME naming a DispatcherConfig; repeat for several",
    )
    simulate.add_argument(
        "--agents",
        type=_count(_MAX_SIM_AGENTS),
        default=None,
        help=f"turns to simulate, 1 to {_MAX_SIM_AGENTS} (default 2000; with"
        " --trace, its first turns)",
    )
    simulate.add_argument(
        "--load",
        type=_load,
        default=None,
        help="offered load, fraction of capacity (default 0.95; with --trace,"
        " its arrivals sped up or slowed to this load, default as recorded)",
    )
    simulate.add_argument(
        "--calls",
        type=_calls_range,
        default=None,
        help=f"LLM calls per turn, LOW-HIGH, at most {_MAX_SIM_CALLS} (default"
        " 1-8; not with --trace)",
    )
    _count_option(simulate, "--limit", _MAX_SIM_LIMIT, 8, "the provider's limit")
    simulate.add_argument(
        "--capacity",
        type=_count(_MAX_SIM_LIMIT),
        default=None,
        help="the provider's own capacity, past which it answers 429,"
        f" 1 to {_MAX_SIM_LIMIT} (default: the limit)",
    )
    simulate.add_argument(
        "--policy",
        choices=_commands.POLICIES,
        action="append",
        help="a policy to run; repeat for several (default: all, or fifo and"
        " oldest-first beside --trace or --config)",
    )
    simulate.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    simulate.add_argument(
        "--json", type=Path, default=None, help="write the metrics as JSON here"
    )
    simulate.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a PNG of the latency distributions here",
    )
    simulate.set_defaults(run=_commands.simulate_command)

    bench = commands.add_parser(
        "bench",
        help="benchmark fairness under load, policy against policy",
        description=(
            "Run the fairness sweep: seeded workloads at several loads and"
            " turn shapes (or a trace of your own at several loads), in"
            " virtual time, under every policy; write its report (JSON,"
            " markdown, plots)."
        ),
    )
    bench.add_argument("name", choices=_BENCHMARKS, help="which benchmark")
    bench.add_argument(
        "--quick", action="store_true", help="smaller sizes, for a first look"
    )
    bench.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="sweep the turns of this JSON Lines trace file instead, sped up"
        " or slowed to each load",
    )
    bench.add_argument(
        "--limit",
        type=_count(_MAX_SIM_LIMIT),
        default=None,
        help=f"with --trace, the provider's limit and capacity, 1 to {_MAX_SIM_LIMIT}"
        " (default 8)",
    )
    bench.add_argument(
        "--policy",
        choices=_commands.POLICIES,
        action="append",
        help="a policy to run; repeat for several (default: all, or fifo and"
        " oldest-first with --trace)",
    )
    bench.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        help="results folder (default bench/results)",
    )
    _count_option(bench, "--jobs", _MAX_JOBS, 1, "processes to run sweep points in")
    bench.set_defaults(run=_commands.bench_command)

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
    serve.set_defaults(run=_commands.serve_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
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
    except UsageError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Failure as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except MissingExtra as exc:
        print(exc, file=sys.stderr)
        return 1
