"""Rounds whose answer is lost after Redis ran them, against a real redis-server.

The connection can drop after the server ran a step's script and before
the client read its answer: the step happened, the process does not know
it. The next round must find the same state, not add to it: one queue
entry per waiter, a lease granted by the lost round handed to its waiter
(or given back if the waiter left meanwhile), nothing left to expire.

The lease is long here (30 s) and every bound is a few seconds, so that
anything left to expire shows as a stall.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import coredis
import pytest
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch._redis._ledger import lease_of

from .._redis import Faults, RedisServer, needs_redis, node_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Dispatcher

pytestmark = needs_redis

LEASE = 30.0


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults.install(monkeypatch)


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (state across sockets)
            await trio.sleep(0.005)


async def until_redis(read: Callable[[], Any], expected: object) -> None:
    with trio.fail_after(5):
        while await read() != expected:  # noqa: ASYNC110 (Redis's state)
            await trio.sleep(0.01)


async def open_pair(
    stack: AsyncExitStack, server: RedisServer
) -> tuple[Dispatcher, Dispatcher, coredis.Redis[str]]:
    one, two = [
        await stack.enter_async_context(
            open_dispatcher({"p": 1}, redis_url=server.url, namespace="ns", lease=LEASE)
        )
        for _ in range(2)
    ]
    client = await stack.enter_async_context(
        coredis.Redis.from_url(server.url, decode_responses=True)
    )
    return one, two, client


async def test_a_lost_enqueue_leaves_no_second_entry_to_stall_the_head(
    server: RedisServer, faults: Faults
) -> None:
    granted = trio.Event()
    async with AsyncExitStack() as stack:
        one, two, client = await open_pair(stack, server)
        async with trio.open_nursery() as nursery:
            release = trio.Event()

            async def hold() -> None:
                async with one.slot("p"):
                    await release.wait()

            nursery.start_soon(hold)
            await until(lambda: one.statistics().providers["p"].local_in_flight == 1)
            faults.lose_next.add(node_of(two))

            async def wait() -> None:
                async with two.slot("p"):
                    granted.set()

            nursery.start_soon(wait)
            await until(lambda: bool(faults.lost))
            await until(lambda: two.statistics().providers["p"].backend_up)
            # The waiter is queued once, however many times it was sent.
            await until_redis(lambda: client.zcard("{ns:p}:queue"), 1)
            await trio.sleep(0.1)
            assert await client.zcard("{ns:p}:queue") == 1
            release.set()
            # Served at the release, not after its lost entry expired.
            with trio.fail_after(5):
                await granted.wait()
        assert await client.zcard("{ns:p}:queue") == 0
        assert await client.zcard("{ns:p}:leases") == 0


async def test_a_lease_granted_by_a_lost_round_goes_to_its_waiter(
    server: RedisServer, faults: Faults
) -> None:
    async with AsyncExitStack() as stack:
        one, two, client = await open_pair(stack, server)
        faults.lose_next.add(node_of(two))
        with trio.fail_after(5):
            async with two.slot("p"):
                [lost] = faults.lost
                [member] = lost.granted
                # The lease the lost round granted, not a second one.
                assert await client.zrange("{ns:p}:leases", 0, -1) == (
                    lease_of(member),
                )
                stats = two.statistics().providers["p"]
                assert (stats.granted_total, stats.local_in_flight) == (1, 1)
        await until_redis(lambda: client.zcard("{ns:p}:leases"), 0)
        # The slot is free for the fleet at once.
        with trio.fail_after(5):
            async with one.slot("p"):
                pass


async def test_a_waiter_that_leaves_after_a_lost_grant_gives_the_lease_back(
    server: RedisServer, faults: Faults
) -> None:
    async with AsyncExitStack() as stack:
        one, two, client = await open_pair(stack, server)
        node = node_of(two)
        faults.lose_next.add(node)
        faults.down.add(node)
        with trio.move_on_after(0.3) as waited:
            async with two.slot("p"):
                pytest.fail("granted although no answer came back")
        assert waited.cancelled_caught
        assert len(faults.lost) == 1
        # Redis holds the lease the lost round granted; nobody uses it.
        assert await client.zcard("{ns:p}:leases") == 1
        faults.down.discard(node)
        await until_redis(lambda: client.zcard("{ns:p}:leases"), 0)
        assert await client.zcard("{ns:p}:queue") == 0
        with trio.fail_after(5):
            async with one.slot("p"):
                pass


async def test_a_waiter_that_leaves_after_a_lost_enqueue_leaves_the_queue(
    server: RedisServer, faults: Faults
) -> None:
    async with AsyncExitStack() as stack:
        one, two, client = await open_pair(stack, server)
        async with one.slot("p"):
            node = node_of(two)
            faults.lose_next.add(node)
            faults.down.add(node)
            with trio.move_on_after(0.3):
                async with two.slot("p"):
                    pytest.fail("granted while the only slot was held")
            assert len(faults.lost) == 1
            assert await client.zcard("{ns:p}:queue") == 1
            faults.down.discard(node)
            # Withdrawn, not left to expire with the lease.
            await until_redis(lambda: client.zcard("{ns:p}:queue"), 0)
        await until_redis(lambda: client.zcard("{ns:p}:leases"), 0)
