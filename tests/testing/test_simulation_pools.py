"""Pools in the simulator: turns on a pool, each call on the member its policy picks."""

from __future__ import annotations

import pytest

from trio_dispatch.testing import (
    DispatcherConfig,
    PoissonArrivals,
    Scenario,
    SimProvider,
    SimulationResult,
    TurnSpec,
    Workload,
    run_simulation,
)


def five_turns() -> Scenario:
    """Members a and b, limit 1 each; A's second call comes back at 1.6.

    No two events share an instant: trio may run tasks woken together in
    either order.
    """
    return Scenario(
        providers=(SimProvider("a", limit=1), SimProvider("b", limit=1)),
        turns=(
            TurnSpec(0.0, "gpt", (1.0, 1.0), (0.6,)),
            TurnSpec(0.25, "gpt", (1.0,)),
            TurnSpec(0.5, "gpt", (1.0,)),
            TurnSpec(0.75, "gpt", (1.0,)),
            TurnSpec(1.2, "gpt", (1.0,)),
        ),
        pools={"gpt": ("a", "b")},
    )


def ends(result: SimulationResult) -> list[float]:
    return [turn.end for turn in result.turns]


def served(result: SimulationResult) -> dict[str, tuple[int, int, float]]:
    return {p.name: (p.served, p.peak_in_flight, p.busy) for p in result.providers}


def test_oldest_first_over_a_pool_finishes_the_turn_in_progress_first() -> None:
    result = run_simulation(five_turns(), "oldest-first")
    # A on a (0-1); B on b (0.25-1.25); C takes a at 1.0, D b at 1.25; A's
    # second call (rank 0) takes a at 2.0 ahead of E (rank 1.2), which
    # takes b at 2.25.
    assert ends(result) == [3.0, 1.25, 2.0, 2.25, 3.25]
    assert served(result) == {"a": (3, 1, 3.0), "b": (3, 1, 3.0)}
    assert {turn.provider for turn in result.turns} == {"gpt"}
    assert all(turn.completed for turn in result.turns)
    assert [(p.held_at_end, p.waiting_at_end) for p in result.providers] == [
        (0, 0),
        (0, 0),
    ]


def test_fifo_over_a_pool_routes_to_the_least_busy_member_then_queues() -> None:
    result = run_simulation(five_turns(), "fifo")
    # E (1.2) queues on a, the least busy then; A's second call (1.6) on b,
    # behind D: it ends last.
    assert ends(result) == [3.25, 1.25, 2.0, 2.25, 3.0]
    assert served(result) == {"a": (3, 1, 3.0), "b": (3, 1, 3.0)}


def test_no_limit_over_a_pool_sends_each_call_to_the_member_with_fewest_calls() -> None:
    result = run_simulation(five_turns(), "none")
    # A's second call finds one call on each: the first member takes it.
    assert ends(result) == [2.6, 1.25, 1.5, 1.75, 2.2]
    assert served(result) == {"a": (4, 2, 4.0), "b": (2, 2, 2.0)}


def test_a_configured_dispatcher_runs_the_scenarios_pools() -> None:
    exact = run_simulation(five_turns(), DispatcherConfig())
    assert ends(exact) == [3.0, 1.25, 2.0, 2.25, 3.25]
    spread = run_simulation(five_turns(), DispatcherConfig({"affinity_wait": 0}))
    assert all(turn.completed for turn in spread.turns)
    with pytest.raises(TypeError, match=r"^'pools' is not an open_dispatcher option"):
        DispatcherConfig({"pools": {"gpt": ("a",)}})


