"""Goodput against a provider with hidden capacity, in virtual time.

Usage::

    python bench/goodput.py [--quick] [--minutes M] [--agents N] [--json PATH]

A provider in memory hides two limits, as real ones do: a concurrency cap
and a tokens-per-minute quota (a bucket refilled continuously, enforced
over 10-second slices, as OpenAI documents for its limits). Beyond either
it answers 429 with ``Retry-After``; every answer, success or 429, carries
its rate-limit figures, reported through ``Dispatcher.observe_rate_limits``
as the providers do. It charges a request its prompt plus ``max_tokens``
on arrival and gives back what the answer did not use at its end.

Closed-loop agents (each starts within the first 30 seconds, then sends its
next turn as soon as the last one is answered, retrying a 429 until it
succeeds) run through the real dispatcher and ``wrap_provider`` under
trio's ``MockClock``, so a run of ten virtual minutes takes seconds. The
workload is seeded; trio's own shuffling of tasks woken together can move
the figures of the schemes that meet many 429s by a few tenths of a
percent from run to run. Each scheme runs the same workload:

(a) a fixed limit set too high; (b) a fixed limit set too low; (c) a
LiteLLM-style cooldown: a fixed limit too high and a 5-second pause after
each 429, whatever the server says; (d) header-learned budgets (no budget
configured, the fixed limit too high); (e) an ``AdaptiveLimit`` (with the
budgets learned as by default); (f) an ``AdaptiveLimit`` alone, budgets
not learned.

The report: tokens served per minute as a share of the quota (answers
completed after a one-minute warm-up), the share of requests answered 429
(the whole run), and turn latency (from a turn's start to its answer, its
429s and retries included) p50 and p95. Uses only the public API.

``--loopback`` runs over real HTTP instead, in real time: the fake LLM
server on loopback (``open_fake_llm_server`` with ``FakeQuotas``, a
request quota as OpenAI keeps it: a full bucket, then a sixtieth of it a
second) and the ``openai`` SDK whose HTTP client uses
``dispatcher.transport("openai")``. Closed-loop agents (all start at once)
each make ``--calls`` streamed calls, retrying a 429 until it succeeds; the
report sets the fleet's end beside the ideal one (every request sent as
soon as the quota holds it, its answer ``--latency`` later), with nothing
configured (budgets learned from the answers' headers) and with
``Budget(requests_per_minute=...)`` configured. Needs the ``testing``
extra and ``openai``::

    python bench/goodput.py --loopback [--agents 30] [--calls 10]
        [--requests-per-minute 240] [--latency 0.3] [--json PATH]
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import random
import statistics
import sys
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

import trio_dispatch
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta, Usage
from trio_dispatch.providers import RateLimited

from _common import (
    command_line,
    count_option,
    environment,
    finish,
    plain,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from trio_dispatch.messages import StreamEvent

PROVIDER = "llm"
QUOTA = 100_000  # tokens per minute
SLICE = 10.0  # seconds of quota the server lets through at once
CAP = 32  # concurrent streams
TOKENS_PER_SECOND = 50.0  # output speed of one stream
FIRST_TOKEN = 0.5  # seconds
CAP_RETRY_AFTER = 1.0  # what the server says after a 429 for concurrency
PROMPT_CHARS = 2000
MAX_TOKENS = 1000
OUTPUT = (200, 800)  # tokens an answer uses, uniform
WARM_UP = 60.0
STAGGER = 30.0


@attrs.define
class HiddenProvider:
    """A provider whose capacity the client is never told, only shown.

    Its ``stream`` reports the rate-limit figures of each answer to
    ``observe`` before the first event or the 429.
    """

    observe: Callable[[str, trio_dispatch.RateLimitInfo], None]
    cooldown: bool = False
    id: str = PROVIDER
    level: float = QUOTA * SLICE / 60.0
    updated: float = 0.0
    in_flight: int = 0
    answered_429: int = 0
    answered: int = 0

    @property
    def rate(self) -> float:
        return QUOTA / 60.0

    def _refill(self) -> None:
        now = trio.current_time()
        ceiling = QUOTA * SLICE / 60.0
        self.level = min(ceiling, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def _figures(self, retry_after: float | None) -> trio_dispatch.RateLimitInfo:
        ceiling = QUOTA * SLICE / 60.0
        remaining = max(0, math.floor(self.level))
        return trio_dispatch.RateLimitInfo(
            tokens=trio_dispatch.Quota(
                limit=QUOTA,
                remaining=remaining,
                reset=max(0.0, (ceiling - self.level) / self.rate),
            ),
            retry_after=retry_after,
        )

    def stream(self, request: ChatRequest) -> Any:  # noqa: ANN401 (the Provider protocol's context manager)
        return self._stream(request)

    @asynccontextmanager
    async def _stream(
        self, request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        await trio.lowlevel.checkpoint()
        self._refill()
        prompt = sum(len(m.content) for m in request.messages) // 4
        reserved = prompt + (request.max_tokens or MAX_TOKENS)
        retry_after: float | None = None
        if self.in_flight >= CAP:
            retry_after = CAP_RETRY_AFTER
        elif self.level < reserved:
            # In whole milliseconds, as retry-after-ms says it.
            retry_after = math.ceil(1000 * (reserved - self.level) / self.rate) / 1000
        if retry_after is not None:
            self.answered_429 += 1
            self.observe(self.id, self._figures(retry_after))
            raise RateLimited(
                "rate limited",
                provider=self.id,
                status_code=429,
                retry_after=None if self.cooldown else retry_after,
            )
        self.level -= reserved
        self.in_flight += 1
        self.answered += 1
        output = int(request.extra["output"]) if request.extra else OUTPUT[0]  # type: ignore[call-overload]  # set by the agents
        try:
            # The headers come with the first token; the figures are the
            # server's when it answers.
            await trio.sleep(FIRST_TOKEN)
            self._refill()
            self.observe(self.id, self._figures(None))
            yield _Events(prompt, output)
        finally:
            self.in_flight -= 1
            self._refill()
            ceiling = QUOTA * SLICE / 60.0
            self.level = min(ceiling, self.level + reserved - prompt - output)


@attrs.define
class _Events:
    """An answer's events: its first token, then the rest after their time."""

    prompt: int
    output: int
    sent: int = 0

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> StreamEvent:
        self.sent += 1
        if self.sent == 1:
            await trio.lowlevel.checkpoint()
            return TextDelta("x")
        if self.sent == 2:
            await trio.sleep(self.output / TOKENS_PER_SECOND)
            return Finish("stop")
        if self.sent == 3:
            await trio.lowlevel.checkpoint()
            return Usage(input_tokens=self.prompt, output_tokens=self.output)
        raise StopAsyncIteration


