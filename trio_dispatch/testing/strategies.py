"""Hypothesis strategies for property-testing limits and policies.

Two kinds of input:

- ``workloads()`` draws small, valid ``Workload`` values to feed to
  ``run_simulation``. Properties worth checking on any of them (and checked
  by trio-dispatch's own suite)::

      @given(workloads(), st.sampled_from(["oldest-first", "fifo"]))
      @settings(deadline=None, max_examples=50)
      def test_limits_hold(workload, policy):
          result = run_simulation(workload, policy)
          for provider in result.providers:
              assert provider.peak_in_flight <= provider.limit
              assert provider.held_at_end == provider.waiting_at_end == 0
          assert all(turn.completed for turn in result.turns)

- ``operation_sequences()`` draws a scripted session against a dispatcher:
  requests that take a slot and leave, limit changes, rate-limit reports
  and the passing of time. ``replay_operations`` plays one inside a trio
  run (under ``autojump_clock``) and calls you back after each step, once
  every task has settled, to assert on ``dispatcher.statistics()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs
import trio
import trio.testing
from hypothesis import strategies as st

from ._distributions import CallsPerTurn, Duration
from ._workloads import (
    BurstArrivals,
    PoissonArrivals,
    RateCurve,
    SimProvider,
    Workload,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._dispatch._dispatcher import Dispatcher

__all__ = [
    "AcquireOp",
    "AdvanceOp",
    "LeaveOp",
    "Operation",
    "RateLimitOp",
    "SetLimitOp",
    "calls_per_turn",
    "durations",
    "operation_sequences",
    "replay_operations",
    "workloads",
]


def durations(
    *, max_mean: float = 4.0, allow_zero: bool = False, mixtures: bool = False
) -> st.SearchStrategy[Duration]:
    """Durations of every kind, with means up to ``max_mean`` seconds.

    ``allow_zero`` allows a constant zero (fine for tool steps; calls should
    take time). ``mixtures`` adds empirical durations and mixtures of the
    others (heavy tails).
    """
    low = 0.0 if allow_zero else 0.01
    means = st.floats(low, max_mean, allow_nan=False, allow_infinity=False)
    positive = st.floats(0.01, max_mean, allow_nan=False, allow_infinity=False)
    simple = st.one_of(
        means.map(Duration.constant),
        positive.map(Duration.exponential),
        st.builds(Duration.lognormal, positive, st.floats(0.0, 1.5)),
        st.builds(
            lambda mean, fraction: Duration.uniform(mean * (1 - fraction), mean),
            positive,
            st.floats(0.0, 1.0),
        ),
    )
    if not mixtures:
        return simple
    empirical = st.lists(positive, min_size=1, max_size=6).map(Duration.empirical)
    parts = st.lists(st.tuples(_weights, simple | empirical), min_size=1, max_size=3)
    return st.one_of(simple, empirical, parts.map(lambda p: Duration.mixture(*p)))


_weights = st.floats(0.1, 10.0)


def calls_per_turn(*, max_calls: int = 5) -> st.SearchStrategy[CallsPerTurn]:
    """Calls per turn of every kind, 1 to ``max_calls``.

    Uniform, geometric, empirical, and mixtures of them (chat turns beside
    agent runs), shrinking towards one uniform range.
    """
    uniform = st.integers(1, max_calls).flatmap(
        lambda low: st.builds(CallsPerTurn, st.just(low), st.integers(low, max_calls))
    )
    geometric = st.floats(1.0, float(max_calls)).map(
        lambda mean: CallsPerTurn.geometric(mean, high=max_calls)
    )
    empirical = st.lists(st.integers(1, max_calls), min_size=1, max_size=6).map(
        CallsPerTurn.empirical
    )
    simple = st.one_of(uniform, geometric, empirical)
    parts = st.lists(st.tuples(_weights, simple), min_size=1, max_size=3)
    return st.one_of(simple, parts.map(lambda p: CallsPerTurn.mixture(*p)))


@st.composite
def _providers(
    draw: st.DrawFn, max_providers: int, max_limit: int, capacities: bool
) -> tuple[SimProvider, ...]:
    count = draw(st.integers(1, max_providers))
    providers = []
    for index in range(count):
        limit = draw(st.integers(1, max_limit))
        capacity = (
            draw(st.none() | st.integers(1, max_limit + 1)) if capacities else None
        )
        providers.append(
            SimProvider(
                name=f"provider-{index}",
                limit=limit,
                capacity=capacity,
                retry_after=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                reject_latency=draw(st.sampled_from([0.0, 0.05])),
                weight=draw(st.floats(0.1, 10.0)),
            )
        )
    return tuple(providers)


def workloads(
    *,
    max_agents: int = 30,
    max_providers: int = 2,
    max_limit: int = 4,
    max_calls: int = 5,
    capacities: bool = False,
    mixed: bool = False,
    pools: bool = False,
) -> st.SearchStrategy[Workload]:
    """Small valid ``Workload`` values, shrinking towards fewer, simpler turns.

    ``capacities``: whether providers may have a capacity of their own (up
    to ``max_limit + 1``) and answer 429; off by default, so that every turn
    completes. ``mixed``: calls per turn of every kind (``calls_per_turn``),
    heavy-tailed durations, arrivals by a rate curve too, and turns of
    priority classes and tenants ``"a"`` and ``"b"``. ``pools``: some of
    the providers (one or more, perhaps all) may be members of a pool,
    ``"pool"``, which then takes their turns.
    """

    @st.composite
    def build(draw: st.DrawFn) -> Workload:
        low = draw(st.integers(1, max_calls))
        high = draw(st.integers(low, max_calls))
        kinds: list[st.SearchStrategy[PoissonArrivals | BurstArrivals | RateCurve]] = [
            st.builds(PoissonArrivals, st.floats(0.1, 1.5)),
            st.builds(BurstArrivals, st.integers(1, 8), st.floats(0.5, 20.0)),
        ]
        if mixed:
            curve = st.lists(st.floats(0.1, 1.5), min_size=1, max_size=4).map(
                lambda loads: RateCurve([(10.0 * i, x) for i, x in enumerate(loads)])
            )
            kinds.append(curve)
        arrivals: PoissonArrivals | BurstArrivals | RateCurve = draw(st.one_of(kinds))
        calls = CallsPerTurn(low, high)
        classes: tuple[tuple[int, float], ...] = ()
        tenants: tuple[tuple[str, float], ...] = ()
        if mixed:
            calls = draw(calls_per_turn(max_calls=max_calls))
            classes = draw(st.sampled_from([(), ((1, 1.0), (0, 3.0))]))
            tenants = draw(st.sampled_from([(), (("a", 1.0), ("b", 2.0))]))
        providers = draw(_providers(max_providers, max_limit, capacities))
        pooled: tuple[tuple[str, tuple[str, ...]], ...] = ()
        if pools:
            names = [provider.name for provider in providers]
            members = draw(
                st.lists(st.sampled_from(names), max_size=len(names), unique=True)
            )
            if members:
                pooled = (("pool", tuple(members)),)
        return Workload(
            agents=draw(st.integers(1, max_agents)),
            arrivals=arrivals,
            providers=providers,
            pools=pooled,
            calls=calls,
            call_duration=draw(durations(mixtures=mixed)),
            tool_duration=draw(durations(allow_zero=True, mixtures=mixed)),
            seed=draw(st.integers(0, 2**32 - 1)),
            max_attempts=draw(st.integers(1, 5)),
            classes=classes,
            tenants=tenants,
        )

    return build()


@final
@attrs.frozen
class AcquireOp:
    """Request ``request`` asks ``provider`` for a slot, with this priority."""

    request: int
    provider: str
    started_at: float


@final
@attrs.frozen
class LeaveOp:
    """Request ``request`` leaves: it releases its slot or stops waiting."""

    request: int


@final
@attrs.frozen
class SetLimitOp:
    """The provider's limit changes."""

    provider: str
    limit: int


