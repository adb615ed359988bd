"""The latency trio-dispatch adds to one LLM call, over loopback HTTP.

Usage::

    python bench/http_latency.py [--calls N] [--warmup N] [--json PATH]

Prints p50/p99 of the time to first event and to stream end, direct and
wrapped, as a markdown table on stdout (progress goes to stderr). With
``--json``, writes the report to ``PATH``. Needs the ``testing`` extra
(hypercorn). The report in ``bench/reports/`` comes from::

    python bench/http_latency.py --calls 400 --json bench/reports/http.json > bench/reports/http.md

``run_http_benchmark`` streams the same small answer from the fake LLM
server on loopback, ``calls`` times straight through an ``OpenAIProvider``
and ``calls`` times through ``wrap_provider`` (a slot of an uncontended
dispatcher taken before the request and given back after the stream), in
one ``trio.run``, one HTTP client and one server for both.

Method. The two paths alternate (direct then wrapped, then wrapped then
direct, ...), after ``warmup`` untimed calls of each, so drift in the
machine, the connection pool or the server affects both alike. Each call
is timed with ``time.perf_counter`` from just before ``stream()`` is
entered to its first event (time to first event) and to just after its
block is left, the response closed and (wrapped) the slot given back
(time to stream end). The report gives p50 and p99 of each path, the
difference of those percentiles, and the median of the per-pair
differences (wrapped minus its neighbouring direct call): the added
latency. It measures the dispatcher's overhead, not a provider's speed; on
a busy machine expect the p99 to wander.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from trio_dispatch import open_dispatcher, wrap_provider
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import OpenAIProvider
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

    from trio_dispatch import Provider

_REPLY_TEXT: Final = "one two three four five six seven eight"


@final
@attrs.frozen
class HttpBenchReport:
    """The results of ``run_http_benchmark``.

    Attributes:
        calls: Timed calls per path.
        warmup: Untimed calls per path before them.
        limit: The dispatcher's limit for the provider (never reached: one
            call at a time).
        first_event: Time to first event.
        stream_end: Time to stream end (response closed, slot given back).
        environment: Interpreter, library versions and machine.
    """

    calls: int
    warmup: int
    limit: int
    first_event: AddedLatency
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
            f"Latency added by the dispatcher per LLM call: trio-dispatch"
            f" {env['trio_dispatch']}, trio {env['trio']}, httpx2 {env['httpx2']},"
            f" {env['python']} on {env['platform']}, {env['cpus']} CPUs.",
            f"{self.calls:,} calls per path against the fake LLM server on loopback,"
            f" interleaved, after {self.warmup} warm-up calls each; µs.",
            "",
            *latency_table(
                "Wrapped",
                [
                    ("Time to first event", self.first_event),
                    ("Time to stream end", self.stream_end),
                ],
            ),
        ]
        return "\n".join(lines) + "\n"


async def _time_call(provider: Provider, request: ChatRequest) -> tuple[float, float]:
    """Seconds to the first event and to the end of one stream."""
    start = time.perf_counter()
    first = math.nan
    async with provider.stream(request) as events:
        async for _ in events:
            if math.isnan(first):
                first = time.perf_counter() - start
    end = time.perf_counter() - start
    if math.isnan(first):
        raise RuntimeError("benchmark went wrong: a stream had no events")
    return first, end


async def _measure(
    calls: int, warmup: int, limit: int, progress: Callable[[str], None]
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    script = FakeScript(default=FakeReply(text=_REPLY_TEXT))
    direct: list[tuple[float, float]] = []
    wrapped: list[tuple[float, float]] = []
    async with (
        open_fake_llm_server(script) as server,
        OpenAIProvider(
            "bench", base_url=server.openai_base_url, api_key="bench", model="fake"
        ) as provider,
        open_dispatcher({provider.id: limit}) as dispatcher,
    ):
        limited = wrap_provider(provider, dispatcher, conversation_id="bench")
        request = ChatRequest(messages=[ChatMessage("user", "Say eight words.")])
        progress(f"warm-up: {warmup} calls per path")
        for _ in range(warmup):
            await _time_call(provider, request)
            await _time_call(limited, request)
        step = max(1, calls // 10)
        for i in range(calls):
            if i % step == 0:
                progress(f"calls {i + 1}-{min(i + step, calls)} of {calls}")
            if i % 2 == 0:
                direct.append(await _time_call(provider, request))
                wrapped.append(await _time_call(limited, request))
            else:
                wrapped.append(await _time_call(limited, request))
                direct.append(await _time_call(provider, request))
        stats = dispatcher.statistics().providers[provider.id]
        expected = warmup + calls
        if (
            stats.granted_total != expected
            or server.statistics().requests_total != 2 * expected
        ):
            raise RuntimeError("benchmark went wrong: calls went missing")
    return direct, wrapped


def _ignore(_message: str) -> None:
    pass


def run_http_benchmark(
    *,
    calls: int = 2_000,
    warmup: int = 100,
    limit: int = 8,
    progress: Callable[[str], None] | None = None,
) -> HttpBenchReport:
    """Measure the latency ``wrap_provider`` adds to an LLM call over HTTP.

    Runs its own ``trio.run`` (call it outside trio) with the fake LLM
    server on loopback; needs the ``testing`` extra (hypercorn).

    Args:
        calls: Timed calls per path (direct, wrapped).
        warmup: Untimed calls per path first.
        limit: The dispatcher's limit for the provider.
        progress: Called with a short line now and then.
    """
    calls = count(calls, "calls")
    warmup = count(warmup, "warmup", zero=True)
    limit = count(limit, "limit")
    gc.collect()
    direct, wrapped = trio.run(_measure, calls, warmup, limit, progress or _ignore)
    return HttpBenchReport(
        calls=calls,
        warmup=warmup,
        limit=limit,
        first_event=AddedLatency.from_samples(
            [first for first, _ in direct], [first for first, _ in wrapped]
        ),
        stream_end=AddedLatency.from_samples(
            [end for _, end in direct], [end for _, end in wrapped]
        ),
        environment=environment(httpx2=True),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = command_line(__doc__)
    parser.add_argument(
        "--calls",
        type=count_option(),
        default=2_000,
        help="timed calls per path (default 2000)",
    )
    parser.add_argument(
        "--warmup",
        type=count_option(zero=True),
        default=100,
        help="untimed calls per path first (default 100)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_http_benchmark(
        calls=args.calls, warmup=args.warmup, progress=show_progress
    )
    finish(report, json_path=args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
