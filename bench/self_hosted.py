"""A server that queues instead of refusing: which limit keeps its queue on our side.

Usage::

    python bench/self_hosted.py [--quick] [--seconds S] [--load L] [--seed N] [--json PATH]

A fleet of agents' turns (each a few calls in a row, a tool's pause between
them, the prompt growing with each call) is offered, open loop, at ``load``
times the capacity of a fake self-hosted server
(``trio_dispatch.testing.FakeBatching``: 6 batch slots; its throughput
grows with the batch up to 6 and not beyond; past its slots it queues,
first come first served, as vLLM, llama.cpp's ``llama-server``, SGLang and
TGI do), through ``Dispatcher.transport`` and httpx2, streaming, in
virtual time (``StreamingASGITransport``, ``MockClock``): every figure is
exact and repeatable for a seed. Each limit meets the same arrivals:

- a fixed 64, what users set "to be safe";
- every fixed limit of a sweep from 1 to 32: the best (most calls per
  second, then the lowest turn p95) is the reference;
- ``AdaptiveLimit(initial=1, maximum=64, signal="latency")``, nothing else
  known;
- the same with the server's metrics given (``server_load``, its
  ``/metrics`` read every ``METRICS_EVERY`` seconds).

For each: the calls completed per second (after the first ``warmup``
seconds), the turns' p50 and p95 (of the turns that started after the
warmup and ended), the server's mean waiting count and the share of the
time its queue held anything, the share of calls a younger turn's call
overtook on the server (it started running while an older turn's call,
asked for earlier, waited), and for the adaptive limit its values over
time and when it settled (from then on within 2 of its final median).

Prints a markdown table on stdout (progress on stderr) and, with
``--json``, writes the report. Exits 1 if a target is missed: the
adaptive limit's throughput at least 95% of the best fixed limit's, its
turn p95 at most 1.1x the best fixed limit's, the server's mean waiting
count at most 1, settled within 60 s; with the server's metrics, the
server's queue empty at least 95% of the time, and throughput at least
95% of the best fixed limit's.

``--server-command`` is for a real server: not in this script yet (see
``docs/benchmarks.md`` for the measurement by hand against
``llama-server``).
"""

from __future__ import annotations

import functools
import json
import math
import random
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import httpx2
import trio
import trio.testing

from trio_dispatch import AdaptiveLimit, ServerLoad, open_dispatcher, parse_server_load
from trio_dispatch.testing import (
    FakeBatching,
    FakeLLMServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    StreamingASGITransport,
)

from _common import command_line, count_option, environment, plain, show_progress

if TYPE_CHECKING:
    from collections.abc import Sequence


PROVIDER: Final = "local"
KEY: Final = "sk-bench"
SERVER: Final = FakeBatching(
    slots=6, prefill_per_token=0.0002, decode_per_token=0.02, decode_growth=0.25
)
"""The fake server: 6 slots; a lone request 50 tokens/s, 6 together 133."""

CALLS_PER_TURN: Final = (2, 4)
"""A turn's calls, drawn uniformly."""

OUTPUT_TOKENS: Final = (40, 160)
"""A call's answer, in tokens, drawn uniformly."""

PROMPT_TOKENS: Final = 400
"""The first call's prompt; each later call's adds the answers and a tool result."""

TOOL_SECONDS: Final = (0.2, 1.0)
"""A tool's pause between two calls of a turn."""

SWEEP: Final = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
QUICK_SWEEP: Final = (2, 4, 6, 8, 12)
SAMPLE_EVERY: Final = 0.1
"""Seconds between two looks at the server's queue and the limit."""

METRICS_EVERY: Final = 0.5
"""Seconds between two readings of the server's ``/metrics`` (``server_load``)."""

LATENCY: Final = AdaptiveLimit(initial=1, minimum=1, maximum=64, signal="latency")


@final
@attrs.frozen
class TurnPlan:
    """One turn: when it starts, and each call's answer length and tool pause."""

    start: float
    outputs: tuple[int, ...]
    pauses: tuple[float, ...]


def capacity_calls_per_second() -> float:
    """The server's throughput in calls per second with every slot busy."""
    mean_output = sum(OUTPUT_TOKENS) / 2
    mean_calls = sum(CALLS_PER_TURN) / 2
    mean_prompt = PROMPT_TOKENS + (mean_calls - 1) / 2 * (mean_output + 100)
    call = SERVER.prefill(int(mean_prompt)) + mean_output * SERVER.step(SERVER.slots)
    return SERVER.slots / call


