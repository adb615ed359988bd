"""Properties of mixed workloads, traces and configurations, on random draws."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_dispatch import Tenant
from trio_dispatch.testing import (
    DispatcherConfig,
    SimCall,
    Workload,
    run_simulation,
)
from trio_dispatch.testing.strategies import calls_per_turn, durations, workloads


@given(calls_per_turn(max_calls=7), st.integers(0, 2**32 - 1))
@settings(max_examples=60)
def test_calls_per_turn_stay_within_their_bounds(calls: object, seed: int) -> None:
    from trio_dispatch.testing import CallsPerTurn  # noqa: PLC0415

    assert isinstance(calls, CallsPerTurn)
    assert 1 <= calls.low <= calls.mean <= calls.high <= 7
    rng = random.Random(seed)
    for _ in range(20):
        assert calls.low <= calls.sample(rng) <= calls.high


@given(durations(mixtures=True), st.integers(0, 2**32 - 1))
@settings(max_examples=60)
def test_durations_of_every_kind_are_never_negative(
    duration: object, seed: int
) -> None:
    from trio_dispatch.testing import Duration  # noqa: PLC0415

    assert isinstance(duration, Duration)
    rng = random.Random(seed)
    assert all(duration.sample(rng) >= 0 for _ in range(20))


def _least_served(call: SimCall) -> float:
    return call.received


CONFIGS = st.sampled_from(
    [
        DispatcherConfig(),
        DispatcherConfig({"priority_aging": 5.0}, key=_least_served),
        DispatcherConfig({"tenants": {"a": Tenant(weight=3.0, limit=1)}}),
    ]
)


@given(workloads(mixed=True, max_agents=15), CONFIGS)
@settings(max_examples=25, deadline=None)
def test_any_configuration_keeps_the_limits_and_finishes_every_turn(
    workload: Workload, config: DispatcherConfig
) -> None:
    result = run_simulation(workload, config)
    for provider in result.providers:
        assert provider.peak_in_flight <= provider.limit
        assert provider.held_at_end == provider.waiting_at_end == 0
    assert all(turn.completed for turn in result.turns)
    assert len(result.turns) == workload.agents


@given(workloads(mixed=True, max_agents=15, max_providers=1))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_workload_written_as_a_trace_reads_back_the_same(workload: Workload) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        workload.write_trace(path)
        back = Workload.from_trace(path, workload.providers)
    assert back.scenario().turns == workload.scenario().turns
