"""The events of a dispatcher that shares its limits through Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from trio_dispatch import open_dispatcher
from trio_dispatch.events import (
    Granted,
    LimitChanged,
    Paused,
    Queued,
    Released,
    Resumed,
)

from .._events import record
from .._redis import needs_redis

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher
    from trio_dispatch.events import DispatchEvent

    from .._redis import RedisServer

pytestmark = needs_redis


async def until(events: list[DispatchEvent], count: int) -> None:
    """Wait (real time: the state lives in Redis) until ``count`` events came."""
    with trio.fail_after(5):
        while len(events) < count:  # noqa: ASYNC110 (events come through Redis rounds)
            await trio.sleep(0.005)


async def test_the_shared_scheduler_tells_the_same_story(server: RedisServer) -> None:
    events: list[DispatchEvent] = []
    release = trio.Event()

    async def hold(dispatcher: Dispatcher, name: str) -> None:
        async with dispatcher.slot(
            "p", conversation_id=name, tenant=f"tenant-{name}", model="m"
        ):
            await release.wait()

    async with (
        open_dispatcher(
            {"p": 1}, redis_url=server.url, namespace="events", lease=1.5
        ) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        nursery.start_soon(hold, dispatcher, "a")
        await until(events, 2)
        nursery.start_soon(hold, dispatcher, "b")
        await until(events, 3)
        release.set()
        await until(events, 6)
        dispatcher.set_limit("p", 2)
        await until(events, 7)
        dispatcher.report_rate_limit("p", 0.2)
        await until(events, 8)
        # The fleet's pause is seen to end by the next round after it.
        await trio.sleep(0.3)
        nursery.start_soon(hold, dispatcher, "c")
        await until(events, 12)
        nursery.cancel_scope.cancel()
    kinds = [(type(e), getattr(e, "conversation_id", None)) for e in events]
    assert kinds == [
        (Queued, "a"),
        (Granted, "a"),
        (Queued, "b"),
        (Released, "a"),
        (Granted, "b"),
        (Released, "b"),
        (LimitChanged, None),
        (Paused, None),
        (Queued, "c"),
        (Resumed, None),
        (Granted, "c"),
        (Released, "c"),
    ]
    # Each request's events name its tenant and model, as the local ones do.
    assert [
        (getattr(e, "tenant", None), getattr(e, "model", None)) for e in events
    ] == [
        (f"tenant-{who}", "m") if who is not None else (None, None) for _, who in kinds
    ]
    granted_b = events[4]
    assert isinstance(granted_b, Granted)
    assert granted_b.wait is not None
    assert granted_b.wait > 0
    assert (granted_b.in_flight, granted_b.waiting) == (1, 0)
    limit = events[6]
    assert isinstance(limit, LimitChanged)
    assert (limit.limit, limit.previous) == (2, 1)
