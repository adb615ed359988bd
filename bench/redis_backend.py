"""The shared backend's cost: a dispatcher on Redis against one of its own.

Usage::

    python bench/redis_backend.py [--quick] [--redis-url URL] [--json PATH]

Starts its own ``redis-server`` on a free loopback port (unless given
``--redis-url``), prints the results as a markdown table on stdout
(progress goes to stderr) and, with ``--json``, writes the full report to
``PATH``. The report in ``bench/reports/`` comes from::

    python bench/redis_backend.py --json bench/reports/redis_backend.json > bench/reports/redis_backend.md

Four measurements:

1. **Grant latency**: one task, nobody else, ``round_trips`` times enters
   and leaves a slot; the time to enter is the latency of a grant. p50 and
   p99 in microseconds, for a local dispatcher and for one on Redis (the
   difference is what the shared backend adds: one script call on
   loopback, and the scheduler's round). Measured twice: back to back (the
   release and the next request go to Redis in one script call) and to an
   idle scheduler (a 5 ms pause, untimed, between cycles: the case of
   requests that hold their slot for a model's answer). Beside them, in
   the same run, a bare call of a trivial script through coredis (a
   client of its own, no dispatcher), two ways: through coredis's
   ``Script`` object, and as the ledger sends its scripts (``EVALSHA``
   straight on a connection of the pool): the floor that the machine and
   the client set.
2. **Contended hand-offs**: ``tasks`` tasks each run ``cycles`` cycles of
   (acquire, one checkpoint, release) under a limit of ``limit``, in one
   process. Hand-offs per second, local and on Redis, in the same run.
3. **Scaling**: 1, 2, 4 and 8 OS processes (``processes``) share a limit of ``limit``;
   each runs ``tasks`` tasks of ``cycles`` cycles (acquire, hold
   ``hold`` seconds, release). Grants per second over the whole fleet, and
   the cross-process order inversions: pairs of requests from different
   processes where the one that asked later was granted first although the
   other was already waiting at least ``tolerance`` seconds earlier (turns
   start when they ask, so asking earlier is an older turn). Beside
   each, in the same run and the same shape, a fleet of the plain Lua
   counting semaphore of 4. (its own worker processes, each with its
   tasks holding ``hold`` seconds); and for both, the Redis commands per
   grant: ``INFO commandstats`` read before the fleet's processes start
   and after they end (their connecting, setting up and closing
   included, ``INFO`` left out) over the fleet's grants.

4. **Redis commands per grant**: the contended hand-offs of 2. again, on
   Redis only, with the server's ``INFO commandstats`` read before and
   after: every command the server ran (the scripts' own calls counted
   one by one, ``INFO`` itself left out) over the grants made. Beside it, in
   the same run, a plain Lua counting semaphore written here (a ZSET of
   leases: one script to take a slot, one to give it back with a wake-up
   publish; a waiter in the process retries when a slot of the process is
   given back): the floor that any Redis semaphore pays. In the scaling
   fleets of 3. its waiters retry on wake-ups: every release publishes
   one, which each other process hears on its subscription (its own
   releases it hears at once), and each wake-up, heard or its own, lets
   one of the process's waiters try again (a wake-up that finds none
   parked lets the next one that fails try again at once); a waiter that
   hears nothing tries again after a second, the safety net that our
   processes' poll is too. And once more
   with the tasks taking turns being two tenants' (``Tenant()`` each), so
   the fleet counts tenants: what fair shares cost on the grant's path.
5. **A pool on Redis**: the contended hand-offs of 2. on a pool of two
   members sharing ``limit`` (half each), against one provider of
   ``limit`` on Redis, taken in turns: hand-offs per second, each member's
   peak in flight, and the Redis commands per grant as in 4. What
   scheduling a group (each grant placed on a member by the pool's rule)
   costs over a provider.

Method. Wall-clock timings (``time.perf_counter``, ``time.time`` across
processes) on trio's real clock; every measurement alternates local and
Redis runs after one untimed warm-up each. Only the public API is used.
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Final, final

import attrs
import coredis
import trio
import trio.testing

from trio_dispatch import Tenant, open_dispatcher

from _common import (
    command_line,
    environment,
    finish,
    plain,
    positive_int,
    redis_server,
    show_progress,
)

_PROVIDER: Final = "p"


@final
@attrs.frozen
class Sizes:
    """How big each measurement is."""

    round_trips: int = attrs.field(default=2_000, validator=positive_int)
    tasks: int = attrs.field(default=100, validator=positive_int)
    cycles: int = attrs.field(default=20, validator=positive_int)
    limit: int = attrs.field(default=4, validator=positive_int)
    fleet_tasks: int = attrs.field(default=20, validator=positive_int)
    fleet_cycles: int = attrs.field(default=10, validator=positive_int)
    hold: float = 0.002
    tolerance: float = 0.002
    repeats: int = attrs.field(default=3, validator=positive_int)
    processes: tuple[int, ...] = (1, 2, 4, 8)

    @classmethod
    def quick(cls) -> Sizes:
        """A first look, in well under a minute."""
        return cls(round_trips=500, tasks=50, cycles=10, fleet_cycles=5, repeats=2)


@final
@attrs.frozen
class FleetRun:
    """One fleet's run: what its grants did, and what they cost Redis."""

    grants: int
    grants_per_second: float
    inversions: int
    peak_in_flight: int
    commands_per_grant: float
    # Each command's calls over the run, for where the cost goes.
    commands: dict[str, int]


