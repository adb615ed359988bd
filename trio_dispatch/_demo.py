"""The demo: a fleet of agents through the dispatcher, over real HTTP.

Two fake LLM servers run on loopback, one speaking OpenAI's chat
completions and one Anthropic's Messages API. A fleet of agent
conversations, each with tools, asks its questions through one dispatcher
that limits each provider. The servers script multi-call tool loops, and
now and then answer 429 with ``Retry-After``, so the provider pause shows.

Each server counts the requests it is answering at once; because each
serves one provider, its peak is the concurrency that provider really saw,
and it never exceeds the limit.

While the fleet runs, the dispatcher's events are recorded: the slots in
use, the calls waiting and the pauses of each provider over time. Then the
same fleet (the same arrivals, questions and faults) runs again with each
provider behind a plain ``trio.CapacityLimiter`` of the same size, first
come first served per call, so the report shows the turn latencies of
oldest-first and FIFO side by side.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping  # noqa: TC003 (cattrs resolves the annotations at run time)
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from . import ConversationOptions, Tool, open_dispatcher
from ._converter import unstructure
from ._validation import (
    check_fraction,
    check_positive_number,
    positive_int,
    validator,
)
from .events import Granted, Paused, Queued, Released, Resumed, Withdrawn
from .providers import AnthropicProvider, OpenAIProvider, ProviderError
from .testing import (
    FakeLLMServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    FakeToolCall,
    Fault,
    open_fake_llm_server,
)
from .testing._metrics import percentile

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from . import Dispatcher, DispatcherStatistics, Provider
    from .messages import ChatRequest, StreamEvent

PROVIDERS = ("openai", "anthropic")
_MAX_LOAD = 10


@final
@attrs.frozen
class DemoOptions:
    """What the demo runs.

    Attributes:
        agents: Conversations, half on each provider.
        turns: Questions each agent asks, one after another.
        max_calls: The most LLM calls in one turn (tool loops of 1 to this).
        limit_openai: Concurrent streams allowed to the OpenAI-style server.
        limit_anthropic: Concurrent streams allowed to the Anthropic-style one.
        load: How fast agents arrive, as a fraction of what the limits can
            serve (above 1, queues grow).
        rate_limit_rate: The share of requests the servers answer with 429.
        seed: Seeds arrivals, tool loops and faults.
    """

    agents: int = attrs.field(default=60, validator=positive_int)
    turns: int = attrs.field(default=3, validator=positive_int)
    max_calls: int = attrs.field(default=4, validator=positive_int)
    limit_openai: int = attrs.field(default=4, validator=positive_int)
    limit_anthropic: int = attrs.field(default=3, validator=positive_int)
    load: float = attrs.field(default=0.9)
    rate_limit_rate: float = attrs.field(
        default=0.02, validator=validator(check_fraction)
    )
    seed: int = 1

    @load.validator
    def _check_load(self, attribute: attrs.Attribute[float], value: float) -> None:
        if check_positive_number(value, attribute.name) > _MAX_LOAD:
            raise ValueError(
                f"load must be a positive number at most {_MAX_LOAD}, got {value!r}"
            )

    def limits(self) -> dict[str, int]:
        """The dispatcher's limits."""
        return {"openai": self.limit_openai, "anthropic": self.limit_anthropic}


@final
@attrs.frozen
class ProviderSummary:
    """What one provider saw during the demo."""

    provider: str
    limit: int
    turns: int
    turn_latency_p50: float
    turn_latency_p95: float
    turn_latency_p99: float
    turn_latency_max: float
    llm_calls: int
    retries: int
    server_requests: int
    server_peak_in_flight: int
    rate_limited: int
    longest_pause: float


@final
@attrs.frozen
class DemoReport:
    """The demo's outcome, for the summary table and the JSON file.

    ``timeline`` holds, per provider, ``(seconds, slots in use, calls
    waiting)`` after each change, and ``pauses`` its paused spans
    ``(start, end)``, in seconds from the start of the run; both come from
    the dispatcher's events. ``fifo_latencies`` are the turn latencies of
    the same fleet run again behind a FIFO limiter of the same sizes.
    """

    options: DemoOptions
    providers: tuple[ProviderSummary, ...]
    turns_completed: int
    turns_failed: int
    duration: float
    turn_latencies: Mapping[str, tuple[float, ...]]
    timeline: Mapping[str, tuple[tuple[float, int, int], ...]] = attrs.field(
        factory=dict
    )
    pauses: Mapping[str, tuple[tuple[float, float], ...]] = attrs.field(factory=dict)
    fifo_latencies: Mapping[str, tuple[float, ...]] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        data: dict[str, Any] = unstructure(self)
        return data


