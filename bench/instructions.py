"""Hand-offs counted in CPU instructions: ``Dispatcher.slot`` against ``trio.CapacityLimiter``.

Runs each workload under ``valgrind --tool=callgrind``, which counts the
instructions the interpreter executes whatever else the machine is doing,
at two sizes, and reports the instructions per cycle (the difference
between the two runs over the cycles between them, so that start-up and
imports cancel out) and the ratio to ``CapacityLimiter``'s. The figures
repeat to within a fraction of a percent on one machine; they are the
load-independent side of ``bench/handoff.py``'s wall-clock medians.

Workloads: contended (200 tasks taking a slot of a limit of 8 in turn,
each holding it across one checkpoint) and uncontended (one task, limit
8). ``valgrind`` must be on ``PATH``.

``--floor`` adds the contended workload through the same path (the slot,
the messages, the scheduler actor) over a minimal policy of a dozen lines
(a heap of tickets and a set of holders, no tenants, models, budgets or
pauses): the cost of the one path itself, without the rules, beside
``CapacityLimiter``'s.
"""

from __future__ import annotations

import heapq
import math
import pathlib
import re
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Final, final

import attrs
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch.lowlevel import SchedulerActor, open_dispatcher_with

import _common

if TYPE_CHECKING:
    import contextlib

    from trio_dispatch import Dispatcher
    from trio_dispatch.lowlevel import BackendSetup, Ticket

TASKS: Final = 200
LIMIT: Final = 8
#: The cycles of the small and the large run of each workload.
SIZES: Final = {
    "contended": (10, 40),
    "uncontended": (1_000, 11_000),
    "contended, minimal policy": (10, 40),
}
WHO: Final = ("trio-dispatch", "CapacityLimiter")


async def _contended_through(
    opened: contextlib.AbstractAsyncContextManager[Dispatcher], cycles: int
) -> None:
    async with opened as dispatcher:

        async def worker() -> None:
            for _ in range(cycles):
                async with dispatcher.slot("p"):
                    await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(worker)


async def _contended_ours(cycles: int) -> None:
    await _contended_through(open_dispatcher({"p": LIMIT}), cycles)


async def _contended_theirs(cycles: int) -> None:
    limiter = trio.CapacityLimiter(LIMIT)

    async def worker() -> None:
        for _ in range(cycles):
            async with limiter:
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for _ in range(TASKS):
            nursery.start_soon(worker)


@final
class MinimalPolicy:
    """The least a policy does for the contended workload: a heap and a set.

    Oldest ticket first among those waiting, ``limit`` holders at most;
    the scheduler actor drives it as it drives ``SlotPolicy``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.wake_at = self.paused_until = None
        # One member, no pool: the scheduler asks.
        self.members = ["p"]
        self.pools: dict[str, list[str]] = {}
        # No member ever goes out of service: the scheduler reads it empty.
        self.service_changes: list[tuple[str, str, float | None]] = []
        self._holders: set[Ticket] = set()
        self._waiting: list[Ticket] = []

    @property
    def in_flight(self) -> int:
        return len(self._holders)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def advance(self, now: float) -> None:
        pass

    def acquire(self, ticket: Ticket, tokens: int = 0) -> list[Ticket]:
        if len(self._holders) < self.limit and not self._waiting:
            self._holders.add(ticket)
            return [ticket]
        heapq.heappush(self._waiting, ticket)
        return []

    def release(self, ticket: Ticket) -> list[Ticket]:
        self._holders.discard(ticket)
        if not self._waiting:
            return []
        granted = heapq.heappop(self._waiting)
        self._holders.add(granted)
        return [granted]

    def set_limit(self, limit: int, *, member: str | None = None) -> list[Ticket]:
        del member  # one member
        self.limit = limit
        return []


async def _contended_floor(cycles: int) -> None:
    def minimal(setup: BackendSetup) -> SchedulerActor:
        return SchedulerActor(setup.provider, MinimalPolicy(LIMIT))  # type: ignore[arg-type]  # SlotPolicy's part that the workload uses

    await _contended_through(open_dispatcher_with(minimal, {"p": LIMIT}), cycles)


async def _uncontended_ours(cycles: int) -> None:
    async with open_dispatcher({"p": LIMIT}) as dispatcher:
        for _ in range(cycles):
            async with dispatcher.slot("p"):
                pass


async def _uncontended_theirs(cycles: int) -> None:
    limiter = trio.CapacityLimiter(LIMIT)
    for _ in range(cycles):
        async with limiter:
            pass


WORKLOADS: Final = {
    ("contended", "trio-dispatch"): _contended_ours,
    ("contended", "CapacityLimiter"): _contended_theirs,
    ("uncontended", "trio-dispatch"): _uncontended_ours,
    ("uncontended", "CapacityLimiter"): _uncontended_theirs,
    ("contended, minimal policy", "trio-dispatch"): _contended_floor,
}


def cycles_between(workload: str, small: int, large: int) -> int:
    """How many hand-off cycles the large run makes more than the small one."""
    return (large - small) * (TASKS if workload.startswith("contended") else 1)


_COLLECTED: Final = re.compile(r"Collected : (\d+)")


def collected(stderr: str) -> int:
    """The instruction count callgrind's summary reports.

    Raises:
        ValueError: The output holds no count.
    """
    found = _COLLECTED.search(stderr)
    if found is None:
        raise ValueError(f"no instruction count in callgrind's output: {stderr!r}")
    return int(found.group(1))


def _count(workload: str, who: str, cycles: int) -> int:
    """Instructions of one run of ``workload`` by ``who``, under callgrind."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(pathlib.Path(__file__).resolve()),
            "--inner",
            workload,
            who,
            str(cycles),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return collected(done.stderr)


