"""The latency ``dispatcher.transport()`` adds to one official SDK call.

Usage::

    python bench/transport_latency.py [--calls N] [--warmup N] [--json PATH]

Prints p50/p99 of the time to first chunk and to stream end, direct and
through the transport, as a markdown table on stdout (progress goes to
stderr). With ``--json``, writes the report to ``PATH``. Needs the
``testing`` extra (hypercorn) and the ``openai`` SDK. The report in
``bench/reports/`` comes from::

    python bench/transport_latency.py --calls 400 --json bench/reports/transport.json > bench/reports/transport.md

``run_transport_benchmark`` streams the same small answer from the fake
LLM server on loopback with ``openai.AsyncOpenAI`` (``max_retries=0``),
``calls`` times on an ``httpx2.AsyncClient`` of its own (direct) and
``calls`` times on one whose transport is ``dispatcher.transport("openai")``
around the same kind of inner transport (a slot of an uncontended
dispatcher taken before the request and given back after the stream), in
one ``trio.run`` against one server.

Method. The two paths alternate (direct then through the transport, then
the other way round, ...), after ``warmup`` untimed calls of each, so drift
in the machine or the server affects both alike. Each call is timed with
``time.perf_counter`` from just before ``chat.completions.create`` to its
first chunk (time to first chunk) and to just after the stream's block is
left, the response closed and the slot given back (time to stream end).
The report gives p50 and p99 of each path, the difference of those
percentiles, and the median of the per-pair differences (transport minus
its neighbouring direct call): the added latency. On a busy machine expect
the p99 to wander.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import httpx2
import openai
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    open_fake_llm_server,
)

from _common import (
    AddedLatency,
    command_line,
    count,
    count_option,
    environment,
    finish,
    latency_table,
    plain,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Callable

_REPLY_TEXT: Final = "one two three four five six seven eight"
_MESSAGES: Final[list[Any]] = [{"role": "user", "content": "Say eight words."}]


@final
@attrs.frozen
class TransportBenchReport:
    """The results of ``run_transport_benchmark``.

    Attributes:
        calls: Timed calls per path.
        warmup: Untimed calls per path before them.
        limit: The dispatcher's limit for the provider (never reached: one
            call at a time).
        first_chunk: Time to first chunk.
        stream_end: Time to stream end (response closed, slot given back).
        environment: Interpreter, library versions and machine.
    """

    calls: int
    warmup: int
    limit: int
    first_chunk: AddedLatency
    stream_end: AddedLatency
    environment: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return plain(self)

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as a markdown table, in microseconds."""
        env = self.environment
        lines = [
            f"Latency added by dispatcher.transport() per openai SDK call:"
            f" trio-dispatch {env['trio_dispatch']}, trio {env['trio']},"
            f" httpx2 {env['httpx2']}, openai {env['openai']},"
            f" {env['python']} on {env['platform']}, {env['cpus']} CPUs.",
            f"{self.calls:,} calls per path against the fake LLM server on loopback,"
            f" interleaved, after {self.warmup} warm-up calls each; µs.",
            "",
            *latency_table(
                "Transport",
                [
                    ("Time to first chunk", self.first_chunk),
                    ("Time to stream end", self.stream_end),
                ],
            ),
        ]
        return "\n".join(lines) + "\n"


async def _time_call(client: openai.AsyncOpenAI) -> tuple[float, float]:
    """Seconds to the first chunk and to the end of one streamed completion."""
    start = time.perf_counter()
    first = math.nan
    stream = await client.chat.completions.create(
        model="fake", messages=_MESSAGES, stream=True
    )
    async with stream:
        async for _ in stream:
            if math.isnan(first):
                first = time.perf_counter() - start
    end = time.perf_counter() - start
    if math.isnan(first):
        raise RuntimeError("benchmark went wrong: a stream had no chunks")
    return first, end


