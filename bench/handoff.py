"""Hand-off benchmarks: ``Dispatcher.slot`` against ``trio.CapacityLimiter``.

Usage::

    python bench/handoff.py [--quick] [--repeats N] [--json PATH]

Prints the results as a markdown table on stdout (progress goes to stderr)
and, with ``--json``, writes the full report, every sample included, to
``PATH``. Exits with status 1 if a target was missed. The report in
``bench/reports/`` comes from::

    python bench/handoff.py --json bench/reports/handoff.json > bench/reports/handoff.md

Four measurements, each taken for trio-dispatch ("ours") and for
``trio.CapacityLimiter`` ("theirs") in the same process:

1. **Contended hand-off rate**: ``tasks`` tasks each run ``cycles`` cycles of
   (acquire, one checkpoint, release) under a limit of ``limit``. The clock
   starts when every task is parked behind a gate and stops when the last
   one finishes, so spawning is not timed. Cycles per second.
2. **Uncontended round trip**: one task, nobody else, ``round_trips`` cycles
   of acquire and release. Microseconds per cycle.
3. **Scaling**: ``limit`` plug tasks take every slot, then ``n`` waiters park
   behind them (``wait_all_tasks_blocked``); the clock starts when the plugs
   let go and stops when every waiter has had its slot for one checkpoint.
   Microseconds per grant at each ``n``, and the growth from the smallest to
   the largest ``n``. A small ``n`` is drained several times per sample so
   every sample hands out at least ``min_grants`` slots.
4. **Memory**: ``memory_waiters`` tasks parked behind one held slot, measured
   with ``tracemalloc`` (started before they are spawned) once all are
   blocked: ``(current - baseline) / n`` bytes per waiter, the task included.

Method. The timings are wall-clock (``time.perf_counter``) on trio's real
clock. Every sample is a fresh ``trio.run``; the two sides alternate (ours,
theirs, ours, theirs, ...), after one untimed warm-up pair. ``gc.collect()``
runs before each sample and the collector is disabled while it runs, so a
full collection over a large heap of parked tasks does not land in one side's
timing. ``tracemalloc`` runs only in the memory measurement. A measurement
reports the medians of both sides and the median of the per-pair ratios
(ours / theirs): on a shared machine the absolute times drift, the ratio of
two neighbouring samples much less.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import tracemalloc
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, final

import attrs
import trio
import trio.testing

from trio_dispatch import open_dispatcher

from _common import (
    command_line,
    count,
    count_option,
    environment,
    finish,
    paired,
    plain,
    positive_int,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from trio_dispatch import Dispatcher

_PROVIDER: Final = "p"


def _waiter_counts(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: object
) -> None:
    if (
        not isinstance(value, tuple)
        or not value
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value)
        or list(value) != sorted(set(value))
    ):
        raise ValueError(
            f"{attribute.name} must be increasing positive integers, got {value!r}"
        )


@final
@attrs.frozen
class HandoffSizes:
    """How big each benchmark is.

    Attributes:
        tasks: Tasks in the contended benchmark.
        cycles: Acquire/checkpoint/release cycles per contended task.
        limit: The concurrency limit of the contended and scaling benchmarks.
        round_trips: Cycles of the uncontended benchmark.
        waiters: Parked waiters of the scaling benchmark, smallest first.
        min_grants: Grants per scaling sample at least; smaller waiter counts
            are drained several times to reach it.
        memory_waiters: Parked waiters of the memory benchmark.
    """

    tasks: int = attrs.field(default=1_000, validator=positive_int)
    cycles: int = attrs.field(default=100, validator=positive_int)
    limit: int = attrs.field(default=8, validator=positive_int)
    round_trips: int = attrs.field(default=20_000, validator=positive_int)
    waiters: tuple[int, ...] = attrs.field(
        default=(1_000, 10_000, 100_000), validator=_waiter_counts
    )
    min_grants: int = attrs.field(default=20_000, validator=positive_int)
    memory_waiters: int = attrs.field(default=100_000, validator=positive_int)

    @classmethod
    def full(cls) -> HandoffSizes:
        """The sizes the targets are stated for."""
        return cls()

    @classmethod
    def quick(cls) -> HandoffSizes:
        """Smaller runs for a first look (about a tenth of the time)."""
        return cls(
            cycles=20,
            round_trips=5_000,
            waiters=(1_000, 10_000, 30_000),
            min_grants=10_000,
            memory_waiters=30_000,
        )


@final
@attrs.frozen
class Measurement:
    """One benchmark, both sides.

    Attributes:
        key: A stable identifier, for JSON readers.
        label: What was measured, for people.
        unit: The unit of ``ours``, ``theirs`` and the samples.
        higher_is_better: Whether a bigger number is the better result.
        ours: Median of trio-dispatch's samples.
        theirs: Median of ``trio.CapacityLimiter``'s samples.
        ratio: Median of the per-pair ratios ``ours / theirs``.
        ours_samples: trio-dispatch's samples, in the order taken.
        theirs_samples: ``trio.CapacityLimiter``'s samples, paired with
            ``ours_samples`` by position.
    """

    key: str
    label: str
    unit: str
    higher_is_better: bool
    ours: float
    theirs: float
    ratio: float
    ours_samples: tuple[float, ...]
    theirs_samples: tuple[float, ...]

    @classmethod
    def from_samples(
        cls,
        key: str,
        label: str,
        unit: str,
        *,
        higher_is_better: bool,
        ours: Sequence[float],
        theirs: Sequence[float],
    ) -> Measurement:
        """Summarise paired samples: the medians and the median pair ratio."""
        pairs = paired(ours, theirs)
        return cls(
            key=key,
            label=label,
            unit=unit,
            higher_is_better=higher_is_better,
            ours=statistics.median(ours),
            theirs=statistics.median(theirs),
            ratio=statistics.median(o / t for o, t in pairs),
            ours_samples=tuple(ours),
            theirs_samples=tuple(theirs),
        )


@final
@attrs.frozen
class Target:
    """A goal for one number of the report, and whether it was met."""

    key: str
    label: str
    value: float
    comparison: Literal["<=", ">="]
    threshold: float
    met: bool

    @classmethod
    def check(
        cls,
        key: str,
        label: str,
        value: float,
        comparison: Literal["<=", ">="],
        threshold: float,
    ) -> Target:
        """Compare ``value`` with ``threshold``."""
        met = value <= threshold if comparison == "<=" else value >= threshold
        return cls(key, label, value, comparison, threshold, met)


@final
@attrs.frozen
class HandoffReport:
    """The results of one run of the hand-off benchmarks.

    Attributes:
        measurements: One entry per benchmark (the scaling benchmark gives one
            per waiter count, and one for the growth).
        targets: The project's goals, checked against the measurements.
        sizes: The sizes the run used.
        repeats: Pairs of timing samples per benchmark.
        quick: Whether this was a ``--quick`` run.
        environment: Interpreter, library versions and machine.
    """

    measurements: tuple[Measurement, ...]
    targets: tuple[Target, ...]
    sizes: HandoffSizes
    repeats: int
    quick: bool
    environment: dict[str, str]

    @property
    def all_met(self) -> bool:
        """Whether every target was met."""
        return all(target.met for target in self.targets)

    def measurement(self, key: str) -> Measurement:
        """The measurement called ``key``."""
        for measurement in self.measurements:
            if measurement.key == key:
                return measurement
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        data = plain(self)
        data["all_met"] = self.all_met
        return data

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as markdown: the measurements, then the targets."""
        env = self.environment
        lines = [
            f"Hand-off benchmarks: trio-dispatch {env['trio_dispatch']} against"
            f" trio.CapacityLimiter (trio {env['trio']}), {env['python']}"
            f" on {env['platform']}, {env['cpus']} CPUs"
            f"{', quick run' if self.quick else ''}.",
            f"Medians of {self.repeats} interleaved pairs; the ratio is the median"
            " of the per-pair ratios (ours / theirs). gc disabled while timing;"
            " tracemalloc only for memory.",
            "",
            "| Benchmark | Unit | trio-dispatch | CapacityLimiter | Ratio |",
            "|---|---|--:|--:|--:|",
        ]
        lines += [
            f"| {m.label} | {m.unit} | {_number(m.ours)} | {_number(m.theirs)}"
            f" | {m.ratio:.2f} |"
            for m in self.measurements
        ]
        lines += ["", "| Target | Measured | Goal | Met |", "|---|--:|--:|---|"]
        lines += [
            f"| {t.label} | {_number(t.value)} | {t.comparison} {_number(t.threshold)}"
            f" | {'yes' if t.met else '**no**'} |"
            for t in self.targets
        ]
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# Sampling.