@final
@attrs.define
class Progress:
    """Live counters the demo updates as it runs (read by the display)."""

    turns_total: int
    turns_done: int = 0
    turns_failed: int = 0
    llm_calls: int = 0
    statistics: DispatcherStatistics | None = None
    server_in_flight: dict[str, int] = attrs.Factory(dict)


TOOL_DELAY = 0.05
_ANSWER = (
    "Based on what the tools returned, here is the answer, streamed token by"
    " token so that the slot is held for the whole stream."
)


async def _lookup(arguments: dict[str, Any]) -> str:
    await trio.sleep(TOOL_DELAY)
    return f"fact about {arguments['topic']}"


async def _compute(arguments: dict[str, Any]) -> str:
    await trio.sleep(TOOL_DELAY)
    return str(sum(int(n) for n in arguments["numbers"]))


TOOLS = (
    Tool(
        name="lookup",
        description="Look a topic up in the knowledge base.",
        parameters={
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
            "additionalProperties": False,
        },
        run=_lookup,
    ),
    Tool(
        name="compute",
        description="Add up a list of integers.",
        parameters={
            "type": "object",
            "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}},
            "required": ["numbers"],
        },
        run=_compute,
    ),
)

# One LLM call's length on the fake servers: latency + first token + tokens.
_LATENCY = 0.02
_FIRST_TOKEN = 0.03
_TOKENS_PER_SECOND = 400.0
_CALL_SECONDS = _LATENCY + _FIRST_TOKEN + len(_ANSWER.split()) / _TOKENS_PER_SECOND


def _calls_planned(question: str, max_calls: int) -> int:
    """How many LLM calls the scripted model makes for ``question``: 1 to max."""
    digest = hashlib.sha256(question.encode()).digest()
    return 1 + digest[0] % max_calls


def _script(options: DemoOptions, rng: random.Random) -> FakeScript:
    """A scripted model: a tool loop whose length the question decides."""

    def choose(request: FakeRequest) -> FakeReply:
        if rng.random() < options.rate_limit_rate:
            return FakeReply(fault=Fault(kind="rate_limit", retry_after=0.25))
        messages = _messages(request)
        question = next(
            (text for role, text in reversed(messages) if role == "user"), ""
        )
        done = sum(1 for role, _ in messages if role == "tool_result")
        if done + 1 < _calls_planned(question, options.max_calls):
            call = (
                FakeToolCall(name="lookup", arguments={"topic": f"step {done + 1}"})
                if done % 2 == 0
                else FakeToolCall(name="compute", arguments={"numbers": [done, 2, 3]})
            )
            return _timed("Let me check.", (call,))
        return _timed(_ANSWER, ())

    return FakeScript(choose=choose)


def _timed(text: str, tool_calls: tuple[FakeToolCall, ...]) -> FakeReply:
    return FakeReply(
        text=text,
        tool_calls=tool_calls,
        latency=_LATENCY,
        time_to_first_token=_FIRST_TOKEN,
        tokens_per_second=_TOKENS_PER_SECOND,
    )


def _messages(request: FakeRequest) -> list[tuple[str, str]]:
    """(role, text) of a request's messages; tool results as ``tool_result``."""
    out: list[tuple[str, str]] = []
    for message in request.body.get("messages", []):
        role = message.get("role", "")
        content = message.get("content")
        if role == "tool":
            out.append(("tool_result", ""))
        elif isinstance(content, str):
            out.append((role, content))
        elif isinstance(content, list):
            for block in content:
                kind = block.get("type")
                if kind == "tool_result":
                    out.append(("tool_result", ""))
                elif kind == "text":
                    out.append((role, block.get("text", "")))
    return out


@attrs.define
class _Tally:
    """What one provider's agents saw, added up as turns finish."""

    latencies: list[float] = attrs.Factory(list)
    llm_calls: int = 0
    retries: int = 0
    longest_pause: float = 0.0