def test_a_members_429_pauses_that_member_only() -> None:
    # a takes one call at a time but its client limit is 2: B, granted on
    # it second, is answered 429 at 0.75, a is paused, and B waits for b.
    scenario = Scenario(
        providers=(
            SimProvider("a", limit=2, capacity=1, retry_after=5.0, reject_latency=0.5),
            SimProvider("b", limit=1),
        ),
        turns=(
            TurnSpec(0.0, "gpt", (2.0,)),
            TurnSpec(0.25, "gpt", (1.0,)),
            TurnSpec(0.5, "gpt", (1.0,)),
        ),
        pools={"gpt": ("a", "b")},
    )
    result = run_simulation(scenario, "oldest-first")
    records = {p.name: p for p in result.providers}
    assert records["a"].rejected == 1
    assert [turn.rejections for turn in result.turns] == [0, 1, 0]
    # C takes b at 0.5 (a is full until B's answer); B takes b at 1.5.
    assert ends(result) == [2.0, 2.5, 1.5]
    assert served(result) == {"a": (1, 1, 2.0), "b": (2, 1, 2.0)}


def test_a_workloads_turns_go_to_its_pools_by_their_members_weight() -> None:
    workload = Workload(
        agents=300,
        arrivals=PoissonArrivals(0.5),
        providers=(SimProvider("a", 4), SimProvider("b", 4), SimProvider("c", 2)),
        pools={"gpt": ("a", "b")},
    )
    turns = workload.scenario().turns
    on_pool = sum(turn.provider == "gpt" for turn in turns)
    assert {turn.provider for turn in turns} == {"gpt", "c"}
    # Weights 1 each: the pool is picked two times in three.
    assert 0.55 < on_pool / len(turns) < 0.78
    assert workload.scenario().pools == (("gpt", ("a", "b")),)


@pytest.mark.parametrize(
    ("pools", "error", "match"),
    [
        ({"a": ("b",)}, ValueError, r"^pool 'a' has the name of a provider$"),
        ({"gpt": ("a", "z")}, ValueError, r"^pool 'gpt' has unknown members \['z'\]$"),
        ({"gpt": "ab"}, TypeError, r"^the members of pool 'gpt' must be"),
        ({"gpt": ()}, ValueError, r"^pool 'gpt' must have a member$"),
        ([("gpt", ("a",)), ("gpt", ("b",))], ValueError, r"^pools must name each"),
    ],
)
def test_pools_are_checked(pools: object, error: type[Exception], match: str) -> None:
    providers = (SimProvider("a", 1), SimProvider("b", 1))
    with pytest.raises(error, match=match):
        Scenario(providers, (), pools=pools)
    with pytest.raises(error, match=match):
        Workload(1, PoissonArrivals(0.5), providers, pools=pools)


def test_a_turn_on_an_unknown_pool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^turn uses unknown provider 'gpt'$"):
        Scenario((SimProvider("a", 1),), (TurnSpec(0.0, "gpt", (1.0,)),))


def test_a_provider_in_two_pools_shares_its_weight_between_them() -> None:
    workload = Workload(
        agents=400,
        arrivals=PoissonArrivals(0.5),
        providers=(SimProvider("a", 2), SimProvider("b", 2)),
        pools={"x": ("a", "b"), "y": ("b",)},
    )
    turns = workload.scenario().turns
    # x weighs 1 + 1/2, y 1/2: x takes three turns in four.
    share = sum(turn.provider == "x" for turn in turns) / len(turns)
    assert 0.68 < share < 0.82


@pytest.mark.parametrize("policy", ["fifo", "none"])
def test_routing_over_a_pool_is_the_same_every_run_with_429s(policy: str) -> None:
    # a answers 429 past 2 calls though its client limit is 3: retries
    # after the same fixed delays ask at one instant, and pick in order.
    workload = Workload(
        agents=40,
        arrivals=PoissonArrivals(2.0),
        providers=(SimProvider("a", limit=3, capacity=2), SimProvider("b", limit=2)),
        pools={"gpt": ("a", "b")},
        seed=0,
    )
    results = {repr(run_simulation(workload, policy)) for _ in range(4)}  # type: ignore[arg-type]
    assert len(results) == 1
    assert run_simulation(workload, policy).metrics().rejections > 0  # type: ignore[arg-type]
