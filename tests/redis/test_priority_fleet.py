"""Priority classes across processes: the shared queue ranks as one process does."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import open_dispatcher

from .._redis import RedisServer, needs_redis

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher

pytestmark = needs_redis


async def _until_waiting(fleet: list[Dispatcher], count: int) -> None:
    # Real time: the queue lives in Redis, across sockets.
    with trio.fail_after(5):
        while any(d.statistics().providers["p"].waiting != count for d in fleet):  # noqa: ASYNC110 (state across sockets)
            await trio.sleep(0.005)


@pytest.mark.parametrize(
    ("aging", "expected"),
    [
        # Class 1 first, each class oldest first.
        (60.0, ["r2", "r6", "l1", "l3"]),
        # Ranks: l1 1, l3 3, r2 2 - 2 = 0, r6 6 - 2 = 4.
        (2.0, ["r2", "l1", "l3", "r6"]),
    ],
)
async def test_the_fleet_grants_by_class_with_the_same_aging(
    server: RedisServer, aging: float, expected: list[str]
) -> None:
    order: list[str] = []
    async with AsyncExitStack() as stack:
        holder, left, right = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": 1},
                    redis_url=server.url,
                    namespace="classes",
                    lease=1.5,
                    priority_aging=aging,
                )
            )
            for _ in range(3)
        ]

        async def wait(
            dispatcher: Dispatcher, name: str, started_at: float, priority: int
        ) -> None:
            async with dispatcher.slot("p", started_at=started_at, priority=priority):
                order.append(name)
                await trio.sleep(0.01)

        release = trio.Event()
        async with trio.open_nursery() as nursery:

            async def hold() -> None:
                async with holder.slot("p"):
                    await release.wait()

            nursery.start_soon(hold)
            with trio.fail_after(5):
                while holder.statistics().providers["p"].local_in_flight != 1:  # noqa: ASYNC110 (state across sockets)
                    await trio.sleep(0.005)
            now = trio.current_time()
            for dispatcher, name, age, priority in [
                (left, "l3", 3, 0),
                (right, "r6", 6, 1),
                (left, "l1", 1, 0),
                (right, "r2", 2, 1),
            ]:
                nursery.start_soon(wait, dispatcher, name, now - 10 + age, priority)
            await _until_waiting([left, right], 4)
            release.set()
    assert order == expected
