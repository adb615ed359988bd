"""The scheduling core's cost per operation: ``SlotPolicy`` alone, without trio.

Usage::

    python bench/policy_ops.py [--quick] [--repeats N] [--json PATH]

Drives ``trio_dispatch.lowlevel.SlotPolicy`` in a tight loop, as the
scheduler actor does, and reports microseconds per round, the median of
the repeats (and the best), for each of:

- uncontended: limit 16, nothing waits; a round is an acquire granted at
  once and its release;
- contended: limit 4, 64 tickets waiting behind 4 holders; a round is the
  oldest holder's release, which grants the oldest waiter, and a newcomer's
  acquire, which queues: 64 always wait;

each with the default tenant alone, with tickets of 4 tenants (weights 1
to 4, the policy told the time before every call, as the actor does once
it counts tenants), and with tickets of a model that has a budget of its
own (too large to hold anyone back: its cost, not its pacing).

Prints the markdown table on stdout, and writes the JSON report to
``PATH`` if asked. The time is the process's CPU time, so that other work
on a shared machine counts less; still, compare runs made side by side
(interleave the two versions' runs), never figures from elsewhere.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Final, final

import attrs

from trio_dispatch import Budget, Tenant
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket

from _common import command_line, count, count_option, environment, finish, plain

if TYPE_CHECKING:
    from collections.abc import Callable

TENANTS: Final = ("a", "b", "c", "d")
"""The tenants of the runs with tenants, weighted 1, 2, 3 and 4."""

MODEL: Final = "m"
"""The model of the runs with a model budget."""

KINDS: Final = ("default", "tenants", "model")
"""The tickets' kinds: the default tenant's, 4 tenants', a budgeted model's."""

_STEP: Final = 1e-4  # seconds of policy time between two calls


@final
@attrs.frozen
class OpsMeasurement:
    """Microseconds per round of one scenario, over the repeats.

    Attributes:
        key: Short identifier, e.g. ``"contended_tenants"``.
        label: What was measured.
        median: Median over the repeats.
        best: The fastest repeat.
        samples: Every repeat's figure.
    """

    key: str
    label: str
    median: float
    best: float
    samples: tuple[float, ...]


@final
@attrs.frozen
class PolicyOpsReport:
    """Every scenario's cost per round, and how it was run."""

    measurements: tuple[OpsMeasurement, ...]
    rounds: int
    repeats: int
    environment: dict[str, str]

    def to_dict(self) -> dict[str, object]:
        """The report as JSON's own types."""
        return plain(self)

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """The report as a markdown table."""
        lines = [
            "# SlotPolicy, cost per operation",
            "",
            f"{self.rounds:,} rounds per repeat, {self.repeats} repeats;"
            f" {', '.join(f'{k} {v}' for k, v in self.environment.items())}.",
            "",
            "| Scenario | Median µs/round | Best µs/round |",
            "|---|--:|--:|",
        ]
        lines += [
            f"| {m.label} | {m.median:.3f} | {m.best:.3f} |" for m in self.measurements
        ]
        return "\n".join(lines) + "\n"


def _policy(kind: str, limit: int) -> SlotPolicy:
    if kind == "tenants":
        tenants = {name: Tenant(weight=i + 1.0) for i, name in enumerate(TENANTS)}
        return SlotPolicy(limit, tenants=tenants)
    if kind == "model":
        budget = Budget(requests_per_minute=1e9, tokens_per_minute=1e12)
        return SlotPolicy(limit, models={MODEL: Throttle(budget, learn=False)})
    return SlotPolicy(limit)


def _ticket(kind: str, seq: int) -> Ticket:
    if kind == "tenants":
        return Ticket(float(seq), seq, tenant=TENANTS[seq % len(TENANTS)])
    if kind == "model":
        return Ticket(float(seq), seq, model=MODEL)
    return Ticket(float(seq), seq)


def _check(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(
            f"benchmark went wrong: {what} is {got}, expected {expected}"
        )


def uncontended(kind: str, rounds: int) -> float:
    """Seconds for ``rounds`` acquires granted at once, each released."""
    policy = _policy(kind, 16)
    tokens = 100 if kind == "model" else 0
    clocked = kind != "default"
    tickets = [_ticket(kind, seq) for seq in range(rounds)]
    acquire, release, advance = policy.acquire, policy.release, policy.advance
    now = 0.0
    start = time.process_time()
    for ticket in tickets:
        if clocked:
            now += _STEP
            advance(now)
        acquire(ticket, tokens)
        if clocked:
            now += _STEP
            advance(now)
        release(ticket)
    elapsed = time.process_time() - start
    stats = policy.statistics()
    _check("granted_total", stats.granted_total, rounds)
    _check("in_flight", stats.in_flight, 0)
    return elapsed


def contended(kind: str, rounds: int, *, limit: int = 4, waiters: int = 64) -> float:
    """Seconds for ``rounds`` releases granting a waiter, each with a newcomer queued."""
    policy = _policy(kind, limit)
    tokens = 100 if kind == "model" else 0
    clocked = kind != "default"
    tickets = [_ticket(kind, seq) for seq in range(limit + waiters + rounds)]
    holders: deque[Ticket] = deque()
    for ticket in tickets[: limit + waiters]:
        holders.extend(policy.acquire(ticket, tokens))
    _check("waiting", policy.waiting, waiters)
    acquire, release, advance = policy.acquire, policy.release, policy.advance
    now = 0.0
    start = time.process_time()
    for ticket in tickets[limit + waiters :]:
        if clocked:
            now += _STEP
            advance(now)
        holders.extend(release(holders.popleft()))
        if clocked:
            now += _STEP
            advance(now)
        acquire(ticket, tokens)
    elapsed = time.process_time() - start
    stats = policy.statistics()
    _check("granted_total", stats.granted_total, limit + rounds)
    _check("waiting", stats.waiting, waiters)
    return elapsed


SCENARIOS: Final[dict[str, tuple[str, Callable[[str, int], float], str]]] = {
    f"{shape}_{kind}": (
        f"{shape.capitalize()}, {description}",
        run,
        kind,
    )
    for shape, run in (("uncontended", uncontended), ("contended", contended))
    for kind, description in zip(
        KINDS,
        ("default tenant", "4 tenants", "a model with a budget"),
        strict=True,
    )
}
"""Every scenario by key: its label, its run and its tickets' kind."""


def run_policy_ops(*, rounds: int = 100_000, repeats: int = 7) -> PolicyOpsReport:
    """Time every scenario ``repeats`` times, ``rounds`` rounds each, in turns."""
    count(rounds, "rounds")
    count(repeats, "repeats")
    samples: dict[str, list[float]] = {key: [] for key in SCENARIOS}
    for _ in range(repeats):
        for key, (_label, run, kind) in SCENARIOS.items():
            gc.collect()
            samples[key].append(1e6 * run(kind, rounds) / rounds)
    measurements = tuple(
        OpsMeasurement(
            key=key,
            label=SCENARIOS[key][0],
            median=statistics.median(found),
            best=min(found),
            samples=tuple(found),
        )
        for key, found in samples.items()
    )
    return PolicyOpsReport(
        measurements=measurements,
        rounds=rounds,
        repeats=repeats,
        environment=environment(),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and print the report."""
    parser = command_line(__doc__, quick="20,000 rounds per repeat, 3 repeats")
    parser.add_argument(
        "--repeats", type=count_option(), default=None, help="default 7, quick 3"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_policy_ops(
        rounds=20_000 if args.quick else 100_000,
        repeats=args.repeats or (3 if args.quick else 7),
    )
    finish(report, json_path=args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
