"""A pool's turn latency by routing policy, simulated: oldest-first against least-busy FIFO.

Usage::

    python bench/pool_routing.py [--quick] [--turns N] [--seed S] [--json PATH]

The simulator (``trio_dispatch.testing.run_simulation``) plays the same
seeded turns, in virtual time, on a pool of two members (``key-a`` and
``key-b``, a client-side limit of 4 each and a real capacity of 4 each),
every turn on the pool: 1 to 8 calls (uniform), each lognormal (mean 2 s,
sd 1 s), tool steps exponential (mean 1 s) between them, Poisson arrivals
at 80%, 95% and 110% of the pool's capacity. Policies:

* ``oldest-first``: the real dispatcher's pool (``pools={"gpt": ("key-a",
  "key-b")}``, affinity on): one queue over both members, the oldest turn
  first;
* ``fifo``: least-busy routing (the member with the most free slots less
  its queue, as LiteLLM's least-busy strategy picks), then first come
  first served at that member (a ``trio.CapacityLimiter`` each);
* ``none``: no client-side limit; each call goes to the member with the
  fewest calls in flight, which answers 429 past its capacity, and the
  agent retries after ``Retry-After`` (1 s), 10 attempts at most;
* ``oldest-first``, one provider of 8: the same turns on one provider of
  the pool's slots, the reference a pool should come close to.

The report: turns completed, turn latency mean, p50, p95 and p99 (from
arrival to the end of the last call, completed turns only), the first
call's wait p95, and the 429s, per load and policy; and, per load, the
ratio of oldest-first's p95 to FIFO's. Virtual time: the figures do not
depend on the machine. Uses only the public API.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import attrs

from trio_dispatch.testing import (
    CallsPerTurn,
    Duration,
    PoissonArrivals,
    SimProvider,
    Workload,
    run_simulation,
)

from _common import (
    bars_and_machine,
    command_line,
    environment,
    finish,
    load_average,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

LOADS = (0.8, 0.95, 1.1)
MEMBER = 4
POOLS = {"gpt": ("key-a", "key-b")}


def workload(turns: int, load: float, seed: int, *, pooled: bool) -> Workload:
    """The seeded turns at ``load``: on the pool, or on one provider of its slots."""
    if pooled:
        providers = tuple(
            SimProvider(name, MEMBER, capacity=MEMBER) for name in POOLS["gpt"]
        )
    else:
        providers = (SimProvider("one", 2 * MEMBER, capacity=2 * MEMBER),)
    return Workload(
        agents=turns,
        arrivals=PoissonArrivals(load),
        providers=providers,
        calls=CallsPerTurn(1, 8),
        call_duration=Duration.lognormal(2.0, 1.0),
        tool_duration=Duration.exponential(1.0),
        seed=seed,
        pools=POOLS if pooled else {},
    )


@attrs.frozen
class Row:
    """One policy at one load."""

    load: float
    policy: str
    turns: int
    completed: int
    mean: float
    p50: float
    p95: float
    p99: float
    first_wait_p95: float
    rejections: int


def run(turns: int, seed: int) -> list[Row]:
    """Every policy at every load, on the same seeded turns."""
    rows: list[Row] = []
    arms = (
        ("oldest-first", "oldest-first", True),
        ("fifo", "fifo", True),
        ("none", "none", True),
        ("oldest-first, one provider of 8", "oldest-first", False),
    )
    for load in LOADS:
        for name, policy, pooled in arms:
            show_progress(f"load {load:.0%}: {name}")
            result = run_simulation(workload(turns, load, seed, pooled=pooled), policy)  # type: ignore[arg-type]  # a policy name
            metrics = result.metrics()
            rows.append(
                Row(
                    load,
                    name,
                    metrics.turns,
                    metrics.completed,
                    metrics.latency_mean,
                    metrics.latency_p50,
                    metrics.latency_p95,
                    metrics.latency_p99,
                    metrics.first_wait_p95,
                    metrics.rejections,
                )
            )
    return rows


@attrs.frozen
class RoutingReport:
    """The rows, and where they were measured."""

    turns: int
    seed: int
    rows: list[Row]
    environment: dict[str, str] = attrs.field(factory=environment)
    load: str = attrs.field(factory=load_average)

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    def ratio(self, load: float) -> float:
        """Oldest-first's turn p95 over FIFO's on the pool, at ``load``."""
        p95 = {row.policy: row.p95 for row in self.rows if row.load == load}
        return p95["oldest-first"] / p95["fifo"]

    def to_markdown(self) -> str:
        lines = [
            f"{self.turns} turns of 1-8 calls (lognormal, mean 2 s) with tool"
            " steps (exponential, mean 1 s), on a pool of two members of"
            f" {MEMBER} slots and {MEMBER} of capacity each; seed {self.seed};"
            " virtual seconds.",
            "",
            "| Load | Policy | Done | Mean | p50 | p95 | p99 |"
            " First call's wait p95 | 429s |",
            "|--:|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        lines += [
            f"| {row.load:.0%} | {row.policy} | {row.completed}/{row.turns}"
            f" | {row.mean:.1f} | {row.p50:.1f} | {row.p95:.1f} | {row.p99:.1f}"
            f" | {row.first_wait_p95:.1f} | {row.rejections} |"
            for row in self.rows
        ]
        lines += [
            "",
            *(
                f"- at {load:.0%}: oldest-first's p95 is {self.ratio(load):.2f}x"
                " least-busy FIFO's"
                for load in LOADS
            ),
            # No bars: the machine's line alone.
            *bars_and_machine({}, self.environment, self.load),
        ]
        return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_line(__doc__, quick="1,000 turns per run instead of 5,000")
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--seed", type=int, default=20240501)
    options = parser.parse_args(argv)
    started = time.perf_counter()
    turns = options.turns or (1000 if options.quick else 5000)
    report = RoutingReport(turns, options.seed, run(turns, options.seed))
    finish(report, json_path=options.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