def _arrivals(options: DemoOptions, rng: random.Random) -> list[float]:
    """Poisson arrival offsets that offer the limits ``options.load``.

    One turn needs (1 + max_calls) / 2 calls on average; the limits serve
    ``limit / call_seconds`` calls a second.
    """
    mean_calls = (1 + options.max_calls) / 2
    capacity = (options.limit_openai + options.limit_anthropic) / _CALL_SECONDS
    rate = options.load * capacity / (mean_calls * options.turns)
    arrivals: list[float] = []
    now = 0.0
    for _ in range(options.agents):
        now += rng.expovariate(rate)
        arrivals.append(now)
    return arrivals


async def run_demo(
    options: DemoOptions,
    *,
    on_progress: Callable[[Progress], None] | None = None,
) -> DemoReport:
    """Run the demo; ``on_progress`` is called about ten times a second."""
    started = trio.current_time()
    progress = Progress(turns_total=options.agents * options.turns)
    run = await _run_fleet(options, progress, on_progress, fifo=False)
    # The same fleet again, first come first served: the baseline.
    fifo = await _run_fleet(
        options, Progress(turns_total=progress.turns_total), None, fifo=True
    )
    return DemoReport(
        options=options,
        providers=run.summaries,
        turns_completed=progress.turns_done,
        turns_failed=progress.turns_failed,
        duration=trio.current_time() - started,
        turn_latencies={
            name: tuple(tally.latencies) for name, tally in run.tallies.items()
        },
        timeline=run.timeline.points(),
        pauses=run.timeline.spans(run.ended),
        fifo_latencies={
            name: tuple(tally.latencies) for name, tally in fifo.tallies.items()
        },
    )