def plan_turns(seconds: float, load: float, seed: int) -> list[TurnPlan]:
    """Poisson arrivals of turns offering ``load`` times the server's capacity."""
    rng = random.Random(seed)
    calls_per_second = load * capacity_calls_per_second()
    turns_per_second = calls_per_second / (sum(CALLS_PER_TURN) / 2)
    plans = []
    now = rng.expovariate(turns_per_second)
    while now < seconds:
        calls = rng.randint(*CALLS_PER_TURN)
        plans.append(
            TurnPlan(
                start=now,
                outputs=tuple(rng.randint(*OUTPUT_TOKENS) for _ in range(calls)),
                pauses=tuple(rng.uniform(*TOOL_SECONDS) for _ in range(calls - 1)),
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


def _reply(request: FakeRequest) -> FakeReply:
    tokens = int(request.body.get("max_tokens", 100))
    return FakeReply(text=" ".join(["tok"] * tokens), output_tokens=tokens)


async def _run(  # one run, its agents and its watch
    plans: Sequence[TurnPlan],
    limit: int | AdaptiveLimit,
    seconds: float,
    warmup: float,
    *,
    metrics: bool = False,
) -> Row:
    server = FakeLLMServer(FakeScript(choose=_reply), api_key=KEY, batching=SERVER)
    calls: list[CallRecord] = []
    turns: list[tuple[float, float]] = []
    queue_samples: list[int] = []
    trace: list[tuple[float, int]] = []
    metrics_client = httpx2.AsyncClient(transport=StreamingASGITransport(server))

    async def server_load() -> ServerLoad:
        answer = await metrics_client.get("http://server.test/metrics")
        return parse_server_load(answer.text)

    async with (
        metrics_client,
        open_dispatcher(
            {PROVIDER: limit},
            server_load={PROVIDER: server_load} if metrics else None,
            server_load_interval=METRICS_EVERY,
        ) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport(
                PROVIDER, inner=StreamingASGITransport(server)
            ),
            timeout=None,
        ) as http,
        trio.open_nursery() as nursery,
    ):

        async def agent(plan: TurnPlan) -> None:
            prompt = "x" * (4 * PROMPT_TOKENS)
            with dispatcher.turn(started_at=plan.start):
                for n, output in enumerate(plan.outputs):
                    messages = [{"role": "user", "content": prompt}]
                    # The server's own estimate of the prompt, for its prefill.
                    prefill = SERVER.prefill(max(1, len(json.dumps(messages)) // 4))
                    record = CallRecord(plan.start, trio.current_time(), prefill)
                    calls.append(record)
                    body = {
                        "model": "m",
                        "stream": True,
                        "max_tokens": output,
                        "messages": messages,
                    }
                    async with http.stream(
                        "POST",
                        "http://server.test/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {KEY}"},
                    ) as response:
                        async for chunk in response.aiter_bytes():
                            if (
                                math.isnan(record.first_token_at)
                                and b'"content": "tok' in chunk
                            ):
                                record.first_token_at = trio.current_time()
                    record.ended_at = trio.current_time()
                    prompt += "y" * (4 * (output + 100))
                    if n < len(plan.pauses):
                        await trio.sleep(plan.pauses[n])
            turns.append((plan.start, trio.current_time()))

        async def watch() -> None:
            while True:
                queue_samples.append(server.statistics().waiting)
                trace.append((trio.current_time(), dispatcher.limits()[PROVIDER]))
                await trio.sleep(SAMPLE_EVERY)

        nursery.start_soon(watch)
        async with trio.open_nursery() as agents:
            for plan in plans:
                await trio.sleep_until(plan.start)
                agents.start_soon(agent, plan)
            await trio.sleep_until(seconds)
            agents.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
        stats = server.statistics()
    name = str(limit) if isinstance(limit, int) else "adaptive (latency)"
    return _row(
        f"{name} + server metrics" if metrics else name,
        calls,
        turns,
        queue_samples,
        trace if isinstance(limit, AdaptiveLimit) else [],
        stats.waiting_seconds,
        seconds,
        warmup,
    )


def _row(  # noqa: PLR0917  # one run's records
    name: str,
    calls: list[CallRecord],
    turns: list[tuple[float, float]],
    queue_samples: list[int],
    trace: list[tuple[float, int]],
    waiting_seconds: float,
    seconds: float,
    warmup: float,
) -> Row:
    measured = seconds - warmup
    done = [c for c in calls if not math.isnan(c.ended_at) and c.ended_at >= warmup]
    durations = sorted(end - start for start, end in turns if start >= warmup)
    samples = queue_samples[int(warmup / SAMPLE_EVERY) :]
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
    if trace:
        values = [value for at, value in trace if at >= warmup]
        final = statistics.median(values[len(values) // 2 :])
        settled = 0.0
        for at, value in trace:
            if abs(value - final) > 2:
                settled = at
        row = attrs.evolve(
            row,
            limit_median=final,
            settled_at=settled,
            limit_trace=tuple(trace[:: int(5 / SAMPLE_EVERY)]),
        )
    return row


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, int(q * len(values)))]


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


def run_self_hosted(
    *, seconds: float, load: float, seed: int, sweep: Sequence[int]
) -> dict[str, Any]:
    """Every limit against the same arrivals; the report as plain data."""
    warmup = min(60.0, seconds / 4)
    plans = plan_turns(seconds, load, seed)
    rows: list[Row] = []
    runs: list[tuple[int | AdaptiveLimit, bool]] = [
        (64, False),
        *((limit, False) for limit in sweep),
        (LATENCY, False),
        (LATENCY, True),
    ]
    for limit, metrics in runs:
        show_progress(f"limit {limit}{' with metrics' if metrics else ''}")
        rows.append(
            trio.run(
                functools.partial(_run, plans, limit, seconds, warmup, metrics=metrics),
                clock=trio.testing.MockClock(autojump_threshold=0),
            )
        )
    # The best fixed limit: the lowest turn p95 among those within 2% of
    # the most calls per second (a finite run's throughputs differ by a
    # call or two where the server is full either way).
    fixed = rows[1:-2]
    most = max(row.calls_per_second for row in fixed)
    best = min(
        (row for row in fixed if row.calls_per_second >= 0.98 * most),
        key=lambda row: row.turn_p95,
    )
    adaptive, with_metrics = rows[-2], rows[-1]
    throughput = adaptive.calls_per_second / best.calls_per_second
    turn_p95 = adaptive.turn_p95 / best.turn_p95
    settled_at = adaptive.settled_at or 0.0
    targets = {
        "throughput_vs_best": throughput,
        "turn_p95_vs_best": turn_p95,
        "server_waiting_mean": adaptive.server_waiting_mean,
        "settled_at": settled_at,
        "metrics_queue_empty": 1 - with_metrics.server_queue_share,
        "metrics_throughput_vs_best": with_metrics.calls_per_second
        / best.calls_per_second,
    }
    met = (
        throughput >= 0.95
        and turn_p95 <= 1.1
        and adaptive.server_waiting_mean <= 1
        and settled_at <= 60
        and targets["metrics_queue_empty"] >= 0.95
        and targets["metrics_throughput_vs_best"] >= 0.95
    )
    return {
        "config": {
            "seconds": seconds,
            "load": load,
            "seed": seed,
            "turns": len(plans),
            "capacity_calls_per_second": capacity_calls_per_second(),
            "server": plain(SERVER),
        },
        "rows": [plain(row) for row in rows],
        "best_fixed": best.limit,
        "targets": targets,
        "met": met,
    }


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table."""
    config = report["config"]
    lines = [
        "# A server that queues: which limit keeps its queue on our side",
        "",
        f"{config['turns']} turns in {config['seconds']:g} virtual seconds, offered at"
        f" {config['load']:.0%} of the server's capacity"
        f" ({config['capacity_calls_per_second']:.2f} calls/s; 6 batch slots),"
        f" seed {config['seed']}; best fixed limit: {report['best_fixed']}.",
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
    lines += [
        "",
        f"Adaptive against the best fixed limit: throughput"
        f" {targets['throughput_vs_best']:.1%} (target at least 95%), turn p95"
        f" {targets['turn_p95_vs_best']:.2f}x (at most 1.1x), server waiting"
        f" {targets['server_waiting_mean']:.2f} on average (at most 1), settled at"
        f" {targets['settled_at']:.0f} s (within 60 s). With the server's metrics:"
        f" its queue empty {targets['metrics_queue_empty']:.1%} of the time (at least"
        f" 95%), throughput {targets['metrics_throughput_vs_best']:.1%} of the best"
        f" fixed limit's (at least 95%). {'Met' if report['met'] else 'MISSED'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = command_line(__doc__, quick="a shorter run (240 s) and a smaller sweep")
    parser.add_argument(
        "--seconds", type=float, default=None, help="virtual seconds of arrivals (600)"
    )
    parser.add_argument(
        "--load", type=float, default=1.2, help="the offered load over the capacity"
    )
    parser.add_argument("--seed", type=count_option(zero=True), default=1)
    args = parser.parse_args(argv)
    seconds = args.seconds or (240.0 if args.quick else 600.0)
    started = time.monotonic()
    report = run_self_hosted(
        seconds=seconds,
        load=args.load,
        seed=args.seed,
        sweep=QUICK_SWEEP if args.quick else SWEEP,
    )
    report["environment"] = environment(httpx2=True)
    print(to_markdown(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    show_progress(f"done in {time.monotonic() - started:.1f} s")
    return 0 if report["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
