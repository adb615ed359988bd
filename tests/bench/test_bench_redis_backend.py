"""Smoke test of the shared-backend benchmark (``bench/redis_backend.py``).

Tiny sizes against a redis-server of the test's own: the report's shape,
and that its figures hang together (quantiles in order, every grant of the
scaling fleets counted, the limit kept); never how fast anything ran.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import pytest

from .._bench import load_bench_script
from .._redis import needs_redis, running_redis

if TYPE_CHECKING:
    # mypy reads bench/redis_backend.py itself (bench/ is among its files).
    import redis_backend
else:
    redis_backend = load_bench_script("redis_backend")

Sizes = redis_backend.Sizes
RedisBackendReport = redis_backend.RedisBackendReport

TINY = Sizes(
    round_trips=20,
    tasks=4,
    cycles=3,
    limit=2,
    fleet_tasks=3,
    fleet_cycles=2,
    repeats=1,
    processes=(1, 2),
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> RedisBackendReport:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        return redis_backend.run(TINY, server.url)


@needs_redis
def test_every_latency_is_a_sane_pair_of_quantiles(report: RedisBackendReport) -> None:
    assert report.sizes == TINY
    pairs = [
        (report.bare_call_p50_us, report.bare_call_p99_us),
        (report.bare_request_p50_us, report.bare_request_p99_us),
        (report.latency_local_p50_us, report.latency_local_p99_us),
        (report.latency_redis_p50_us, report.latency_redis_p99_us),
        (report.idle_latency_local_p50_us, report.idle_latency_local_p99_us),
        (report.idle_latency_redis_p50_us, report.idle_latency_redis_p99_us),
    ]
    for p50, p99 in pairs:
        assert math.isfinite(p99)
        assert 0 < p50 <= p99
    assert report.handoffs_local_per_s > 0
    assert report.handoffs_redis_per_s > 0
    # Every grant costs the server a few commands: the script call and its
    # own calls; the plain semaphore's at least its two script calls.
    assert report.commands_per_grant > 1
    assert report.semaphore_commands_per_grant > 2
    assert report.tenant_commands_per_grant > 1
    assert report.pool_handoffs_per_s > 0
    assert report.pool_provider_handoffs_per_s > 0
    assert report.pool_commands_per_grant > 1


@needs_redis
def test_the_pools_members_each_held_at_most_their_own_limit(
    report: RedisBackendReport,
) -> None:
    limits = redis_backend.pool_limits(TINY)
    assert sum(limits.values()) == TINY.limit
    # Both members served, neither above its limit.
    assert set(report.pool_peak_in_flight) == set(limits)
    for member, peak in report.pool_peak_in_flight.items():
        assert 1 <= peak <= limits[member]


@needs_redis
def test_every_grant_of_the_scaling_fleets_is_counted_within_the_limit(
    report: RedisBackendReport,
) -> None:
    assert [row.processes for row in report.scaling] == [1, 2]
    for row in report.scaling:
        assert row.grants == row.processes * TINY.fleet_tasks * TINY.fleet_cycles
        assert 1 <= row.peak_in_flight <= TINY.limit
        assert row.grants_per_second > 0
        assert row.inversions >= 0
    # One process cannot invert the order across processes.
    assert report.scaling[0].inversions == 0


@needs_redis
def test_the_semaphore_runs_each_fleet_too_and_both_count_commands(
    report: RedisBackendReport,
) -> None:
    for row in report.scaling:
        semaphore = row.semaphore
        assert semaphore is not None
        assert semaphore.grants == row.grants
        assert 1 <= semaphore.peak_in_flight <= TINY.limit
        assert semaphore.grants_per_second > 0
        assert semaphore.inversions >= 0
        # A grant costs ours a step at least (the script and its own
        # calls); the semaphore its two script calls and theirs.
        assert row.commands_per_grant > 1
        assert semaphore.commands_per_grant > 2
        # The figure is the per-command counts summed over the grants.
        for run in (row, semaphore):
            assert run.commands_per_grant == sum(run.commands.values()) / row.grants
        assert semaphore.commands["evalsha"] >= 2 * row.grants


@needs_redis
def test_json_and_markdown_hold_the_same_figures(report: RedisBackendReport) -> None:
    data = json.loads(report.to_json())
    assert data["bare_call_p50_us"] == report.bare_call_p50_us
    assert data["latency_redis_p99_us"] == report.latency_redis_p99_us
    assert data["sizes"]["processes"] == [1, 2]
    assert [row["grants"] for row in data["scaling"]] == [
        row.grants for row in report.scaling
    ]
    markdown = report.to_markdown()
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    # Two tables, each with a header and a separator: twelve measurements,
    # then one row per fleet.
    assert len(rows) == 4 + 12 + len(report.scaling)
    assert f"{report.latency_redis_p50_us:.0f}" in markdown
    assert data["commands_per_grant"] == report.commands_per_grant
    assert f"| {report.commands_per_grant:.1f} |" in markdown
    assert f"semaphore: {report.semaphore_commands_per_grant:.1f})" in markdown
    assert data["tenant_commands_per_grant"] == report.tenant_commands_per_grant
    assert f"two tenants | | {report.tenant_commands_per_grant:.1f} |" in markdown
    assert data["pool_commands_per_grant"] == report.pool_commands_per_grant
    assert f"two members | | {report.pool_commands_per_grant:.1f} |" in markdown
    assert f" | {report.pool_handoffs_per_s:,.0f} |" in markdown
    assert data["pool_peak_in_flight"] == report.pool_peak_in_flight
    for row in report.scaling:
        assert f"| {row.processes} | {row.grants} |" in markdown
        assert row.semaphore is not None
        assert (
            f" | {row.peak_in_flight} | {row.commands_per_grant:.1f}"
            f" | {row.semaphore.grants_per_second:,.0f} |"
        ) in markdown
        assert f" | {row.semaphore.commands_per_grant:.1f} |" in markdown
    assert [row["semaphore"]["grants"] for row in data["scaling"]] == [
        row.grants for row in report.scaling
    ]


def test_inversions_count_pairs_granted_against_the_order_they_asked_in() -> None:
    # (asked, granted, released) per request, one list per process.
    first = [(0.0, 1.0, 1.5), (0.5, 0.6, 0.7)]
    second = [(0.1, 0.2, 0.3)]
    # Process 1's request at 0.1 was granted before process 0's request of
    # 0.0, which was waiting: one inversion. Process 0's own pair does not
    # count; a pair asked within the tolerance does not either.
    assert redis_backend._inversions([first, second], tolerance=0.05) == 1
    assert redis_backend._inversions([first, second], tolerance=0.2) == 0
    assert redis_backend._inversions([first], tolerance=0.0) == 0
