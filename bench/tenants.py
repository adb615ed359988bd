"""Tenant shares on one provider at 95% load, in virtual time.

Usage::

    python bench/tenants.py [--quick] [--minutes M] [--seed S] [--json PATH]
    python bench/tenants.py --scaling [--requests N] [--json PATH]

Two tenants share one provider of ``LIMIT`` slots through the real
dispatcher (``open_dispatcher``, ``Dispatcher.turn``, ``Dispatcher.slot``)
under trio's ``MockClock``, so an hour of traffic takes seconds:

* a heavy tenant: many agents, each running long tool loops (several LLM
  calls per turn, with tool time between them, when it holds no slot);
* a light tenant: a few agents with short turns (one or two calls).

The heavy tenant's agents run closed loops: a turn, then think time
(exponential), then the next turn, so its throughput (turns per minute)
shows what any delay costs it. The light tenant's agents start turns at
random times (a Poisson process each), whatever became of the last, so it
offers the same work in every arm (served faster, a closed loop would ask
for more, and take it from the heavy tenant). The think times and gaps
are set so that the work the tenants offer (slot-seconds per second, at no
wait) is 85% and 10% of the provider's capacity: 95% in all (the closed
loop's waits make what is used a little less; the report says how much).
Every call holds its slot for a time drawn per call (the time to its last
token); between two calls of a turn its tool runs, holding no slot. Each
agent draws its turns from its own seeded random stream, in the same order
whatever the timing, so every arm replays the same workload.

Arms:

* oldest-first alone: no tenant named anywhere (today's order: the
  oldest turn first, so every heavy turn in progress goes before a light
  turn that started after it);
* tenant shares 1:1: both tenants named, weight 1 each;
* tenant shares 3:1 (heavy:light): the heavy tenant weighted 3;
* tenant shares 1:3 (heavy:light): the light tenant weighted 3.

The report, over the run after a warm-up: the light tenant's turn latency
(from the turn's start to the end of its last call, waits, holds and tool
time included) p50 and p95; each tenant's share of the provider's
slot-time beside its ideal share (weighted max-min over what each offers:
a tenant that asks for less than its weighted share gets what it asks,
the rest is split by weight); the heavy tenant's throughput (turns
completed per minute) and its turn latency. Issue 21's bar: the light
tenant's p95 with 1:1 shares at most half of what oldest-first alone gives
it, and the heavy tenant's throughput within 2% of oldest-first's. The
exit status is 1 if the bar is missed. Uses only the public API.

``--scaling`` measures instead what many tenants cost, in wall time on
trio's real clock: ``SCALING_LIMIT`` slots held by one tenant, then N
requests park behind them, and the clock runs from the moment the slots
are given back until the last request has had its slot for one
checkpoint. Once with every request of one tenant, once with each of its
own tenant (per-user tenants nobody configured), for N and 4N; the best
of ``SCALING_REPEATS`` runs each, every run a fresh ``trio.run`` with the
collector off. The growth from N to 4N is 4x where a grant's cost does
not grow with the waiters, 16x where it grows linearly. Its exit status
is 0.
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

import trio_dispatch
from trio_dispatch.testing import percentile

from _common import (
    command_line,
    count_option,
    environment,
    finish,
    plain,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

PROVIDER = "llm"
LIMIT = 8
LOAD = {"heavy": 0.85, "light": 0.10}  # of the capacity, at no wait
WARM_UP = 120.0  # seconds left out of every figure
BAR_LATENCY = 0.5  # light p95 with 1:1 shares over oldest-first's, at most
BAR_THROUGHPUT = 0.02  # heavy throughput's change with 1:1 shares, at most
SCALING_LIMIT = 4  # slots in the --scaling measurement
SCALING_REPEATS = 3  # runs of each size; the best is kept


@attrs.frozen
class TenantLoad:
    """How one tenant's agents behave.

    Attributes:
        agents: Agents (closed loops) of the tenant.
        calls: Fewest and most LLM calls of a turn (uniform).
        hold: Shortest and longest hold of a call's slot, seconds (uniform).
        tool: Shortest and longest tool time between two calls (uniform).
        load: The share of the provider's capacity it offers, at no wait.
        closed: Whether each agent waits for its turn's end before it
            thinks and starts the next (a closed loop), or starts turns at
            random times whatever happened to the last (an open loop: a
            Poisson process of turns, the same in every arm).
    """

    agents: int
    calls: tuple[int, int]
    hold: tuple[float, float]
    tool: tuple[float, float]
    load: float
    closed: bool

    def plan(self, draw: random.Random) -> list[tuple[float, float]]:
        """A turn's calls: the tool time before each (0 first) and its hold."""
        calls = draw.randint(*self.calls)
        return [
            (draw.uniform(*self.tool) if call else 0.0, draw.uniform(*self.hold))
            for call in range(calls)
        ]

    @property
    def busy(self) -> float:
        """Seconds a turn takes at no wait: its holds and its tool time."""
        return self.work + self.tool_time

    @property
    def work(self) -> float:
        """Slot-seconds of a turn, on average."""
        return _mean(self.calls) * _mean(self.hold)

    @property
    def tool_time(self) -> float:
        """Tool seconds of a turn, on average."""
        return (_mean(self.calls) - 1) * _mean(self.tool)

    def think(self, limit: int) -> float:
        """The mean think time that makes the tenant offer ``load`` of ``limit``.

        Each agent offers ``work / (busy + think)`` slot-seconds a second
        (an open loop's turns start ``busy + think`` apart on average).
        """
        return self.agents * self.work / (self.load * limit) - self.busy


