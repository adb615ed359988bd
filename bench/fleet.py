"""How many concurrent streams one trio process carries at 50 tokens/s.

Usage::

    python bench/fleet.py [--quick] [--rate 50] [--threshold-ms 100]
                          [--client ours|minimal] [--out DIR]

A separate process (``bench/_fleet_server.py``: plain sockets and a
selector, on 127.0.0.1 only, gone when this one closes its stdin or after
280 seconds) answers every chat completion request with a precomputed
OpenAI stream, one chunk per token, each token due ``1/rate`` seconds after
the one before. The first chunk's text is the stream's schedule start on
the monotonic clock every process shares, so the client knows when each
token was due.

The client, this trio process, opens ``N`` streams through
``OpenAIProvider`` and ``wrap_provider`` (each holds a slot of a dispatcher
with limit ``N``), started evenly over a second, and notes for every token
due in the measuring window how late it reached the consumer: arrival
minus due time. **It carries ``N`` streams when no stream fails and the
99th percentile of that lateness is at most ``--threshold-ms``** (100 ms,
five token intervals, by default); past that it has fallen behind: its
event loop is saturated and tokens wait in socket buffers longer and
longer. A few tens of milliseconds of lateness come from the machine alone
(this process waiting for a CPU); the threshold sits well above them. The
report also gives the client's CPU share over the window (process time
over wall time; 100% is one core) and the server's own lateness, which
shows it kept pace: a level where the server's p99 exceeds
``_SERVER_SLACK`` says nothing about the client, and ends the search.

``N`` doubles from ``--start`` until a level falls behind, then the gap is
halved three times; the figure is the largest ``N`` carried. A level takes
about ten seconds (one to start the streams, two of warm-up, a five-second
window, the streams' end), and no level starts after 200 seconds, so the
whole run stays well under five minutes. The machine's load average is in
the report: a busy machine means a run to repeat.

``--client minimal`` runs the same search with a minimal loop (httpx2,
its ``EventSource`` and ``json.loads``, no slot) instead, to show what our layer
costs over real sockets; its report goes to ``fleet-minimal.md``/``.json``.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Final

import attrs
import httpx2
import trio

from trio_dispatch import Provider, open_dispatcher, wrap_provider
from trio_dispatch.messages import ChatMessage, ChatRequest, TextDelta
from trio_dispatch.providers import OpenAIProvider, ProviderError

from _common import command_line, environment, finish_in, load_average, show_progress

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

SERVER: Final = pathlib.Path(__file__).resolve().parent / "_fleet_server.py"
_REQUEST: Final = ChatRequest([ChatMessage("user", "Stream a long answer.")])
# The server's own p99 lateness past which a level says nothing about us.
_SERVER_SLACK: Final = 0.010
QUICK_LEVELS: Final = (2, 4)
CLIENTS: Final = ("ours", "minimal")


def _check_positive(value: object, name: str) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@attrs.frozen
class Level:
    """One concurrency level: ``streams`` streams at once, and how it went.

    Attributes:
        streams: Concurrent streams.
        carried: Whether every stream completed and the p99 lateness was
            within the threshold.
        tokens: Tokens due in the measuring window (lateness samples).
        late_p50_ms: Median lateness of those tokens at the consumer.
        late_p99_ms: 99th percentile lateness.
        late_max_ms: The latest token.
        cpu_share: The client's process time over wall time in the window
            (1.0 is one core busy).
        cpu_us_per_token: ``cpu_share`` over the tokens due per second: the
            client's CPU microseconds per token.
        failed: Streams that raised.
        server_p99_ms: The server's own p99 lateness in sending tokens.
        server_cpu_share: The server's CPU share over the level.
    """

    streams: int
    carried: bool
    tokens: int
    late_p50_ms: float
    late_p99_ms: float
    late_max_ms: float
    cpu_share: float
    cpu_us_per_token: float
    failed: int
    server_p99_ms: float
    server_cpu_share: float


@attrs.frozen
class Timing:
    """How a level runs: tokens per second, and its phases in seconds."""

    rate: float = attrs.field(validator=lambda _, a, v: _check_positive(v, a.name))
    stagger: float = attrs.field(validator=lambda _, a, v: _check_positive(v, a.name))
    warmup: float = attrs.field(validator=lambda _, a, v: _check_positive(v, a.name))
    window: float = attrs.field(validator=lambda _, a, v: _check_positive(v, a.name))

    @property
    def tokens(self) -> int:
        """Tokens per stream: enough to outlast the window."""
        return math.ceil((self.stagger + self.warmup + self.window + 0.5) * self.rate)


@attrs.frozen
class FleetReport:
    """The search's result and every level it ran.

    Attributes:
        client: ``ours`` or ``minimal``.
        carried: The most concurrent streams carried (0 if none were).
        threshold_ms: The p99 lateness that counts as falling behind.
        timing: Rate and phases.
        levels: In the order they ran.
        inconclusive: Why the search stopped early, if it did.
        environment: Interpreter, library versions, machine and load.
    """

    client: str
    carried: int
    threshold_ms: float
    timing: Timing
    levels: tuple[Level, ...]
    inconclusive: str | None
    environment: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return attrs.asdict(self, recurse=True)

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as markdown."""
        env, timing = self.environment, self.timing
        lines = [
            f"Fleet capacity: trio-dispatch {env['trio_dispatch']}, trio {env['trio']},"
            f" httpx2 {env['httpx2']}, {env['python']} on {env['platform']},"
            f" {env['cpus']} CPUs. Load average {env['load_before']} before,"
            f" {env['load_after']} after.",
            f"OpenAI streams at {timing.rate:g} tokens/s through "
            + (
                "`OpenAIProvider` and a dispatcher slot each"
                if self.client == "ours"
                else "a minimal loop (httpx2 + its EventSource + json.loads)"
            )
            + ", from a paced server in another process"
            f" on loopback; streams start over {timing.stagger:g} s, then"
            f" {timing.warmup:g} s of warm-up and a {timing.window:g} s window."
            f" Carried: no stream fails and tokens reach the consumer at most"
            f" {self.threshold_ms:g} ms after they were due, at p99.",
            "",
            f"**One process carries {self.carried:,} concurrent streams**"
            f" ({self.carried * timing.rate:,.0f} tokens/s).",
            "",
            "| Streams | Carried | Lateness p50 (ms) | p99 (ms) | max (ms)"
            " | Client CPU | CPU µs per token | Failed | Server p99 (ms)"
            " | Server CPU |",
            "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for level in sorted(self.levels, key=lambda level: level.streams):
            lines.append(
                f"| {level.streams:,} | {'yes' if level.carried else 'no'}"
                f" | {level.late_p50_ms:,.1f} | {level.late_p99_ms:,.1f}"
                f" | {level.late_max_ms:,.1f} | {level.cpu_share:.0%}"
                f" | {level.cpu_us_per_token:,.0f}"
                f" | {level.failed} | {level.server_p99_ms:,.1f}"
                f" | {level.server_cpu_share:.0%} |"
            )
        if self.inconclusive:
            lines += ["", f"Stopped early: {self.inconclusive}."]
        return "\n".join(lines) + "\n"


def _quantile(ordered: Sequence[float], q: float) -> float:
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class _Clock:
    """Notes how late each token of one stream reached the consumer."""

    __slots__ = ("anchor", "index", "interval", "lateness", "window")

    def __init__(
        self, interval: float, window: tuple[float, float], lateness: list[float]
    ) -> None:
        self.interval = interval
        self.window = window
        self.lateness = lateness
        self.index = -1
        self.anchor = 0.0

    def token(self, text: str) -> None:
        now = time.monotonic()
        self.index += 1
        if self.index == 0:
            self.anchor = float(text)  # the schedule's start, from the server
            return
        due = self.anchor + self.index * self.interval
        if self.window[0] <= due < self.window[1]:
            self.lateness.append(now - due)


async def _ours(limited: Provider, clock: _Clock) -> None:
    async with limited.stream(_REQUEST) as events:
        async for event in events:
            if type(event) is TextDelta:
                clock.token(event.text)


async def _minimal(client: httpx2.AsyncClient, url: str, clock: _Clock) -> None:
    async with client.stream("POST", url, json={}) as response:
        async for sse in httpx2.EventSource(response):
            if sse.data == "[DONE]":
                continue
            choices = json.loads(sse.data)["choices"]
            content = choices[0]["delta"].get("content") if choices else None
            if content:
                clock.token(content)


async def _level(
    port: int, streams: int, timing: Timing, client_kind: str
) -> tuple[list[float], float, int]:
    """Run one level: the lateness samples, the client's CPU share, failures."""
    interval = 1.0 / timing.rate
    lateness: list[float] = []
    failed = 0
    start = time.monotonic()
    window = (
        start + timing.stagger + timing.warmup,
        start + timing.stagger + timing.warmup + timing.window,
    )
    cpu: list[float] = []

    async def probe() -> None:
        await trio.sleep(max(0.0, window[0] - time.monotonic()))
        marks = time.process_time(), time.monotonic()
        await trio.sleep(max(0.0, window[1] - time.monotonic()))
        cpu.append((time.process_time() - marks[0]) / (time.monotonic() - marks[1]))

    async def one(i: int) -> None:
        nonlocal failed
        await trio.sleep(timing.stagger * i / streams)
        clock = _Clock(interval, window, lateness)
        try:
            if client_kind == "minimal":
                await _minimal(client, f"{base_url}/chat/completions", clock)
            else:
                await _ours(limited, clock)
        except (ProviderError, httpx2.HTTPError):
            failed += 1

    base_url = f"http://127.0.0.1:{port}/v1"
    client = httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=0),
        timeout=httpx2.Timeout(10.0, read=30.0),
    )
    async with (
        OpenAIProvider(
            "fleet",
            base_url=base_url,
            api_key="fleet",
            model="fleet",
            client=client,
            read_timeout=30.0,
        ) as provider,
        client,
        open_dispatcher({provider.id: streams}) as dispatcher,
    ):
        limited = wrap_provider(provider, dispatcher)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            for i in range(streams):
                nursery.start_soon(one, i)
    return lateness, cpu[0], failed