@attrs.frozen
class Scheme:
    """One way of setting the dispatcher up."""

    name: str
    label: str
    limit: int | trio_dispatch.AdaptiveLimit
    learn_budgets: bool
    cooldown: bool = False


SCHEMES = [
    Scheme("a", "fixed limit 64 (too high)", 64, learn_budgets=False),
    Scheme("b", "fixed limit 8 (too low)", 8, learn_budgets=False),
    Scheme(
        "c",
        "fixed 64, 5 s cooldown after a 429",
        64,
        learn_budgets=False,
        cooldown=True,
    ),
    Scheme("d", "fixed 64, budgets learned from headers", 64, learn_budgets=True),
    Scheme(
        "e",
        "AdaptiveLimit(8, 1, 64), budgets learned",
        trio_dispatch.AdaptiveLimit(initial=8, minimum=1, maximum=64),
        learn_budgets=True,
    ),
    Scheme(
        "f",
        "AdaptiveLimit(8, 1, 64) alone",
        trio_dispatch.AdaptiveLimit(initial=8, minimum=1, maximum=64),
        learn_budgets=False,
    ),
]


@attrs.frozen
class Row:
    """One scheme's figures."""

    scheme: str
    label: str
    quota_share: float
    share_429: float
    requests: int
    answered_429: int
    turns: int
    latency_p50: float
    latency_p95: float
    final_limit: int | None


