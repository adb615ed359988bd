"""An httpx2 transport that serves an ASGI app in the same trio run, streaming.

``httpx2.ASGITransport`` runs the app to its end and hands back the whole
body at once, so a stream's timing (the first token, the time between two)
is lost, and a client that leaves early is never heard by the app.
``StreamingASGITransport`` runs each request's app call in a task of its
own and passes the body on chunk by chunk as the app sends it, with no
socket: under ``trio.testing.MockClock`` a fake server's pacing is exact
virtual time. Closing the response tells the app ``http.disconnect``.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Self, final

import httpx2
import trio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping
    from types import TracebackType

    _App = Callable[..., Awaitable[None]]


@final
class _Body(httpx2.AsyncByteStream):
    """A response body as the app sends it; closing it disconnects the app.

    Its own iterator, not an async generator: a reader that leaves it
    unfinished leaves nothing for the garbage collector to finalise.
    """

    def __init__(
        self,
        chunks: trio.MemoryReceiveChannel[bytes],
        disconnect: trio.Event,
        failure: list[Exception],
    ) -> None:
        self._chunks = chunks
        self._disconnect = disconnect
        self._failure = failure

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chunks.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            if self._failure:
                # The app failed mid-body: the client's read fails with it.
                raise self._failure[0] from None
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._disconnect.set()
        await self._chunks.aclose()


@final
class StreamingASGITransport(httpx2.AsyncBaseTransport):
    """Serve ``app`` (an ASGI 3 application) to an ``httpx2.AsyncClient``, streaming.

    Use it inside the client's ``async with`` (which enters the transport:
    the app's calls run in its nursery, cancelled when it closes)::

        async with httpx2.AsyncClient(transport=StreamingASGITransport(app)) as client:
            ...

    An exception the app raises reaches the client: from the request if
    the app had not started its response, else from reading the body
    after the chunks sent before it.

    Raises:
        RuntimeError: A request is sent before the transport is entered
            or after it closed, or the app ended without a response.
    """

    def __init__(
        self, app: _App, *, client: tuple[str, int] = ("127.0.0.1", 123)
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI application, got {app!r}")
        self._app = app
        self._client = client
        self._nursery: trio.Nursery | None = None
        self._stack = contextlib.AsyncExitStack()

    def __repr__(self) -> str:
        return f"<StreamingASGITransport {self._app!r}>"

    async def __aenter__(self) -> Self:
        if self._nursery is not None:
            raise RuntimeError("a StreamingASGITransport can be entered only once")
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel every app call still running, and wait for them."""
        nursery = self._nursery
        if nursery is not None:
            nursery.cancel_scope.cancel()
        await self._stack.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        nursery = self._nursery
        if nursery is None:
            raise RuntimeError(
                "StreamingASGITransport serves only inside its client's `async with`"
            )
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]  # an async request's stream
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": self._client,
            "root_path": "",
        }
        send_chunk, chunks = trio.open_memory_channel[bytes](math.inf)
        started = trio.Event()
        disconnect = trio.Event()
        response: dict[str, Any] = {}
        failure: list[Exception] = []
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["headers"] = message.get("headers", [])
                started.set()
            elif message["type"] == "http.response.body":
                data = message.get("body", b"")
                if data:
                    try:
                        send_chunk.send_nowait(data)
                    except trio.ClosedResourceError:
                        disconnect.set()  # the client left
                if not message.get("more_body", False):
                    send_chunk.close()

        async def serve() -> None:
            try:
                await self._app(scope, receive, send)
            except Exception as exc:  # the client's to meet (see above)
                failure.append(exc)
            finally:
                send_chunk.close()
                started.set()

        nursery.start_soon(serve)
        await started.wait()
        if "status" not in response:
            if failure:
                raise failure[0]
            raise RuntimeError("the app ended without a response")
        return httpx2.Response(
            response["status"],
            headers=response["headers"],
            stream=_Body(chunks, disconnect, failure),
            request=request,
        )