class _ServerProcess:
    """The paced server in its own process, and the pipe that asks it for figures."""

    def __init__(self, timing: Timing, lifetime: float) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                "--rate",
                repr(timing.rate),
                "--tokens",
                str(timing.tokens),
                "--lifetime",
                repr(lifetime),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def report(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("report\n")
        self.process.stdin.flush()
        data: dict[str, Any] = json.loads(self.process.stdout.readline())
        return data

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


def _run_level(
    server: _ServerProcess,
    streams: int,
    timing: Timing,
    threshold: float,
    client_kind: str,
) -> Level:
    server.report()  # start the server's figures afresh
    samples, cpu_share, failed = trio.run(
        _level, server.port, streams, timing, client_kind
    )
    served = server.report()
    ordered = sorted(samples)
    p99 = _quantile(ordered, 0.99) if ordered else math.inf
    return Level(
        streams=streams,
        carried=failed == 0 and bool(ordered) and p99 <= threshold,
        tokens=len(ordered),
        late_p50_ms=1e3 * _quantile(ordered, 0.5) if ordered else math.inf,
        late_p99_ms=1e3 * p99,
        late_max_ms=1e3 * ordered[-1] if ordered else math.inf,
        cpu_share=cpu_share,
        cpu_us_per_token=1e6 * cpu_share / (streams * timing.rate),
        failed=failed,
        server_p99_ms=served["late_p99_ms"],
        server_cpu_share=served["cpu_share"],
    )


def run(
    *,
    timing: Timing,
    threshold_ms: float = 100.0,
    start: int = 100,
    largest: int = 6400,
    levels: Sequence[int] | None = None,
    client: str = "ours",
    progress: Callable[[str], None] | None = None,
) -> FleetReport:
    """Find the most streams one process carries; see the module notes.

    Args:
        timing: Rate and phases of every level.
        client: ``ours`` (``OpenAIProvider`` through slots) or ``minimal``
            (httpx2, its ``EventSource`` and ``json.loads``, for comparison).
        threshold_ms: The p99 lateness that counts as falling behind.
        start: The first level; levels double from there.
        largest: Never try more streams than this.
        levels: Run exactly these levels instead of searching.
        progress: Called with a short line per level.
    """
    _check_positive(threshold_ms, "threshold_ms")
    for value, name in ((start, "start"), (largest, "largest")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    threshold = threshold_ms / 1e3
    lifetime = 280.0
    load_before = load_average()
    ran: list[Level] = []
    inconclusive: str | None = None
    server = _ServerProcess(timing, lifetime)
    began = time.monotonic()
    try:

        def attempt(streams: int) -> Level | None:
            nonlocal inconclusive
            level = _run_level(server, streams, timing, threshold, client)
            ran.append(level)
            if progress is not None:
                progress(
                    f"{streams} streams: p99 {level.late_p99_ms:.1f} ms,"
                    f" CPU {level.cpu_share:.0%}, server p99"
                    f" {level.server_p99_ms:.1f} ms"
                )
            if level.server_p99_ms > 1e3 * _SERVER_SLACK:
                inconclusive = (
                    f"at {streams} streams the server fell behind"
                    f" (p99 {level.server_p99_ms:.1f} ms)"
                )
                return None
            return level

        if levels is not None:
            for streams in levels:
                if attempt(streams) is None:
                    break
        else:
            _search(attempt, start, largest, lambda: time.monotonic() - began > 200)
    finally:
        server.close()
    best = max((level.streams for level in ran if level.carried), default=0)
    loads = {"load_before": load_before, "load_after": load_average()}
    return FleetReport(
        client=client,
        carried=best,
        threshold_ms=threshold_ms,
        timing=timing,
        levels=tuple(ran),
        inconclusive=inconclusive,
        environment=environment(httpx2=True) | loads,
    )


def _search(
    attempt: Callable[[int], Level | None],
    start: int,
    largest: int,
    late: Callable[[], bool],
) -> None:
    """Double from ``start`` until a level is not carried, then halve the gap.

    ``attempt`` returns ``None`` when a level says nothing (the search
    stops); ``late`` says when to stop for time.
    """
    carried, failed = 0, 0
    streams = start
    while streams <= largest and not late():
        level = attempt(streams)
        if level is None:
            return
        if not level.carried:
            failed = streams
            break
        carried, streams = streams, streams * 2
    for _ in range(3):
        if not failed or not carried or late():
            return
        middle = (carried + failed) // 2
        level = attempt(middle)
        if level is None:
            return
        if level.carried:
            carried = middle
        else:
            failed = middle


def main(argv: Sequence[str] | None = None) -> int:
    """Run the search, print its table and write its reports."""
    parser = command_line(__doc__, quick="two tiny levels (tests)", out="fleet")
    parser.add_argument("--rate", type=float, default=50.0, help="tokens per second")
    parser.add_argument(
        "--threshold-ms", type=float, default=100.0, help="p99 lateness allowed"
    )
    parser.add_argument("--start", type=int, default=100, help="the first level")
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="ours",
        help="our provider through slots, or the minimal loop to compare",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.quick:
        timing = Timing(rate=args.rate, stagger=0.1, warmup=0.2, window=0.4)
        report = run(
            timing=timing,
            threshold_ms=args.threshold_ms,
            levels=QUICK_LEVELS,
            client=args.client,
            progress=show_progress,
        )
    else:
        timing = Timing(rate=args.rate, stagger=1.0, warmup=2.0, window=5.0)
        report = run(
            timing=timing,
            threshold_ms=args.threshold_ms,
            start=args.start,
            client=args.client,
            progress=show_progress,
        )
    name = "fleet" if args.client == "ours" else f"fleet-{args.client}"
    finish_in(report, args.out, name, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