async def _run_scheme(scheme: Scheme, agents: int, minutes: float, seed: int) -> Row:
    end = minutes * 60.0
    served: list[tuple[float, int]] = []
    latencies: list[float] = []
    pause = 5.0 if scheme.cooldown else 1.0
    async with trio_dispatch.open_dispatcher(
        {PROVIDER: scheme.limit},
        learn_budgets=scheme.learn_budgets,
        default_pause=pause,
        max_pause=60.0 if not scheme.cooldown else pause,
    ) as dispatcher:
        provider = HiddenProvider(
            dispatcher.observe_rate_limits, cooldown=scheme.cooldown
        )
        start = trio.current_time()

        async def agent(number: int) -> None:
            draw = random.Random(seed * 1000 + number)
            await trio.sleep(draw.uniform(0, STAGGER))
            while trio.current_time() - start < end:
                output = draw.randint(*OUTPUT)
                request = ChatRequest(
                    [ChatMessage("user", "x" * PROMPT_CHARS)],
                    max_tokens=MAX_TOKENS,
                    extra={"output": output},
                )
                turn = trio.current_time()
                limited = trio_dispatch.wrap_provider(
                    provider, dispatcher, started_at=turn
                )
                while True:
                    try:
                        async with limited.stream(request) as events:
                            used = 0
                            async for event in events:
                                if isinstance(event, Usage):
                                    used = event.prompt_tokens + event.output_tokens
                        break
                    except RateLimited:
                        continue
                now = trio.current_time()
                latencies.append(now - turn)
                served.append((now - start, used))

        async with trio.open_nursery() as nursery:
            for number in range(agents):
                nursery.start_soon(agent, number)
            with trio.move_on_at(start + end):
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()
        stats = dispatcher.statistics().providers[PROVIDER]
    window = end - WARM_UP
    tokens = sum(used for at, used in served if WARM_UP <= at <= end)
    requests = provider.answered + provider.answered_429
    quantiles = statistics.quantiles(latencies, n=20, method="inclusive")
    return Row(
        scheme=scheme.name,
        label=scheme.label,
        quota_share=tokens / (QUOTA * window / 60.0),
        share_429=provider.answered_429 / requests if requests else 0.0,
        requests=requests,
        answered_429=provider.answered_429,
        turns=len(latencies),
        latency_p50=statistics.median(latencies),
        latency_p95=quantiles[18],
        final_limit=stats.limit,
    )