@final
@attrs.frozen
class ScalingRow:
    """One fleet size: ours, and the plain Lua semaphore in the same shape."""

    processes: int
    grants: int
    grants_per_second: float
    inversions: int
    peak_in_flight: int
    commands_per_grant: float = 0.0
    commands: dict[str, int] = attrs.field(factory=dict)
    semaphore: FleetRun | None = None


@final
@attrs.frozen
class RedisBackendReport:
    """Everything measured, for JSON and markdown."""

    environment: dict[str, str]
    sizes: Sizes
    bare_call_p50_us: float
    bare_call_p99_us: float
    bare_request_p50_us: float
    bare_request_p99_us: float
    latency_local_p50_us: float
    latency_local_p99_us: float
    latency_redis_p50_us: float
    latency_redis_p99_us: float
    idle_latency_local_p50_us: float
    idle_latency_local_p99_us: float
    idle_latency_redis_p50_us: float
    idle_latency_redis_p99_us: float
    handoffs_local_per_s: float
    handoffs_redis_per_s: float
    scaling: tuple[ScalingRow, ...]
    commands_per_grant: float = 0.0
    semaphore_commands_per_grant: float = 0.0
    tenant_commands_per_grant: float = 0.0
    pool_handoffs_per_s: float = 0.0
    pool_provider_handoffs_per_s: float = 0.0
    pool_commands_per_grant: float = 0.0
    pool_peak_in_flight: dict[str, int] = attrs.field(factory=dict)

    def to_json(self) -> str:
        """The report as a JSON document."""
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        """The report as markdown."""
        lines = [
            "# Shared backend (Redis) against a local dispatcher",
            "",
            "| measurement | local | redis |",
            "| --- | ---: | ---: |",
            f"| bare script call p50 / p99, no dispatcher (µs) | |"
            f" {self.bare_call_p50_us:.0f} / {self.bare_call_p99_us:.0f} |",
            f"| bare EVALSHA on a connection p50 / p99, no dispatcher (µs) | |"
            f" {self.bare_request_p50_us:.0f} / {self.bare_request_p99_us:.0f} |",
            f"| grant latency p50, back to back (µs) | {self.latency_local_p50_us:.0f}"
            f" | {self.latency_redis_p50_us:.0f} |",
            f"| grant latency p99, back to back (µs) | {self.latency_local_p99_us:.0f}"
            f" | {self.latency_redis_p99_us:.0f} |",
            f"| grant latency p50, idle scheduler (µs)"
            f" | {self.idle_latency_local_p50_us:.0f}"
            f" | {self.idle_latency_redis_p50_us:.0f} |",
            f"| grant latency p99, idle scheduler (µs)"
            f" | {self.idle_latency_local_p99_us:.0f}"
            f" | {self.idle_latency_redis_p99_us:.0f} |",
            f"| contended hand-offs per second | {self.handoffs_local_per_s:,.0f}"
            f" | {self.handoffs_redis_per_s:,.0f} |",
            f"| Redis commands per grant, contended (plain Lua semaphore:"
            f" {self.semaphore_commands_per_grant:.1f}) |"
            f" | {self.commands_per_grant:.1f} |",
            f"| Redis commands per grant, contended, the tasks of two tenants |"
            f" | {self.tenant_commands_per_grant:.1f} |",
            f"| contended hand-offs per second, a pool of two members"
            f" (one provider of their slots, in turns:"
            f" {self.pool_provider_handoffs_per_s:,.0f}) |"
            f" | {self.pool_handoffs_per_s:,.0f} |",
            f"| Redis commands per grant, contended, a pool of two members |"
            f" | {self.pool_commands_per_grant:.1f} |",
            f"| each member's peak in flight, a pool of two members"
            f" ({', '.join(f'{m} of {n}' for m, n in pool_limits(self.sizes).items())}) |"
            f" | {', '.join(f'{m}: {n}' for m, n in sorted(self.pool_peak_in_flight.items()))} |",
            "",
            f"Scaling: processes sharing a limit of {self.sizes.limit} on Redis,"
            f" each with {self.sizes.fleet_tasks} tasks of"
            f" {self.sizes.fleet_cycles} cycles holding {self.sizes.hold * 1000:g} ms;"
            " beside each fleet, in the same run, one of the plain Lua semaphore"
            " in the same shape (its waiters retry on the wake-ups its releases"
            " publish). Grants per second are the whole fleet's; commands per"
            " grant count every command the server ran from before the fleet's"
            " processes started to after they ended (`INFO` left out).",
            "",
            "| processes | grants | grants per second | cross-process inversions"
            " | peak in flight | Redis commands per grant"
            " | semaphore: grants per second | semaphore: inversions"
            " | semaphore: peak | semaphore: commands per grant |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in self.scaling:
            sem = row.semaphore
            theirs = (
                " | | | |"
                if sem is None
                else f" {sem.grants_per_second:,.0f} | {sem.inversions}"
                f" | {sem.peak_in_flight} | {sem.commands_per_grant:.1f} |"
            )
            lines.append(
                f"| {row.processes} | {row.grants} | {row.grants_per_second:,.0f}"
                f" | {row.inversions} | {row.peak_in_flight}"
                f" | {row.commands_per_grant:.1f} |" + theirs
            )
        lines += [
            "",
            "Environment: "
            + ", ".join(f"{k} {v}" for k, v in self.environment.items()),
            "",
        ]
        return "\n".join(lines)


def _options(redis_url: str | None, namespace: str) -> dict[str, Any]:
    if redis_url is None:
        return {}
    return {"redis_url": redis_url, "namespace": namespace, "lease": 5.0}


_IDLE_GAP = 0.005


async def _latencies(
    rounds: int, redis_url: str | None, namespace: str, gap: float = 0.0
) -> list[float]:
    found = []
    async with open_dispatcher(
        {_PROVIDER: 1}, **_options(redis_url, namespace)
    ) as dispatcher:
        for _ in range(rounds):
            slot = dispatcher.slot(_PROVIDER)
            started = time.perf_counter()
            async with slot:
                found.append(time.perf_counter() - started)
            if gap:
                await trio.sleep(gap)
    return found


_BARE_SCRIPT: Final = "return redis.call('TIME')"


async def _bare_calls(rounds: int, redis_url: str) -> list[float]:
    """A trivial script on its own client: the floor under a grant."""
    found = []
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        script = client.register_script(_BARE_SCRIPT)
        await script(keys=["{bare}:k"], args=[])
        for _ in range(rounds):
            started = time.perf_counter()
            await script(keys=["{bare}:k"], args=[])
            found.append(time.perf_counter() - started)
    return found


async def _bare_requests(rounds: int, redis_url: str) -> list[float]:
    """The same script as the ledger runs its own: EVALSHA on a connection."""
    found = []
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        sha = await client.script_load(_BARE_SCRIPT)
        pool = client.connection_pool
        connection = await pool.get_connection()
        pool.release(connection)
        for _ in range(rounds):
            started = time.perf_counter()
            await connection.create_request(b"EVALSHA", sha, 1, "{bare}:k")
            found.append(time.perf_counter() - started)
    return found


def pool_limits(sizes: Sizes) -> dict[str, int]:
    """The pool's two members, sharing ``limit``."""
    half = max(1, sizes.limit // 2)
    return {f"{_PROVIDER}-a": half, f"{_PROVIDER}-b": max(1, sizes.limit - half)}


async def _handoffs(  # each measurement's shape
    sizes: Sizes,
    redis_url: str | None,
    namespace: str,
    tenants: tuple[str, ...] = (),
    *,
    pooled: bool = False,
    peaks: dict[str, int] | None = None,
) -> float:
    """Contended hand-offs per second.

    With ``tenants``, the tasks take turns being theirs (so the fleet counts
    tenants). ``pooled``: on a pool of two members sharing ``limit``
    (``pool_limits``), each member's peak in flight kept in ``peaks``.
    """
    limits = pool_limits(sizes) if pooled else {_PROVIDER: sizes.limit}
    pools = {_PROVIDER: tuple(limits)} if pooled else None
    holding: collections.Counter[str] = collections.Counter()
    async with open_dispatcher(
        limits,
        pools=pools,
        tenants={name: Tenant() for name in tenants},
        **_options(redis_url, namespace),
    ) as dispatcher:
        gate = trio.Event()

        async def cycle(tenant: str | None) -> None:
            await gate.wait()
            for _ in range(sizes.cycles):
                async with dispatcher.slot(_PROVIDER, tenant=tenant) as slot:
                    member = slot.member
                    assert member is not None  # granted
                    holding[member] += 1
                    if peaks is not None:
                        peaks[member] = max(peaks.get(member, 0), holding[member])
                    await trio.lowlevel.checkpoint()
                    holding[member] -= 1

        async with trio.open_nursery() as nursery:
            for n in range(sizes.tasks):
                nursery.start_soon(
                    cycle, tenants[n % len(tenants)] if tenants else None
                )
            await trio.testing.wait_all_tasks_blocked()
            started = time.perf_counter()
            gate.set()
        return sizes.tasks * sizes.cycles / (time.perf_counter() - started)


async def _command_counts(client: coredis.Redis[str]) -> dict[str, int]:
    """Each command's calls the server has run so far, ``INFO`` left out."""
    stats = await client.info("commandstats")
    counts = {}
    for name, value in stats.items():
        if name.startswith("cmdstat_") and name != "cmdstat_info":
            assert isinstance(value, dict)
            counts[name.removeprefix("cmdstat_")] = int(value["calls"])
    return counts


async def _commands(client: coredis.Redis[str]) -> int:
    """Commands the server has run so far, ``INFO`` left out."""
    return sum((await _command_counts(client)).values())


async def _counts_at(redis_url: str) -> dict[str, int]:
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        return await _command_counts(client)


async def _commands_per_grant(
    sizes: Sizes,
    redis_url: str,
    namespace: str,
    tenants: tuple[str, ...] = (),
    *,
    pooled: bool = False,
) -> float:
    """The contended hand-offs on Redis: server commands over grants."""
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        before = await _commands(client)
        await _handoffs(sizes, redis_url, namespace, tenants, pooled=pooled)
        return (await _commands(client) - before) / (sizes.tasks * sizes.cycles)


# A plain counting semaphore in Lua: leases in a ZSET scored by expiry on the
# server's clock, pruned, counted and added in one script; removed and
# announced in another.
_TAKE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
"""
_GIVE: Final = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', KEYS[2], ARGV[2] or '1')
return 0
"""


async def _semaphore_commands_per_grant(
    sizes: Sizes, redis_url: str, namespace: str
) -> float:
    """The same hand-offs on the plain semaphore: server commands over grants."""
    keys = [f"{{{namespace}}}:leases", f"{{{namespace}}}:wake"]
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        take = await client.script_load(_TAKE)
        give = await client.script_load(_GIVE)
        freed = trio.Condition()
        ids = iter(range(1 << 62))
        gate = trio.Event()

        async def cycle() -> None:
            await gate.wait()
            for _ in range(sizes.cycles):
                lease = str(next(ids))
                while not await client.evalsha(
                    take, keys[:1], [str(sizes.limit), "5000", lease]
                ):
                    async with freed:
                        await freed.wait()
                await trio.lowlevel.checkpoint()
                await client.evalsha(give, keys, [lease])
                async with freed:
                    freed.notify()

        before = await _commands(client)
        async with trio.open_nursery() as nursery:
            for _ in range(sizes.tasks):
                nursery.start_soon(cycle)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        return (await _commands(client) - before) / (sizes.tasks * sizes.cycles)


@final
class _Wakeups:
    """Releases announced to one process of the semaphore's fleet.

    Each wake-up lets one parked waiter try again; one that finds nobody
    parked lets the next waiter that would park try again at once (it may
    have failed just before the release).
    """

    def __init__(self) -> None:
        self._parked: collections.deque[trio.Event] = collections.deque()
        self._pending = 0

    def announce(self) -> None:
        if self._parked:
            self._parked.popleft().set()
        else:
            self._pending += 1

    async def wait(self, poll: float) -> None:
        if self._pending:
            self._pending -= 1
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._parked.append(event)
        with trio.move_on_after(poll):
            await event.wait()
        if not event.is_set():
            # The safety net: no wake-up came.
            self._parked.remove(event)


_SEMAPHORE_POLL: Final = 1.0


async def _ready() -> None:
    """Tell the fleet's parent this process is ready; return once all are."""
    print("ready", flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)


async def _semaphore_worker(settings: dict[str, Any]) -> None:
    """One process of the plain semaphore's fleet: prints its grants as JSON."""
    namespace = settings["namespace"]
    keys = [f"{{{namespace}}}:leases", f"{{{namespace}}}:wake"]
    node = uuid.uuid4().hex
    take = hashlib.sha1(_TAKE.encode()).hexdigest()
    give = hashlib.sha1(_GIVE.encode()).hexdigest()
    records: list[tuple[float, float, float]] = []
    holding = 0
    peak = 0
    ids = iter(range(1 << 62))
    wakeups = _Wakeups()
    url = settings["redis_url"]
    async with (
        coredis.Redis.from_url(url, decode_responses=True) as client,
        coredis.Redis.from_url(url, decode_responses=True) as listener,
        trio.open_nursery() as nursery,
    ):
        subscribed = trio.Event()

        async def listen() -> None:
            async with listener.pubsub(channels=[keys[1]]) as pubsub:
                async for message in pubsub:
                    if message["type"] == "subscribe":
                        subscribed.set()
                    elif message["type"] == "message" and message["data"] != node:
                        wakeups.announce()

        nursery.start_soon(listen)
        await subscribed.wait()
        # The connections its tasks will use at once, made before the
        # start (ours are too: the dispatcher is open by then).
        # Its scripts go as the ledger sends its own: EVALSHA straight on
        # a connection of the pool (coredis's general command path costs
        # about a round trip more, see the bare calls above).
        pool = client.connection_pool
        connection = await pool.get_connection()
        pool.release(connection)
        limit = str(settings["limit"])
        await _ready()

        async def cycle() -> None:
            nonlocal holding, peak
            for _ in range(settings["cycles"]):
                lease = f"{node}:{next(ids)}"
                asked = time.time()
                while not await connection.create_request(
                    b"EVALSHA", take, 1, keys[0], limit, "5000", lease, decode=True
                ):
                    await wakeups.wait(_SEMAPHORE_POLL)
                granted = time.time()
                holding += 1
                peak = max(peak, holding)
                await trio.sleep(settings["hold"])
                holding -= 1
                # Given back from here (as a slot of ours is by leaving it):
                # the next grant's take runs after this give.
                released = time.time()
                await connection.create_request(
                    b"EVALSHA", give, 2, *keys, lease, node, decode=True
                )
                # Its own wake-up, at once: the subscription skips it.
                wakeups.announce()
                records.append((asked, granted, released))

        async with trio.open_nursery() as tasks:
            for _ in range(settings["tasks"]):
                tasks.start_soon(cycle)
        nursery.cancel_scope.cancel()
    print(json.dumps({"records": records, "peak": peak}), flush=True)


async def _worker(settings: dict[str, Any]) -> None:
    """One process of the scaling fleet: prints its grants as JSON."""
    if settings.get("semaphore"):
        await _semaphore_worker(settings)
        return
    records: list[tuple[float, float, float]] = []
    holding = 0
    peak = 0
    async with open_dispatcher(
        {_PROVIDER: settings["limit"]},
        redis_url=settings["redis_url"],
        namespace=settings["namespace"],
        lease=5.0,
    ) as dispatcher:
        await _ready()

        async def cycle() -> None:
            nonlocal holding, peak
            for _ in range(settings["cycles"]):
                asked = time.time()
                async with dispatcher.slot(_PROVIDER):
                    granted = time.time()
                    holding += 1
                    peak = max(peak, holding)
                    await trio.sleep(settings["hold"])
                    holding -= 1
                records.append((asked, granted, time.time()))

        async with trio.open_nursery() as nursery:
            for _ in range(settings["tasks"]):
                nursery.start_soon(cycle)
    print(json.dumps({"records": records, "peak": peak}), flush=True)


def _inversions(
    fleets: list[list[tuple[float, float, float]]], tolerance: float
) -> int:
    """Pairs from different processes granted against the order they asked in."""
    tagged = sorted(
        (asked, granted, n)
        for n, records in enumerate(fleets)
        for asked, granted, _ in records
    )
    found = 0
    for i, (asked_i, granted_i, n_i) in enumerate(tagged):
        for asked_j, granted_j, n_j in tagged[i + 1 :]:
            if asked_j - asked_i < tolerance:
                continue
            # j asked clearly later, from another process, yet was granted
            # before i, which was waiting by then.
            if n_j != n_i and granted_j < granted_i and asked_j < granted_i:
                found += 1
    return found


def _scaling(sizes: Sizes, redis_url: str, processes: int, run: int) -> ScalingRow:
    ours = _fleet(sizes, redis_url, processes, f"scaling-{processes}-{run}")
    semaphore = _fleet(
        sizes, redis_url, processes, f"sem-{processes}-{run}", semaphore=True
    )
    return ScalingRow(
        processes=processes,
        grants=ours.grants,
        grants_per_second=ours.grants_per_second,
        inversions=ours.inversions,
        peak_in_flight=ours.peak_in_flight,
        commands_per_grant=ours.commands_per_grant,
        commands=ours.commands,
        semaphore=semaphore,
    )


def _fleet(
    sizes: Sizes,
    redis_url: str,
    processes: int,
    namespace: str,
    *,
    semaphore: bool = False,
) -> FleetRun:
    """One fleet of ``processes`` worker processes, ours or the semaphore's."""
    if semaphore:
        # Loaded once here, as a deployment would: the workers run them.
        trio.run(_load_semaphore, redis_url)
    settings = {
        "redis_url": redis_url,
        "namespace": namespace,
        "limit": sizes.limit,
        "tasks": sizes.fleet_tasks,
        "cycles": sizes.fleet_cycles,
        "hold": sizes.hold,
        "semaphore": semaphore,
    }
    before = trio.run(_counts_at, redis_url)
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    # Everyone starts together, once every process is ready: a wall-clock
    # instant fixed in advance let a process slow to start on a busy
    # machine begin after the others had finished, and the fleet take
    # turns instead of contending.
    pipes = [(w.stdin, w.stdout) for w in workers]
    for _, stdout in pipes:
        assert stdout is not None
        if stdout.readline() != b"ready\n":
            raise RuntimeError("a worker of the fleet failed to start")
    for stdin, _ in pipes:
        assert stdin is not None
        stdin.write(b"go\n")
        stdin.close()
    outputs = []
    for w, (_, stdout) in zip(workers, pipes, strict=True):
        assert stdout is not None
        with w:
            outputs.append(json.loads(stdout.read()))
    after = trio.run(_counts_at, redis_url)
    commands = {
        name: calls - before.get(name, 0)
        for name, calls in sorted(after.items())
        if calls != before.get(name, 0)
    }
    fleets = [[tuple(r) for r in out["records"]] for out in outputs]
    every = [r for fleet in fleets for r in fleet]
    # Fleet-wide peak, from the grant and release instants.
    events = sorted([(g, 1) for _, g, _ in every] + [(e, -1) for _, _, e in every])
    holding = peak = 0
    for _, step in events:
        holding += step
        peak = max(peak, holding)
    span = max(e for _, _, e in every) - min(a for a, _, _ in every)
    return FleetRun(
        grants=len(every),
        grants_per_second=len(every) / span,
        inversions=_inversions(fleets, sizes.tolerance),
        peak_in_flight=peak,
        commands_per_grant=sum(commands.values()) / len(every),
        commands=commands,
    )


async def _load_semaphore(redis_url: str) -> None:
    async with coredis.Redis.from_url(redis_url, decode_responses=True) as client:
        await client.script_load(_TAKE)
        await client.script_load(_GIVE)


def run(sizes: Sizes, redis_url: str) -> RedisBackendReport:
    """Take every measurement."""
    show_progress("grant latency")
    trio.run(_latencies, 50, None, "warm")
    trio.run(_latencies, 50, redis_url, "warm")
    bare: list[float] = []
    bare_requests: list[float] = []
    local: list[float] = []
    shared: list[float] = []
    idle_local: list[float] = []
    idle_shared: list[float] = []
    idle_rounds = max(1, sizes.round_trips // 4)
    for n in range(sizes.repeats):
        bare += trio.run(_bare_calls, sizes.round_trips, redis_url)
        bare_requests += trio.run(_bare_requests, sizes.round_trips, redis_url)
        local += trio.run(_latencies, sizes.round_trips, None, "lat")
        shared += trio.run(_latencies, sizes.round_trips, redis_url, f"lat{n}")
        idle_local += trio.run(_latencies, idle_rounds, None, "idle", _IDLE_GAP)
        idle_shared += trio.run(
            _latencies, idle_rounds, redis_url, f"idle{n}", _IDLE_GAP
        )
    show_progress("contended hand-offs")
    local_rates = []
    shared_rates = []
    for n in range(sizes.repeats):
        local_rates.append(trio.run(_handoffs, sizes, None, "h"))
        shared_rates.append(trio.run(_handoffs, sizes, redis_url, f"h{n}"))
    show_progress("commands per grant")
    commands = trio.run(_commands_per_grant, sizes, redis_url, "cmds")
    semaphore = trio.run(_semaphore_commands_per_grant, sizes, redis_url, "sem")
    with_tenants = trio.run(
        _commands_per_grant, sizes, redis_url, "tcmds", ("light", "heavy")
    )
    show_progress("a pool of two members")
    pool_rates = []
    provider_rates = []
    peaks: dict[str, int] = {}
    for n in range(sizes.repeats):
        provider_rates.append(trio.run(_handoffs, sizes, redis_url, f"pp{n}"))
        pool_rates.append(
            trio.run(
                functools.partial(
                    _handoffs, sizes, redis_url, f"pl{n}", pooled=True, peaks=peaks
                )
            )
        )
    pool_commands = trio.run(
        functools.partial(_commands_per_grant, sizes, redis_url, "pcmds", pooled=True)
    )
    rows = []
    for processes in sizes.processes:
        show_progress(f"scaling: {processes} processes")
        rows.append(_scaling(sizes, redis_url, processes, 0))
    return RedisBackendReport(
        environment=environment(),
        sizes=sizes,
        bare_call_p50_us=_quantile(bare, 0.50) * 1e6,
        bare_call_p99_us=_quantile(bare, 0.99) * 1e6,
        bare_request_p50_us=_quantile(bare_requests, 0.50) * 1e6,
        bare_request_p99_us=_quantile(bare_requests, 0.99) * 1e6,
        latency_local_p50_us=_quantile(local, 0.50) * 1e6,
        latency_local_p99_us=_quantile(local, 0.99) * 1e6,
        latency_redis_p50_us=_quantile(shared, 0.50) * 1e6,
        latency_redis_p99_us=_quantile(shared, 0.99) * 1e6,
        idle_latency_local_p50_us=_quantile(idle_local, 0.50) * 1e6,
        idle_latency_local_p99_us=_quantile(idle_local, 0.99) * 1e6,
        idle_latency_redis_p50_us=_quantile(idle_shared, 0.50) * 1e6,
        idle_latency_redis_p99_us=_quantile(idle_shared, 0.99) * 1e6,
        handoffs_local_per_s=statistics.median(local_rates),
        handoffs_redis_per_s=statistics.median(shared_rates),
        scaling=tuple(rows),
        commands_per_grant=commands,
        semaphore_commands_per_grant=semaphore,
        tenant_commands_per_grant=with_tenants,
        pool_handoffs_per_s=statistics.median(pool_rates),
        pool_provider_handoffs_per_s=statistics.median(provider_rates),
        pool_commands_per_grant=pool_commands,
        pool_peak_in_flight=peaks,
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """The command line: see the module's docstring."""
    parser = command_line(__doc__, quick="smaller runs")
    parser.add_argument("--redis-url", help="an existing Redis (else one is started)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        trio.run(_worker, json.loads(args.worker))
        return
    sizes = Sizes.quick() if args.quick else Sizes()
    started = time.perf_counter()
    if args.redis_url is not None:
        report = run(sizes, args.redis_url)
    else:
        with redis_server() as url:
            report = run(sizes, url)
    finish(report, json_path=args.json, started=started)


if __name__ == "__main__":
    main()
