"""A server that queues instead of refusing: which limit keeps its queue on our side.

Usage::

    python bench/self_hosted.py [--quick] [--seconds S] [--load L] [--seed N]
        [--sweep 1,2,4] [--json PATH]
    python bench/self_hosted.py --server-command "CMD ... {port} ..." [--model NAME] ...
    python bench/self_hosted.py --server-url URL [--metrics-url URL] [--model NAME] ...

A fleet of agents' turns (each a few calls in a row, a tool's pause between
them, the prompt growing with each call) is offered, open loop, at ``load``
times a self-hosted server's capacity, through ``Dispatcher.transport`` and
httpx2, streaming. Each limit meets the same arrivals:

- a fixed 64, what users set "to be safe";
- every fixed limit of a sweep: the best (most calls per second, then the
  lowest turn p95) is the reference;
- ``AdaptiveLimit(initial=1, maximum=64, signal="latency")``, nothing else
  known;
- the same with the server's metrics given (``server_load``, its
  ``/metrics`` read every ``METRICS_EVERY`` seconds).

By default the server is a fake one (``trio_dispatch.testing.FakeBatching``:
6 batch slots; its throughput grows with the batch up to 6 and not beyond;
past its slots it queues, first come first served, as vLLM, llama.cpp's
``llama-server``, SGLang and TGI do), run in virtual time
(``StreamingASGITransport``, ``MockClock``): a fixed limit's figures are
exact and repeatable for a seed; a learned limit's vary a little from run
to run, as its moves follow the order in which trio runs the tasks ready
together (which trio shuffles). Its sweep runs from 1 to 32.

With ``--server-command`` or ``--server-url`` the server is a real one, on
the real clock, through ``httpx2.AsyncHTTPTransport``:

- ``--server-command "CMD ..."`` (split as a shell would, run without one)
  starts it, with a free port put in place of every ``{port}``; the script
  waits until its ``/health`` (or, where that is 404, ``/v1/models``)
  answers 200, and stops it at the end (SIGTERM to its process group, then
  SIGKILL), on an error or Ctrl+C too. It listens on
  ``http://127.0.0.1:{port}``, or at ``--server-url`` if given (a command
  with no ``{port}`` needs it);
- ``--server-url URL`` alone: a server already running (a vLLM of yours);
- ``--model NAME``: the ``model`` of each request's body (by default, the
  first that ``/v1/models`` lists); ``--metrics-url``: its Prometheus
  metrics (by default ``<server>/metrics``), where its queue is read.

Its capacity is unknown, so it is measured first: a calibration at a fixed
limit of ``--calibration-limit`` (16) concurrent calls, offered far more
calls than it can take, for ``CALIBRATION_SECONDS`` (30; half the run's
length if shorter), gives the calls per second the arrivals are planned
from. The turns are smaller than the fake server's (``REAL_WORKLOAD``:
prompts from 100 tokens, answers of 16 to 64), so a CPU server completes
enough of them; each request asks for ``max_tokens`` and ``ignore_eos``
(which llama.cpp, vLLM and SGLang honour) so that the answer has the length
planned, and its prompt starts with its turn's number, so that only a
turn's own calls share a prefix in the server's cache. The sweep is 1, 2,
4, 6 and 8 (for ``llama-server --parallel 4``; ``--sweep`` for a larger
server, and ``--calibration-limit`` above its batch). Before each run the
script waits, at most ``IDLE_SECONDS``, until the server's metrics show
nothing running nor waiting: the calls cut off at the end of a run may
still be on it. A request that fails (no answer, a connection closed,
a status other than 200; ``llama-server`` sometimes closes a kept-alive
connection just as a client reuses it) is sent once more; a second
failure ends its turn. Both are counted in the report, with the
machine's load average at the end of each run.

For each limit: the calls completed per second (after the first ``warmup``
seconds), the turns' p50 and p95 (of the turns that started after the
warmup and ended), the server's mean waiting count and the share of the
time its queue held anything, the share of calls a younger turn's call
overtook on the server (it started running while an older turn's call,
asked for earlier, waited), and for the adaptive limit its values over
time and when it settled (from then on within 2 of its final median).
Against the fake server its queue is its own exact statistics, sampled
every 0.1 s, and a call started running at its first token less its
prefill; against a real one, the queue is its ``/metrics``
(``parse_server_load``; llama.cpp's ``llamacpp:requests_deferred``) read
every 0.25 s, the waiting count integrated over those readings, and since
its prefill is unknown, a call's first content chunk stands for the moment
it started running (the overtaken share counts a call whose prefill was
long as started late).

Prints a markdown table on stdout (progress on stderr) and, with
``--json``, writes the report. Against the fake server, exits 1 if a
target is missed: the adaptive limit's throughput at least 95% of the best
fixed limit's, its turn p95 at most 1.1x the best fixed limit's, the
server's mean waiting count at most 1, settled within 60 s; with the
server's metrics, the server's queue empty at least 95% of the time, and
throughput at least 95% of the best fixed limit's. Against a real server
the same comparison is reported as measured, and the status is 0 (1 if
the server cannot be started or reached).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import random
import shlex
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs
import httpx2
import trio
import trio.testing

from trio_dispatch import (
    AdaptiveLimit,
    ServerLoad,
    ServerLoadUnavailable,
    ServerMetrics,
    open_dispatcher,
    parse_server_load,
)
from trio_dispatch.testing import (
    FakeBatching,
    FakeLLMServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    StreamingASGITransport,
)

from _common import (
    command_line,
    count_option,
    environment,
    free_port,
    load_average,
    plain,
    show_progress,
)
from _model_server import (
    ServerUnavailable,
    first_model,
    server_command,
    serving,
    wait_until_ready,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
    from contextlib import AbstractAsyncContextManager


PROVIDER: Final = "local"
KEY: Final = "sk-bench"
SERVER: Final = FakeBatching(
    slots=6, prefill_per_token=0.0002, decode_per_token=0.02, decode_growth=0.25
)
"""The fake server: 6 slots; a lone request 50 tokens/s, 6 together 133."""


@final
@attrs.frozen
class Workload:
    """The agents' turns: their calls, answers, prompts and tools' pauses.

    Attributes:
        calls_per_turn: A turn's calls, drawn uniformly between the two.
        output_tokens: A call's answer, in tokens, drawn uniformly.
        prompt_tokens: The first call's prompt.
        added_tokens: A tool's result, added to the prompt with each answer.
        tool_seconds: A tool's pause between two calls of a turn.
    """

    calls_per_turn: tuple[int, int]
    output_tokens: tuple[int, int]
    prompt_tokens: int
    added_tokens: int
    tool_seconds: tuple[float, float]

    def mean_calls(self) -> float:
        """A turn's calls, on average."""
        return sum(self.calls_per_turn) / 2


