"""The demo: a fleet of agents through the dispatcher, over real HTTP.

Two fake LLM servers run on loopback, one speaking OpenAI's chat
completions and one Anthropic's Messages API. A fleet of agent
conversations, each with tools, asks its questions through one dispatcher
that limits each provider: oldest-agent-first. Then the same fleet runs
again with each provider behind a plain ``trio.CapacityLimiter`` of the
same size, first come first served per call, and the report compares the
two runs.

The comparison is fair because everything the fleet meets is scripted from
the seed, never drawn at random as the run goes: the agents' arrivals,
which provider each uses, how many LLM calls each turn makes, how long each
call takes and which calls are answered 429. The servers decide a reply by
a seeded hash of where the request stands in the schedule (the agent, its
turn, the call within the turn, and the attempt), read from the request
itself; so both runs meet the same calls, the same durations and the same
429s at the same points, whatever order the limiter serves them in.

Each server counts the requests it is answering at once; because each
serves one provider, its peak is the concurrency that provider really saw,
and it never exceeds the limit. While each run goes, the slots in use, the
calls waiting and the pauses of each provider are recorded over time.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping  # noqa: TC003 (cattrs resolves the annotations at run time)
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, final

import attrs
import trio

from .. import ConversationOptions, Tool, open_dispatcher
from .._converter import unstructure
from .._validation import check_fraction, check_positive_number, positive_int, validator
from ..events import Granted, Paused, Queued, Released, Resumed, Withdrawn
from ..providers import AnthropicProvider, OpenAIProvider, ProviderError, RateLimited
from ..testing import (
    FakeLLMServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    FakeToolCall,
    Fault,
    open_fake_llm_server,
    percentile,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from .. import Dispatcher, DispatcherStatistics, Provider
    from ..messages import ChatRequest, StreamEvent

PROVIDERS = ("openai", "anthropic")
_MAX_LOAD = 10

RunName = Literal["oldest-first", "fifo"]
#: The two runs, in the order they go, and what the display calls them.
RUNS: Final[dict[RunName, str]] = {
    "oldest-first": "oldest-first",
    "fifo": "FIFO, same fleet",
}


@final
@attrs.frozen
class DemoOptions:
    """What the demo runs.

    The defaults are a workload where the order of turns matters, as on
    the agent platforms trio-dispatch is for: tool loops of 1 to 8 LLM
    calls, arriving as fast as the limits can serve them (load 1), so
    queues build and stay for most of the run.

    Attributes:
        agents: Conversations; each provider gets a share as large as its
            share of the summed limits.
        turns: Questions each agent asks, one after another.
        max_calls: The most LLM calls in one turn (tool loops of 1 to this).
        limit_openai: Concurrent streams allowed to the OpenAI-style server.
        limit_anthropic: Concurrent streams allowed to the Anthropic-style one.
        load: How fast agents arrive, as a fraction of what the limits can
            serve (above 1, queues grow).
        rate_limit_rate: The share of requests the servers answer with 429.
        seed: Seeds arrivals, tool loops, call durations and faults.
    """

    agents: int = attrs.field(default=100, validator=positive_int)
    turns: int = attrs.field(default=1, validator=positive_int)
    max_calls: int = attrs.field(default=8, validator=positive_int)
    limit_openai: int = attrs.field(default=6, validator=positive_int)
    limit_anthropic: int = attrs.field(default=4, validator=positive_int)
    load: float = attrs.field(default=1.0)
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
    """What one provider saw during one run of the demo."""

    provider: str
    limit: int
    turns: int
    turn_latency_p50: float
    turn_latency_p95: float
    turn_latency_p99: float
    turn_latency_max: float
    first_call_wait_p50: float
    first_call_wait_p95: float
    first_call_wait_max: float
    llm_calls: int
    retries: int
    server_requests: int
    server_peak_in_flight: int
    rate_limited: int
    longest_pause: float


@final
@attrs.frozen
class ScriptedAnswer:
    """How a fake server answered one request, as its script decided.

    Attributes:
        agent: The agent that asked.
        turn: Its turn, from 0.
        call: The LLM call within the turn, from 0.
        attempt: The attempt at that call, from 0 (a retry after a 429 is 1).
        status: 200, or 429 for a scripted rate limit.
        seconds: How long the answer was scripted to take.
    """

    agent: int
    turn: int
    call: int
    attempt: int
    status: int
    seconds: float


@final
@attrs.frozen
class RunReport:
    """What one run of the fleet measured.

    ``turn_latencies`` and ``first_call_waits`` hold, per provider, each
    completed turn's latency and how long its first LLM call waited (from
    the question to the first request reaching the server). ``timeline``
    holds ``(seconds, slots in use, calls waiting)`` after each change,
    ``pauses`` the paused spans ``(start, end)``, both in seconds from the
    start of the run. ``answers`` is what each fake server answered, in the
    order of the schedule.
    """

    name: RunName
    providers: tuple[ProviderSummary, ...]
    turns_completed: int
    turns_failed: int
    duration: float
    turn_latencies: Mapping[str, tuple[float, ...]]
    first_call_waits: Mapping[str, tuple[float, ...]]
    timeline: Mapping[str, tuple[tuple[float, int, int], ...]]
    pauses: Mapping[str, tuple[tuple[float, float], ...]]
    answers: Mapping[str, tuple[ScriptedAnswer, ...]]

    def pooled(self, figure: Literal["latency", "first_call_wait"]) -> list[float]:
        """Turn latencies (or first-call waits) of every provider together."""
        source = self.turn_latencies if figure == "latency" else self.first_call_waits
        return sorted(value for values in source.values() for value in values)


@final
@attrs.frozen
class DemoReport:
    """The demo's outcome: the oldest-first run and the FIFO run.

    ``fifo`` is ``None`` when the demo was interrupted before the FIFO run
    finished: the comparison is then incomplete.
    """

    options: DemoOptions
    oldest_first: RunReport
    fifo: RunReport | None = None

    @property
    def complete(self) -> bool:
        """Whether both runs finished."""
        return self.fifo is not None

    def runs(self) -> tuple[RunReport, ...]:
        """The runs that finished, oldest-first first."""
        return (
            (self.oldest_first,)
            if self.fifo is None
            else (self.oldest_first, self.fifo)
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        data: dict[str, Any] = unstructure(self)
        data["complete"] = self.complete
        return data


@final
@attrs.frozen
class ProviderRow:
    """One provider's line in the live display."""

    limit: int | None
    in_use: int
    waiting: int
    paused: bool

    @classmethod
    def rows_of(cls, statistics: DispatcherStatistics) -> dict[str, ProviderRow]:
        """Every provider's line, as the dispatcher's ``statistics`` tell it."""
        return {
            name: cls(
                limit=provider.limit,
                in_use=provider.in_flight,
                waiting=provider.waiting,
                paused=provider.paused,
            )
            for name, provider in statistics.providers.items()
        }


