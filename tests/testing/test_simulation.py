"""The virtual-time simulation harness, its workloads and strategies."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import open_dispatcher
from trio_dispatch.testing import (
    BURST_SPACING,
    POLICIES,
    BurstArrivals,
    CallsPerTurn,
    Duration,
    PoissonArrivals,
    PolicyName,
    Scenario,
    SimProvider,
    SimulationResult,
    TurnSpec,
    Workload,
    run_simulation,
    simulate,
)
from trio_dispatch.testing.strategies import (
    AcquireOp,
    LeaveOp,
    Operation,
    SetLimitOp,
    operation_sequences,
    replay_operations,
    workloads,
)


def three_turns() -> Scenario:
    """Limit 1. A (two calls around a tool step) is overtaken under FIFO."""
    return Scenario(
        providers=(SimProvider("p", limit=1),),
        turns=(
            TurnSpec(0.0, "p", (1.0, 1.0), (0.5,)),
            TurnSpec(0.25, "p", (1.0,)),
            TurnSpec(0.5, "p", (1.0,)),
        ),
    )


def ends(result: SimulationResult) -> list[float]:
    return [turn.end for turn in result.turns]


def test_oldest_first_finishes_the_turn_in_progress_first() -> None:
    result = run_simulation(three_turns(), "oldest-first")
    # A: 0-1, tool 1-1.5, waits for B (1-2), then 2-3 ahead of C; C: 3-4.
    assert ends(result) == [3.0, 2.0, 4.0]
    assert [t.latency for t in result.turns] == [3.0, 1.75, 3.5]
    assert [t.slot_wait for t in result.turns] == [0.5, 0.75, 2.5]
    assert [t.first_slot_wait for t in result.turns] == [0.0, 0.75, 2.5]
    assert [t.ideal for t in result.turns] == [2.5, 1.0, 1.0]
    assert all(t.completed for t in result.turns)
    (provider,) = result.providers
    assert (provider.peak_in_flight, provider.served, provider.busy) == (1, 4, 4.0)
    assert (provider.held_at_end, provider.waiting_at_end) == (0, 0)


def test_fifo_sends_the_turn_in_progress_to_the_back() -> None:
    result = run_simulation(three_turns(), "fifo")
    # A's second call queues behind C, which asked at 0.5.
    assert ends(result) == [4.0, 2.0, 3.0]
    assert [t.slot_wait for t in result.turns] == [1.5, 0.75, 1.5]


def test_no_limit_runs_everything_at_once() -> None:
    result = run_simulation(three_turns(), "none")
    assert ends(result) == [2.5, 1.25, 1.5]
    assert result.providers[0].peak_in_flight == 3


def rate_limited(limit: int, max_attempts: int = 10) -> Scenario:
    return Scenario(
        providers=(
            SimProvider(
                "p", limit=limit, capacity=1, retry_after=1.0, reject_latency=0.125
            ),
        ),
        turns=(TurnSpec(0.0, "p", (2.0,)), TurnSpec(0.5, "p", (1.0,))),
        max_attempts=max_attempts,
    )


def test_a_provider_over_capacity_answers_429_and_the_agent_retries() -> None:
    result = run_simulation(rate_limited(limit=1), "none")
    # B: 429 at 0.625, retry at 1.625, 429 at 1.75, retry at 2.75, done 3.75.
    assert ends(result) == [2.0, 3.75]
    assert [t.rejections for t in result.turns] == [0, 2]
    assert result.providers[0].rejected == 2
    assert result.providers[0].peak_in_flight == 1
    assert result.metrics().rejections == 2


def test_a_turn_gives_up_after_max_attempts() -> None:
    result = run_simulation(rate_limited(limit=1, max_attempts=2), "none")
    first, second = result.turns
    assert first.completed
    assert not second.completed
    assert (second.end, second.calls, second.rejections) == (1.75, 0, 2)
    assert result.metrics().completed == 1


def test_a_429_is_reported_to_the_dispatcher_and_retried() -> None:
    # A client limit above the provider's capacity: B is granted, refused,
    # and the provider paused until its Retry-After.
    result = run_simulation(rate_limited(limit=2), "oldest-first")
    assert ends(result) == [2.0, 3.75]
    assert [t.rejections for t in result.turns] == [0, 2]
    assert result.providers[0].held_at_end == 0


def test_a_client_limit_at_the_capacity_avoids_every_429() -> None:
    result = run_simulation(rate_limited(limit=1), "oldest-first")
    assert ends(result) == [2.0, 3.0]
    assert result.metrics().rejections == 0


async def test_simulate_runs_inside_an_existing_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await trio.sleep(10)
    result = await simulate(three_turns(), "oldest-first")
    assert [t.latency for t in result.turns] == [3.0, 1.75, 3.5]
    assert trio.current_time() == 14.0


def test_run_simulation_rejects_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match=r"^policy must be one of .*; got 'lifo'$"):
        run_simulation(three_turns(), "lifo")  # type: ignore[arg-type]  # on purpose
    with pytest.raises(TypeError, match=r"^policy must be one of .*; got 1$"):
        run_simulation(three_turns(), 1)  # type: ignore[arg-type]  # on purpose


def busy_workload(seed: int) -> Workload:
    return Workload(
        agents=150,
        arrivals=PoissonArrivals(0.95),
        providers=(
            SimProvider("a", limit=3, capacity=3, weight=3),
            SimProvider("b", limit=2, capacity=1, weight=2),
        ),
        calls=CallsPerTurn(1, 6),
        call_duration=Duration.lognormal(1.0, 1.0),
        tool_duration=Duration.exponential(0.5),
        seed=seed,
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_result(policy: PolicyName) -> None:
    first = run_simulation(busy_workload(7), policy)
    second = run_simulation(busy_workload(7), policy)
    assert first.to_json() == second.to_json()
    assert SimulationResult.from_json(first.to_json()) == first
    assert run_simulation(busy_workload(8), policy).to_json() != first.to_json()


def test_same_seed_same_scenario() -> None:
    assert busy_workload(3).scenario() == busy_workload(3).scenario()
    assert busy_workload(3).scenario() != busy_workload(4).scenario()


def test_workload_load_sets_the_arrival_rate() -> None:
    workload = busy_workload(0)
    # 0.95 * (3 + 2) slots / (3.5 calls * 1.0 s per call)
    assert workload.arrival_rate == 0.95 * 5 / 3.5
    assert workload.load == pytest.approx(0.95, rel=1e-12)
    turns = workload.scenario().turns
    assert len(turns) == 150
    assert all(
        1 <= len(t.calls) <= 6 and len(t.tools) == len(t.calls) - 1 for t in turns
    )
    assert {t.provider for t in turns} == {"a", "b"}


def test_bursts_arrive_in_order_a_spacing_apart() -> None:
    workload = Workload(
        agents=5,
        arrivals=BurstArrivals(size=2, interval=10.0),
        providers=(SimProvider("p", 1),),
    )
    arrivals = [t.arrival for t in workload.scenario().turns]
    assert arrivals == [0.0, BURST_SPACING, 10.0, 10.0 + BURST_SPACING, 20.0]


def test_values_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^limit must be a positive integer, got 0$"):
        SimProvider("p", 0)
    with pytest.raises(
        ValueError, match=r"^a turn of 2 calls has 1 tool steps, got 0$"
    ):
        TurnSpec(0.0, "p", (1.0, 1.0))
    with pytest.raises(ValueError, match=r"^turn uses unknown provider 'q'$"):
        Scenario((SimProvider("p", 1),), (TurnSpec(0.0, "q", (1.0,)),))
    with pytest.raises(ValueError, match=r"^high must be >= low, got low=3 high=2$"):
        CallsPerTurn(3, 2)
    with pytest.raises(ValueError, match=r"spread must not exceed its mean"):
        Duration("uniform", 1.0, 2.0)


@settings(deadline=None, max_examples=25)
@given(workloads(pools=True), st.sampled_from(POLICIES))
def test_generated_workloads_keep_the_invariants(
    workload: Workload, policy: PolicyName
) -> None:
    result = run_simulation(workload, policy)
    assert len(result.turns) == workload.agents
    for provider in result.providers:
        if policy != "none":
            assert provider.peak_in_flight <= provider.limit
        assert provider.held_at_end == provider.waiting_at_end == 0
    for turn in result.turns:
        assert turn.completed
        assert turn.end >= turn.start + turn.ideal - 1e-9


@settings(deadline=None, max_examples=25)
@given(workloads(capacities=True, pools=True), st.sampled_from(POLICIES))
def test_providers_never_serve_beyond_capacity(
    workload: Workload, policy: PolicyName
) -> None:
    result = run_simulation(workload, policy)
    for provider in result.providers:
        if provider.capacity is not None:
            assert provider.peak_in_flight <= provider.capacity
        if policy != "none":
            assert provider.peak_in_flight <= provider.limit
        assert provider.held_at_end == provider.waiting_at_end == 0
    attempts = workload.max_attempts
    for turn in result.turns:
        assert turn.completed or turn.rejections >= attempts


async def replay_and_check(operations: tuple[Operation, ...]) -> None:
    holding = {"a": 0, "b": 0}
    granted_at_lowering = {"a": -1, "b": -1}
    async with open_dispatcher({"a": 1, "b": 1}) as dispatcher:

        def check(operation: Operation) -> None:
            stats = dispatcher.statistics().providers
            if isinstance(operation, SetLimitOp) and operation.limit < holding.get(
                operation.provider, 0
            ):
                granted_at_lowering[operation.provider] = stats[
                    operation.provider
                ].granted_total
            for name, provider in stats.items():
                assert provider.limit is not None  # both are limited from the start
                holding[name] = provider.in_flight
                if provider.in_flight > provider.limit:
                    # Only the holders from before a lowering may exceed it.
                    assert provider.granted_total == granted_at_lowering[name]
                if provider.waiting and not provider.paused:
                    assert provider.in_flight >= provider.limit

        await replay_operations(dispatcher, operations, on_step=check)
        await trio.testing.wait_all_tasks_blocked()
        for provider in dispatcher.statistics().providers.values():
            assert (provider.in_flight, provider.waiting) == (0, 0)
            assert provider.granted_total == provider.released_total


@settings(deadline=None, max_examples=40)
@given(operation_sequences())
def test_replayed_operations_keep_the_invariants(
    operations: tuple[Operation, ...],
) -> None:
    # One trio run per example, on a virtual clock: generate, then replay.
    trio.run(
        replay_and_check, operations, clock=trio.testing.MockClock(autojump_threshold=0)
    )


def test_operation_sequences_only_leave_active_requests() -> None:
    @settings(max_examples=50)
    @given(operation_sequences(max_size=30))
    def check(operations: tuple[Operation, ...]) -> None:
        active: set[int] = set()
        for operation in operations:
            if isinstance(operation, AcquireOp):
                assert operation.request not in active
                active.add(operation.request)
            elif isinstance(operation, LeaveOp):
                active.remove(operation.request)

    check()
