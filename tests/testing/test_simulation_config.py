"""Your own dispatcher configuration in the simulator, in exact virtual time."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import AdaptiveLimit, Budget, Tenant
from trio_dispatch.testing import (
    CallsPerTurn,
    DispatcherConfig,
    PoissonArrivals,
    Scenario,
    SimCall,
    SimProvider,
    SimulationResult,
    TurnSpec,
    Workload,
    run_simulation,
    simulate,
)

ONE = (SimProvider("p", 1),)
FOUR = (SimProvider("p", 4),)


def ends(result: SimulationResult) -> list[float]:
    return [turn.end for turn in result.turns]


def test_no_options_is_oldest_first_exactly() -> None:
    workload = Workload(
        agents=150,
        arrivals=PoissonArrivals(1.0),
        providers=(SimProvider("p", 3, capacity=3),),
        calls=CallsPerTurn(1, 6),
        classes=((1, 0.3), (0, 0.7)),
        seed=2,
    )
    ours = run_simulation(workload, DispatcherConfig())
    reference = run_simulation(workload, "oldest-first")
    assert ours.policy == "configured"
    assert ours.turns == reference.turns
    assert ours.providers == reference.providers


def test_tenants_share_the_slots_where_oldest_first_would_not() -> None:
    # Limit 1: tenant a's three turns, then b's; each one call of 1 s.
    turns = [TurnSpec(0.1 * i, "p", (1.0,), tenant="a") for i in range(3)]
    scenario = Scenario(ONE, [*turns, TurnSpec(0.3, "p", (1.0,), tenant="b")])
    assert ends(run_simulation(scenario, "oldest-first")) == [1.0, 2.0, 3.0, 4.0]
    # With tenants, b (no service yet) goes before a's second and third.
    shared = DispatcherConfig({"tenants": {"a": Tenant(weight=1.0)}})
    assert ends(run_simulation(scenario, shared)) == [1.0, 3.0, 4.0, 2.0]


def test_an_order_of_ones_own_sees_what_each_turn_received() -> None:
    # A: three calls of 1 s back to back from 0; B: one call at 0.5.
    scenario = Scenario(
        ONE,
        [TurnSpec(0.0, "p", (1.0, 1.0, 1.0), (0.0, 0.0)), TurnSpec(0.5, "p", (1.0,))],
    )
    assert ends(run_simulation(scenario, "oldest-first")) == [4.0, 2.0]
    seen: list[tuple[int, int, float, float, float]] = []

    def least_served(call: SimCall) -> float:
        index = 0 if len(call.turn.calls) == 3 else 1
        seen.append((index, call.call, call.now, call.received, call.waited))
        return call.received

    result = run_simulation(scenario, DispatcherConfig(key=least_served))
    # At 1 s A has received 1 s, B nothing: B goes first.
    assert ends(result) == [4.0, 2.0]
    assert [t.slot_wait for t in result.turns] == [1.0, 0.5]
    assert seen == [
        (0, 0, 0.0, 0.0, 0.0),
        (1, 0, 0.5, 0.0, 0.0),
        (0, 1, 1.0, 1.0, 0.0),
        (0, 2, 3.0, 2.0, 1.0),
    ]


def test_an_application_classes_its_turns() -> None:
    scenario = Scenario(
        ONE,
        [TurnSpec(0.0, "p", (1.0, 1.0, 1.0), (0.0, 0.0)), TurnSpec(0.5, "p", (1.0,))],
    )
    chat_first = DispatcherConfig(
        {"priority_aging": 1e9}, priority=lambda turn: 1 if len(turn.calls) == 1 else 0
    )
    result = run_simulation(scenario, chat_first)
    assert ends(result) == [4.0, 2.0]
    assert [t.priority for t in result.turns] == [0, 1]


def burst(count: int, tokens: tuple[int, ...] = ()) -> Scenario:
    """``count`` one-call turns of 1 s, in order at (nearly) the same instant."""
    return Scenario(
        FOUR, [TurnSpec(i * 1e-6, "p", (1.0,), tokens=tokens) for i in range(count)]
    )


def test_an_adaptive_limit_grows_from_its_initial_value() -> None:
    adaptive = DispatcherConfig(
        {"limits": {"p": AdaptiveLimit(initial=1, minimum=1, maximum=4)}}
    )
    result = run_simulation(burst(40), adaptive)
    fixed = run_simulation(burst(40), "oldest-first")
    assert result.providers[0].peak_in_flight == 4
    # It starts at one slot, so it takes longer than four from the start.
    assert max(ends(result)) == 12.0
    assert max(ends(fixed)) == pytest.approx(10.0, abs=1e-5)


def test_a_token_budget_paces_the_grants() -> None:
    paced = DispatcherConfig({"budgets": {"p": Budget(tokens_per_minute=6000)}})
    result = run_simulation(burst(10, tokens=(1000,)), paced)
    # Six calls' tokens at once, then one call's every 10 s.
    assert [round(end, 3) for end in ends(result)] == [
        1.0,
        1.0,
        1.0,
        1.0,
        2.0,
        2.0,
        11.0,
        21.0,
        31.0,
        41.0,
    ]


def test_max_waiting_fails_the_turns_it_refuses() -> None:
    result = run_simulation(burst(40), DispatcherConfig({"max_waiting": 5}))
    metrics = result.metrics()
    # Four holding and five waiting; the other 31 are refused at once.
    assert (metrics.completed, metrics.turns) == (9, 40)
    refused = [t for t in result.turns if not t.completed]
    assert all(t.calls == 0 and t.latency == 0 for t in refused)


def test_simulate_takes_a_configuration_inside_a_run() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main() -> SimulationResult:
        return await simulate(burst(8), DispatcherConfig(name="mine"))

    result = trio.run(main, clock=clock)
    assert result.policy == "mine"
    assert max(ends(result)) == pytest.approx(2.0, abs=1e-5)


def test_bad_configurations_are_refused_at_once() -> None:
    with pytest.raises(
        TypeError,
        match=r"^'redis_url' is not an open_dispatcher option the simulator takes"
        r" \(it takes affinity_wait, budgets, default_pause, learn_budgets, limits, max_hold,"
        r" max_pause, max_waiting, priority_aging, retry_grace, tenants,"
        r" unknown_providers\)$",
    ):
        DispatcherConfig({"redis_url": "redis://localhost"})
    with pytest.raises(
        TypeError, match=r"^key must be a function of a SimCall, or None; got 3$"
    ):
        DispatcherConfig(key=3)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(
        TypeError,
        match=r"^priority must be a function of a TurnSpec, or None; got 'x'$",
    ):
        DispatcherConfig(priority="x")  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(ValueError, match=r"^name must be a non-empty string, got ''$"):
        DispatcherConfig(name="")
    with pytest.raises(ValueError, match=r"^priority_aging must be a positive number"):
        run_simulation(burst(2), DispatcherConfig({"priority_aging": -1}))
