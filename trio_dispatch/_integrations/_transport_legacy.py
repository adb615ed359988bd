"""``Dispatcher.transport`` for code still on the legacy ``httpx``.

The same transport as ``_transport``'s, built on httpx's own base classes
(an ``httpx.AsyncClient`` takes nothing else); the holding is shared.
Imported only when ``inner`` is an ``httpx.AsyncBaseTransport``.
"""

from __future__ import annotations

from typing import final

import httpx

from ._transport import HeldBodyBase, TransportBase


@final
class _LegacyHeldBody(HeldBodyBase, httpx.AsyncByteStream):
    """An httpx response body that holds its call's slot until it is closed."""


@final
class LegacyDispatchTransport(
    TransportBase[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport
):
    """``Dispatcher.transport`` around an httpx transport."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``, holding a slot first if it is a model call."""
        response: httpx.Response = await self._handle(request, httpx, _LegacyHeldBody)
        return response