@final
@attrs.define
class Progress:
    """Live counters the demo updates as it runs (read by the display).

    ``phase`` names the run going on; ``rows`` are the providers as its
    limiter sees them (``statistics`` too, in the oldest-first run).
    """

    turns_total: int
    turns_done: int = 0
    turns_failed: int = 0
    llm_calls: int = 0
    statistics: DispatcherStatistics | None = None
    server_in_flight: dict[str, int] = attrs.Factory(dict)
    phase: str = RUNS["oldest-first"]
    rows: dict[str, ProviderRow] = attrs.Factory(dict)


TOOL_DELAY = 0.05
_ANSWER = "Based on the tools, here is the answer, streamed token by token."
_STEP = "Let me check that."

#: The mean length of one LLM call on the fake servers, in seconds. Each
#: call takes 0.4x to 1.6x of it (a seeded hash decides): 60% before the
#: headers, the rest streaming its tokens, so the slot is held throughout.
CALL_SECONDS = 0.1
_BEFORE_HEADERS = 0.6
#: ``Retry-After`` of the scripted 429s.
RETRY_AFTER = 0.25


def _unit(seed: int, *key: object) -> float:
    """A number in [0, 1) that ``seed`` and ``key`` decide, the same every run."""
    text = ":".join(map(str, (seed, *key)))
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def calls_planned(options: DemoOptions, agent: int, turn: int) -> int:
    """How many LLM calls the scripted model makes in this turn: 1 to max."""
    return 1 + int(_unit(options.seed, "calls", agent, turn) * options.max_calls)


def call_seconds(options: DemoOptions, agent: int, turn: int, call: int) -> float:
    """How long this LLM call takes, retries alike."""
    return CALL_SECONDS * (
        0.4 + 1.2 * _unit(options.seed, "seconds", agent, turn, call)
    )


def rate_limited(
    options: DemoOptions, agent: int, turn: int, call: int, attempt: int
) -> bool:
    """Whether this attempt at this call is answered 429."""
    return (
        _unit(options.seed, "429", agent, turn, call, attempt) < options.rate_limit_rate
    )