def run_scheme(scheme: Scheme, *, agents: int, minutes: float, seed: int = 1) -> Row:
    """Run one scheme in virtual time and return its figures."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(_run_scheme, scheme, agents, minutes, seed, clock=clock)


@attrs.frozen
class GoodputReport:
    """Every scheme's figures for one workload."""

    agents: int
    minutes: float
    quota_tokens_per_minute: int
    concurrency_cap: int
    rows: tuple[Row, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"Goodput, {self.agents} agents, {self.minutes:g} virtual minutes;"
            f" hidden quota {self.quota_tokens_per_minute:,} tokens/min,"
            f" concurrency cap {self.concurrency_cap}",
            "",
            "| scheme | quota served | 429 share | turn p50 | turn p95 | limit at end |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in self.rows:
            lines.append(
                f"| ({row.scheme}) {row.label} | {row.quota_share:.1%}"
                f" | {row.share_429:.2%} ({row.answered_429}/{row.requests})"
                f" | {row.latency_p50:.1f} s | {row.latency_p95:.1f} s"
                f" | {row.final_limit} |"
            )
        return "\n".join(lines) + "\n"


def run_goodput(
    *, agents: int, minutes: float, schemes: list[Scheme] | None = None
) -> GoodputReport:
    """Run every scheme (or those given) on the same workload."""
    rows = []
    for scheme in SCHEMES if schemes is None else schemes:
        show_progress(f"({scheme.name}) {scheme.label}")
        rows.append(run_scheme(scheme, agents=agents, minutes=minutes))
    return GoodputReport(
        agents=agents,
        minutes=minutes,
        quota_tokens_per_minute=QUOTA,
        concurrency_cap=CAP,
        rows=tuple(rows),
        environment=environment(),
    )


# -- over loopback HTTP ------------------------------------------------------


def ideal_end(*, agents: int, calls: int, per_minute: int, latency: float) -> float:
    """When a closed-loop fleet ends at best under a request quota.

    Each agent sends its next call as soon as its last one is answered and
    the quota's bucket (``per_minute`` full, refilled at a sixtieth of it a
    second) holds a request; an answer takes ``latency``.
    """
    rate = per_minute / 60.0
    level, at, end = float(per_minute), 0.0, 0.0
    free = [(0.0, agent) for agent in range(agents)]
    left = [calls] * agents
    while free:
        ready, agent = heapq.heappop(free)
        now = max(ready, at)
        level = min(float(per_minute), level + (now - at) * rate)
        if level < 1.0:
            now += (1.0 - level) / rate
            level = 1.0
        level -= 1.0
        at = now
        done = now + latency
        end = max(end, done)
        left[agent] -= 1
        if left[agent]:
            heapq.heappush(free, (done, agent))
    return end


@attrs.frozen
class LoopbackRow:
    """One configuration's run over loopback HTTP."""

    setting: str
    end: float
    ideal: float
    ratio: float
    requests: int
    answered_429: int


@attrs.frozen
class LoopbackReport:
    """The fleet's end beside the ideal one, for each configuration."""

    agents: int
    calls: int
    requests_per_minute: int
    latency: float
    rows: tuple[LoopbackRow, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"Goodput over loopback HTTP (openai SDK through"
            f" dispatcher.transport): {self.agents} agents x {self.calls} calls,"
            f" {self.requests_per_minute} requests/min, answers in"
            f" {self.latency:g} s",
            "",
            "| configured | fleet ends | ideal | ratio | requests | answered 429 |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in self.rows:
            lines.append(
                f"| {row.setting} | {row.end:.2f} s | {row.ideal:.2f} s"
                f" | {row.ratio:.2f}x | {row.requests} | {row.answered_429} |"
            )
        return "\n".join(lines) + "\n"


async def _loopback_fleet(
    *, agents: int, calls: int, per_minute: int, latency: float, budget: bool
) -> tuple[float, int, int]:
    """One fleet's end (seconds), requests sent and answers of 429."""
    import httpx2  # noqa: PLC0415 (only over loopback)
    import openai  # noqa: PLC0415

    from trio_dispatch.testing import (  # noqa: PLC0415
        FakeQuotas,
        FakeReply,
        FakeScript,
        open_fake_llm_server,
    )

    script = FakeScript(default=FakeReply(text="ok", latency=latency))
    quotas = FakeQuotas(requests_per_minute=per_minute)
    budgets = (
        {"openai": trio_dispatch.Budget(requests_per_minute=per_minute)}
        if budget
        else {}
    )
    async with (
        open_fake_llm_server(script, quotas=quotas) as server,
        trio_dispatch.open_dispatcher(
            {"openai": agents}, budgets=budgets
        ) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("openai"), timeout=60.0
        ) as http,
    ):
        client = openai.AsyncOpenAI(
            api_key="bench",
            base_url=server.openai_base_url,
            http_client=http,
            max_retries=0,
        )
        refused = 0

        async def agent() -> None:
            nonlocal refused
            done = 0
            while done < calls:
                try:
                    stream = await client.chat.completions.create(
                        model="fake",
                        messages=[{"role": "user", "content": "hi"}],
                        stream=True,
                    )
                except openai.RateLimitError:
                    refused += 1
                    continue
                async with stream:
                    async for _ in stream:
                        pass
                done += 1

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(agents):
                nursery.start_soon(agent)
        end = trio.current_time() - start
        sent = server.statistics().requests_total
    return end, sent, refused


def run_loopback(
    *, agents: int, calls: int, per_minute: int, latency: float
) -> LoopbackReport:
    """Run the fleet over loopback HTTP, learned and configured, in real time."""
    import warnings  # noqa: PLC0415

    ideal = ideal_end(
        agents=agents, calls=calls, per_minute=per_minute, latency=latency
    )
    rows = []
    for setting, budget in (
        ("nothing", False),
        (f"Budget(requests_per_minute={per_minute})", True),
    ):
        show_progress(f"over loopback, {setting} configured")
        with warnings.catch_warnings():
            # The openai SDK leaves the async generators under a stream
            # unclosed when it stops at [DONE]; trio warns when collected.
            warnings.filterwarnings(
                "ignore",
                message=r"Async generator '(openai|httpx2|httpcore2)\.",
                category=ResourceWarning,
            )
            fleet = functools.partial(
                _loopback_fleet,
                agents=agents,
                calls=calls,
                per_minute=per_minute,
                latency=latency,
                budget=budget,
            )
            end, sent, refused = trio.run(fleet)
        rows.append(LoopbackRow(setting, end, ideal, end / ideal, sent, refused))
    return LoopbackReport(
        agents=agents,
        calls=calls,
        requests_per_minute=per_minute,
        latency=latency,
        rows=tuple(rows),
        environment=environment(),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print markdown, and write JSON with ``--json``."""
    parser = command_line(__doc__, quick="3 virtual minutes")
    parser.add_argument("--minutes", type=count_option(), default=10)
    parser.add_argument("--agents", type=count_option(), default=None)
    parser.add_argument(
        "--loopback", action="store_true", help="real HTTP on loopback, real time"
    )
    parser.add_argument("--calls", type=count_option(), default=10)
    parser.add_argument("--requests-per-minute", type=count_option(), default=240)
    parser.add_argument("--latency", type=float, default=0.3)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report: GoodputReport | LoopbackReport
    if args.loopback:
        report = run_loopback(
            agents=30 if args.agents is None else args.agents,
            calls=args.calls,
            per_minute=args.requests_per_minute,
            latency=args.latency,
        )
    else:
        minutes = 3 if args.quick else args.minutes
        agents = 40 if args.agents is None else args.agents
        report = run_goodput(agents=agents, minutes=minutes)
    finish(
        report,
        json_path=args.json,
        started=started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