@final
@attrs.frozen
class RateLimitOp:
    """The provider answered 429; grants pause for ``retry_after`` seconds."""

    provider: str
    retry_after: float


@final
@attrs.frozen
class AdvanceOp:
    """Virtual time passes."""

    seconds: float


Operation = AcquireOp | LeaveOp | SetLimitOp | RateLimitOp | AdvanceOp


def operation_sequences(
    *,
    providers: Sequence[str] = ("a", "b"),
    max_limit: int = 3,
    max_size: int = 40,
) -> st.SearchStrategy[tuple[Operation, ...]]:
    """Valid scripted sessions against a dispatcher limiting ``providers``.

    Every ``LeaveOp`` names a request that was acquired and has not left;
    ``started_at`` values come from a few instants, so ties are common.
    ``max_limit`` bounds what a ``SetLimitOp`` sets.
    """
    names = tuple(providers)
    if not names:
        raise ValueError("providers must name at least one provider")
    provider = st.sampled_from(names)
    pauses = st.sampled_from([0.0, 0.5, 2.0])
    kinds = st.sampled_from(["acquire", "acquire", "leave", "limit", "rate", "advance"])

    @st.composite
    def build(draw: st.DrawFn) -> tuple[Operation, ...]:
        size = draw(st.integers(0, max_size))
        operations: list[Operation] = []
        active: list[int] = []
        next_request = 0
        for _ in range(size):
            kind = draw(kinds)
            if kind == "leave" and active:
                request = active.pop(draw(st.integers(0, len(active) - 1)))
                operations.append(LeaveOp(request))
            elif kind == "limit":
                name = draw(provider)
                operations.append(SetLimitOp(name, draw(st.integers(1, max_limit))))
            elif kind == "rate":
                name = draw(provider)
                operations.append(RateLimitOp(name, draw(pauses)))
            elif kind == "advance":
                operations.append(AdvanceOp(draw(st.sampled_from([0.25, 1.0, 3.0]))))
            else:
                name = draw(provider)
                started_at = float(draw(st.integers(0, 4)))
                operations.append(AcquireOp(next_request, name, started_at))
                active.append(next_request)
                next_request += 1
        return tuple(operations)

    return build()


