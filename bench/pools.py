"""A pool of two members against one, in virtual time: throughput, order, affinity, a pause.

Usage::

    python bench/pools.py [--quick] [--seconds S] [--seed S] [--json PATH]

Agents' turns arrive at random (a Poisson process) through the real
dispatcher (``open_dispatcher``, ``Dispatcher.turn``, ``Dispatcher.slot``)
under trio's ``MockClock``. Each turn is one conversation of 1 to 5 calls
(uniform), each call holding its slot 0.5 to 2 s (uniform: the time to its
last token), with 0.2 s of tool time between two calls, holding none. The
turns offer ``LOAD`` (95%) of the capacity of two members of ``MEMBER``
(4) slots each. Every arm replays the same seeded turns.

Arms:

* pool 4+4: ``pools={"gpt": ("key-a", "key-b")}``, each member of 4,
  affinity on (``affinity_wait`` 2 s);
* one member alone: the same load on one provider of 4 (twice its
  capacity: it serves what it can);
* one provider of 8: the same load on one provider of the pool's slots;
* pool 4+4, affinity off (``affinity_wait=0``);
* pool 4+4 at half the load (capacity to spare), affinity on;
* pool 4+4, key-a paused: ``report_rate_limit("key-a", 10)`` at a third of
  the run, as a 429 with ``Retry-After: 10`` would.

The report: turns completed per minute, turn latency p50 and p95 (from
the turn's arrival to the end of its last call, over turns arriving after
a warm-up of a tenth of the run, that ended within it), each member's peak
in flight beside its limit, and for the pools the share of a
conversation's later calls granted on the member of its first call, with
the hits and moves ``statistics()`` counts. For the pause: key-b's slots
in use over the pause (time-averaged, sampled every 10 ms), and the
samples where a request waited for the pool while key-b had a free slot.

Issue 29's bars, checked: the pool at least 1.9x the turns per minute of
one member alone, no member above its limit, turn p95 within 10% of one
provider of 8; at half load at least 95% of later calls on the first
call's member; during the pause key-b at least 95% busy, and no sample
with a request waiting while key-b had a free slot. The exit status is 1
if a bar is missed. Uses only the public API.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import TYPE_CHECKING

import attrs
import trio
import trio.testing

import trio_dispatch
from trio_dispatch.testing import percentile

from _common import bars_and_machine, command_line, environment, finish, load_average

if TYPE_CHECKING:
    from collections.abc import Sequence

MEMBER = 4
LOAD = 0.95
CALLS = (1, 5)
HOLD = (0.5, 2.0)
TOOL = 0.2
PAUSE = 10.0
SAMPLE = 0.01


@attrs.frozen
class Turn:
    """One turn: when it arrives, and how long each of its calls holds its slot."""

    arrives: float
    holds: tuple[float, ...]


def turns_of(seed: int, seconds: float, load: float) -> list[Turn]:
    """The seeded turns arriving over ``seconds`` at ``load`` of the pool's capacity."""
    rng = random.Random(seed)
    mean_calls = (CALLS[0] + CALLS[1]) / 2
    capacity = 2 * MEMBER / ((HOLD[0] + HOLD[1]) / 2)  # calls per second
    rate = load * capacity / mean_calls  # turns per second
    turns: list[Turn] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return turns
        calls = rng.randint(*CALLS)
        turns.append(Turn(at, tuple(rng.uniform(*HOLD) for _ in range(calls))))


@attrs.frozen
class Arm:
    """One arm: its limits, pools, affinity, where the calls go, and a pause."""

    name: str
    limits: dict[str, int]
    provider: str
    pools: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    affinity_wait: float = 2.0
    load: float = LOAD
    pause: bool = False