@final
class _Timeline:
    """What the dispatcher did, over time, from its events."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._points: dict[str, list[tuple[float, int, int]]] = {
            name: [(0.0, 0, 0)] for name in PROVIDERS
        }
        self._paused: dict[str, list[tuple[float, float | None]]] = {
            name: [] for name in PROVIDERS
        }

    async def record(
        self,
        dispatcher: Dispatcher,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with dispatcher.events(buffer=1 << 16) as events:
            task_status.started()
            async for event in events:
                at = event.at - self.started
                if isinstance(event, Granted | Queued | Released | Withdrawn):
                    self._points[event.provider].append(
                        (at, event.in_flight, event.waiting)
                    )
                elif isinstance(event, Paused) and event.until is not None:
                    spans = self._paused[event.provider]
                    if not spans or spans[-1][1] is not None:
                        spans.append((at, None))
                elif isinstance(event, Resumed):
                    spans = self._paused[event.provider]
                    if spans and spans[-1][1] is None:
                        spans[-1] = (spans[-1][0], at)

    def points(self) -> dict[str, tuple[tuple[float, int, int], ...]]:
        """Per provider, ``(seconds, slots in use, calls waiting)`` after each change."""
        return {name: tuple(points) for name, points in self._points.items()}

    def spans(self, ended: float) -> dict[str, tuple[tuple[float, float], ...]]:
        """The paused spans; one still open ends at ``ended``."""
        return {
            name: tuple(
                (start, ended - self.started if end is None else end)
                for start, end in spans
            )
            for name, spans in self._paused.items()
        }


@final
@attrs.frozen
class _Fleet:
    tallies: dict[str, _Tally]
    summaries: tuple[ProviderSummary, ...]
    timeline: _Timeline
    ended: float


@final
class _FifoProvider:
    """A provider behind a ``trio.CapacityLimiter``: FIFO per call."""

    def __init__(self, provider: Provider, limiter: trio.CapacityLimiter) -> None:
        self._provider = provider
        self._limiter = limiter

    @property
    def id(self) -> str:
        return self._provider.id

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        return self._stream(request)

    @asynccontextmanager
    async def _stream(
        self, request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        async with self._limiter, self._provider.stream(request) as events:
            yield events


async def _run_fleet(
    options: DemoOptions,
    progress: Progress,
    on_progress: Callable[[Progress], None] | None,
    *,
    fifo: bool,
) -> _Fleet:
    """Run the fleet once: oldest-first through the dispatcher, or FIFO."""
    rng = random.Random(options.seed)
    tallies = {name: _Tally() for name in PROVIDERS}
    arrivals = _arrivals(options, rng)
    started = trio.current_time()
    timeline = _Timeline(started)
    limits = options.limits()
    async with (
        # Outside the dispatcher: it reads the events to the end after the
        # dispatcher closes.
        trio.open_nursery() as recorder,
        open_fake_llm_server(_script(options, random.Random(rng.random()))) as server_o,
        open_fake_llm_server(_script(options, random.Random(rng.random()))) as server_a,
        OpenAIProvider(
            id="openai",
            base_url=server_o.openai_base_url,
            api_key="sk-demo-openai",
            model="demo-model",
        ) as openai,
        AnthropicProvider(
            id="anthropic",
            base_url=server_a.anthropic_base_url,
            api_key="sk-ant-demo",
            model="demo-model",
        ) as anthropic,
        open_dispatcher(
            {} if fifo else limits, default_pause=0.25, unknown_providers="allow"
        ) as dispatcher,
    ):
        await recorder.start(timeline.record, dispatcher)
        servers = {"openai": server_o, "anthropic": server_a}
        providers: dict[str, Provider] = {"openai": openai, "anthropic": anthropic}
        if fifo:
            providers = {
                name: _FifoProvider(provider, trio.CapacityLimiter(limits[name]))
                for name, provider in providers.items()
            }

        async def agent(index: int, arrival: float) -> None:
            name = PROVIDERS[index % 2]
            tally = tallies[name]
            await trio.sleep_until(started + arrival)
            conversation = dispatcher.start_conversation(
                providers[name],
                conversation_id=f"agent-{index:03d}",
                tools=TOOLS,
                system_prompt="You are a helpful agent. Use the tools.",
                options=ConversationOptions(
                    retry_backoff=0.05, seed=options.seed * 1000 + index
                ),
            )
            try:
                for turn in range(options.turns):
                    question = f"agent {index} question {turn}: what do the tools say?"
                    try:
                        result = await conversation.ask(question)
                    except ProviderError:
                        progress.turns_failed += 1
                        continue
                    tally.latencies.append(result.finished_at - result.started_at)
                    tally.retries += result.retries
                    tally.llm_calls += result.llm_calls
                    progress.llm_calls += result.llm_calls
                    progress.turns_done += 1
            finally:
                conversation.close()

        def observe() -> None:
            _observe(dispatcher, servers, progress, tallies)
            if on_progress is not None:
                on_progress(progress)

        async def watch() -> None:
            while True:
                observe()
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as agents:
                for index, arrival in enumerate(arrivals):
                    agents.start_soon(agent, index, arrival)
            nursery.cancel_scope.cancel()
        observe()
        ended = trio.current_time()
        summaries = tuple(
            _summary(
                name, limit=limits[name], server=servers[name], tally=tallies[name]
            )
            for name in PROVIDERS
        )
    return _Fleet(tallies, summaries, timeline, ended)


def _observe(
    dispatcher: Dispatcher,
    servers: Mapping[str, FakeLLMServer],
    progress: Progress,
    tallies: Mapping[str, _Tally],
) -> None:
    stats = dispatcher.statistics()
    progress.statistics = stats
    now = trio.current_time()
    for name, provider in stats.providers.items():
        if provider.paused_until is not None:
            tally = tallies[name]
            tally.longest_pause = max(tally.longest_pause, provider.paused_until - now)
    for name, server in servers.items():
        progress.server_in_flight[name] = server.statistics().in_flight


def _summary(
    name: str, *, limit: int, server: FakeLLMServer, tally: _Tally
) -> ProviderSummary:
    server_stats = server.statistics()
    latencies = tally.latencies
    return ProviderSummary(
        provider=name,
        limit=limit,
        turns=len(latencies),
        turn_latency_p50=percentile(latencies, 50),
        turn_latency_p95=percentile(latencies, 95),
        turn_latency_p99=percentile(latencies, 99),
        turn_latency_max=max(latencies, default=math.nan),
        llm_calls=tally.llm_calls,
        retries=tally.retries,
        server_requests=server_stats.requests_total,
        server_peak_in_flight=server_stats.peak_in_flight,
        rate_limited=server_stats.responses_by_status.get(429, 0),
        longest_pause=tally.longest_pause,
    )