FAKE_WORKLOAD: Final = Workload(
    calls_per_turn=(2, 4),
    output_tokens=(40, 160),
    prompt_tokens=400,
    added_tokens=100,
    tool_seconds=(0.2, 1.0),
)
"""The turns offered to the fake server."""

REAL_WORKLOAD: Final = attrs.evolve(
    FAKE_WORKLOAD, output_tokens=(16, 64), prompt_tokens=100, added_tokens=30
)
"""The turns offered to a real server: shorter, for a small model on a CPU.

A turn's last prompt stays under 400 tokens, well within the 2,048 of a
slot of ``llama-server --parallel 4 -c 8192``.
"""

SWEEP: Final = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
QUICK_SWEEP: Final = (2, 4, 6, 8, 12)
REAL_SWEEP: Final = (1, 2, 4, 6, 8)
"""The fixed limits tried against a real server, quick or not."""

FAKE_SAMPLE_EVERY: Final = 0.1
"""Seconds between two looks at the fake server's queue and the limit."""

REAL_SAMPLE_EVERY: Final = 0.25
"""Seconds between two readings of a real server's queue (its ``/metrics``)."""

METRICS_EVERY: Final = 0.5
"""Seconds between two readings of the server's ``/metrics`` (``server_load``)."""

LATENCY: Final = AdaptiveLimit(initial=1, minimum=1, maximum=64, signal="latency")

CALIBRATION_LIMIT: Final = 16
"""The fixed limit at which a real server's capacity is measured, by default."""

CALIBRATION_SECONDS: Final = 30.0
"""How long a real server's capacity is measured (at most half a run's length)."""

CALIBRATION_OFFER: Final = 4.0
"""Calls per second offered to the calibration, per slot of its limit.

More than a server gives at that concurrency, unless a call takes under
0.25 s: the dispatcher's queue never runs dry, and the calls completed per
second are the server's.
"""

IDLE_SECONDS: Final = 120.0
"""How long, at most, a real server is given to finish the last run's calls."""


@final
@attrs.frozen
class TurnPlan:
    """One turn: when it starts, and each call's answer length and tool pause."""

    start: float
    outputs: tuple[int, ...]
    pauses: tuple[float, ...]