def _run(
    main: Callable[..., Awaitable[float]], *args: int, collect: bool = True
) -> float:
    """One sample: a fresh ``trio.run``, collected before and after.

    ``collect=False`` turns the garbage collector off while it runs (every
    timing does this; the memory measurement keeps it on).
    """
    gc.collect()
    enabled = gc.isenabled()
    if not collect:
        gc.disable()
    try:
        return trio.run(main, *args)
    finally:
        if enabled:
            gc.enable()
        gc.collect()


def _check(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(
            f"benchmark went wrong: {what} is {got}, expected {expected}"
        )


def _slot_statistics(dispatcher: Dispatcher) -> tuple[int, int, int]:
    stats = dispatcher.statistics().providers[_PROVIDER]
    return stats.in_flight, stats.waiting, stats.released_total


async def _contended_ours(tasks: int, cycles: int, limit: int) -> float:
    async with open_dispatcher({_PROVIDER: limit}) as dispatcher:
        gate = trio.Event()

        async def worker() -> None:
            await gate.wait()
            for _ in range(cycles):
                async with dispatcher.slot(_PROVIDER):
                    await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(worker)
            await trio.testing.wait_all_tasks_blocked()
            start = time.perf_counter()
            gate.set()
        elapsed = time.perf_counter() - start
        await trio.testing.wait_all_tasks_blocked()
        _check("released_total", _slot_statistics(dispatcher)[2], tasks * cycles)
    return elapsed


async def _contended_theirs(tasks: int, cycles: int, limit: int) -> float:
    limiter = trio.CapacityLimiter(limit)
    gate = trio.Event()
    done = 0

    async def worker() -> None:
        nonlocal done
        await gate.wait()
        for _ in range(cycles):
            async with limiter:
                await trio.lowlevel.checkpoint()
        done += cycles

    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
        await trio.testing.wait_all_tasks_blocked()
        start = time.perf_counter()
        gate.set()
    elapsed = time.perf_counter() - start
    _check("cycles done", done, tasks * cycles)
    return elapsed


async def _round_trips_ours(n: int, limit: int) -> float:
    async with open_dispatcher({_PROVIDER: limit}) as dispatcher:
        await trio.testing.wait_all_tasks_blocked()
        start = time.perf_counter()
        for _ in range(n):
            async with dispatcher.slot(_PROVIDER):
                pass
        elapsed = time.perf_counter() - start
        await trio.testing.wait_all_tasks_blocked()
        _check("released_total", _slot_statistics(dispatcher)[2], n)
    return elapsed


async def _round_trips_theirs(n: int, limit: int) -> float:
    limiter = trio.CapacityLimiter(limit)
    start = time.perf_counter()
    for _ in range(n):
        async with limiter:
            pass
    elapsed = time.perf_counter() - start
    _check("borrowed_tokens", limiter.borrowed_tokens, 0)
    return elapsed


async def _hold_ours(dispatcher: Dispatcher, gate: trio.Event) -> None:
    async with dispatcher.slot(_PROVIDER):
        await gate.wait()


async def _pass_ours(dispatcher: Dispatcher) -> None:
    async with dispatcher.slot(_PROVIDER):
        await trio.lowlevel.checkpoint()


async def _hold_theirs(limiter: trio.CapacityLimiter, gate: trio.Event) -> None:
    async with limiter:
        await gate.wait()


async def _pass_theirs(limiter: trio.CapacityLimiter) -> None:
    async with limiter:
        await trio.lowlevel.checkpoint()


async def _drain_ours(waiters: int, limit: int, rounds: int) -> float:
    """Seconds spent granting ``waiters`` parked waiters, summed over rounds."""
    elapsed = 0.0
    async with open_dispatcher({_PROVIDER: limit}) as dispatcher:
        for _ in range(rounds):
            elapsed += await _timed_drain(
                partial(_hold_ours, dispatcher),
                partial(_pass_ours, dispatcher),
                lambda: ("waiting", _slot_statistics(dispatcher)[1]),
                waiters=waiters,
                limit=limit,
            )
        await trio.testing.wait_all_tasks_blocked()
        _check("in_flight", _slot_statistics(dispatcher)[0], 0)
        _check(
            "released_total",
            _slot_statistics(dispatcher)[2],
            (waiters + limit) * rounds,
        )
    return elapsed


async def _drain_theirs(waiters: int, limit: int, rounds: int) -> float:
    """Seconds spent granting ``waiters`` parked waiters, summed over rounds."""
    elapsed = 0.0
    limiter = trio.CapacityLimiter(limit)
    for _ in range(rounds):
        elapsed += await _timed_drain(
            partial(_hold_theirs, limiter),
            partial(_pass_theirs, limiter),
            lambda: ("tasks_waiting", limiter.statistics().tasks_waiting),
            waiters=waiters,
            limit=limit,
        )
    _check("borrowed_tokens", limiter.borrowed_tokens, 0)
    return elapsed


async def _timed_drain(
    hold: Callable[[trio.Event], Awaitable[None]],
    pass_through: Callable[[], Awaitable[None]],
    waiting: Callable[[], tuple[str, int]],
    *,
    waiters: int,
    limit: int,
) -> float:
    """Seconds from opening the gate to the last of ``waiters`` passing.

    ``limit`` holders wait on the gate while ``waiters`` tasks park behind
    them; spawning and parking are not timed.
    """
    gate = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(limit):
            nursery.start_soon(hold, gate)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(waiters):
            nursery.start_soon(pass_through)
        await trio.testing.wait_all_tasks_blocked()
        _check(*waiting(), waiters)
        start = time.perf_counter()
        gate.set()
    return time.perf_counter() - start


class _Traced:
    """Bytes allocated since construction, by ``tracemalloc``.

    Starts tracing if nobody has (and stops it again on ``stop``); if
    tracing already runs, measures against it and leaves it running.
    """

    def __init__(self) -> None:
        self._owner = not tracemalloc.is_tracing()
        if self._owner:
            tracemalloc.start()
        self._baseline = tracemalloc.get_traced_memory()[0]

    def grown(self) -> int:
        return tracemalloc.get_traced_memory()[0] - self._baseline

    def stop(self) -> None:
        if self._owner:
            tracemalloc.stop()


async def _memory_ours(waiters: int) -> float:
    async with open_dispatcher({_PROVIDER: 1}) as dispatcher:
        gate = trio.Event()
        async with trio.open_nursery() as nursery:
            per_waiter = await _memory_per_waiter(
                nursery, partial(_hold_ours, dispatcher, gate), waiters
            )
            _check("waiting", _slot_statistics(dispatcher)[1], waiters)
            nursery.cancel_scope.cancel()
    return per_waiter


async def _memory_theirs(waiters: int) -> float:
    limiter = trio.CapacityLimiter(1)
    gate = trio.Event()
    async with trio.open_nursery() as nursery:
        per_waiter = await _memory_per_waiter(
            nursery, partial(_hold_theirs, limiter, gate), waiters
        )
        _check("tasks_waiting", limiter.statistics().tasks_waiting, waiters)
        nursery.cancel_scope.cancel()
    return per_waiter


async def _memory_per_waiter(
    nursery: trio.Nursery, hold: Callable[[], Awaitable[None]], waiters: int
) -> float:
    """Bytes per task parked behind one holder, as tracemalloc counts them."""
    nursery.start_soon(hold)
    await trio.testing.wait_all_tasks_blocked()
    gc.collect()
    traced = _Traced()
    try:
        for _ in range(waiters):
            nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        grown = traced.grown()
    finally:
        traced.stop()
    return grown / waiters


# The benchmarks.


def _pairs(
    progress: Callable[[str], None],
    name: str,
    repeats: int,
    ours: Callable[[], float],
    theirs: Callable[[], float],
) -> tuple[list[float], list[float]]:
    ours_samples: list[float] = []
    theirs_samples: list[float] = []
    for i in range(repeats):
        progress(f"{name}: pair {i + 1}/{repeats}")
        ours_samples.append(ours())
        theirs_samples.append(theirs())
    return ours_samples, theirs_samples


def _contended(
    sizes: HandoffSizes, repeats: int, progress: Callable[[str], None]
) -> Measurement:
    args = (sizes.tasks, sizes.cycles, sizes.limit)
    total = sizes.tasks * sizes.cycles
    ours, theirs = _pairs(
        progress,
        "contended",
        repeats,
        lambda: total / _run(_contended_ours, *args, collect=False),
        lambda: total / _run(_contended_theirs, *args, collect=False),
    )
    return Measurement.from_samples(
        "contended",
        f"Contended hand-off ({sizes.tasks:,} tasks x {sizes.cycles:,} cycles,"
        f" limit {sizes.limit})",
        "cycles/s",
        higher_is_better=True,
        ours=ours,
        theirs=theirs,
    )


def _uncontended(
    sizes: HandoffSizes, repeats: int, progress: Callable[[str], None]
) -> Measurement:
    n = sizes.round_trips
    ours, theirs = _pairs(
        progress,
        "uncontended",
        repeats,
        lambda: 1e6 * _run(_round_trips_ours, n, sizes.limit, collect=False) / n,
        lambda: 1e6 * _run(_round_trips_theirs, n, sizes.limit, collect=False) / n,
    )
    return Measurement.from_samples(
        "uncontended",
        f"Uncontended round trip (1 task x {n:,} cycles, limit {sizes.limit})",
        "us/cycle",
        higher_is_better=False,
        ours=ours,
        theirs=theirs,
    )


def _scaling(
    sizes: HandoffSizes, repeats: int, progress: Callable[[str], None]
) -> list[Measurement]:
    samples: dict[int, tuple[list[float], list[float]]] = {
        n: ([], []) for n in sizes.waiters
    }
    for i in range(repeats):
        for n in sizes.waiters:
            progress(f"scaling {n:,} waiters: pair {i + 1}/{repeats}")
            rounds = -(-sizes.min_grants // n)
            grants = n * rounds
            ours, theirs = samples[n]
            seconds = _run(_drain_ours, n, sizes.limit, rounds, collect=False)
            ours.append(1e6 * seconds / grants)
            seconds = _run(_drain_theirs, n, sizes.limit, rounds, collect=False)
            theirs.append(1e6 * seconds / grants)
    measurements = [
        Measurement.from_samples(
            f"scaling_{n}",
            f"Per grant, {n:,} waiters parked (limit {sizes.limit})",
            "us/grant",
            higher_is_better=False,
            ours=samples[n][0],
            theirs=samples[n][1],
        )
        for n in sizes.waiters
    ]
    smallest, largest = sizes.waiters[0], sizes.waiters[-1]
    ours_small, theirs_small = samples[smallest]
    ours_large, theirs_large = samples[largest]
    measurements.append(
        Measurement.from_samples(
            "scaling_growth",
            f"Per-grant growth, {largest:,} / {smallest:,} waiters",
            "x",
            higher_is_better=False,
            ours=[b / a for a, b in zip(ours_small, ours_large, strict=True)],
            theirs=[b / a for a, b in zip(theirs_small, theirs_large, strict=True)],
        )
    )
    return measurements


def _memory(sizes: HandoffSizes, progress: Callable[[str], None]) -> Measurement:
    n = sizes.memory_waiters
    # tracemalloc counts allocations exactly, so one pair is enough.
    ours, theirs = _pairs(
        progress,
        "memory",
        1,
        lambda: _run(_memory_ours, n),
        lambda: _run(_memory_theirs, n),
    )
    return Measurement.from_samples(
        "memory",
        f"Memory per waiting task ({n:,} waiters, tracemalloc)",
        "bytes/waiter",
        higher_is_better=False,
        ours=ours,
        theirs=theirs,
    )


def _targets(
    sizes: HandoffSizes, measurements: dict[str, Measurement]
) -> tuple[Target, ...]:
    smallest, largest = sizes.waiters[0], sizes.waiters[-1]
    return (
        Target.check(
            "contended_ratio",
            "Contended rate, ours / CapacityLimiter",
            measurements["contended"].ratio,
            ">=",
            0.8,
        ),
        Target.check(
            "uncontended_ratio",
            "Uncontended time per cycle, ours / CapacityLimiter",
            measurements["uncontended"].ratio,
            "<=",
            3.0,
        ),
        Target.check(
            "scaling_growth",
            f"Ours per grant, {largest:,} / {smallest:,} waiters",
            measurements["scaling_growth"].ours,
            "<=",
            1.3,
        ),
        Target.check(
            "memory_per_waiter",
            "Ours, bytes per waiting task",
            measurements["memory"].ours,
            "<=",
            3_000,
        ),
    )


def _ignore(_message: str) -> None:
    pass


def run_handoff_benchmarks(
    *,
    repeats: int | None = None,
    sizes: HandoffSizes | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> HandoffReport:
    """Run the hand-off benchmarks and check the targets.

    Runs its own ``trio.run`` for every sample, so call it outside trio.

    Args:
        repeats: Pairs of samples per timing benchmark; defaults to 7, or 3
            for a quick run. Memory is measured once per side.
        sizes: How big each benchmark is; defaults to ``HandoffSizes.full()``,
            or ``HandoffSizes.quick()`` for a quick run.
        quick: Use the quick defaults.
        progress: Called with a short line before each pair of samples.
    """
    repeats = (3 if quick else 7) if repeats is None else count(repeats, "repeats")
    if sizes is None:
        sizes = HandoffSizes.quick() if quick else HandoffSizes.full()
    report = progress or _ignore

    report("warm-up")
    warm_up = (min(sizes.tasks, 100), min(sizes.cycles, 10), sizes.limit)
    _run(_contended_ours, *warm_up)
    _run(_contended_theirs, *warm_up)

    found = [
        _contended(sizes, repeats, report),
        _uncontended(sizes, repeats, report),
        *_scaling(sizes, repeats, report),
        _memory(sizes, report),
    ]
    by_key = {measurement.key: measurement for measurement in found}
    return HandoffReport(
        measurements=tuple(found),
        targets=_targets(sizes, by_key),
        sizes=sizes,
        repeats=repeats,
        quick=quick,
        environment=environment(),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; the exit status says whether every target was met."""
    parser = command_line(__doc__, quick="smaller sizes, fewer repeats")
    parser.add_argument(
        "--repeats",
        type=count_option(),
        default=None,
        help="pairs of samples per benchmark (default 7, quick 3)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_handoff_benchmarks(
        repeats=args.repeats, quick=args.quick, progress=show_progress
    )
    finish(report, json_path=args.json, started=started)
    return 0 if report.all_met else 1


if __name__ == "__main__":
    sys.exit(main())