async def _hold(
    dispatcher: Dispatcher, operation: AcquireOp, scope: trio.CancelScope
) -> None:
    with scope:
        async with dispatcher.slot(
            operation.provider,
            conversation_id=f"request-{operation.request}",
            started_at=operation.started_at,
        ):
            await trio.sleep_forever()


async def replay_operations(
    dispatcher: Dispatcher,
    operations: Sequence[Operation],
    *,
    on_step: Callable[[Operation], None] | None = None,
) -> None:
    """Play ``operations`` against ``dispatcher`` in the current trio run.

    Each ``AcquireOp`` starts a task holding ``dispatcher.slot(...)`` until
    its ``LeaveOp`` cancels it. After each operation every task settles,
    then ``on_step`` is called with it; requests still active at the end
    leave. ``ValueError`` if a ``LeaveOp`` names a request not active.
    """
    scopes: dict[int, trio.CancelScope] = {}
    async with trio.open_nursery() as nursery:
        for operation in operations:
            if isinstance(operation, AcquireOp):
                scope = trio.CancelScope()
                scopes[operation.request] = scope
                nursery.start_soon(_hold, dispatcher, operation, scope)
            elif isinstance(operation, LeaveOp):
                left = scopes.pop(operation.request, None)
                if left is None:
                    raise ValueError(f"request {operation.request} is not active")
                left.cancel()
            elif isinstance(operation, SetLimitOp):
                dispatcher.set_limit(operation.provider, operation.limit)
            elif isinstance(operation, RateLimitOp):
                dispatcher.report_rate_limit(operation.provider, operation.retry_after)
            else:
                await trio.sleep(operation.seconds)
            await trio.testing.wait_all_tasks_blocked()
            if on_step is not None:
                on_step(operation)
        for scope in scopes.values():
            scope.cancel()
