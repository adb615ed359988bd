"""``Dispatcher.transport`` for code still on the legacy ``httpx``.

The same transport as ``_transport``'s, built on httpx's own base classes
(an ``httpx.AsyncClient`` takes nothing else); the holding is shared.
Imported only when ``inner`` is an ``httpx.AsyncBaseTransport``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import httpx

from ._transport import HeldChunks, Hold, RateLimitReader, takes_slot

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from ._dispatcher import Dispatcher


@final
class _LegacyHeldBody(httpx.AsyncByteStream):
    """A response body that holds its call's slot until it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, hold: Hold) -> None:
        self._inner = inner
        self._hold = hold
        self._chunks: HeldChunks | None = None
        hold.watch(self.aclose)

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._chunks = HeldChunks(self._inner.__aiter__(), self._hold, self.aclose)
        return self._chunks

    async def aclose(self) -> None:
        await self._hold.close(self._inner.aclose)
        if self._chunks is not None:
            # Closed before its end: the inner iterator is closed too.
            await self._chunks.close_inner()


@final
class LegacyDispatchTransport(httpx.AsyncBaseTransport):
    """``Dispatcher.transport`` around an httpx transport."""

    def __init__(
        self, dispatcher: Dispatcher, provider: str, inner: httpx.AsyncBaseTransport
    ) -> None:
        self._dispatcher = dispatcher
        self._provider = provider
        self._inner = inner
        self._reader = RateLimitReader(provider)

    def __repr__(self) -> str:
        return f"<trio_dispatch transport {self._provider!r} inner={self._inner!r}>"

    async def __aenter__(self) -> LegacyDispatchTransport:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_value, traceback)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``, holding a slot first if it is a model call."""
        if not takes_slot(request.method, request.url.path):
            return await self._inner.handle_async_request(request)
        try:
            content: bytes | None = request.content
        except httpx.RequestNotRead:
            content = None
        hold = await Hold.take(self._dispatcher, self._provider, self._reader, content)
        try:
            with hold.timed():
                response = await self._inner.handle_async_request(request)
            hold.answered(response.status_code, response.headers)
        except BaseException:
            hold.give_back()
            raise
        if response.is_closed:
            # Its body was read already (a mock's): nothing more on the wire.
            hold.give_back()
        else:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _LegacyHeldBody(response.stream, hold)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
