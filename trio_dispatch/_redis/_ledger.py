"""The shared ledger: one provider's leases, queue, limit and pause in Redis.

Every key of a provider lives under one hash tag, ``{<namespace>:<provider>}``,
so the scripts touch one Redis Cluster slot, and each operation is one Lua
script, atomic on the server (``lua/*.lua``, their arguments laid out by the
values of ``_scripts``). What each key holds, and the rules the scripts keep
on them, is written in ``SCHEMA.md`` beside this module.
"""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs
import coredis
from coredis.exceptions import NoScriptError

from .._policy._budgets import FORGET_AFTER, Budget, forgets, full_in, refilled
from .._policy._ratelimits import server_delay
from .._policy._slots import (
    DEFAULT_AFFINITY_WAIT,
    DEFAULT_FAILURE_COOLDOWN,
    DEFAULT_FAILURE_THRESHOLD,
)
from ..messages._limits import Tenant
from ._clock import ServerClock
from ._scripts import (
    PauseArgs,
    Plan,
    ResumeArgs,
    SetBudgetArgs,
    SetLimitArgs,
    SetTenantArgs,
    load_scripts,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from .._policy._budgets import AdaptiveLimit
    from .._policy._ratelimits import RateLimitInfo
    from ._scripts import Script, Scripts, Seed

    Client: TypeAlias = coredis.Redis[str] | coredis.RedisCluster[str]
    """A client of one Redis server, or of a Redis Cluster."""

# Members of the queue: a 16-digit arrival, a colon, the lease id.
MEMBER_PREFIX: Final = 17

_SCRIPTS: Final = load_scripts()
# A round with no changes of its own (it renews the process, reads the state).
_NO_CHANGES: Final = Plan()

_EVALSHA: Final = b"EVALSHA"
_SCRIPT_LOAD: Final = b"SCRIPT LOAD"
# The server's clock comes in whole milliseconds: the time it read was half
# of one later, on average.
_HALF_MS: Final = 0.0005


def keys_of(namespace: str, provider: str) -> list[str]:
    """The keys of one provider, in the order the scripts take them."""
    tag = "{" + namespace + ":" + provider + "}"
    return [
        f"{tag}:{name}"
        for name in (
            "leases",
            "queue",
            "qexp",
            "conf",
            "nodes",
            "nwait",
            "grantno",
            "qcost",
            "charge",
            "unans",
            "inuse",
            "tconf",
            "tstate",
            "tback",
            "qmeta",
            "lmeta",
            "models",
        )
    ]


def channel_of(namespace: str, provider: str) -> str:
    """The channel that carries a provider's wake-ups."""
    return "{" + namespace + ":" + provider + "}:wake"


def provider_of_channel(namespace: str, channel: str) -> str | None:
    """The provider a wake-up channel belongs to, or ``None`` if not ours."""
    head = "{" + namespace + ":"
    tail = "}:wake"
    if channel.startswith(head) and channel.endswith(tail):
        return channel[len(head) : -len(tail)]
    return None


def wakes(message: str | None, node: str) -> bool:
    """Whether a wake-up on a provider's channel asks ``node``'s process for a round.

    ``None`` (a subscription begins: wake-ups may have been missed) and
    ``wake`` are for every process; a node's name, from a step of that
    node's process, for every other one; ``>`` and nodes separated by
    spaces, from a step whose only change was slots given back, for the
    processes of those nodes (theirs are the entries that can take them).
    """
    if message is None:
        return True
    if message.startswith(">"):
        return node in message[1:].split(" ")
    return message != node


def lease_of(member: str) -> str:
    """The lease id inside a queue member."""
    return member[MEMBER_PREFIX:]


def member_of(arrival: int, lease_id: str) -> str:
    """The queue member of a waiter that arrived at ``arrival`` (microseconds)."""
    return f"{arrival:016d}:{lease_id}"


@final
@attrs.frozen
class StepResult:
    """What one ``step`` did and saw, in the server's terms.

    Attributes:
        granted: The members granted a lease: those that a step whose
            answer was lost had granted, then the others in queue order.
        limit: The stored limit, or ``None`` when there is none or it is
            unlimited on purpose.
        in_flight: Live leases of the whole fleet.
        queued: Entries in the shared queue.
        waiting: Waiters of the whole fleet, as their processes report them.
        paused_for: Seconds left of the pause, or 0.
        server_time: The server's clock, in seconds.
        budget: The provider's budgets, if it has any.
        adaptive: An adaptive limit's bounds, backoff and signal, if the
            limit is one.
        tenants: The tenants configured or in play, fleet-wide (once
            tenants are counted), by name.
        models: The budgets of the models the step met (those of its
            entries and leases, and of its figures), by model.
        counting: Whether the fleet counts tenants (from the first tenant
            or model budget seen): then every waiter is published.
        epoch: The namespace's epoch (see ``Ledger.step``), or empty if it
            has none.
        forgotten: The models whose learned budgets the step forgot.
        granted_on: A group's: the member of each grant of ``granted``, in
            the same order (a provider's: empty names).
        members: A group's members, by name, in their order (a provider's:
            none; ``limit``, ``paused_for`` and ``budget`` are its own).
    """

    granted: list[str]
    limit: int | None
    in_flight: int
    queued: int
    waiting: int
    paused_for: float
    server_time: float
    budget: LedgerBudget | None = None
    adaptive: tuple[int, int, float, str] | None = None
    tenants: dict[str, LedgerTenant] = attrs.field(factory=dict)
    models: dict[str, LedgerBudget] = attrs.field(factory=dict)
    counting: bool = False
    epoch: str = ""
    forgotten: list[str] = attrs.field(factory=list)
    granted_on: list[str] = attrs.field(factory=list)
    members: dict[str, LedgerMember] = attrs.field(factory=dict)

    def configured_tenants(self) -> dict[str, Tenant]:
        """The configured tenants' settings, by name."""
        return {
            name: Tenant(weight=tenant.weight, limit=tenant.limit)
            for name, tenant in self.tenants.items()
            if tenant.configured
        }


@final
@attrs.frozen
class LedgerMember:
    """One member of a group as a step saw it.

    Attributes:
        limit: Its stored limit, or ``None`` (unlimited).
        in_flight: Its live leases, fleet-wide.
        paused_for: Seconds left of its pause, or 0.
        budget: Its budgets, if it has any.
        failures: Its calls failed in a row, before their answer.
        out_for: Seconds left of its cooldown out of service, or ``None``
            while it is in service.
        half_open: Whether it is back from a cooldown, taking one request
            (its probe) until that request succeeds.
        outages: How many times it was taken out of service.
        affinity_hits: Requests that preferred it and were granted on it.
        affinity_moves: Requests that preferred it and were granted on
            another member.
        models: Its models' budgets that the step met, by model.
        forgotten: Its models whose learned budgets the step forgot.
        adaptive: Its adaptive limit's bounds, backoff and signal, if its
            limit is one (``StepResult.adaptive``'s shape).
    """

    limit: int | None
    in_flight: int
    paused_for: float
    budget: LedgerBudget | None = None
    failures: int = 0
    out_for: float | None = None
    half_open: bool = False
    outages: int = 0
    affinity_hits: int = 0
    affinity_moves: int = 0
    models: dict[str, LedgerBudget] = attrs.field(factory=dict)
    forgotten: list[str] = attrs.field(factory=list)
    adaptive: tuple[int, int, float, str] | None = None


def _members_of(rows: list[Any]) -> dict[str, LedgerMember]:
    """A group's members from a step's answer: fourteen fields each."""
    return {
        str(rows[k]): LedgerMember(
            limit=_limit_of(rows[k + 1]),
            in_flight=int(rows[k + 2]),
            paused_for=int(rows[k + 3]) / 1000,
            budget=_budget_of(rows[k + 4]),
            failures=int(rows[k + 5]),
            out_for=None if rows[k + 6] == "" else int(rows[k + 6]) / 1000,
            half_open=int(rows[k + 7]) == 1,
            outages=int(rows[k + 8]),
            affinity_hits=int(rows[k + 9]),
            affinity_moves=int(rows[k + 10]),
            models=_models_of(list(rows[k + 11])),
            forgotten=[str(model) for model in rows[k + 12]],
            adaptive=_bounds_of(rows[k + 13]),
        )
        for k in range(0, len(rows), 14)
    }


@final
class NamespaceLost(Exception):
    """A step found the namespace's epoch changed: Redis lost it, and the step did nothing."""


@final
@attrs.frozen
class LedgerTenant:
    """One tenant of a provider, fleet-wide, after one step.

    Attributes:
        weight: Its share weight.
        limit: Its cap on the provider's slots, or ``None``.
        in_flight: Leases it holds, fleet-wide.
        queued: Its entries in the shared queue.
        service: Its counter (seconds of slots held, divided by its weight).
        configured: Whether its weight and cap are configured (else the
            defaults, for a tenant in play).
    """

    weight: float
    limit: int | None
    in_flight: int
    queued: int
    service: float
    configured: bool = False


@final
@attrs.frozen
class LedgerBudget:
    """A provider's fleet-wide budgets after one step.

    Attributes:
        requests_per_minute: The request budget's rate, or ``None``.
        requests_available: Requests its bucket holds, or ``None``.
        requests_capacity: The most its bucket holds, or ``None``.
        tokens_per_minute: The token budget's rate, or ``None``.
        tokens_available: Tokens its bucket holds, or ``None``.
        tokens_capacity: The most its bucket holds, or ``None``.
        learned: Whether figures of answers were learned.
        ready_in: Seconds until the head of the queue fits the budgets,
            if they hold it back (else ``None``).
        requests_configured: Whether the request budget is configured
            (else learned).
        tokens_configured: Whether the token budget is configured.
        idle: A learned model's budgets: seconds their model has been
            idle, or ``None`` while it is in use (and for the provider's
            budgets, or a model's configured ones).
    """

    requests_per_minute: float | None
    requests_available: float | None
    requests_capacity: float | None
    tokens_per_minute: float | None
    tokens_available: float | None
    tokens_capacity: float | None
    learned: bool
    ready_in: float | None
    requests_configured: bool = False
    tokens_configured: bool = False
    idle: float | None = None

    def configured(self) -> Budget | None:
        """The configured budgets (a configured one's capacity is its rate), if any."""
        requests = self.requests_capacity if self.requests_configured else None
        tokens = self.tokens_capacity if self.tokens_configured else None
        if requests is None and tokens is None:
            return None
        return Budget(requests_per_minute=requests, tokens_per_minute=tokens)

    def _buckets(self) -> list[tuple[float, float, float]]:
        """Each bucket's level, capacity and refill per second."""
        return [
            (level, capacity, per_minute / 60.0)
            for level, capacity, per_minute in (
                (
                    self.requests_available,
                    self.requests_capacity,
                    self.requests_per_minute,
                ),
                (self.tokens_available, self.tokens_capacity, self.tokens_per_minute),
            )
            if level is not None and capacity is not None and per_minute is not None
        ]

    def forgotten(self, seconds: float) -> bool:
        """Whether they are forgotten ``seconds`` after the step that saw them.

        By the rule of the pure core, ``_budgets.forgets``.
        """
        if self.idle is None:
            return False
        return forgets(
            self.idle + seconds,
            [
                (refilled(level, capacity, rate, seconds), capacity)
                for level, capacity, rate in self._buckets()
            ],
        )

    def forgotten_in(self) -> float | None:
        """Seconds after the step that saw them until they are forgotten, if idle."""
        if self.idle is None:
            return None
        return max(
            [FORGET_AFTER - self.idle]
            + [full_in(*bucket) for bucket in self._buckets()]
        )


@final
class SeenModels:
    """Each model's budgets as the latest step that met it saw them, and when.

    A step answers only the models it met; a process keeps the others as
    last seen, and leaves out those the ledger forgot, or that the pure
    core's rule forgets since (``LedgerBudget.forgotten``): watched in a
    heap by that instant, so a step costs the same however many are idle.
    """

    __slots__ = ("_forgetting", "_rows")

    def __init__(self) -> None:
        self._rows: dict[str, tuple[LedgerBudget, float]] = {}
        self._forgetting: list[tuple[float, str]] = []

    def __repr__(self) -> str:
        return f"<SeenModels {len(self._rows)}>"

    def update(self, result: StepResult | LedgerMember, now: float) -> None:
        """Take what ``result``, a step answered at ``now``, says of the models.

        A group's: what it says of one member's (``StepResult.members``).
        """
        rows = self._rows
        for model in result.forgotten:
            rows.pop(model, None)
        forgetting = self._forgetting
        for model, budget in result.models.items():
            rows[model] = (budget, now)
            seconds = budget.forgotten_in()
            if seconds is not None:
                heapq.heappush(forgetting, (now + seconds, model))
        while forgetting and forgetting[0][0] <= now:
            _, model = heapq.heappop(forgetting)
            row = rows.get(model)
            if row is not None and row[0].forgotten(now - row[1]):
                del rows[model]

    def items(self, now: float) -> list[tuple[str, LedgerBudget, float]]:
        """Each model not forgotten by ``now``: its budgets, and when they were seen."""
        return [
            (model, budget, at)
            for model, (budget, at) in self._rows.items()
            if not budget.forgotten(now - at)
        ]


def _float(text: str) -> float | None:
    return None if text == "" else float(text)


def _budget_of(text: str) -> LedgerBudget | None:
    if not text:
        return None
    r_pm, r_lvl, r_cap, t_pm, t_lvl, t_cap, learned, r_cfg, t_cfg, ready_in = (
        text.split(",")
    )
    return LedgerBudget(
        _float(r_pm),
        _float(r_lvl),
        _float(r_cap),
        _float(t_pm),
        _float(t_lvl),
        _float(t_cap),
        learned=learned == "1",
        ready_in=None if int(ready_in) < 0 else int(ready_in) / 1000,
        requests_configured=r_cfg == "1",
        tokens_configured=t_cfg == "1",
    )


def _tenants_of(rows: list[str]) -> dict[str, LedgerTenant]:
    return {
        rows[k]: LedgerTenant(
            weight=float(rows[k + 1]),
            limit=int(rows[k + 2]) if rows[k + 2] else None,
            in_flight=int(rows[k + 3]),
            queued=int(rows[k + 4]),
            service=float(rows[k + 5]),
            configured=rows[k + 6] == "1",
        )
        for k in range(0, len(rows), 7)
    }


def _models_of(rows: list[str]) -> dict[str, LedgerBudget]:
    models: dict[str, LedgerBudget] = {}
    for k in range(0, len(rows), 3):
        budget = _budget_of(rows[k + 1])
        if budget is not None:
            idle = rows[k + 2]
            models[rows[k]] = (
                budget if idle == "" else attrs.evolve(budget, idle=int(idle) / 1000)
            )
    return models


def _bounds_of(text: str) -> tuple[int, int, float, str] | None:
    if not text:
        return None
    low, high, backoff, signal = text.split(",")
    return int(low), int(high), float(backoff), signal or "rate_limits"


def _limit_of(stored: object) -> int | None:
    if stored in (None, "", "none"):
        return None
    return int(str(stored))


@final
class Ledger:
    """The scripts of one namespace, bound to a coredis client.

    A script runs by its digest (``EVALSHA``) on a connection of the
    client's pool, straight through the connection's request: a step is on
    the path of every grant, and coredis's general command path (a command
    object wrapped for the retry and the answer's transformation, each
    copy serialising the arguments again, the pool's lock) cost about as
    much as the round trip itself. The ledger keeps the connection of its
    last call while it is usable, as coredis's own commands share one: it
    is back in the pool as soon as a command is sent, so the pool replaces
    it if it dies. Redis answers ``NOSCRIPT`` when it has lost the script
    (restarted empty, or its cache flushed): the script is loaded on the
    same connection and run once more.

    Args:
        client: A coredis client whose pool lends a connection only for
            the time it takes to send a command (no subscription, blocking
            command or transaction on it), since calls go on a connection
            that is back in the pool.
        namespace: The prefix of every key; processes that share it share
            their limits.
        lease: Seconds a lease or a queue entry lives without renewal.
        scripts: The scripts to run (``load_scripts``); the default reads
            the server's clock.
        wall_clock: This process's clock, which ``clock`` reads as the
            server's (the wall clock; a test may give a host's that is
            off).

    Attributes:
        clock: This process's clock read as the server's: measured by
            ``measure_clock`` and by every ``step``, whose answer carries
            the server's time.
    """

    __slots__ = (
        "_client",
        "_connection",
        "_names",
        "_scripts",
        "clock",
        "lease",
        "namespace",
        "on_idle",
        "on_lost",
        "users",
    )

    def __init__(
        self,
        client: Client,
        namespace: str,
        lease: float,
        *,
        scripts: Scripts | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = ServerClock(wall_clock)
        self._client = client
        self._scripts = _SCRIPTS if scripts is None else scripts
        self._connection: coredis.BaseConnection | None = None
        self.namespace = namespace
        self.lease = lease
        # Each provider's keys and channel, made once: a step is on the
        # path of every grant.
        self._names: dict[str, tuple[list[str], str]] = {}
        # Set by whoever listens for wake-ups, to hear that Redis was lost.
        self.on_lost: Callable[[], object] | None = None
        # The schedulers using it, so that the client outlives their last
        # releases; on_idle is called when the last one is done.
        self.users = 0
        self.on_idle: Callable[[], object] | None = None

    def enter(self) -> None:
        """A scheduler starts using the ledger."""
        self.users += 1

    def leave(self) -> None:
        """A scheduler is done with the ledger, its last releases sent."""
        self.users -= 1
        if not self.users and self.on_idle is not None:
            self.on_idle()

    def names(self, provider: str) -> tuple[list[str], str]:
        """The keys and the wake-up channel of ``provider``."""
        names = self._names.get(provider)
        if names is None:
            names = self._names[provider] = (
                keys_of(self.namespace, provider),
                channel_of(self.namespace, provider),
            )
        return names

    def lost(self) -> None:
        """A call failed: whoever listens for wake-ups should subscribe again."""
        if self.on_lost is not None:
            self.on_lost()

    async def _run(
        self, script: Script, keys: Sequence[str], args: Sequence[str]
    ) -> Any:  # noqa: ANN401 (a Lua script's answer is untyped)
        """Run ``script`` on ``keys`` and ``args``; its answer, decoded."""
        client = self._client
        if isinstance(client, coredis.RedisCluster):
            # A cluster's pool lends a connection per node: coredis routes
            # the call to the node of the keys' slot.
            try:
                return await client.evalsha(script.sha, keys, args)
            except NoScriptError:
                await client.script_load(script.text)
                return await client.evalsha(script.sha, keys, args)
        connection = self._connection
        if connection is None or not connection.usable:
            pool = client.connection_pool
            connection = await pool.get_connection()
            # Back at once: requests share a connection (see the class).
            pool.release(connection)
            self._connection = connection
        try:
            return await connection.create_request(
                _EVALSHA, script.sha, len(keys), *keys, *args, decode=True
            )
        except NoScriptError:
            await connection.create_request(_SCRIPT_LOAD, script.text)
            return await connection.create_request(
                _EVALSHA, script.sha, len(keys), *keys, *args, decode=True
            )

    async def step(
        self,
        provider: str,
        node: str,
        plan: Plan = _NO_CHANGES,
        *,
        waiting: int = 0,
        epoch: str = "",
        seed: Seed | None = None,
        observed: RateLimitInfo | None = None,
        observed_models: Mapping[str, RateLimitInfo] | None = None,
        verdicts: Sequence[int] = (),
        members: Sequence[str] = (),
        pools: Mapping[str, Sequence[str]] | None = None,
        member_figures: Sequence[tuple[str, str | None, RateLimitInfo]] = (),
        member_verdicts: Sequence[tuple[str, int]] = (),
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        failure_cooldown: float = DEFAULT_FAILURE_COOLDOWN,
        affinity_wait: float = DEFAULT_AFFINITY_WAIT,
    ) -> StepResult:
        """Apply one round of a process's changes (``plan``), in order, atomically.

        First the namespace's epoch, made by the first step with a seed
        that finds none (so it changes only when Redis lost the
        namespace): with ``seed`` (the settings the process knows the
        fleet has), if the epoch is not ``epoch`` (the one the process last
        saw) or there is none, it stores again each setting of the seed
        the namespace does not hold, and no other; without, if ``epoch``
        is given and the namespace's is another, it does nothing and
        raises ``NamespaceLost``. Then it applies ``verdicts`` (the
        process's latency signal's, in order) to a latency-signal adaptive
        limit, as ``Adaptive.move`` does; then the plan's
        ``spoil`` and ``usage``, releases, withdraws, enqueues or renews
        its entries (a member's start the same each time it is sent),
        renews its leases, marks its ``answered`` leases as counted by the
        provider, learns from ``observed`` (the provider's figures) and
        ``observed_models`` (each model's), then grants what it can of
        the plan's ``ask`` and ``enqueue``. ``waiting`` is the process's
        count of waiters. Sent twice, the same changes leave the same
        state, as long as the plan's ``recheck`` is true when a step of
        this node may have run without its answer reaching it: only then
        does the step look its members up among the leases, one server
        call that a node whose every step was answered can spare.

        ``members`` (in their order) and ``pools`` make ``provider`` a
        group: each member keeps its own limit, adaptive limit, budgets
        (its models' too), pause and leases, and each entry waits in its
        lane (the plan's ``lanes``) for the members that may take it,
        granted as the pure core's fill grants it (see ``step.lua``). A
        group's figures (each for a model or none) and verdicts come each
        with its member (``member_figures``, ``member_verdicts``); its
        tenants share it as a provider's do; and
        the plan's ``failed`` leases count for
        their member's health as ``SlotPolicy.fail`` counts them
        (``failure_threshold`` failures in a row take a member out of
        service for ``failure_cooldown`` seconds, then half-open); an entry
        preferring a member (``lane_text``) waits for it alone at most
        ``affinity_wait`` seconds, as ``SlotPolicy`` places it.

        Raises:
            ValueError: A group's step with a provider's figures or
                verdicts, or a pool that is not a list of its members; a
                provider's with a member's figures or verdicts.
        """
        if members and (observed is not None or observed_models or verdicts):
            raise ValueError("a group's figures and verdicts each name their member")
        if not members and (member_figures or member_verdicts):
            raise ValueError("a provider's step takes no member's figures or verdicts")
        if pools:
            known = set(members)
            for pool, names in pools.items():
                strangers = [name for name in names if name not in known]
                if strangers or not names or pool in known:
                    raise ValueError(
                        f"pool {pool!r} must name members of the group, and not be"
                        f" one: {list(names)!r} of {list(members)!r}"
                    )
        keys, channel = self.names(provider)
        figures: list[tuple[str | None, RateLimitInfo]] = []
        if observed is not None:
            figures.append((None, observed))
        if observed_models:
            figures += observed_models.items()
        figures += [(model, info) for _, model, info in member_figures]
        args = plan.pack(
            node=node,
            ttl=round(self.lease * 1000),
            waiting=waiting,
            channel=channel,
            epoch=epoch,
            seed=seed,
            observed=figures,
            verdicts=list(verdicts) + [change for _, change in member_verdicts],
            members=members,
            pools=pools,
            figures_on=[name for name, _, _ in member_figures],
            verdicts_on=[name for name, _ in member_verdicts],
            failure_threshold=failure_threshold,
            failure_cooldown=round(failure_cooldown * 1000),
            affinity_wait=round(affinity_wait * 1000),
        )
        clock = self.clock
        sent = clock.local()
        # A Lua script's answer is untyped; this one has a fixed shape.
        reply: Any = await self._run(self._scripts.step, keys, args)
        received = clock.local()
        if len(reply) == 1:
            raise NamespaceLost(f"the namespace's epoch is {reply[0]!r}, not {epoch!r}")
        (
            granted,
            limit,
            in_flight,
            queued,
            waiting_all,
            pause,
            now,
            budget,
            spec,
            tenants,
            models,
            counting,
            stored_epoch,
            forgotten,
            member_rows,
            granted_on,
        ) = reply
        clock.sample(sent, received, int(now) / 1000 + _HALF_MS)
        return StepResult(
            granted=list(granted),
            limit=_limit_of(limit),
            in_flight=int(in_flight),
            queued=int(queued),
            waiting=int(waiting_all),
            paused_for=int(pause) / 1000,
            server_time=int(now) / 1000,
            budget=_budget_of(budget),
            adaptive=_bounds_of(spec),
            tenants=_tenants_of(tenants),
            models=_models_of(models),
            counting=counting == 1,
            epoch=stored_epoch,
            forgotten=list(forgotten),
            granted_on=[str(name) for name in granted_on],
            members=_members_of(member_rows),
        )

    async def measure_clock(self, samples: int = 3) -> None:
        """Read the server's clock ``samples`` times, for ``clock``."""
        clock = self.clock
        for _ in range(samples):
            sent = clock.local()
            now = await self._run(self._scripts.time, (), ())
            clock.sample(sent, clock.local(), int(now) / 1000 + _HALF_MS)

    async def set_limit(
        self,
        provider: str,
        limit: int | AdaptiveLimit | None,
        *,
        overwrite: bool = True,
        member: str | None = None,
    ) -> int | None:
        """Store ``limit`` (``None``: unlimited); returns the stored limit.

        An ``AdaptiveLimit`` is stored at its ``initial`` value, with its
        bounds. With ``overwrite=False`` a limit already stored wins.
        ``member``: the limit of that member of group ``provider``.
        """
        keys, channel = self.names(provider)
        args = SetLimitArgs(
            limit=limit, overwrite=overwrite, channel=channel, member=member
        )
        stored = await self._run(self._scripts.set_limit, keys, args.pack())
        return _limit_of(stored[0])

    async def set_budget(
        self,
        provider: str,
        budget: Budget,
        *,
        model: str | None = None,
        member: str | None = None,
        members: Sequence[str] = (),
    ) -> None:
        """Store the fleet's configured budgets of ``provider`` or of its ``model``.

        ``member``: those of that member of group ``provider`` (or of its
        ``model``), whose ``members`` count their models' entries and leases
        from the first model's budget on.
        """
        keys, channel = self.names(provider)
        args = SetBudgetArgs(
            budget=budget, channel=channel, model=model, member=member, members=members
        )
        await self._run(self._scripts.set_budget, keys, args.pack())

    async def set_tenant(
        self,
        provider: str,
        tenant: str,
        settings: Tenant | None,
        *,
        members: Sequence[str] = (),
    ) -> None:
        """Store a tenant's weight and cap for the fleet (``None``: the defaults).

        ``members``: those of group ``provider``, whose leases count for
        the tenant of no name from the first tenant on.
        """
        keys, channel = self.names(provider)
        args = SetTenantArgs(
            tenant=tenant, settings=settings, channel=channel, members=members
        )
        await self._run(self._scripts.set_tenant, keys, args.pack())

    async def pause(
        self,
        provider: str,
        retry_after: float | None,
        *,
        default_pause: float,
        max_pause: float,
        member: str | None = None,
    ) -> float:
        """Pause the provider fleet-wide; returns the seconds left of the pause.

        A ``retry_after`` that is not positive names no delay
        (``server_delay``): the fleet backs off, as the local policy does.
        ``member``: pause that member of group ``provider``.
        """
        delay = server_delay(retry_after)
        args = PauseArgs(
            # At least a millisecond: a positive delay never rounds to none.
            delay=None if delay is None else max(1, round(delay * 1000)),
            default_pause=round(default_pause * 1000),
            max_pause=round(max_pause * 1000),
            member=member,
        )
        left = await self._run(
            self._scripts.pause, self.names(provider)[0], args.pack()
        )
        return int(str(left)) / 1000

    async def resume(self, provider: str, *, member: str | None = None) -> None:
        """End the provider's pause and its backoff streak, fleet-wide.

        ``member``: that member's of group ``provider``.
        """
        keys, channel = self.names(provider)
        args = ResumeArgs(channel=channel, member=member)
        await self._run(self._scripts.resume, keys, args.pack())
