"""Reading a dispatcher's events in tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher
    from trio_dispatch.events import DispatchEvent, EventSubscription


async def record(
    dispatcher: Dispatcher,
    into: list[DispatchEvent],
    *,
    buffer: int = 1024,
    task_status: trio.TaskStatus[EventSubscription] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Append every event of ``dispatcher`` to ``into`` until it closes.

    Start it with ``nursery.start``: it returns the subscription once it is
    subscribed, so nothing that follows is missed.
    """
    async with dispatcher.events(buffer=buffer) as events:
        task_status.started(events)
        async for event in events:
            into.append(event)