def _mean(bounds: tuple[float, float]) -> float:
    return (bounds[0] + bounds[1]) / 2


TENANTS = {
    "heavy": TenantLoad(
        agents=64,
        calls=(10, 20),
        hold=(1.0, 3.0),
        tool=(2.0, 8.0),
        load=LOAD["heavy"],
        closed=True,
    ),
    "light": TenantLoad(
        agents=4,
        calls=(1, 2),
        hold=(1.0, 3.0),
        tool=(0.5, 1.0),
        load=LOAD["light"],
        closed=False,
    ),
}


@attrs.frozen
class Arm:
    """One way of naming the tenants: ``None``, none named (oldest-first)."""

    name: str
    label: str
    weights: Mapping[str, float] | None


ARMS = (
    Arm("oldest-first", "oldest-first alone (no tenants)", None),
    Arm("1:1", "tenant shares 1:1", {"heavy": 1.0, "light": 1.0}),
    Arm("3:1", "tenant shares 3:1 (heavy:light)", {"heavy": 3.0, "light": 1.0}),
    Arm("1:3", "tenant shares 1:3 (heavy:light)", {"heavy": 1.0, "light": 3.0}),
)


def ideal_shares(
    demands: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min shares of a capacity of 1 (water-filling).

    A tenant that asks for less than its weighted share of what is left
    gets what it asks; the rest is split again among the others, by
    weight, until every tenant has its demand or the capacity is gone.
    """
    shares = dict.fromkeys(demands, 0.0)
    left = 1.0
    hungry = {t for t, d in demands.items() if d > 0}
    while hungry and left > 1e-12:
        total = sum(weights[t] for t in hungry)
        offer = {t: left * weights[t] / total for t in hungry}
        sated = {t for t in hungry if demands[t] - shares[t] <= offer[t]}
        if not sated:
            for t in hungry:
                shares[t] += offer[t]
            break
        for t in sated:
            left -= demands[t] - shares[t]
            shares[t] = demands[t]
        hungry -= sated
    return shares


@attrs.frozen
class TenantFigures:
    """One tenant's figures in one arm.

    Attributes:
        tenant: Its name.
        turns: Turns started after the warm-up and completed in the run.
        turns_per_minute: Turns completed per minute after the warm-up.
        latency_p50: Median turn latency, seconds.
        latency_p95: 95th percentile of turn latency, seconds.
        share: Its share of the provider's slot-time after the warm-up.
        ideal_share: Its weighted max-min share of what the tenants offer.
    """

    tenant: str
    turns: int
    turns_per_minute: float
    latency_p50: float
    latency_p95: float
    share: float
    ideal_share: float


@attrs.frozen
class ArmResult:
    """One arm's figures: each tenant's, and the provider's utilisation."""

    arm: str
    label: str
    utilisation: float
    tenants: tuple[TenantFigures, ...]

    def of(self, tenant: str) -> TenantFigures:
        """The figures of ``tenant``."""
        return next(f for f in self.tenants if f.tenant == tenant)


async def _run_arm(arm: Arm, minutes: float, seed: int) -> ArmResult:
    end = WARM_UP + minutes * 60.0
    # (tenant, start, end) of every turn; (tenant, granted, released) of
    # every call.
    turns: list[tuple[str, float, float]] = []
    holds: list[tuple[str, float, float]] = []
    options: dict[str, Any] = {}
    if arm.weights is not None:
        options["tenants"] = {
            name: trio_dispatch.Tenant(weight=weight)
            for name, weight in arm.weights.items()
        }
    async with trio_dispatch.open_dispatcher(
        {PROVIDER: LIMIT}, **options
    ) as dispatcher:

        async def turn(
            tenant: str, number: int, plan: list[tuple[float, float]]
        ) -> None:
            started = trio.current_time()
            named: dict[str, Any] = {} if arm.weights is None else {"tenant": tenant}
            with dispatcher.turn(conversation_id=f"{tenant}-{number}", **named):
                for tool, hold in plan:
                    await trio.sleep(tool)
                    async with dispatcher.slot(PROVIDER):
                        granted = trio.current_time()
                        await trio.sleep(hold)
                    holds.append((tenant, granted, trio.current_time()))
            turns.append((tenant, started, trio.current_time()))

        async def agent(
            tenant: str, load: TenantLoad, number: int, nursery: trio.Nursery
        ) -> None:
            draw = random.Random(f"{seed}/{tenant}/{number}")
            gap = load.think(LIMIT) + (0.0 if load.closed else load.busy)
            await trio.sleep(draw.uniform(0, load.think(LIMIT) + load.busy))
            while True:
                plan = load.plan(draw)
                if load.closed:
                    await turn(tenant, number, plan)
                else:
                    nursery.start_soon(turn, tenant, number, plan)
                await trio.sleep(draw.expovariate(1 / gap))

        async with trio.open_nursery() as nursery:
            for tenant, load in TENANTS.items():
                for number in range(load.agents):
                    nursery.start_soon(agent, tenant, load, number, nursery)
            await trio.sleep(end)
            nursery.cancel_scope.cancel()
    return _figures(arm, turns, holds, end)


def _figures(
    arm: Arm,
    turns: Sequence[tuple[str, float, float]],
    holds: Sequence[tuple[str, float, float]],
    end: float,
) -> ArmResult:
    window = end - WARM_UP
    capacity = LIMIT * window
    slot_time = dict.fromkeys(TENANTS, 0.0)
    for tenant, granted, released in holds:
        slot_time[tenant] += max(0.0, min(released, end) - max(granted, WARM_UP))
    weights = arm.weights or dict.fromkeys(TENANTS, 1.0)
    ideal = ideal_shares({t: load.load for t, load in TENANTS.items()}, weights)
    figures = []
    for tenant in TENANTS:
        latencies = [
            stop - start
            for who, start, stop in turns
            if who == tenant and start >= WARM_UP
        ]
        completed = sum(
            1 for who, _, stop in turns if who == tenant and stop >= WARM_UP
        )
        figures.append(
            TenantFigures(
                tenant=tenant,
                turns=len(latencies),
                turns_per_minute=60.0 * completed / window,
                latency_p50=percentile(latencies, 50),
                latency_p95=percentile(latencies, 95),
                share=slot_time[tenant] / capacity,
                ideal_share=ideal[tenant],
            )
        )
    return ArmResult(
        arm=arm.name,
        label=arm.label,
        utilisation=sum(slot_time.values()) / capacity,
        tenants=tuple(figures),
    )


def run_arm(arm: Arm, *, minutes: float, seed: int = 1) -> ArmResult:
    """Run one arm in virtual time: ``minutes`` measured after the warm-up."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(_run_arm, arm, minutes, seed, clock=clock)


@attrs.frozen
class Bar:
    """Issue 21's bar, with 1:1 shares against oldest-first alone.

    Attributes:
        light_p95_ratio: The light tenant's p95 with 1:1 shares over its
            p95 with oldest-first alone (met at 0.5 or less).
        heavy_throughput_change: The heavy tenant's throughput with 1:1
            shares over oldest-first's, less 1 (met within 2% either way).
        met: Whether both are met.
    """

    light_p95_ratio: float
    heavy_throughput_change: float
    met: bool


def bar(results: Sequence[ArmResult]) -> Bar:
    """Issue 21's bar, from the arms ``oldest-first`` and ``1:1``."""
    arms = {result.arm: result for result in results}
    alone, shares = arms["oldest-first"], arms["1:1"]
    ratio = shares.of("light").latency_p95 / alone.of("light").latency_p95
    change = (
        shares.of("heavy").turns_per_minute / alone.of("heavy").turns_per_minute - 1
    )
    met = ratio <= BAR_LATENCY and abs(change) <= BAR_THROUGHPUT
    return Bar(light_p95_ratio=ratio, heavy_throughput_change=change, met=met)


@attrs.frozen
class TenantsReport:
    """Every arm's figures for one seeded workload."""

    minutes: float
    warm_up: float
    limit: int
    seed: int
    workload: dict[str, dict[str, Any]]
    arms: tuple[ArmResult, ...]
    bar: Bar | None
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        heavy, light = self.workload["heavy"], self.workload["light"]
        lines = [
            f"Tenant shares, one provider of {self.limit} slots at"
            f" {heavy['load'] + light['load']:.0%} offered load,"
            f" {self.minutes:g} virtual minutes after a {self.warm_up:g} s"
            f" warm-up (seed {self.seed}): heavy tenant {heavy['agents']} agents,"
            f" {heavy['calls'][0]}-{heavy['calls'][1]} calls a turn"
            f" ({heavy['load']:.0%} of capacity); light tenant"
            f" {light['agents']} agents, {light['calls'][0]}-{light['calls'][1]}"
            f" calls a turn ({light['load']:.0%})",
            "",
            "| arm | light p50 | light p95 | light share (ideal)"
            " | heavy share (ideal) | heavy turns/min | heavy p50 | heavy p95"
            " | utilisation |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for arm in self.arms:
            h, li = arm.of("heavy"), arm.of("light")
            lines.append(
                f"| {arm.label} | {li.latency_p50:.1f} s | {li.latency_p95:.1f} s"
                f" | {li.share:.1%} ({li.ideal_share:.1%})"
                f" | {h.share:.1%} ({h.ideal_share:.1%})"
                f" | {h.turns_per_minute:.2f} | {h.latency_p50:.1f} s"
                f" | {h.latency_p95:.1f} s | {arm.utilisation:.1%} |"
            )
        if self.bar is not None:
            b = self.bar
            lines += [
                "",
                f"Bar (1:1 vs oldest-first): light p95 {b.light_p95_ratio:.2f}x"
                f" (at most {BAR_LATENCY:g}x), heavy throughput"
                f" {b.heavy_throughput_change:+.1%} (within"
                f" {BAR_THROUGHPUT:.0%}): {'met' if b.met else 'MISSED'}",
            ]
        return "\n".join(lines) + "\n"


def run_tenants(
    *, minutes: float, seed: int = 1, arms: Sequence[Arm] = ARMS
) -> TenantsReport:
    """Run every arm (or those given) on the same workload."""
    results = []
    for arm in arms:
        show_progress(arm.label)
        results.append(run_arm(arm, minutes=minutes, seed=seed))
    names = {arm.name for arm in arms}
    return TenantsReport(
        minutes=minutes,
        warm_up=WARM_UP,
        limit=LIMIT,
        seed=seed,
        workload={
            tenant: {**plain(load), "think": load.think(LIMIT)}
            for tenant, load in TENANTS.items()
        },
        arms=tuple(results),
        bar=bar(results) if {"oldest-first", "1:1"} <= names else None,
        environment=environment(),
    )


async def _drain(requests: int, *, distinct: bool) -> float:
    """Seconds to serve ``requests`` parked behind full slots (see ``--scaling``)."""
    async with trio_dispatch.open_dispatcher({PROVIDER: SCALING_LIMIT}) as d:
        gate = trio.Event()
        served = 0

        async def plug(*, task_status: trio.TaskStatus[None]) -> None:
            async with d.slot(PROVIDER, tenant="plug"):
                task_status.started()
                await gate.wait()

        async def request(i: int) -> None:
            nonlocal served
            async with d.slot(PROVIDER, tenant=f"user{i}" if distinct else "user"):
                await trio.lowlevel.checkpoint()
            served += 1

        async with trio.open_nursery() as nursery:
            for _ in range(SCALING_LIMIT):
                await nursery.start(plug)
            for i in range(requests):
                nursery.start_soon(request, i)
            await trio.testing.wait_all_tasks_blocked()
            started = time.perf_counter()
            gate.set()
        seconds = time.perf_counter() - started
    assert served == requests
    return seconds


def _best_drain(requests: int, *, distinct: bool) -> float:
    samples = []
    for _ in range(SCALING_REPEATS):
        gc.collect()
        gc.disable()
        try:
            samples.append(trio.run(partial(_drain, requests, distinct=distinct)))
        finally:
            gc.enable()
    return min(samples)


@attrs.frozen
class ScalingRow:
    """Serving ``requests`` of one tenant or of as many tenants, N and 4N."""

    tenants: str
    requests: int
    seconds: float
    seconds_4x: float

    @property
    def growth(self) -> float:
        """The time for 4N requests over the time for N."""
        return self.seconds_4x / self.seconds


@attrs.frozen
class ScalingReport:
    """What many tenants cost (``--scaling``)."""

    limit: int
    repeats: int
    rows: tuple[ScalingRow, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(
            {**plain(self), "growth": {row.tenants: row.growth for row in self.rows}},
            indent=2,
        )

    def to_markdown(self) -> str:
        n = self.rows[0].requests
        lines = [
            f"Serving N and 4N requests parked behind {self.limit} full slots,"
            f" wall time on trio's real clock (best of {self.repeats})",
            "",
            f"| requests of | {n:,} requests | {4 * n:,} requests"
            " | per request, N / 4N | growth, 4N / N |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in self.rows:
            lines.append(
                f"| {row.tenants} | {1e3 * row.seconds:.1f} ms"
                f" | {1e3 * row.seconds_4x:.1f} ms"
                f" | {1e6 * row.seconds / n:.1f} / {1e6 * row.seconds_4x / (4 * n):.1f} µs"
                f" | {row.growth:.2f}x |"
            )
        return "\n".join(lines) + "\n"


def run_scaling(requests: int) -> ScalingReport:
    """Serve ``requests`` and four times as many, of one tenant and of as many."""
    rows = []
    for distinct, label in ((False, "one tenant"), (True, "a tenant each")):
        show_progress(f"scaling: {label}")
        rows.append(
            ScalingRow(
                tenants=label,
                requests=requests,
                seconds=_best_drain(requests, distinct=distinct),
                seconds_4x=_best_drain(4 * requests, distinct=distinct),
            )
        )
    return ScalingReport(
        limit=SCALING_LIMIT,
        repeats=SCALING_REPEATS,
        rows=tuple(rows),
        environment=environment(),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print markdown, and write JSON with ``--json``.

    Returns 1 if issue 21's bar is missed (or not measured), else 0.
    """
    parser = command_line(__doc__, quick="15 virtual minutes")
    parser.add_argument("--minutes", type=count_option(), default=60)
    parser.add_argument("--seed", type=count_option(), default=1)
    parser.add_argument(
        "--arm",
        action="append",
        choices=[arm.name for arm in ARMS],
        help="run only this arm (repeatable)",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="measure instead the wall time of N and 4N requests, of N tenants",
    )
    parser.add_argument(
        "--requests", type=count_option(), default=1000, help="N for --scaling"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    json_path = args.json
    if args.scaling:
        finish(run_scaling(args.requests), json_path=json_path, started=started)
        return 0
    arms = ARMS if not args.arm else tuple(a for a in ARMS if a.name in args.arm)
    report = run_tenants(
        minutes=15 if args.quick else args.minutes, seed=args.seed, arms=arms
    )
    finish(report, json_path=json_path, started=started)
    return 0 if report.bar is not None and report.bar.met else 1


if __name__ == "__main__":
    sys.exit(main())