ARMS = (
    Arm(
        "pool 4+4",
        {"key-a": MEMBER, "key-b": MEMBER},
        "gpt",
        {"gpt": ("key-a", "key-b")},
    ),
    Arm("one member alone", {"key-a": MEMBER}, "key-a"),
    Arm("one provider of 8", {"one": 2 * MEMBER}, "one"),
    Arm(
        "pool 4+4, affinity off",
        {"key-a": MEMBER, "key-b": MEMBER},
        "gpt",
        {"gpt": ("key-a", "key-b")},
        affinity_wait=0.0,
    ),
    Arm(
        "pool 4+4, half load",
        {"key-a": MEMBER, "key-b": MEMBER},
        "gpt",
        {"gpt": ("key-a", "key-b")},
        load=LOAD / 2,
    ),
    Arm(
        "pool 4+4, key-a paused",
        {"key-a": MEMBER, "key-b": MEMBER},
        "gpt",
        {"gpt": ("key-a", "key-b")},
        pause=True,
    ),
)


@attrs.frozen
class Row:
    """One arm's figures."""

    arm: str
    offered_per_minute: float
    turns_per_minute: float
    p50: float
    p95: float
    peaks: dict[str, tuple[int, int]]
    same_member: float | None
    affinity_hits: int
    affinity_moves: int
    pause_busy: float | None = None
    pause_idle_waits: int | None = None


async def _run_arm(arm: Arm, turns: Sequence[Turn], seconds: float) -> Row:
    ended: list[tuple[float, float]] = []  # (arrived, ended)
    later_calls = same = 0
    busy: list[int] = []
    idle_waits = 0
    async with trio_dispatch.open_dispatcher(
        arm.limits, pools=arm.pools, affinity_wait=arm.affinity_wait
    ) as dispatcher:

        async def turn(index: int, one: Turn) -> None:
            nonlocal later_calls, same
            first = None
            with dispatcher.turn(conversation_id=f"turn-{index}"):
                for call, hold in enumerate(one.holds):
                    if call:
                        await trio.sleep(TOOL)
                    async with dispatcher.slot(arm.provider) as slot:
                        if call == 0:
                            first = slot.member
                        else:
                            later_calls += 1
                            same += slot.member == first
                        await trio.sleep(hold)
            ended.append((one.arrives, trio.current_time()))

        async def pause_and_watch() -> None:
            nonlocal idle_waits
            await trio.sleep(seconds / 3)
            dispatcher.report_rate_limit("key-a", PAUSE)
            until = trio.current_time() + PAUSE
            while trio.current_time() < until:
                await trio.sleep(SAMPLE)
                stats = dispatcher.statistics()
                in_use = stats.providers["key-b"].in_flight
                busy.append(in_use)
                if stats.pools["gpt"].waiting and in_use < MEMBER:
                    idle_waits += 1

        with trio.move_on_after(seconds):
            async with trio.open_nursery() as nursery:
                if arm.pause:
                    nursery.start_soon(pause_and_watch)
                for index, one in enumerate(turns):
                    await trio.sleep_until(one.arrives)
                    nursery.start_soon(turn, index, one)
        stats = dispatcher.statistics()
    warm = seconds / 10
    latencies = sorted(end - start for start, end in ended if start >= warm)
    members = list(arm.limits)
    pooled = [stats.pools[name] for name in arm.pools]
    return Row(
        arm=arm.name,
        offered_per_minute=len(turns) / (seconds / 60),
        turns_per_minute=len(ended) / (seconds / 60),
        p50=percentile(latencies, 50),
        p95=percentile(latencies, 95),
        peaks={
            name: (stats.providers[name].peak_in_flight, arm.limits[name])
            for name in members
        },
        same_member=(same / later_calls) if arm.pools and later_calls else None,
        affinity_hits=sum(pool.affinity_hits for pool in pooled),
        affinity_moves=sum(pool.affinity_moves for pool in pooled),
        pause_busy=(sum(busy) / len(busy) / MEMBER) if busy else None,
        pause_idle_waits=idle_waits if arm.pause else None,
    )