async def _measure(
    calls: int, warmup: int, limit: int, progress: Callable[[str], None]
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    script = FakeScript(default=FakeReply(text=_REPLY_TEXT))
    direct: list[tuple[float, float]] = []
    through: list[tuple[float, float]] = []
    async with (
        open_fake_llm_server(script) as server,
        open_dispatcher({"openai": limit}) as dispatcher,
        httpx2.AsyncClient() as direct_http,
        httpx2.AsyncClient(transport=dispatcher.transport("openai")) as held_http,
    ):
        plain_client, held_client = (
            openai.AsyncOpenAI(
                api_key="bench",
                base_url=server.openai_base_url,
                http_client=http,
                max_retries=0,
            )
            for http in (direct_http, held_http)
        )
        progress(f"warm-up: {warmup} calls per path")
        for _ in range(warmup):
            await _time_call(plain_client)
            await _time_call(held_client)
        step = max(1, calls // 10)
        for i in range(calls):
            if i % step == 0:
                progress(f"calls {i + 1}-{min(i + step, calls)} of {calls}")
            if i % 2 == 0:
                direct.append(await _time_call(plain_client))
                through.append(await _time_call(held_client))
            else:
                through.append(await _time_call(held_client))
                direct.append(await _time_call(plain_client))
        stats = dispatcher.statistics().providers["openai"]
        expected = warmup + calls
        if (
            stats.granted_total != expected
            or stats.in_flight != 0
            or server.statistics().requests_total != 2 * expected
        ):
            raise RuntimeError("benchmark went wrong: calls went missing")
    return direct, through


def _ignore(_message: str) -> None:
    pass


def run_transport_benchmark(
    *,
    calls: int = 1_000,
    warmup: int = 50,
    limit: int = 8,
    progress: Callable[[str], None] | None = None,
) -> TransportBenchReport:
    """Measure the latency ``dispatcher.transport()`` adds to an SDK call.

    Runs its own ``trio.run`` (call it outside trio) with the fake LLM
    server on loopback; needs the ``testing`` extra (hypercorn) and openai.

    Args:
        calls: Timed calls per path (direct, through the transport).
        warmup: Untimed calls per path first.
        limit: The dispatcher's limit for the provider.
        progress: Called with a short line now and then.
    """
    calls = count(calls, "calls")
    warmup = count(warmup, "warmup", zero=True)
    limit = count(limit, "limit")
    gc.collect()
    with warnings.catch_warnings():
        # The openai SDK leaves the async generators under a stream unclosed
        # when it stops at [DONE], with or without the transport; trio warns
        # when they are collected.
        warnings.filterwarnings(
            "ignore",
            message=r"Async generator '(openai|httpx2|httpcore2)\.",
            category=ResourceWarning,
        )
        direct, through = trio.run(_measure, calls, warmup, limit, progress or _ignore)
    return TransportBenchReport(
        calls=calls,
        warmup=warmup,
        limit=limit,
        first_chunk=AddedLatency.from_samples(
            [first for first, _ in direct], [first for first, _ in through]
        ),
        stream_end=AddedLatency.from_samples(
            [end for _, end in direct], [end for _, end in through]
        ),
        environment=_environment(),
    )


def _environment() -> dict[str, str]:
    """``environment()`` with the HTTP client's and the SDK's versions."""
    found = environment()
    return {
        "python": found["python"],
        "trio": found["trio"],
        "httpx2": httpx2.__version__,
        "openai": openai.__version__,
        **{key: found[key] for key in ("trio_dispatch", "platform", "cpus")},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = command_line(__doc__)
    parser.add_argument(
        "--calls",
        type=count_option(),
        default=1_000,
        help="timed calls per path (default 1000)",
    )
    parser.add_argument(
        "--warmup",
        type=count_option(zero=True),
        default=50,
        help="untimed calls per path first (default 50)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_transport_benchmark(
        calls=args.calls, warmup=args.warmup, progress=show_progress
    )
    finish(report, json_path=args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