def capacity_calls_per_second() -> float:
    """The fake server's throughput in calls per second with every slot busy."""
    workload = FAKE_WORKLOAD
    mean_output = sum(workload.output_tokens) / 2
    mean_prompt = workload.prompt_tokens + (workload.mean_calls() - 1) / 2 * (
        mean_output + workload.added_tokens
    )
    call = SERVER.prefill(int(mean_prompt)) + mean_output * SERVER.step(SERVER.slots)
    return SERVER.slots / call


def plan_turns(
    seconds: float, calls_per_second: float, seed: int, workload: Workload
) -> list[TurnPlan]:
    """Poisson arrivals of turns offering ``calls_per_second`` calls."""
    rng = random.Random(seed)
    turns_per_second = calls_per_second / workload.mean_calls()
    plans = []
    now = rng.expovariate(turns_per_second)
    while now < seconds:
        calls = rng.randint(*workload.calls_per_turn)
        plans.append(
            TurnPlan(
                start=now,
                outputs=tuple(
                    rng.randint(*workload.output_tokens) for _ in range(calls)
                ),
                pauses=tuple(
                    rng.uniform(*workload.tool_seconds) for _ in range(calls - 1)
                ),
            )
        )
        now += rng.expovariate(turns_per_second)
    return plans


@final
@attrs.define
class CallRecord:
    """One call as the agent saw it."""

    turn_start: float
    asked_at: float
    prefill: float
    first_token_at: float = math.nan
    ended_at: float = math.nan

    @property
    def running_at(self) -> float:
        """When the server gave it a batch slot: its first token less its prefill."""
        return self.first_token_at - self.prefill


@final
@attrs.frozen
class Row:
    """One limit's figures."""

    limit: str
    calls_per_second: float
    turns_done: int
    turn_p50: float
    turn_p95: float
    server_waiting_mean: float
    server_queue_share: float
    overtaken_share: float
    limit_median: float | None = None
    settled_at: float | None = None
    limit_trace: tuple[tuple[float, int], ...] = ()
    retried: int = 0
    failed: int = 0


@final
@attrs.define
class Errors:
    """One run's failed requests: sent again once, then failed again."""

    retried: int = 0
    failed: int = 0


class RunServer(Protocol):
    """The server of one run, as its agents and its watch see it."""

    @property
    def load(self) -> ServerMetrics | Callable[[], Awaitable[ServerLoad]]:
        """Where the dispatcher reads its load, with the server's metrics given."""
        ...

    def transport(self) -> httpx2.AsyncBaseTransport:
        """Where the dispatcher's transport sends the calls."""
        ...

    def prefill(self, messages: list[dict[str, str]]) -> float:
        """Seconds between a call's batch slot and its first token, as far as known."""
        ...

    async def waiting(self) -> int | None:
        """The requests on the server's own queue now (``None``: unknown this time)."""
        ...

    def waiting_seconds(
        self, samples: Sequence[tuple[float, int]], seconds: float
    ) -> float:
        """The run's requests times seconds spent on the server's queue."""
        ...


class Target(Protocol):
    """Where the runs' calls go: the fake server in virtual time, or a real one."""

    @property
    def url(self) -> str:
        """Where its chat completions are (less ``/v1/chat/completions``)."""
        ...

    @property
    def model(self) -> str:
        """The ``model`` of the requests' bodies."""
        ...

    @property
    def workload(self) -> Workload:
        """The turns offered to it."""
        ...

    @property
    def sample_every(self) -> float:
        """Seconds between two looks at its queue and the limit."""
        ...

    @property
    def capacity(self) -> float | None:
        """Its calls per second with every slot busy, or ``None``: to be measured."""
        ...

    @property
    def calibration_limit(self) -> int:
        """The fixed limit its capacity is measured at, if it must be."""
        ...

    def clock(self) -> trio.abc.Clock | None:
        """The clock of its runs (``None``: trio's own)."""
        ...

    def open_run(self) -> AbstractAsyncContextManager[RunServer]:
        """A run's server, ready for its first call."""
        ...


