"""Dispatchers sharing their limits through a real Redis Cluster.

Three masters cover every slot. Each provider's keys carry one hash tag,
so each exchange touches one slot, wherever it lives; dispatchers pointed
at different nodes of the cluster find every provider's ledger, and the
wake-ups (classic pub/sub, which a cluster broadcasts to every node) reach
all of them. Time is real; what is asserted is order and counts.
"""

from __future__ import annotations

import subprocess
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch._redis._ledger import keys_of

from .._redis import (
    REDIS_CLI,
    RedisServer,
    coredis_leaks,
    needs_redis_cli,
    running_cluster,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from trio_dispatch import Dispatcher

pytestmark = [needs_redis_cli, coredis_leaks]

LEASE = 3.0
# Provider names whose hash tags land on different masters of three.
PROVIDERS = ["openai", "anthropic", "local", "p", "q"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


def keyslot(port: int, key: str) -> int:
    assert REDIS_CLI is not None
    answer = subprocess.run(
        [REDIS_CLI, "-p", str(port), "cluster", "keyslot", key],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(answer.stdout)


def owner(servers: list[RedisServer], slot: int) -> int:
    """The port of the master that serves ``slot``."""
    assert REDIS_CLI is not None
    nodes = subprocess.run(
        [REDIS_CLI, "-p", str(servers[0].port), "cluster", "nodes"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <state> <ranges>
    for line in nodes.splitlines():
        fields = line.split()
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        for span in fields[8:]:
            first, _, last = span.partition("-")
            if int(first) <= slot <= int(last or first):
                return port
    raise AssertionError(f"slot {slot} is not served")


def test_each_provider_ledger_is_in_one_slot_and_they_spread(
    cluster: list[RedisServer],
) -> None:
    port = cluster[0].port
    slots = {}
    for provider in PROVIDERS:
        [slot] = {keyslot(port, key) for key in keys_of("cluster-fleet", provider)}
        slots[provider] = slot
    # The test's point: the providers live on more than one master.
    assert len({owner(cluster, slot) for slot in slots.values()}) > 1


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` for at most 5 seconds (state across sockets)."""
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (polling state across sockets)
            await trio.sleep(0.005)


async def test_limits_and_pauses_hold_across_nodes_of_a_cluster(
    cluster: list[RedisServer],
) -> None:
    holding = dict.fromkeys(PROVIDERS, 0)
    peak = dict.fromkeys(PROVIDERS, 0)

    async def work(dispatcher: Dispatcher, provider: str) -> None:
        async with dispatcher.slot(provider):
            holding[provider] += 1
            peak[provider] = max(peak[provider], holding[provider])
            await trio.sleep(0.005)
            holding[provider] -= 1

    async with AsyncExitStack() as stack:
        fleet = [
            await stack.enter_async_context(
                open_dispatcher(
                    dict.fromkeys(PROVIDERS, 2),
                    # Each process knows a different node of the cluster.
                    redis_url=server.url,
                    namespace="cluster-fleet",
                    lease=LEASE,
                )
            )
            for server in cluster
        ]
        async with trio.open_nursery() as nursery:
            for n in range(60):
                nursery.start_soon(work, fleet[n % 3], PROVIDERS[n % len(PROVIDERS)])
        assert peak == dict.fromkeys(PROVIDERS, 2)
        for dispatcher in fleet:
            stats = dispatcher.statistics().providers
            assert all(stats[p].backend == "redis" for p in PROVIDERS)
            assert all(stats[p].backend_up for p in PROVIDERS)
            assert sum(stats[p].granted_total for p in PROVIDERS) == 20
        # A rate limit seen through one node pauses the provider for a
        # process that reaches the cluster through another.
        fleet[0].report_rate_limit("anthropic", retry_after=30.0)
        await until(lambda: fleet[0].statistics().providers["anthropic"].paused)
        granted = trio.Event()

        async def wait() -> None:
            async with fleet[2].slot("anthropic"):
                granted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await until(lambda: fleet[2].statistics().providers["anthropic"].paused)
            await trio.sleep(0.2)
            assert not granted.is_set()
            # And a resume through the third node wakes it at once.
            fleet[1].resume("anthropic")
            with trio.fail_after(LEASE / 3):
                await granted.wait()


async def test_statistics_name_the_cluster_backend(
    cluster: list[RedisServer], tmp_path: Path
) -> None:
    async with (
        open_dispatcher(
            {"p": 1}, redis_url=cluster[1].url, namespace="cluster-stats", lease=LEASE
        ) as dispatcher,
        dispatcher.slot("p"),
    ):
        stats = dispatcher.statistics().providers["p"]
        assert (stats.backend, stats.backend_up, stats.local_in_flight) == (
            "redis",
            True,
            1,
        )