def run(seconds: float, seed: int) -> list[Row]:
    """Every arm, each in its own virtual-time run on the same seeded turns."""
    rows = []
    for arm in ARMS:
        turns = turns_of(seed, seconds, arm.load)
        clock = trio.testing.MockClock(autojump_threshold=0)
        rows.append(trio.run(_run_arm, arm, turns, seconds, clock=clock))
    return rows


def bars(rows: Sequence[Row]) -> dict[str, bool]:
    """Issue 29's bars, each met or not."""
    by = {row.arm: row for row in rows}
    pool, alone, eight = by["pool 4+4"], by["one member alone"], by["one provider of 8"]
    half, paused = by["pool 4+4, half load"], by["pool 4+4, key-a paused"]
    return {
        "pool >= 1.9x one member's turns per minute": pool.turns_per_minute
        >= 1.9 * alone.turns_per_minute,
        "pool's turns per minute within 1% of one provider of 8's": pool.turns_per_minute
        >= 0.99 * eight.turns_per_minute,
        "no member above its limit": all(
            peak <= limit for row in rows for peak, limit in row.peaks.values()
        ),
        "pool turn p95 within 10% of one provider of 8": pool.p95 <= 1.1 * eight.p95,
        ">= 95% of later calls on the first call's member at half load": (
            half.same_member or 0.0
        )
        >= 0.95,
        "key-b >= 95% busy during key-a's pause": (paused.pause_busy or 0.0) >= 0.95,
        "no request waits while key-b has a free slot": paused.pause_idle_waits == 0,
    }


@attrs.frozen
class PoolsReport:
    """The arms' rows, the bars, and where they were measured."""

    seconds: float
    seed: int
    rows: list[Row]
    bars: dict[str, bool]
    environment: dict[str, str] = attrs.field(factory=environment)
    load: str = attrs.field(factory=load_average)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"Turns of {CALLS[0]}-{CALLS[1]} calls of {HOLD[0]:g}-{HOLD[1]:g} s,"
            f" {TOOL:g} s of tool time between calls, arriving at {LOAD:.0%} of"
            f" two members' capacity ({MEMBER} slots each) unless said;"
            f" {self.seconds:g} s of virtual time, seed {self.seed}.",
            "",
            "| Arm | Turns/min offered | Turns/min completed | Turn p50 (s) |"
            " Turn p95 (s) | Peak in flight / limit |"
            " Later calls on the first call's member | Hits | Moves |",
            "|---|--:|--:|--:|--:|---|--:|--:|--:|",
        ]
        for row in self.rows:
            peaks = ", ".join(
                f"{name} {peak}/{limit}" for name, (peak, limit) in row.peaks.items()
            )
            pooled = row.same_member is not None
            same = f"{row.same_member:.1%}" if pooled else ""
            hits = str(row.affinity_hits) if pooled else ""
            moves = str(row.affinity_moves) if pooled else ""
            lines.append(
                f"| {row.arm} | {row.offered_per_minute:.1f}"
                f" | {row.turns_per_minute:.1f} | {row.p50:.2f}"
                f" | {row.p95:.2f} | {peaks} | {same} | {hits} | {moves} |"
            )
        paused = next(row for row in self.rows if row.pause_busy is not None)
        lines += [
            "",
            f"During key-a's {PAUSE:g} s pause: key-b {paused.pause_busy:.1%} busy"
            f" (sampled every {SAMPLE * 1000:g} ms); {paused.pause_idle_waits}"
            " samples with a request waiting while key-b had a free slot.",
            "",
            *bars_and_machine(self.bars, self.environment, self.load),
        ]
        return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_line(__doc__, quick="120 s of virtual time instead of 600")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args(argv)
    started = time.perf_counter()
    seconds = options.seconds or (120.0 if options.quick else 600.0)
    rows = run(seconds, options.seed)
    report = PoolsReport(seconds, options.seed, rows, bars(rows))
    finish(report, json_path=options.json, started=started)
    return 0 if all(report.bars.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