def provider_of(options: DemoOptions, agent: int) -> str:
    """The provider an agent uses: each gets its share of the summed limits."""
    share = options.limit_openai / (options.limit_openai + options.limit_anthropic)
    return "openai" if _unit(options.seed, "provider", agent) < share else "anthropic"


_QUESTION = re.compile(r"^agent (\d+) question (\d+):")


def _question(agent: int, turn: int) -> str:
    return f"agent {agent} question {turn}: what do the tools say?"


@final
class _Script:
    """The scripted model of one fake server for one run, and its record.

    The reply to a request depends only on where it stands in the schedule
    (agent, turn, call, attempt), read from the request; the attempt counts
    the requests already seen for that call, which one agent sends one
    after another.
    """

    def __init__(self, options: DemoOptions) -> None:
        self._options = options
        self._attempts: dict[tuple[int, int, int], int] = {}
        self.answers: list[tuple[float, ScriptedAnswer]] = []

    def script(self) -> FakeScript:
        return FakeScript(choose=self.choose)

    def choose(self, request: FakeRequest) -> FakeReply:
        messages = _messages(request)
        question = next(
            (text for role, text in reversed(messages) if role == "user"), ""
        )
        match = _QUESTION.match(question)
        if match is None:
            return _timed(_ANSWER, (), CALL_SECONDS)
        agent, turn = int(match[1]), int(match[2])
        call = sum(1 for role, _ in messages if role == "tool_result")
        key = (agent, turn, call)
        attempt = self._attempts.get(key, 0)
        self._attempts[key] = attempt + 1
        options = self._options
        seconds = call_seconds(options, agent, turn, call)
        limited = rate_limited(options, agent, turn, call, attempt)
        self.answers.append(
            (
                trio.current_time(),
                ScriptedAnswer(
                    agent=agent,
                    turn=turn,
                    call=call,
                    attempt=attempt,
                    status=429 if limited else 200,
                    seconds=0.0 if limited else seconds,
                ),
            )
        )
        if limited:
            return FakeReply(fault=Fault(kind="rate_limit", retry_after=RETRY_AFTER))
        if call + 1 < calls_planned(options, agent, turn):
            tool = (
                FakeToolCall(name="lookup", arguments={"topic": f"step {call + 1}"})
                if call % 2 == 0
                else FakeToolCall(name="compute", arguments={"numbers": [call, 2, 3]})
            )
            return _timed(_STEP, (tool,), seconds)
        return _timed(_ANSWER, (), seconds)

    def in_order(self) -> tuple[ScriptedAnswer, ...]:
        """The answers in the order of the schedule, not of their arrival."""
        return tuple(
            sorted(
                (answer for _, answer in self.answers),
                key=lambda a: (a.agent, a.turn, a.call, a.attempt),
            )
        )

    def first_requests(self) -> dict[tuple[int, int], float]:
        """When the first request of each turn reached the server."""
        first: dict[tuple[int, int], float] = {}
        for at, answer in self.answers:
            if answer.call == 0 and answer.attempt == 0:
                first.setdefault((answer.agent, answer.turn), at)
        return first


