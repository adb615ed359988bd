"""Many models seen once: what idle learned budgets cost a grant, and memory.

Usage::

    python bench/many_models.py [--quick] [--models N] [--grants G]
        [--redis-grants R] [--redis-url URL] [--json PATH]

The transport takes each request's model from its JSON body, so a fleet
that serves a fine-tune per customer meets a new model now and then, each
with rate-limit figures of its own: a budget learned per model. Two runs,
each beside a control with no other model (the same run with ``--models
0``), through the public API only:

* **local**: on trio's ``MockClock`` (virtual time, jumping whenever every
  task waits), ``N`` models are seen once each (a slot, its answer's
  figures, the slot given back), then two virtual hours pass with nothing
  to do, then ``G`` requests of another model go one after the other, each
  holding its slot 10 virtual ms. The CPU time of those grants, and the
  models whose budgets the dispatcher still keeps afterwards
  (``statistics()``);
* **redis**: the same on a real redis-server (its own, unless given
  ``--redis-url``), in real time: ``N`` models seen once, then at once ``R``
  requests of another model one after the other; the wall and CPU time of
  those grants. The learned budgets are still there then: they are
  forgotten a minute after their model's last request at the earliest.

The report in ``bench/reports/`` comes from::

    python bench/many_models.py --json bench/reports/many_models.json > bench/reports/many_models.md
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from typing import Any

import attrs
import trio
import trio.testing

from trio_dispatch import Quota, RateLimitInfo, open_dispatcher

from _common import (
    command_line,
    count_option,
    environment,
    finish,
    plain,
    redis_server,
    show_progress,
)

PROVIDER = "p"
LIMIT = 4
IDLE = 7200.0
HOLD = 0.01
# Each model's figures: 100 requests a minute, one spent.
FIGURES = RateLimitInfo(requests=Quota(limit=100, remaining=99))
OTHER = RateLimitInfo(requests=Quota(limit=10**6, remaining=10**6 - 1))


@attrs.frozen
class Run:
    """One run: the models seen before, and the timed grants of another model."""

    backend: str
    models: int
    grants: int
    cpu_seconds: float
    wall_seconds: float
    models_kept: int


async def _see(dispatcher: Any, models: int) -> None:  # noqa: ANN401  # a Dispatcher
    """``models`` models seen once each: a slot, its answer's figures."""
    for k in range(models):
        model = f"ft-{k}"
        async with dispatcher.slot(PROVIDER, model=model):
            dispatcher.observe_rate_limits(PROVIDER, FIGURES, model=model)


async def _grants(dispatcher: Any, grants: int, hold: float) -> tuple[float, float]:  # noqa: ANN401  # a Dispatcher
    """CPU and wall seconds of ``grants`` requests of another model, one by one."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(grants):
        async with dispatcher.slot(PROVIDER, model="other"):
            dispatcher.observe_rate_limits(PROVIDER, OTHER, model="other")
            if hold:
                await trio.sleep(hold)
    return time.process_time() - cpu, time.perf_counter() - wall


def _kept(dispatcher: Any) -> int:  # noqa: ANN401  # a Dispatcher
    models = dispatcher.statistics().providers[PROVIDER].models
    return len(set(models) - {"other"})


async def _local(models: int, grants: int) -> Run:
    async with open_dispatcher({PROVIDER: LIMIT}) as dispatcher:
        await _see(dispatcher, models)
        await trio.sleep(IDLE)
        cpu, wall = await _grants(dispatcher, grants, HOLD)
        return Run("local", models, grants, cpu, wall, _kept(dispatcher))


async def _redis(models: int, grants: int, url: str) -> Run:
    async with open_dispatcher(
        {PROVIDER: LIMIT}, redis_url=url, namespace=f"bench-{uuid.uuid4().hex}"
    ) as dispatcher:
        await _see(dispatcher, models)
        cpu, wall = await _grants(dispatcher, grants, 0.0)
        return Run("redis", models, grants, cpu, wall, _kept(dispatcher))


def run_local(models: int, grants: int) -> Run:
    """The local run, in virtual time."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(_local, models, grants, clock=clock)


def run_redis(models: int, grants: int, url: str) -> Run:
    """The Redis run, in real time."""
    return trio.run(_redis, models, grants, url)


@attrs.frozen
class ManyModelsReport:
    """Each backend's run with many idle models, beside its control."""

    runs: tuple[Run, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            "Grants of one model, one after the other, after many models"
            " were seen once (each a learned budget), beside none",
            "",
            "| backend | models seen once | grants | CPU s | wall s"
            " | CPU against none | budgets kept after |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        control = {run.backend: run for run in self.runs if run.models == 0}
        for run in self.runs:
            base = control.get(run.backend)
            ratio = (
                f"{run.cpu_seconds / base.cpu_seconds:.2f}x"
                if base is not None and base.cpu_seconds > 0
                else "-"
            )
            lines.append(
                f"| {run.backend} | {run.models:,} | {run.grants:,}"
                f" | {run.cpu_seconds:.3f} | {run.wall_seconds:.3f} | {ratio}"
                f" | {run.models_kept:,} |"
            )
        return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print markdown, and write JSON with ``--json``."""
    parser = command_line(__doc__, quick="300 models, 200 and 50 grants")
    parser.add_argument("--models", type=count_option(), default=3000)
    parser.add_argument("--grants", type=count_option(), default=2000)
    parser.add_argument("--redis-grants", type=count_option(), default=200)
    parser.add_argument("--redis-url", default=None, help="an existing server")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models, grants, redis_grants = (
        (300, 200, 50) if args.quick else (args.models, args.grants, args.redis_grants)
    )
    runs = []
    for seen in (0, models):
        show_progress(f"local: {seen} models seen once, {grants} grants")
        runs.append(run_local(seen, grants))
    given = contextlib.nullcontext(args.redis_url)
    with redis_server() if args.redis_url is None else given as url:
        for seen in (0, models):
            show_progress(f"redis: {seen} models seen once, {redis_grants} grants")
            runs.append(run_redis(seen, redis_grants, url))
    finish(
        ManyModelsReport(runs=tuple(runs), environment=environment()),
        json_path=args.json,
        started=started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