@final
@attrs.frozen
class Row:
    """One workload: instructions per cycle, ours and theirs."""

    workload: str
    ours: float
    theirs: float

    @property
    def ratio(self) -> float:
        """Ours over theirs: above 1, ours costs more."""
        return self.ours / self.theirs


@final
@attrs.frozen
class InstructionsReport:
    """The instructions per hand-off cycle of each workload."""

    rows: tuple[Row, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        """The report as a JSON document."""
        import json  # noqa: PLC0415  # only when written

        return json.dumps(
            {
                "rows": [
                    {**_common.plain(row), "ratio": row.ratio} for row in self.rows
                ],
                "environment": self.environment,
            },
            indent=2,
        )

    def to_markdown(self) -> str:
        """The report as markdown."""
        lines = [
            "# Hand-offs in instructions (valgrind --tool=callgrind)",
            "",
            "| Workload | trio-dispatch | CapacityLimiter | Ratio |",
            "|---|--:|--:|--:|",
        ]
        lines += [
            f"| {row.workload} | {row.ours:,.0f} | {row.theirs:,.0f} | {row.ratio:.2f} |"
            for row in self.rows
        ]
        lines += [
            "",
            "Instructions per acquire-release cycle: the difference between a"
            f" run of {SIZES['contended'][1]} and one of {SIZES['contended'][0]}"
            f" cycles per task ({TASKS} tasks, limit {LIMIT}) contended, of"
            f" {SIZES['uncontended'][1]:,} and {SIZES['uncontended'][0]:,}"
            " cycles uncontended, over the cycles between them.",
            "",
            "Environment: "
            + ", ".join(f"{key} {value}" for key, value in self.environment.items()),
        ]
        return "\n".join(lines) + "\n"


def run_instructions(*, floor: bool = False) -> InstructionsReport:
    """Count every workload (the minimal policy's too, with ``floor``); needs ``valgrind``.

    The minimal policy's row is set beside ``CapacityLimiter``'s contended
    count: the same workload on their side.
    """
    rows = []
    theirs: dict[str, float] = {}
    for workload, (small, large) in SIZES.items():
        floor_row = workload == "contended, minimal policy"
        if floor_row and not floor:
            continue
        per_cycle = {}
        for who in WHO[:1] if floor_row else WHO:
            _common.show_progress(f"{workload}, {who}")
            difference = _count(workload, who, large) - _count(workload, who, small)
            per_cycle[who] = difference / cycles_between(workload, small, large)
        theirs[workload] = per_cycle.get(WHO[1], theirs.get("contended", math.nan))
        rows.append(Row(workload, per_cycle[WHO[0]], theirs[workload]))
    return InstructionsReport(tuple(rows), _common.environment())


def main(argv: list[str] | None = None) -> int:
    """Count the instructions; the report goes to stdout (and ``--json``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--inner"]:
        workload, who, cycles = args[1], args[2], int(args[3])
        trio.run(WORKLOADS[workload, who], cycles)
        return 0
    parser = _common.command_line(__doc__)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="add the contended workload over a minimal policy (the path alone)",
    )
    options = parser.parse_args(args)
    if shutil.which("valgrind") is None:
        print("bench/instructions.py needs valgrind on PATH", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = run_instructions(floor=options.floor)
    _common.finish(report, json_path=options.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