def _timed(
    text: str, tool_calls: tuple[FakeToolCall, ...], seconds: float
) -> FakeReply:
    words = len(text.split())
    return FakeReply(
        text=text,
        tool_calls=tool_calls,
        latency=seconds * _BEFORE_HEADERS,
        time_to_first_token=0.0,
        tokens_per_second=words / (seconds * (1 - _BEFORE_HEADERS)),
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
    # (agent, turn) -> when the turn started, for its first call's wait.
    started: dict[tuple[int, int], float] = attrs.Factory(dict)
    llm_calls: int = 0
    retries: int = 0
    longest_pause: float = 0.0


def arrivals(options: DemoOptions) -> list[float]:
    """Poisson arrival offsets that offer the limits ``options.load``.

    One turn needs (1 + max_calls) / 2 calls on average; the limits serve
    ``limit / CALL_SECONDS`` calls a second.
    """
    rng = random.Random(options.seed)
    mean_calls = (1 + options.max_calls) / 2
    capacity = (options.limit_openai + options.limit_anthropic) / CALL_SECONDS
    rate = options.load * capacity / (mean_calls * options.turns)
    out: list[float] = []
    now = 0.0
    for _ in range(options.agents):
        now += rng.expovariate(rate)
        out.append(now)
    return out


async def run_demo(
    options: DemoOptions,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    on_run: Callable[[DemoReport], None] | None = None,
) -> DemoReport:
    """Run the demo: the fleet oldest-first, then the same fleet FIFO.

    ``on_progress`` is called about ten times a second in both runs;
    ``on_run`` with the report so far after each run, so that a caller
    interrupted during the FIFO run still has the first run's figures.
    """
    total = options.agents * options.turns
    first = await _run_fleet(
        options, Progress(turns_total=total), on_progress, "oldest-first"
    )
    report = DemoReport(options=options, oldest_first=first)
    if on_run is not None:
        on_run(report)
    fifo = await _run_fleet(
        options, Progress(turns_total=total, phase=RUNS["fifo"]), on_progress, "fifo"
    )
    report = attrs.evolve(report, fifo=fifo)
    if on_run is not None:
        on_run(report)
    return report


@final
class _Timeline:
    """What the limiter did, over time: from the dispatcher's events, or the FIFO's."""

    def __init__(self, started: float) -> None:
        self.started = started
        self._points: dict[str, list[tuple[float, int, int]]] = {
            name: [(0.0, 0, 0)] for name in PROVIDERS
        }
        self._paused: dict[str, list[tuple[float, float | None]]] = {
            name: [] for name in PROVIDERS
        }

    def add(self, provider: str, in_use: int, waiting: int) -> None:
        """Slots in use and calls waiting at ``provider``, as of now."""
        self._points[provider].append(
            (trio.current_time() - self.started, in_use, waiting)
        )

    def pause(self, provider: str, until: float) -> None:
        """``provider`` is paused from now until ``until`` (trio clock)."""
        now = trio.current_time() - self.started
        spans = self._paused[provider]
        if spans and spans[-1][1] is not None and spans[-1][1] >= now:
            spans[-1] = (spans[-1][0], until - self.started)
        else:
            spans.append((now, until - self.started))

    async def record(
        self,
        dispatcher: Dispatcher,
        *,
        slots: bool,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Record the dispatcher's pauses, and its slots if ``slots``."""
        async with dispatcher.events(buffer=1 << 16) as events:
            task_status.started()
            async for event in events:
                at = event.at - self.started
                if isinstance(event, Granted | Queued | Released | Withdrawn):
                    if slots:
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
class _FifoProvider:
    """A provider behind a ``trio.CapacityLimiter``: FIFO per call.

    It honours ``Retry-After`` as the dispatcher does: a 429 holds back
    every call granted after it until the pause is over. So the two runs
    differ only in the order calls are served.
    """

    def __init__(
        self, provider: Provider, limiter: trio.CapacityLimiter, timeline: _Timeline
    ) -> None:
        self._provider = provider
        self._limiter = limiter
        self._timeline = timeline
        self._waiting = 0
        self._sending = 0
        self.paused_until = -math.inf

    @property
    def id(self) -> str:
        return self._provider.id

    def row(self) -> ProviderRow:
        """The provider as the live display shows it."""
        return ProviderRow(
            limit=int(self._limiter.total_tokens),
            in_use=self._sending,
            waiting=self._waiting,
            paused=trio.current_time() < self.paused_until,
        )

    def _note(self) -> None:
        self._timeline.add(self.id, self._sending, self._waiting)

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        self._waiting += 1
        self._note()
        try:
            await self._limiter.acquire()
            # Paused: the slot is granted, in FIFO order, but nothing is
            # sent before the pause is over (as the dispatcher grants none);
            # meanwhile the call still counts as waiting.
            try:
                await trio.sleep_until(self.paused_until)
            except BaseException:
                self._limiter.release()
                raise
        finally:
            self._waiting -= 1
        self._sending += 1
        self._note()
        try:
            async with self._provider.stream(request) as events:
                yield events
        except RateLimited as error:
            pause = RETRY_AFTER if error.retry_after is None else error.retry_after
            self.paused_until = max(self.paused_until, trio.current_time() + pause)
            self._timeline.pause(self.id, self.paused_until)
            raise
        finally:
            self._sending -= 1
            self._limiter.release()
            self._note()


async def _run_fleet(
    options: DemoOptions,
    progress: Progress,
    on_progress: Callable[[Progress], None] | None,
    name: RunName,
) -> RunReport:
    """Run the fleet once: oldest-first through the dispatcher, or FIFO."""
    fifo = name == "fifo"
    tallies = {provider: _Tally() for provider in PROVIDERS}
    started = trio.current_time()
    timeline = _Timeline(started)
    limits = options.limits()
    scripts = {provider: _Script(options) for provider in PROVIDERS}
    async with (
        # Outside the dispatcher: it reads the events to the end after the
        # dispatcher closes.
        trio.open_nursery() as recorder,
        open_fake_llm_server(scripts["openai"].script()) as server_o,
        open_fake_llm_server(scripts["anthropic"].script()) as server_a,
        # Their ids are their defaults, "openai" and "anthropic".
        OpenAIProvider(
            base_url=server_o.openai_base_url, api_key="sk-demo", model="demo-model"
        ) as openai,
        AnthropicProvider(
            base_url=server_a.anthropic_base_url,
            api_key="sk-ant-demo",
            model="demo-model",
        ) as anthropic,
        open_dispatcher(
            {} if fifo else limits, default_pause=RETRY_AFTER, unknown_providers="allow"
        ) as dispatcher,
    ):
        await recorder.start(partial(timeline.record, dispatcher, slots=not fifo))
        servers = {"openai": server_o, "anthropic": server_a}
        providers: dict[str, Provider] = {"openai": openai, "anthropic": anthropic}
        fifos = {
            key: _FifoProvider(provider, trio.CapacityLimiter(limits[key]), timeline)
            for key, provider in providers.items()
            if fifo
        }
        providers.update(fifos)

        async def agent(index: int, arrival: float) -> None:
            provider_name = provider_of(options, index)
            tally = tallies[provider_name]
            await trio.sleep_until(started + arrival)
            conversation = dispatcher.start_conversation(
                providers[provider_name],
                conversation_id=f"agent-{index:03d}",
                tools=TOOLS,
                system_prompt="You are a helpful agent. Use the tools.",
                options=ConversationOptions(
                    retry_backoff=0.05, seed=options.seed * 1000 + index
                ),
            )
            try:
                for turn in range(options.turns):
                    tally.started[index, turn] = trio.current_time()
                    try:
                        result = await conversation.ask(_question(index, turn))
                    except ProviderError:
                        progress.turns_failed += 1
                        continue
                    tally.latencies.append(result.finished_at - result.started_at)
                    tally.started[index, turn] = result.started_at
                    tally.retries += result.retries
                    tally.llm_calls += result.llm_calls
                    progress.llm_calls += result.llm_calls
                    progress.turns_done += 1
            finally:
                conversation.close()

        def observe() -> None:
            _observe(dispatcher, servers, fifos, progress, tallies)
            if on_progress is not None:
                on_progress(progress)

        async def watch() -> None:
            while True:
                observe()
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as agents:
                for index, arrival in enumerate(arrivals(options)):
                    agents.start_soon(agent, index, arrival)
            nursery.cancel_scope.cancel()
        observe()
        ended = trio.current_time()
        waits = {p: _first_call_waits(tallies[p], scripts[p]) for p in PROVIDERS}
        return RunReport(
            name=name,
            providers=tuple(
                _summary(p, limits[p], servers[p], tallies[p], waits[p])
                for p in PROVIDERS
            ),
            turns_completed=progress.turns_done,
            turns_failed=progress.turns_failed,
            duration=ended - started,
            turn_latencies={p: tuple(tally.latencies) for p, tally in tallies.items()},
            first_call_waits={p: tuple(w) for p, w in waits.items()},
            timeline=timeline.points(),
            pauses=timeline.spans(ended),
            answers={p: script.in_order() for p, script in scripts.items()},
        )


def _first_call_waits(tally: _Tally, script: _Script) -> list[float]:
    first = script.first_requests()
    return [
        max(0.0, first[key] - start)
        for key, start in tally.started.items()
        if key in first
    ]


def _observe(
    dispatcher: Dispatcher,
    servers: Mapping[str, FakeLLMServer],
    fifos: Mapping[str, _FifoProvider],
    progress: Progress,
    tallies: Mapping[str, _Tally],
) -> None:
    stats = dispatcher.statistics()
    now = trio.current_time()
    for name, provider in stats.providers.items():
        if provider.paused_until is not None:
            tally = tallies[name]
            tally.longest_pause = max(tally.longest_pause, provider.paused_until - now)
    if fifos:
        progress.rows = {name: fifo.row() for name, fifo in fifos.items()}
    else:
        progress.statistics = stats
        progress.rows = ProviderRow.rows_of(stats)
    for name, server in servers.items():
        progress.server_in_flight[name] = server.statistics().in_flight


def _summary(
    name: str, limit: int, server: FakeLLMServer, tally: _Tally, waits: list[float]
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
        first_call_wait_p50=percentile(waits, 50),
        first_call_wait_p95=percentile(waits, 95),
        first_call_wait_max=max(waits, default=math.nan),
        llm_calls=tally.llm_calls,
        retries=tally.retries,
        server_requests=server_stats.requests_total,
        server_peak_in_flight=server_stats.peak_in_flight,
        rate_limited=server_stats.responses_by_status.get(429, 0),
        longest_pause=tally.longest_pause,
    )