@final
@attrs.define(eq=False)
class _FakeRun:
    server: FakeLLMServer
    metrics_client: httpx2.AsyncClient

    async def load(self) -> ServerLoad:
        answer = await self.metrics_client.get("http://server.test/metrics")
        return parse_server_load(answer.text)

    def transport(self) -> httpx2.AsyncBaseTransport:
        return StreamingASGITransport(self.server)

    def prefill(self, messages: list[dict[str, str]]) -> float:
        # The server's own estimate of the prompt, for its prefill.
        return SERVER.prefill(max(1, len(json.dumps(messages)) // 4))

    async def waiting(self) -> int | None:
        await trio.lowlevel.checkpoint()
        return self.server.statistics().waiting

    def waiting_seconds(
        self, samples: Sequence[tuple[float, int]], seconds: float
    ) -> float:
        return self.server.statistics().waiting_seconds


@final
@attrs.frozen
class FakeTarget:
    """The fake batching server (``SERVER``), a fresh one for each run, in virtual time."""

    url: str = "http://server.test"
    model: str = "m"
    workload: Workload = FAKE_WORKLOAD
    sample_every: float = FAKE_SAMPLE_EVERY
    capacity: float | None = attrs.field(factory=capacity_calls_per_second)
    calibration_limit: int = CALIBRATION_LIMIT

    def clock(self) -> trio.abc.Clock | None:
        """Virtual time, jumping whenever every task waits."""
        return trio.testing.MockClock(autojump_threshold=0)

    @contextlib.asynccontextmanager
    async def open_run(self) -> AsyncIterator[RunServer]:
        """A new fake server, and a client of its metrics."""
        server = FakeLLMServer(FakeScript(choose=_reply), api_key=KEY, batching=SERVER)
        async with httpx2.AsyncClient(
            transport=StreamingASGITransport(server)
        ) as metrics_client:
            yield _FakeRun(server, metrics_client)


@final
@attrs.define(eq=False)
class _RealRun:
    load: ServerMetrics
    client: httpx2.AsyncClient

    def transport(self) -> httpx2.AsyncBaseTransport:
        return httpx2.AsyncHTTPTransport()

    def prefill(self, messages: list[dict[str, str]]) -> float:
        return 0.0  # unknown: the first content chunk stands for the start

    async def waiting(self) -> int | None:
        try:
            return (await self.load.read(self.client)).waiting
        except ServerLoadUnavailable:
            return None

    def waiting_seconds(
        self, samples: Sequence[tuple[float, int]], seconds: float
    ) -> float:
        return _integrated(samples, seconds)


@final
@attrs.frozen
class RealTarget:
    """A real server at ``url``, its queue read from ``metrics_url``, on the real clock."""

    url: str
    model: str
    metrics_url: str
    calibration_limit: int = CALIBRATION_LIMIT
    workload: Workload = REAL_WORKLOAD
    sample_every: float = REAL_SAMPLE_EVERY
    capacity: float | None = None

    def clock(self) -> trio.abc.Clock | None:
        """Trio's own clock."""
        return None

    @contextlib.asynccontextmanager
    async def open_run(self) -> AsyncIterator[RunServer]:
        """The server, once it has nothing running nor waiting (or ``IDLE_SECONDS`` on)."""
        metrics = ServerMetrics(self.metrics_url, timeout=self.sample_every)
        async with httpx2.AsyncClient() as client:
            with trio.move_on_after(IDLE_SECONDS):
                while True:
                    try:
                        load = await metrics.read(client)
                    except ServerLoadUnavailable:
                        break  # no metrics to wait on
                    if load.running == load.waiting == 0:
                        break
                    await trio.sleep(self.sample_every)
            yield _RealRun(metrics, client)


def _reply(request: FakeRequest) -> FakeReply:
    tokens = int(request.body.get("max_tokens", 100))
    return FakeReply(text=" ".join(["tok"] * tokens), output_tokens=tokens)


def _words(head: str, tokens: int) -> str:
    """Text of about ``tokens`` tokens, four characters each, starting with ``head``."""
    return (f"{head} " + "tok " * tokens)[: 4 * tokens]


def _has_content(line: str) -> bool:
    """Whether a line of a chat completion's stream carries some of the answer."""
    if not line.startswith("data:"):
        return False
    try:
        event = json.loads(line[len("data:") :])
    except ValueError:  # "[DONE]", or what is no event of the answer's
        return False
    choices = event.get("choices") if isinstance(event, dict) else None
    return any(
        isinstance(choice, dict) and (choice.get("delta") or {}).get("content")
        for choice in choices or ()
    )


async def _call(
    http: httpx2.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    record: CallRecord,
    now: Callable[[], float],
    errors: Errors,
) -> bool:
    """Make one call, streamed, and once more if it fails; whether it was answered."""
    for attempt in range(2):
        try:
            async with http.stream(
                "POST", url, json=body, headers={"authorization": f"Bearer {KEY}"}
            ) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if math.isnan(record.first_token_at) and _has_content(line):
                        record.first_token_at = now()
        except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
            show_progress(f"request failed ({type(exc).__name__}: {exc})")
            record.first_token_at = math.nan
            if attempt:
                errors.failed += 1
                return False
            errors.retried += 1
        else:
            record.ended_at = now()
            return True
    raise AssertionError("unreachable")  # pragma: no cover


async def _run(  # one run, its agents and its watch
    target: Target,
    plans: Sequence[TurnPlan],
    limit: int | AdaptiveLimit,
    seconds: float,
    warmup: float,
    *,
    metrics: bool = False,
) -> Row:
    calls: list[CallRecord] = []
    turns: list[tuple[float, float]] = []
    queue_samples: list[tuple[float, int]] = []
    trace: list[tuple[float, int]] = []
    errors = Errors()
    workload = target.workload
    async with (
        target.open_run() as server,
        open_dispatcher(
            {PROVIDER: limit},
            server_load={PROVIDER: server.load} if metrics else None,
            server_load_interval=METRICS_EVERY,
        ) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport(PROVIDER, inner=server.transport()),
            timeout=None,
        ) as http,
        trio.open_nursery() as nursery,
    ):
        origin = trio.current_time()

        def now() -> float:
            return trio.current_time() - origin

        async def agent(index: int, plan: TurnPlan) -> None:
            prompt = _words(f"turn {index}", workload.prompt_tokens)
            with dispatcher.turn(started_at=origin + plan.start):
                for n, output in enumerate(plan.outputs):
                    messages = [{"role": "user", "content": prompt}]
                    record = CallRecord(plan.start, now(), server.prefill(messages))
                    calls.append(record)
                    body = {
                        "model": target.model,
                        "stream": True,
                        "max_tokens": output,
                        "ignore_eos": True,
                        "messages": messages,
                    }
                    answered = await _call(
                        http,
                        f"{target.url}/v1/chat/completions",
                        body,
                        record=record,
                        now=now,
                        errors=errors,
                    )
                    if not answered:
                        return  # failed twice: the turn is given up
                    prompt += "tok " * (output + workload.added_tokens)
                    if n < len(plan.pauses):
                        await trio.sleep(plan.pauses[n])
            turns.append((plan.start, now()))

        async def watch() -> None:
            while True:
                at = now()
                waiting = await server.waiting()
                if waiting is not None:
                    queue_samples.append((at, waiting))
                trace.append((at, dispatcher.limits()[PROVIDER]))
                await trio.sleep(target.sample_every)

        nursery.start_soon(watch)
        async with trio.open_nursery() as agents:
            for index, plan in enumerate(plans):
                await trio.sleep_until(origin + plan.start)
                agents.start_soon(agent, index, plan)
            await trio.sleep_until(origin + seconds)
            agents.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
        waiting_seconds = server.waiting_seconds(queue_samples, seconds)
    name = str(limit) if isinstance(limit, int) else "adaptive (latency)"
    row = _row(
        f"{name} + server metrics" if metrics else name,
        calls,
        turns,
        queue_samples,
        trace if isinstance(limit, AdaptiveLimit) else [],
        waiting_seconds,
        seconds,
        warmup,
        target.sample_every,
    )
    return attrs.evolve(row, retried=errors.retried, failed=errors.failed)


def _row(  # noqa: PLR0917  # one run's records
    name: str,
    calls: list[CallRecord],
    turns: list[tuple[float, float]],
    queue_samples: list[tuple[float, int]],
    trace: list[tuple[float, int]],
    waiting_seconds: float,
    seconds: float,
    warmup: float,
    sample_every: float,
) -> Row:
    measured = seconds - warmup
    done = [c for c in calls if not math.isnan(c.ended_at) and c.ended_at >= warmup]
    durations = sorted(end - start for start, end in turns if start >= warmup)
    samples = [waiting for at, waiting in queue_samples if at >= warmup]
    row = Row(
        limit=name,
        calls_per_second=len(done) / measured,
        turns_done=len(durations),
        turn_p50=_quantile(durations, 0.5),
        turn_p95=_quantile(durations, 0.95),
        server_waiting_mean=waiting_seconds / seconds,
        server_queue_share=sum(1 for s in samples if s) / max(1, len(samples)),
        overtaken_share=_overtaken(calls),
    )
    values = [value for at, value in trace if at >= warmup]
    if values:
        final = statistics.median(values[len(values) // 2 :])
        settled = 0.0
        for at, value in trace:
            if abs(value - final) > 2:
                settled = at
        row = attrs.evolve(
            row,
            limit_median=final,
            settled_at=settled,
            limit_trace=tuple(trace[:: max(1, round(5 / sample_every))]),
        )
    return row


def _integrated(samples: Sequence[tuple[float, int]], seconds: float) -> float:
    """Requests times seconds, each reading holding until the next (the last until the end)."""
    ends = [at for at, _ in samples[1:]] + [seconds]
    return sum(
        waiting * max(0.0, end - at)
        for (at, waiting), end in zip(samples, ends, strict=True)
    )


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, int(q * len(values)))]


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else math.nan


def _overtaken(calls: list[CallRecord]) -> float:
    """The share of calls a younger turn's call overtook.

    ``y`` overtook ``o`` if ``y``'s turn started after ``o``'s and ``y``
    started running on the server while ``o`` waited (asked for, not yet
    running): the dispatcher, holding the queue, would have sent ``o`` first.
    """
    started = sorted(
        (c for c in calls if not math.isnan(c.first_token_at)),
        key=lambda c: c.running_at,
    )
    overtaken = 0
    for i, older in enumerate(started):
        for younger in started[:i]:
            if (
                younger.turn_start > older.turn_start
                and older.asked_at <= younger.running_at < older.running_at
            ):
                overtaken += 1
                break
    return overtaken / max(1, len(started))


def calibrate(target: Target, seconds: float, seed: int) -> Row:
    """The target's calls per second at its calibration limit, offered far more."""
    limit = target.calibration_limit
    plans = plan_turns(seconds, CALIBRATION_OFFER * limit, seed, target.workload)
    show_progress(f"calibration: a fixed limit of {limit} for {seconds:g} s")
    row = trio.run(
        functools.partial(_run, target, plans, limit, seconds, seconds / 6),
        clock=target.clock(),
    )
    return attrs.evolve(row, limit=f"calibration ({limit})")


def run_self_hosted(
    target: Target, *, seconds: float, load: float, seed: int, sweep: Sequence[int]
) -> dict[str, Any]:
    """Every limit against the same arrivals; the report as plain data."""
    calibration = None
    capacity = target.capacity
    calibration_seconds = min(CALIBRATION_SECONDS, seconds / 2)
    if capacity is None:
        calibration = calibrate(target, calibration_seconds, seed)
        capacity = calibration.calls_per_second
        show_progress(f"capacity: {capacity:.3f} calls/s")
    warmup = min(60.0, seconds / 4)
    plans = plan_turns(seconds, load * capacity, seed, target.workload)
    rows: list[Row] = []
    loads: list[str] = []
    runs: list[tuple[int | AdaptiveLimit, bool]] = [
        (64, False),
        *((limit, False) for limit in sweep),
        (LATENCY, False),
        (LATENCY, True),
    ]
    for limit, metrics in runs:
        show_progress(f"limit {limit}{' with metrics' if metrics else ''}")
        row = trio.run(
            functools.partial(
                _run, target, plans, limit, seconds, warmup, metrics=metrics
            ),
            clock=target.clock(),
        )
        rows.append(row)
        loads.append(load_average())
        if calibration is not None:
            show_progress(
                f"{row.calls_per_second:.3f} calls/s, turn p95 {row.turn_p95:.1f} s,"
                f" server waiting {row.server_waiting_mean:.2f};"
                f" load average {loads[-1]}"
            )
    # The best fixed limit: the lowest turn p95 among those within 2% of
    # the most calls per second (a finite run's throughputs differ by a
    # call or two where the server is full either way).
    fixed = rows[1:-2]
    most = max(row.calls_per_second for row in fixed)
    best = min(
        (row for row in fixed if row.calls_per_second >= 0.98 * most),
        key=lambda row: (math.isnan(row.turn_p95), row.turn_p95),
    )
    adaptive, with_metrics = rows[-2], rows[-1]
    throughput = _ratio(adaptive.calls_per_second, best.calls_per_second)
    turn_p95 = _ratio(adaptive.turn_p95, best.turn_p95)
    settled_at = adaptive.settled_at or 0.0
    targets = {
        "throughput_vs_best": throughput,
        "turn_p95_vs_best": turn_p95,
        "server_waiting_mean": adaptive.server_waiting_mean,
        "settled_at": settled_at,
        "metrics_queue_empty": 1 - with_metrics.server_queue_share,
        "metrics_throughput_vs_best": _ratio(
            with_metrics.calls_per_second, best.calls_per_second
        ),
    }
    met = (
        throughput >= 0.95
        and turn_p95 <= 1.1
        and adaptive.server_waiting_mean <= 1
        and settled_at <= 60
        and targets["metrics_queue_empty"] >= 0.95
        and targets["metrics_throughput_vs_best"] >= 0.95
    )
    config: dict[str, Any] = {
        "seconds": seconds,
        "load": load,
        "seed": seed,
        "turns": len(plans),
        "capacity_calls_per_second": capacity,
    }
    if calibration is None:
        config["server"] = plain(SERVER)
    else:
        assert isinstance(target, RealTarget)
        config |= {
            "server_url": target.url,
            "metrics_url": target.metrics_url,
            "model": target.model,
            "workload": plain(target.workload),
            "calibration_limit": target.calibration_limit,
            "calibration_seconds": calibration_seconds,
            "calibration": plain(calibration),
            "load_averages": dict(zip((row.limit for row in rows), loads, strict=True)),
        }
    return {
        "config": config,
        "rows": [plain(row) for row in rows],
        "best_fixed": best.limit,
        "targets": targets,
        "met": met,
    }


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table."""
    config = report["config"]
    real = "calibration" in config
    if real:
        calibration = config["calibration"]
        errors = [
            f"{row['limit']}: {row['retried']}/{row['failed']}"
            for row in [calibration, *report["rows"]]
            if row["retried"] or row["failed"]
        ]
        loads = ", ".join(
            f"{name}: {value}" for name, value in config["load_averages"].items()
        )
        environment = report.get("environment", {})
        header = [
            f"{config['turns']} turns in {config['seconds']:g} seconds against the"
            f" server at {config['server_url']} (model {config['model']!r}), offered"
            f" at {config['load']:.0%} of its capacity"
            f" ({config['capacity_calls_per_second']:.2f} calls/s, measured at a"
            f" fixed limit of {config['calibration_limit']} for"
            f" {config['calibration_seconds']:g} s, with the server's queue"
            f" {calibration['server_waiting_mean']:.1f} on average), seed"
            f" {config['seed']}; best fixed limit: {report['best_fixed']}.",
            "",
            *(
                [f"Server started with `{config['server_command']}`.", ""]
                if config.get("server_command")
                else []
            ),
            f"Its queue read from {config['metrics_url']}; a call's first content"
            " chunk stands for the moment it started running (its prefill is"
            " unknown).",
        ]
        footer = [
            "",
            "Request errors, sent once more (retried/failed again): "
            + (", ".join(errors) if errors else "none")
            + ".",
            "",
            f"Load average (1 min): {environment.get('load_before', '?')} before,"
            f" at the end of each run {loads}.",
        ]
    else:
        header = [
            f"{config['turns']} turns in {config['seconds']:g} virtual seconds, offered at"
            f" {config['load']:.0%} of the server's capacity"
            f" ({config['capacity_calls_per_second']:.2f} calls/s; 6 batch slots),"
            f" seed {config['seed']}; best fixed limit: {report['best_fixed']}.",
        ]
        footer = []
    lines = [
        "# A server that queues: which limit keeps its queue on our side",
        "",
        *header,
        "",
        "| Limit | Calls/s | Turns | Turn p50 | Turn p95 | Server waiting (mean) | Server queue non-empty | Overtaken | Limit (median) | Settled at |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in report["rows"]:
        median = "" if row["limit_median"] is None else f"{row['limit_median']:g}"
        settled = "" if row["settled_at"] is None else f"{row['settled_at']:.0f} s"
        lines.append(
            f"| {row['limit']} | {row['calls_per_second']:.3f} | {row['turns_done']}"
            f" | {row['turn_p50']:.1f} s | {row['turn_p95']:.1f} s"
            f" | {row['server_waiting_mean']:.2f} | {row['server_queue_share']:.1%}"
            f" | {row['overtaken_share']:.1%} | {median} | {settled} |"
        )
    targets = report["targets"]
    verdict = "Met." if report["met"] else "MISSED."
    if real:
        verdict = "All met." if report["met"] else "Not all met, as measured."
    lines += [
        "",
        f"Adaptive against the best fixed limit: throughput"
        f" {targets['throughput_vs_best']:.1%} (target at least 95%), turn p95"
        f" {targets['turn_p95_vs_best']:.2f}x (at most 1.1x), server waiting"
        f" {targets['server_waiting_mean']:.2f} on average (at most 1), settled at"
        f" {targets['settled_at']:.0f} s (within 60 s). With the server's metrics:"
        f" its queue empty {targets['metrics_queue_empty']:.1%} of the time (at least"
        f" 95%), throughput {targets['metrics_throughput_vs_best']:.1%} of the best"
        f" fixed limit's (at least 95%). {verdict}",
        *footer,
    ]
    return "\n".join(lines) + "\n"


def _url(text: str) -> str:
    """An argparse type: an http:// or https:// URL with a host, without a final slash."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected an http:// or https:// URL, got {text!r}"
        )
    return text.rstrip("/")


