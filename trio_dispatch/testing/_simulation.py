"""A virtual-time simulation harness that drives the real dispatcher.

Every agent turn is a trio task. For each of its calls it takes a slot,
sleeps the call's duration while holding it, gives it back and sleeps the
following tool step. The policies differ only in how a slot is taken:

- ``"oldest-first"``: ``Dispatcher.slot(provider, started_at=turn_start,
  priority=turn_class)``, the real dispatcher and scheduler actors (ranking
  classes with ``priority_aging``);
- ``"random"``: the same dispatcher, with every call's ``started_at`` drawn
  from a seeded RNG, i.e. service in random order;
- ``"fifo"``: one ``trio.CapacityLimiter`` per provider, first come first
  served per call;
- ``"none"``: no client-side limit at all;
- a ``DispatcherConfig``: the real dispatcher opened with your own
  ``open_dispatcher`` options (limits and ``AdaptiveLimit``, priority
  aging, tenants, budgets, ``max_waiting``...), every slot naming its
  turn's start, class, tenant, model and tokens; with a ``key``, in an
  order of your own.

A provider with a ``capacity`` answers 429 (after its ``reject_latency``)
to any call that finds ``capacity`` calls in flight. Under the dispatcher
the agent reports it (pausing the provider's grants for ``retry_after``)
and asks again at once with the same priority; without one it waits
``retry_after`` itself. After ``max_attempts`` sends the turn gives up, so
no client-side limit is simulated honestly, retry storms and all.

A turn on a pool (the scenario's ``pools``) runs each call on a member,
with that member's capacity, 429s and record: the dispatcher's choice
(its slot's ``member``; the turn is one conversation, for affinity, and a
429 pauses that member); under ``"fifo"`` the least busy member (free
slots less its queue, ties to the first), then its ``CapacityLimiter``;
under ``"none"`` the member with the fewest calls in flight. Those two
routings read the members' state when a call asks; calls that ask at one
virtual instant (429s retried after the same fixed delays) pick one after
the other, in their turns' order, so that the run is the same every time.

Determinism: the scenario is drawn before the run, and trio only reorders
tasks that wake at the same virtual instant, which continuous random
durations never do (bursts are spread by ``BURST_SPACING`` for that
reason). The same workload, seed and policy give the same result.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import inspect
import itertools
import json
import math
import operator
import random
from typing import TYPE_CHECKING, Any, Literal, final

import attrs
import trio
import trio.testing

from .._converter import structure, unstructure
from .._dispatch._open import open_dispatcher
from .._exceptions import QueueFull
from .._validation import check_positive_seconds, check_text, validator
from ._metrics import PolicyMetrics, ProviderRecord, TurnRecord, compute_metrics
from ._workloads import Scenario, TurnSpec, Workload

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager

    from ._workloads import SimProvider

PolicyName = Literal["oldest-first", "fifo", "random", "none"]

#: Every policy ``run_simulation`` knows, in the order reports show them.
POLICIES: tuple[PolicyName, ...] = ("oldest-first", "fifo", "random", "none")


@final
@attrs.frozen
class SimulationResult:
    """Everything one simulation run recorded.

    Its ``policy``, one record per turn and one per provider, in scenario
    order.
    """

    policy: str
    turns: tuple[TurnRecord, ...]
    providers: tuple[ProviderRecord, ...]

    def metrics(self) -> PolicyMetrics:
        """The summary metrics of this run."""
        return compute_metrics(self.policy, self.turns, self.providers)

    def to_json(self) -> str:
        """The whole result as JSON; ``from_json`` reads it back."""
        return json.dumps(unstructure(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SimulationResult:
        """Read a result written by ``to_json``."""
        return structure(json.loads(text), cls)


#: ``open_dispatcher`` options the simulator does not take: it has no Redis,
#: its providers no server whose load could be read and no call that fails
#: before its answer (they answer 429), and the pools are the scenario's.
_NOT_SIMULATED = frozenset(
    {
        "redis_url",
        "namespace",
        "lease",
        "redis_connect_timeout",
        "server_load",
        "server_load_interval",
        "pools",
        "failure_threshold",
        "failure_cooldown",
    }
)


def _check_options(
    _instance: object, _attribute: object, options: Mapping[str, Any]
) -> None:
    known = set(inspect.signature(open_dispatcher).parameters) - _NOT_SIMULATED
    for name in options:
        if name not in known:
            raise TypeError(
                f"{name!r} is not an open_dispatcher option the simulator takes"
                f" (it takes {', '.join(sorted(known))})"
            )


def _to_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(options or {})


def _check_key(_instance: object, attribute: attrs.Attribute[Any], key: object) -> None:
    if key is not None and not callable(key):
        of = "a SimCall" if attribute.name == "key" else "a TurnSpec"
        raise TypeError(
            f"{attribute.name} must be a function of {of}, or None; got {key!r}"
        )


@final
@attrs.frozen
class SimCall:
    """What a ``DispatcherConfig``'s ``key`` knows of a call as it asks for a slot.

    Times are seconds from the simulation's start.

    Attributes:
        turn: The turn it belongs to (its calls, tenant, priority, model...).
        call: Its position in the turn, from 0.
        started_at: When the turn started.
        now: When the call asks.
        received: Slot seconds the turn's earlier calls were served.
        waited: Seconds the turn's earlier calls waited for slots.
    """

    turn: TurnSpec
    call: int
    started_at: float
    now: float
    received: float
    waited: float


@final
@attrs.frozen
class DispatcherConfig:
    """A dispatcher configuration of your own, for the simulator.

    The simulator opens the real dispatcher with ``open_dispatcher(limits,
    **options)``: ``options`` are its keywords (``priority_aging``,
    ``tenants``, ``budgets``, ``max_waiting``...), and ``limits`` among them
    (ints or ``AdaptiveLimit``) override the workload's providers' own.
    Every slot names its turn's start, priority class, tenant, model and
    tokens, as an application would.

    ``key``, if given, is an order of your own: a function of a ``SimCall``
    (the request and what its turn has received so far) to a number, lower
    served first, given to the dispatcher as the call's ``started_at``.
    ``priority``, if given, is how your application classes each turn: a
    function of a ``TurnSpec`` to its priority class (by default, the
    turn's own ``priority``), such as a higher class for short interactive
    turns. ``name`` names the run in reports.

    Raises:
        TypeError: An option ``open_dispatcher`` does not have, or one the
            simulator does not take (Redis's); a ``key`` not callable.
    """

    options: Mapping[str, Any] = attrs.field(
        default=None, converter=_to_options, validator=_check_options
    )
    key: Callable[[SimCall], float] | None = attrs.field(
        default=None, validator=_check_key, eq=False
    )
    priority: Callable[[TurnSpec], int] | None = attrs.field(
        default=None, validator=_check_key, eq=False
    )
    name: str = attrs.field(default="configured", validator=validator(check_text))


def check_policy(policy: object) -> PolicyName:
    if policy in POLICIES:
        return policy
    rule = f"policy must be one of {', '.join(POLICIES)}"
    if not isinstance(policy, str):
        raise TypeError(f"{rule}; got {policy!r}")
    raise ValueError(f"{rule}; got {policy!r}")


class _Timekeeper:
    """Cheap virtual-time sleeps for the simulated agents.

    ``trio.sleep`` costs a cancel scope, a deadline and a raised
    ``Cancelled`` per call, which dominates a simulation made of little
    else. Agents park on one heap instead; once every task is blocked, the
    timekeeper jumps the ``MockClock`` to the earlier of the heap's first
    wake-up and trio's own next deadline (the schedulers' pauses) and wakes
    whoever is due: what ``autojump`` does, with the agents' timers kept
    out of trio's deadline machinery.
    """

    __slots__ = ("_arrivals", "_clock", "_heap", "_parked", "_seq", "_turns")

    def __init__(self, clock: trio.testing.MockClock) -> None:
        self._clock = clock
        self._arrivals: list[list[Any]] = []
        self._turns: list[list[Any]] = []
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()
        self._parked: trio.lowlevel.Task | None = None

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the virtual clock."""
        entry: list[Any] = [deadline, next(self._seq), trio.lowlevel.current_task()]
        heapq.heappush(self._heap, entry)
        await self._park(entry)

    async def arrive(self, provider: _ProviderState, order: int) -> bool:
        """Offer a call to a provider with a capacity: accepted or refused?

        Calls of one virtual instant are decided together once every task
        is blocked, in ``order``, so trio's scheduling order cannot pick who
        gets the last place.
        """
        entry: list[Any] = [order, provider, trio.lowlevel.current_task(), False]
        self._arrivals.append(entry)
        await self._park(entry)
        return bool(entry[3])

    async def take_turn(self, order: tuple[float, int]) -> None:
        """Go in ``order`` among the tasks of this virtual instant that asked too.

        Once every task is blocked, they go one at a time, in ``order``,
        each until it blocks again (parked in a limiter, asleep through
        its call): what each reads of the others when it goes, and where
        it queues, is then the same in every run.
        """
        entry: list[Any] = [order, None, trio.lowlevel.current_task()]
        self._turns.append(entry)
        await self._park(entry)

    async def _take_turns(self) -> None:
        turns = sorted(self._turns, key=operator.itemgetter(0))
        self._turns.clear()
        for entry in turns:
            task = entry[2]
            if task is not None:
                trio.lowlevel.reschedule(task)
                await trio.testing.wait_all_tasks_blocked()

    async def _park(self, entry: list[Any]) -> None:
        """Wait to be woken by ``run``; a cancelled task is crossed off ``entry``."""
        self._unpark_now()

        def abort(_raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            entry[2] = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _admit_arrivals(self) -> None:
        arrivals = sorted(self._arrivals, key=operator.itemgetter(0))
        self._arrivals.clear()
        for entry in arrivals:
            _, provider, task, _ = entry
            if task is None:
                continue
            capacity = provider.capacity
            if capacity is None or provider.in_flight < capacity:
                provider.admit()
                entry[3] = True
            trio.lowlevel.reschedule(task)

    def _unpark_now(self) -> None:
        parked = self._parked
        if parked is not None:
            self._parked = None
            trio.lowlevel.reschedule(parked)

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of virtual time."""
        await self.sleep_until(self._clock.current_time() + seconds)

    async def run(self) -> None:
        """Keep time until cancelled."""
        clock = self._clock
        heap = self._heap
        heappop = heapq.heappop
        reschedule = trio.lowlevel.reschedule
        statistics = trio.lowlevel.current_statistics
        wait_idle = trio.testing.wait_all_tasks_blocked
        while True:
            await wait_idle()
            if self._arrivals:
                self._admit_arrivals()
                continue
            if self._turns:
                await self._take_turns()
                continue
            while heap and heap[0][2] is None:
                heappop(heap)
            until_deadline = statistics().seconds_to_next_deadline
            if not heap:
                if until_deadline == math.inf:
                    # Nothing to wake: park until someone sleeps.
                    self._parked = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(self._unpark)
                else:
                    clock.jump(max(until_deadline, 0.0))
                continue
            now = clock.current_time()
            wake = heap[0][0]
            if wake - now > until_deadline:
                clock.jump(max(until_deadline, 0.0))
                continue
            if wake > now:
                clock.jump(wake - now)
            while heap and heap[0][0] <= wake:
                task = heappop(heap)[2]
                if task is not None:
                    reschedule(task)

    def _unpark(self, _raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self._parked = None
        return trio.lowlevel.Abort.SUCCEEDED


@attrs.define
class _ProviderState:
    spec: SimProvider
    # Whether arrivals must be decided at the end of their instant.
    defer: bool
    capacity: int | None = attrs.field(init=False)
    in_flight: int = 0
    peak: int = 0
    served: int = 0
    rejected: int = 0
    busy: float = 0.0

    def __attrs_post_init__(self) -> None:
        self.capacity = self.spec.capacity

    def admit(self) -> None:
        """Count one more call in flight."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)


class _Run:
    """The mutable state of one simulation run."""

    def __init__(
        self,
        scenario: Scenario,
        t0: float,
        clock: _Timekeeper | None,
        acquire: Callable[
            [str, float, TurnSpec, int, str | None], AbstractAsyncContextManager[Any]
        ],
        report: Callable[[str, float], None] | None,
        *,
        batches: bool = False,
        key: Callable[[SimCall], float] | None = None,
        limits: Mapping[str, int] | None = None,
    ) -> None:
        self.t0 = t0
        self.keeper = clock
        self.sleep: Callable[[float], Awaitable[None]]
        self.sleep_until: Callable[[float], Awaitable[None]]
        if clock is None:
            self.sleep, self.sleep_until = trio.sleep, trio.sleep_until
        else:
            self.sleep, self.sleep_until = clock.sleep, clock.sleep_until
        self.acquire = acquire
        self.report = report
        self.key = key
        self.max_attempts = scenario.max_attempts
        # A batch of grants wakes several agents at one instant; if the
        # provider can refuse some of them, who gets in must not depend on
        # trio's scheduling order (see _Timekeeper.arrive). One grant at a
        # time (CapacityLimiter) or no limit never makes such ties.
        self.states = {
            p.name: _ProviderState(
                p,
                defer=clock is not None
                and batches
                and p.capacity is not None
                and (p.limit if limits is None else limits.get(p.name, p.limit))
                > p.capacity,
            )
            for p in scenario.providers
        }
        self.records: list[TurnRecord | None] = [None] * len(scenario.turns)
        # The pools' names: a turn on one is a conversation (affinity), and
        # each call runs on the member its slot names.
        self.pools = {pool for pool, _ in scenario.pools}

    async def drive(
        self,
        turns: Sequence[TurnSpec],
        priorities: Sequence[Sequence[float]] | None,
    ) -> None:
        t0 = self.t0
        order = sorted(range(len(turns)), key=lambda i: turns[i].arrival)
        turn = self.turn
        sleep_until = self.sleep_until
        async with trio.open_nursery() as nursery:
            for index in order:
                spec = turns[index]
                await sleep_until(t0 + spec.arrival)
                nursery.start_soon(
                    turn,
                    index,
                    spec,
                    None if priorities is None else priorities[index],
                    name="trio_dispatch simulated turn",
                )

    async def turn(  # noqa: PLR0912, PLR0915  # one flat loop: a coroutine per call costs
        self, index: int, spec: TurnSpec, priorities: Sequence[float] | None
    ) -> None:
        name = spec.provider
        states = self.states
        # On a pool, each call's member is its slot's; a turn is one
        # conversation there (its calls prefer their member).
        conversation = f"turn {index}" if name in self.pools else None
        acquire = self.acquire
        report = self.report
        key = self.key
        keeper = self.keeper
        max_attempts = self.max_attempts
        now = trio.current_time
        sleep = self.sleep
        tools = spec.tools
        last_tool = len(tools)
        started_at = self.t0 + spec.arrival
        slot_wait = 0.0
        max_wait = 0.0
        first_wait = 0.0
        rejections = 0
        made = 0
        received = 0.0
        completed = True
        try:
            for position, duration in enumerate(spec.calls):
                if key is not None:
                    priority = key(
                        SimCall(
                            spec,
                            position,
                            spec.arrival,
                            now() - self.t0,
                            received,
                            slot_wait,
                        )
                    )
                elif priorities is None:
                    priority = started_at
                else:
                    priority = priorities[position]
                attempts = 0
                while True:
                    asked = now()
                    async with acquire(
                        name, priority, spec, position, conversation
                    ) as held:
                        waited = now() - asked
                        slot_wait += waited
                        max_wait = max(max_wait, waited)
                        if position == 0 and attempts == 0:
                            first_wait = waited
                        state = states[name if conversation is None else held.member]
                        provider = state.spec
                        capacity = state.capacity
                        if capacity is None:
                            accepted = True
                            state.admit()
                        elif state.defer:
                            accepted = await keeper.arrive(state, index)  # type: ignore[union-attr]  # defer needs a keeper
                        else:
                            accepted = state.in_flight < capacity
                            if accepted:
                                state.admit()
                        if not accepted:
                            await sleep(provider.reject_latency)
                            state.rejected += 1
                            rejections += 1
                            if report is not None:
                                report(provider.name, provider.retry_after)
                            served = False
                        else:
                            await sleep(duration)
                            state.in_flight -= 1
                            state.served += 1
                            state.busy += duration
                            served = True
                    if served:
                        break
                    attempts += 1
                    if attempts >= max_attempts:
                        completed = False
                        break
                    if report is None:
                        await sleep(provider.retry_after)
                    # Else the dispatcher holds every grant until Retry-After:
                    # queue again at once, with the same priority.
                if not completed:
                    break
                made += 1
                received += duration
                if position < last_tool:
                    await sleep(tools[position])
        except QueueFull:
            # max_waiting refused the call, before anything was held: the
            # turn fails, as it would in an application.
            completed = False
        self.records[index] = TurnRecord(
            index=index,
            provider=name,
            start=spec.arrival,
            end=now() - self.t0,
            calls=made,
            ideal=spec.ideal,
            slot_wait=slot_wait,
            max_slot_wait=max_wait,
            first_slot_wait=first_wait,
            rejections=rejections,
            completed=completed,
            priority=spec.priority,
            planned=len(spec.calls),
        )

    def result(
        self, policy: str, leftovers: dict[str, tuple[int, int]]
    ) -> SimulationResult:
        records = self.records
        if any(r is None for r in records):  # pragma: no cover  # the nursery waits
            raise RuntimeError("a simulated turn did not finish")
        providers = tuple(
            ProviderRecord(
                name=name,
                limit=state.spec.limit,
                capacity=state.capacity,
                peak_in_flight=state.peak,
                served=state.served,
                rejected=state.rejected,
                busy=state.busy,
                held_at_end=leftovers.get(name, (0, 0))[0],
                waiting_at_end=leftovers.get(name, (0, 0))[1],
            )
            for name, state in self.states.items()
        )
        return SimulationResult(
            policy=policy,
            turns=tuple(records),  # type: ignore[arg-type]  # no None left, checked above
            providers=providers,
        )


def _random_priorities(scenario: Scenario, seed: int) -> list[tuple[float, ...]]:
    rng = random.Random(f"trio_dispatch random policy {seed}")
    draw = rng.random
    return [tuple(draw() for _ in turn.calls) for turn in scenario.turns]


async def simulate(
    workload: Workload | Scenario,
    policy: PolicyName | DispatcherConfig,
    *,
    seed: int | None = None,
    priority_aging: float = 60.0,
) -> SimulationResult:
    """Simulate ``workload`` under ``policy`` in the current trio run.

    The run should use a ``MockClock(autojump_threshold=0)``; on a real clock
    it takes real time. Times in the result are seconds from the call.

    Args:
        workload: What to play: a ``Workload`` is drawn with its
            ``scenario()`` first.
        policy: ``"oldest-first"``, ``"fifo"``, ``"random"`` or ``"none"``;
            or a ``DispatcherConfig``: the real dispatcher opened with your
            own options (and order, if it has a ``key``).
        seed: The seed of the ``"random"`` policy's priorities; defaults to
            the workload's seed (0 for a ``Scenario``).
        priority_aging: The dispatcher's ``priority_aging`` (only
            ``"oldest-first"`` has classes; a ``DispatcherConfig`` has its
            own).
    """
    if not isinstance(policy, DispatcherConfig):
        policy = check_policy(policy)
    priority_aging = check_positive_seconds(priority_aging, "priority_aging")
    if isinstance(workload, Workload):
        scenario = workload.scenario()
        if seed is None:
            seed = workload.seed
    else:
        scenario = workload
    if isinstance(policy, DispatcherConfig):
        config = policy
        limits, options = _limits_and_options(scenario, config)
        if config.priority is not None:
            classed = config.priority
            scenario = attrs.evolve(
                scenario,
                turns=[attrs.evolve(t, priority=classed(t)) for t in scenario.turns],
            )
        if scenario.pools:
            options["pools"] = dict(scenario.pools)
        # Opened first, so that a bad option is its own error, at once.
        async with open_dispatcher(limits, **options) as dispatcher:
            return await _keeping_time(
                functools.partial(_configured, scenario, config, dispatcher, limits)
            )
    return await _keeping_time(
        functools.partial(
            _simulate, scenario, policy, seed, priority_aging=priority_aging
        )
    )


async def _keeping_time(
    run: Callable[[_Timekeeper | None], Awaitable[SimulationResult]],
) -> SimulationResult:
    """``run(keeper)``, with a timekeeper running if the clock is a ``MockClock``."""
    clock = trio.lowlevel.current_clock()
    async with trio.open_nursery() as nursery:
        keeper = None
        if isinstance(clock, trio.testing.MockClock):
            keeper = _Timekeeper(clock)
            nursery.start_soon(keeper.run, name="trio_dispatch simulation clock")
        result = await run(keeper)
        nursery.cancel_scope.cancel()
    return result


def _limits_and_options(
    scenario: Scenario, config: DispatcherConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``open_dispatcher``'s limits (the workload's, then the config's) and options."""
    options = dict(config.options)
    limits = {p.name: p.limit for p in scenario.providers} | dict(
        options.pop("limits", None) or {}
    )
    return limits, options


async def _configured(
    scenario: Scenario,
    config: DispatcherConfig,
    dispatcher: Any,  # noqa: ANN401  # a Dispatcher (the package imports this module)
    limits: Mapping[str, Any],
    keeper: _Timekeeper | None,
) -> SimulationResult:
    """A run through ``dispatcher``, opened with ``config``'s own options."""
    t0 = trio.current_time()
    leftovers: dict[str, tuple[int, int]] = {}
    slot: Callable[..., AbstractAsyncContextManager[Any]] = dispatcher.slot

    def acquire(
        name: str, rank: float, spec: TurnSpec, position: int, conversation: str | None
    ) -> AbstractAsyncContextManager[Any]:
        return slot(
            name,
            conversation_id=conversation,
            started_at=rank,
            priority=spec.priority,
            tenant=spec.tenant,
            model=spec.model,
            tokens=spec.tokens[position] if spec.tokens else None,
        )

    run = _Run(
        scenario,
        t0,
        keeper,
        acquire,
        dispatcher.report_rate_limit,
        batches=True,
        key=config.key,
        limits={name: _highest(limit) for name, limit in limits.items()},
    )
    await run.drive(scenario.turns, None)
    # Let the schedulers read the last releases before looking.
    await trio.testing.wait_all_tasks_blocked()
    for name, stats in dispatcher.statistics().providers.items():
        leftovers[name] = (stats.in_flight, stats.waiting)
    return run.result(config.name, leftovers)


def _highest(limit: object) -> int:
    """An int limit, or an ``AdaptiveLimit``'s ``maximum``."""
    return limit if isinstance(limit, int) else int(getattr(limit, "maximum", 1))


async def _simulate(
    scenario: Scenario,
    policy: PolicyName,
    seed: int | None,
    keeper: _Timekeeper | None,
    priority_aging: float = 60.0,
) -> SimulationResult:
    t0 = trio.current_time()
    providers = scenario.providers
    leftovers: dict[str, tuple[int, int]] = {}
    if policy in ("oldest-first", "random"):
        priorities = (
            _random_priorities(scenario, seed or 0) if policy == "random" else None
        )
        async with open_dispatcher(
            {p.name: p.limit for p in providers},
            priority_aging=priority_aging,
            pools=dict(scenario.pools) or None,
        ) as dispatcher:
            # The random policy's draws stand for the whole order: no classes.
            classes = policy == "oldest-first"

            def slot(
                name: str,
                started_at: float,
                spec: TurnSpec,
                _position: int,
                conversation: str | None,
            ) -> AbstractAsyncContextManager[Any]:
                return dispatcher.slot(
                    name,
                    conversation_id=conversation,
                    started_at=started_at,
                    priority=spec.priority if classes else 0,
                )

            report = dispatcher.report_rate_limit
            run = _Run(scenario, t0, keeper, slot, report, batches=True)
            await run.drive(scenario.turns, priorities)
            # Let the schedulers read the last releases before looking.
            await trio.testing.wait_all_tasks_blocked()
            for name, stats in dispatcher.statistics().providers.items():
                leftovers[name] = (stats.in_flight, stats.waiting)
    elif policy == "fifo":
        limiters = {p.name: trio.CapacityLimiter(p.limit) for p in providers}
        pools = dict(scenario.pools)

        def limited(
            name: str, rank: float, _spec: TurnSpec, position: int, *_: object
        ) -> AbstractAsyncContextManager[Any]:
            members = pools.get(name)
            if members is None:
                return limiters[name]
            # The least busy member (LiteLLM's least-busy routing), then
            # first come first served at it.
            return _Picked(
                lambda: max(members, key=lambda m: _spare(limiters[m])),
                limiters,
                keeper,
                (rank, position),
            )

        run = _Run(scenario, t0, keeper, limited, None)
        await run.drive(scenario.turns, None)
        for name, limiter in limiters.items():
            held = limiter.statistics()
            leftovers[name] = (held.borrowed_tokens, held.tasks_waiting)
    else:
        free = contextlib.nullcontext()
        pools = dict(scenario.pools)

        def unlimited(
            name: str, rank: float, _spec: TurnSpec, position: int, *_: object
        ) -> AbstractAsyncContextManager[Any]:
            members = pools.get(name)
            if members is None:
                return free
            # No limit: the member with the fewest calls in flight.
            states = run.states
            return _Picked(
                lambda: min(members, key=lambda m: states[m].in_flight),
                None,
                keeper,
                (rank, position),
            )

        run = _Run(scenario, t0, keeper, unlimited, None)
        await run.drive(scenario.turns, None)
    return run.result(policy, leftovers)


def _spare(limiter: trio.CapacityLimiter) -> float:
    """A limiter's free slots less the calls queued for it: how little it is busy."""
    return limiter.available_tokens - limiter.statistics().tasks_waiting


@final
class _Picked:
    """A pool's call without the dispatcher: its member picked, held through its limiter if any.

    With a timekeeper, the calls of one virtual instant pick in ``order``,
    one after the other (``_Timekeeper.take_turn``): the same picks, and
    the same places in the limiters' queues, in every run.
    """

    __slots__ = ("_choose", "_keeper", "_limiter", "_limiters", "_order", "member")

    def __init__(
        self,
        choose: Callable[[], str],
        limiters: Mapping[str, trio.CapacityLimiter] | None,
        keeper: _Timekeeper | None,
        order: tuple[float, int],
    ) -> None:
        self._choose = choose
        self._limiters = limiters
        self._keeper = keeper
        self._order = order
        self._limiter: trio.CapacityLimiter | None = None
        self.member = ""

    async def __aenter__(self) -> _Picked:
        if self._keeper is not None:
            await self._keeper.take_turn(self._order)
        member = self.member = self._choose()
        if self._limiters is not None:
            limiter = self._limiter = self._limiters[member]
            await limiter.acquire()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._limiter is not None:
            self._limiter.release()


def run_simulation(
    workload: Workload | Scenario,
    policy: PolicyName | DispatcherConfig,
    *,
    seed: int | None = None,
    clock: trio.abc.Clock | None = None,
    priority_aging: float = 60.0,
) -> SimulationResult:
    """Simulate ``workload`` under ``policy`` in a fresh trio run, on ``clock``.

    By default a new ``MockClock(autojump_threshold=0)``, so hours of
    simulated traffic take seconds. See ``simulate``.
    """
    priority_aging = check_positive_seconds(priority_aging, "priority_aging")
    if clock is None:
        clock = trio.testing.MockClock(autojump_threshold=0)
    return trio.run(
        functools.partial(
            simulate, workload, policy, seed=seed, priority_aging=priority_aging
        ),
        clock=clock,
    )
