"""What the admin app and the fake LLM server share of ASGI 3.

Both are served by hypercorn on trio; both answer the lifespan protocol
the same way, having nothing to start or stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

Message: TypeAlias = "dict[str, Any]"
Receive: TypeAlias = "Callable[[], Awaitable[Message]]"
Send: TypeAlias = "Callable[[Message], Awaitable[None]]"


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer a lifespan scope: started at once, stopped at once."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