def _sweep(text: str) -> tuple[int, ...]:
    """An argparse type: fixed limits, comma-separated."""
    parse = count_option()
    return tuple(parse(part.strip()) for part in text.split(","))


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a usage error (status 2) for what cannot work."""
    parser = command_line(
        __doc__,
        quick="a shorter run (240 s, a smaller sweep; against a real server 60 s)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds of arrivals in each run (600 virtual; 120 against a real server)",
    )
    parser.add_argument(
        "--load", type=float, default=1.2, help="the offered load over the capacity"
    )
    parser.add_argument("--seed", type=count_option(zero=True), default=1)
    parser.add_argument(
        "--sweep", type=_sweep, default=None, help="the fixed limits tried, e.g. 1,2,4"
    )
    real = parser.add_argument_group(
        "a real server", "Run against a real server instead of the fake one."
    )
    real.add_argument(
        "--server-command",
        default=None,
        help="start the server with this command ({port}: a free port), stop it at the end",
    )
    real.add_argument(
        "--server-url",
        type=_url,
        default=None,
        help="where the server listens (default with --server-command:"
        " http://127.0.0.1:{port})",
    )
    real.add_argument(
        "--metrics-url",
        type=_url,
        default=None,
        help="its Prometheus metrics (default: <server>/metrics)",
    )
    real.add_argument(
        "--model",
        default=None,
        help="the model field of the requests (default: the first of /v1/models)",
    )
    real.add_argument(
        "--calibration-limit",
        type=count_option(),
        default=None,
        help=f"the fixed limit its capacity is measured at ({CALIBRATION_LIMIT})",
    )
    args = parser.parse_args(argv)
    if args.server_command is None and args.server_url is None:
        for option in ("metrics_url", "model", "calibration_limit"):
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                parser.error(f"{flag} needs --server-command or --server-url")
    if args.server_command is not None:
        if not shlex.split(args.server_command):
            parser.error("--server-command must not be empty")
        if "{port}" not in args.server_command and args.server_url is None:
            parser.error(
                "--server-command needs a {port} placeholder, or --server-url"
                " for where it listens"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    real = args.server_command is not None or args.server_url is not None
    if real:
        seconds = args.seconds or (60.0 if args.quick else 120.0)
        sweep = args.sweep or REAL_SWEEP
    else:
        seconds = args.seconds or (240.0 if args.quick else 600.0)
        sweep = args.sweep or (QUICK_SWEEP if args.quick else SWEEP)
    started = time.monotonic()
    load_before = load_average()
    try:
        with contextlib.ExitStack() as stack:
            target: Target = FakeTarget()
            if real:
                url = args.server_url
                if args.server_command is not None:
                    port = free_port()
                    url = url or f"http://127.0.0.1:{port}"
                    command = server_command(args.server_command, port)
                    show_progress(f"starting {shlex.join(command)}")
                    stack.enter_context(serving(command, url))
                else:
                    wait_until_ready(url, timeout=10)
                target = RealTarget(
                    url=url,
                    model=args.model or first_model(url),
                    metrics_url=args.metrics_url or f"{url}/metrics",
                    calibration_limit=args.calibration_limit or CALIBRATION_LIMIT,
                )
            report = run_self_hosted(
                target, seconds=seconds, load=args.load, seed=args.seed, sweep=sweep
            )
    except ServerUnavailable as exc:
        print(f"self_hosted: {exc}", file=sys.stderr)
        return 1
    report["environment"] = environment(httpx2=True)
    if real:
        report["config"]["server_command"] = args.server_command
        report["environment"] |= {
            "load_before": load_before,
            "load_after": load_average(),
        }
    print(to_markdown(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    show_progress(f"done in {time.monotonic() - started:.1f} s")
    return 0 if report["met"] or real else 1


if __name__ == "__main__":
    sys.exit(main())
