"""The HTTP half every provider shares: send, check the status, read SSE.

A provider supplies the request and a *decoder*: a small synchronous state
machine (no I/O, no trio) that turns each server-sent event into stream
events and knows whether the stream reached its terminator. Everything
else lives here, once:

* ``_ProviderBase`` holds the httpx client (owned or lent), the timeouts,
  the key and the rate-limit hook, and its repr shows no key.
* ``EventStream`` is what ``stream()`` returns: an async context manager
  that sends the request on entry, raises the typed status error there,
  iterates events, and closes the response on exit, shielded, whatever
  happened.
* httpx's exceptions become ``ProviderError`` subclasses right where they
  are caught: their detail is folded into the message or adds nothing. The
  typed error is raised after the ``except`` clause, so the httpx exception
  (which holds the request, key header included) is not kept as its
  ``__context__`` either.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeVar, final

import httpx
import trio
from httpx_sse import EventSource, ServerSentEvent

from .._converter import describe_error, json_kind, structure
from ..messages import ToolCall
from ._errors import (
    AuthenticationError,
    BadRequest,
    MalformedStream,
    Overloaded,
    ProviderConnectionError,
    ProviderError,
    RateLimited,
    ServerError,
    StreamInterrupted,
)
from ._retry_after import parse_retry_after

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable
    from types import TracebackType

    from ..messages import StreamEvent
    from ._base import RateLimitReporter

# Closing a response never waits on the peer for long, but it is cleanup,
# so it runs shielded (cancellation is level-triggered) and bounded.
_CLOSE_TIMEOUT: Final = 5.0
# After the terminator we read on to the end of the body, so the connection
# can be reused; a server that holds it open gets this long, then we close.
_DRAIN_TIMEOUT: Final = 0.5
# An error body is read for its message only; never all of a huge one.
_ERROR_BODY_LIMIT: Final = 64 * 1024
# How much of a server's own message an exception repeats.
_MESSAGE_LIMIT: Final = 500
_REDACTED: Final = "[redacted]"

_T = TypeVar("_T")


class WireDecoder(Protocol):
    """A wire format's parser: server-sent events in, stream events out.

    Pure and synchronous. ``feed`` raises ``MalformedStream`` for an event
    that makes no sense and the typed error for an error event.
    """

    @property
    def done(self) -> bool:
        """Whether the stream's terminator has arrived."""
        ...

    def feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        """The stream events one server-sent event completes, in order."""
        ...

    def end_of_stream(self) -> list[StreamEvent]:
        """The body ended: the last events, or ``StreamInterrupted``."""
        ...


def _check_timeout(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a non-empty string, got {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def _check_base_url(value: object) -> str:
    url = _check_text(value, "base_url")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


class _ProviderBase:
    """What both HTTP providers share; see ``OpenAIProvider`` for the API."""

    def __init__(
        self,
        id: str,
        *,
        base_url: str,
        api_key: str,
        model: str,
        client: httpx.AsyncClient | None,
        connect_timeout: float,
        read_timeout: float,
        on_rate_limit: RateLimitReporter | None,
    ) -> None:
        self._id = _check_text(id, "id")
        self._base_url = _check_base_url(base_url)
        # Checked without echoing it: a key must not reach a message.
        if not isinstance(api_key, str):
            raise TypeError("api_key must be a non-empty string")
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self._api_key = api_key
        self._model = _check_text(model, "model")
        connect = _check_timeout(connect_timeout, "connect_timeout")
        read = _check_timeout(read_timeout, "read_timeout")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(
                f"client must be an httpx.AsyncClient, got {type(client).__name__}"
            )
        if on_rate_limit is not None and not callable(on_rate_limit):
            raise TypeError("on_rate_limit must be callable")
        self._read_timeout = read
        # Passed with every request, so a lent client gets our timeouts too;
        # the read timeout is what turns a stalled stream into an error.
        self._timeout = httpx.Timeout(
            connect=connect, read=read, write=read, pool=connect
        )
        self._owns_client = client is None
        self._client = httpx.AsyncClient() if client is None else client
        self._on_rate_limit = on_rate_limit

    @property
    def id(self) -> str:
        """The provider's id, as the dispatcher knows it."""
        return self._id

    @property
    def model(self) -> str:
        """The model every request asks for."""
        return self._model

    @property
    def base_url(self) -> str:
        """The API's base URL, without a trailing slash."""
        return self._base_url

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self._id!r}, base_url={self._base_url!r}, "
            f"model={self._model!r})"
        )

    async def aclose(self) -> None:
        """Close the HTTP client, if the provider made it (not if it was lent)."""
        if self._owns_client:
            await self._client.aclose()
        else:
            await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await self.aclose()

    def _open(
        self,
        url: str,
        headers: dict[str, str],
        body: dict[str, Any],
        decoder: WireDecoder,
    ) -> EventStream:
        request = self._client.build_request(
            "POST",
            url,
            headers={
                "accept": "text/event-stream",
                "cache-control": "no-store",
                **headers,
            },
            content=json.dumps(body).encode(),
            timeout=self._timeout,
        )
        return EventStream(self, request, decoder)

    # -- used by EventStream ------------------------------------------------

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, _REDACTED)

    def _report(self, error: ProviderError) -> None:
        if isinstance(error, RateLimited | Overloaded) and self._on_rate_limit:
            self._on_rate_limit(self._id, error.retry_after)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        # The typed error is raised after the except clauses, not in them:
        # httpx's exception holds the request, headers and key included, and
        # would ride along as __context__ (``from None`` only hides it).
        error: ProviderError | None = None
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            error = ProviderConnectionError(
                f"{self._id}: {_timeout_text(exc, self._timeout)} "
                f"(POST {request.url.host}{request.url.path})",
                provider=self._id,
            )
        except httpx.TransportError as exc:
            detail = self._redact(str(exc)) or type(exc).__name__
            error = ProviderConnectionError(
                f"{self._id}: could not reach {request.url.host}: {detail}",
                provider=self._id,
            )
        if error is not None:
            raise error
        checked = False
        try:
            await self._check_status(response)
            checked = True
        finally:
            if not checked:
                await _close_response(response, None)
        return response

    async def _check_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if 200 <= status < 300:
            content_type = response.headers.get("content-type", "")
            if content_type.partition(";")[0].strip().lower() != "text/event-stream":
                raise MalformedStream(
                    f"{self._id}: expected an event stream, got HTTP {status} "
                    f"with content-type {content_type!r}",
                    provider=self._id,
                    status_code=status,
                )
            return
        body = await _read_bounded(response)
        # Redact before error_details shortens: a cut key would slip past.
        text = self._redact(body.decode("utf-8", errors="replace"))
        error_type, message = error_details(text.encode())
        retry_after = parse_retry_after(response.headers, time.time())
        error = error_for_status(
            self._id,
            status,
            error_type=error_type,
            message=message,
            retry_after=retry_after,
        )
        self._report(error)
        raise error


async def _read_bounded(response: httpx.Response) -> bytes:
    """Up to ``_ERROR_BODY_LIMIT`` bytes of the body, then close the response."""
    chunks: list[bytes] = []
    size = 0
    body = response.aiter_bytes()
    try:
        async for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size >= _ERROR_BODY_LIMIT:
                break
    except (httpx.TransportError, httpx.DecodingError):
        pass  # the status says enough; the message is a courtesy
    finally:
        await _close_response(response, body)
    return b"".join(chunks)[:_ERROR_BODY_LIMIT]


async def _close_response(
    response: httpx.Response, body: AsyncIterator[object] | None
) -> None:
    """Close ``response``, then run its body iterator to its end. Shielded.

    httpx and httpcore read a body through a chain of async generators, and
    closing only the outermost one abandons the others, which trio reports
    (a ``ResourceWarning`` each) when they are garbage collected. With the
    connection closed first, the next step fails at the bottom of the chain
    and the failure finishes every generator on its way up.
    """
    with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
        await response.aclose()
        if body is not None:
            with contextlib.suppress(Exception):  # expected: the connection is closed
                async for _ in body:
                    pass


def _timeout_text(exc: httpx.TimeoutException, timeout: httpx.Timeout) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"could not connect within {timeout.connect:g} s"
    if isinstance(exc, httpx.PoolTimeout):
        return f"no free connection within {timeout.pool:g} s"
    if isinstance(exc, httpx.WriteTimeout):
        return f"could not send the request within {timeout.write:g} s"
    return f"no response within {timeout.read:g} s"


def error_details(body: bytes) -> tuple[str | None, str]:
    """``(error type, message)`` from an error body, in either API's shape.

    Both OpenAI (``{"error": {"message", "type", "code"}}``) and Anthropic
    (``{"type": "error", "error": {"type", "message"}}``) nest the details
    under ``error``; anything else is shown as text.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return None, _shorten(text)
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        error_type = error.get("type")
        code = error.get("code")
        message = error.get("message")
        kind = error_type if isinstance(error_type, str) and error_type else None
        if isinstance(code, str) and code and code != kind:
            kind = f"{kind} ({code})" if kind else code
        return kind, _shorten(message if isinstance(message, str) else text)
    if isinstance(error, str):
        return None, _shorten(error)
    return None, _shorten(text)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MESSAGE_LIMIT:
        return text[: _MESSAGE_LIMIT - 3] + "..."
    return text


def error_for_status(
    provider: str,
    status: int,
    *,
    error_type: str | None,
    message: str,
    retry_after: float | None,
) -> ProviderError:
    """The typed error for an HTTP status; the status decides the class."""
    what = f"HTTP {status}" + (f" {error_type}" if error_type else "")
    text = f"{provider}: {what}" + (f": {message}" if message else "")
    if status == 429:
        return RateLimited(
            text + _retry_after_text(retry_after),
            provider=provider,
            status_code=status,
            retry_after=retry_after,
        )
    if status in (503, 529):
        return Overloaded(
            text + _retry_after_text(retry_after),
            provider=provider,
            status_code=status,
            retry_after=retry_after,
        )
    if status >= 500:
        return ServerError(text, provider=provider, status_code=status)
    if status in (401, 403):
        return AuthenticationError(text, provider=provider, status_code=status)
    # Other 4xx, and statuses an API should never answer a POST with (a
    # redirect means a wrong base_url): sending again will not help.
    return BadRequest(text, provider=provider, status_code=status)


def error_for_type(provider: str, error_type: str, message: str) -> ProviderError:
    """The typed error for an error reported inside a stream, by its type.

    Knows both APIs' vocabularies (``rate_limit_error``,
    ``rate_limit_exceeded``, ``overloaded_error``, ``invalid_request_error``,
    ...); an unknown type is taken for a server-side failure.
    """
    text = f"{provider}: {error_type} in the stream" + (
        f": {message}" if message else ""
    )
    kind = error_type.lower()
    if "rate_limit" in kind:
        return RateLimited(text, provider=provider)
    if "overloaded" in kind or "unavailable" in kind:
        return Overloaded(text, provider=provider)
    if any(word in kind for word in ("authentication", "permission", "api_key")):
        return AuthenticationError(text, provider=provider)
    if any(word in kind for word in ("invalid_request", "not_found", "too_large")):
        return BadRequest(text, provider=provider)
    return ServerError(text, provider=provider)


def _retry_after_text(retry_after: float | None) -> str:
    return "" if retry_after is None else f" (retry after {retry_after:g} s)"


# A decoder's fast path parses with this: on a small chunk, json.loads
# spends a quarter to a half of its time around it (two whitespace regexes,
# three calls). Data it does not take whole, (value, end) with end ==
# len(data), goes to the full path and parse_json_data, which accept or
# refuse it as always.
raw_json: Final = json.JSONDecoder().raw_decode


def parse_json_data(
    provider: str, event: ServerSentEvent, redact: Callable[[str], str] = str
) -> object:
    """An event's ``data`` as JSON, or ``MalformedStream`` naming the problem."""
    try:
        return json.loads(event.data)
    except (ValueError, RecursionError) as exc:
        data = redact(event.data)  # before the cut, which could halve a key
        excerpt = data if len(data) <= 80 else data[:77] + "..."
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise MalformedStream(
            f"{provider}: an event's data is not valid JSON ({reason}): {excerpt!r}",
            provider=provider,
        ) from None


@final
class EventStream:
    """One request's answer: entered to send, iterated for events.

    Returned by a provider's ``stream()``; see ``Provider`` for the rules.
    It may be entered once.
    """

    def __init__(
        self, provider: _ProviderBase, request: httpx.Request, decoder: WireDecoder
    ) -> None:
        self._provider = provider
        self._request = request
        self._decoder = decoder
        self._state = "new"  # -> "open" -> "closed"
        self._finished = False
        self._pending: collections.deque[StreamEvent] = collections.deque()
        self._response: httpx.Response | None = None
        self._events: AsyncGenerator[ServerSentEvent, None] | None = None

    def __repr__(self) -> str:
        return f"<EventStream {self._provider.id!r} {self._state}>"

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("a provider stream can be entered only once")
        self._state = "open"
        try:
            self._response = await self._provider._send(self._request)
        except BaseException:
            self._state = "closed"
            raise
        self._events = EventSource(self._response).aiter_sse()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._state = "closed"
        if self._response is not None:
            await _close_response(self._response, self._events)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._state != "open":
            raise RuntimeError("iterate a provider stream inside its async with block")
        pending = self._pending
        if pending:
            await trio.lowlevel.checkpoint()
            return pending.popleft()
        if self._finished:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        assert self._events is not None
        # Every chunk passes here: the next server-sent event is read in
        # place, not through a helper coroutine, and a lone event (the
        # common case) skips the deque.
        read = self._events.__anext__
        decoder = self._decoder
        try:
            while True:
                if decoder.done:
                    await self._drain()
                    self._finished = True
                    raise StopAsyncIteration
                # Raised after the except clauses, as in _send: no httpx
                # exception (holding the request and its key) as __context__.
                failure: ProviderError | None = None
                try:
                    sse = await read()
                except StopAsyncIteration:
                    sse = None
                except (httpx.TransportError, httpx.DecodingError) as exc:
                    failure = self._read_error(exc)
                if failure is not None:
                    raise failure
                events = self._end_of_body() if sse is None else decoder.feed(sse)
                if events:
                    break
        except ProviderError as error:
            self._finished = True
            # A server could echo the key in an error event; it stops here.
            error.args = tuple(
                self._provider._redact(arg) if isinstance(arg, str) else arg
                for arg in error.args
            )
            self._provider._report(error)
            raise
        if len(events) > 1:
            pending.extend(events[1:])
        return events[0]

    def _end_of_body(self) -> list[StreamEvent]:
        """The decoder's last events, or ``StopAsyncIteration`` if none."""
        self._finished = True
        events = self._decoder.end_of_stream()
        if not events:
            raise StopAsyncIteration
        return events

    def _read_error(
        self, exc: httpx.TransportError | httpx.DecodingError
    ) -> ProviderError:
        """The typed error for a failure reading the body."""
        provider = self._provider
        if isinstance(exc, httpx.TimeoutException):
            return ProviderConnectionError(
                f"{provider.id}: the stream stalled: no data for "
                f"{provider._read_timeout:g} s",
                provider=provider.id,
            )
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
            return StreamInterrupted(
                f"{provider.id}: the connection dropped in the middle of the stream",
                provider=provider.id,
            )
        if isinstance(exc, httpx.TransportError):
            return ProviderConnectionError(
                f"{provider.id}: the stream failed: {type(exc).__name__}",
                provider=provider.id,
            )
        # A corrupt compressed body: httpx raises this between its own body
        # generators, abandoning the inner ones, so trio will also warn about
        # them; there is no reaching them from here.
        return MalformedStream(  # pragma: no cover (no test makes httpx do it)
            f"{provider.id}: the stream's body could not be decoded",
            provider=provider.id,
        )

    async def _drain(self) -> None:
        """Read past the terminator to the end of the body, briefly.

        A body read to its end lets httpx reuse the connection; one that is
        not is closed on exit, which is also fine.
        """
        assert self._events is not None
        with trio.move_on_after(_DRAIN_TIMEOUT):
            try:
                async for _ in self._events:
                    pass
            except (httpx.TransportError, httpx.DecodingError):
                pass  # the answer is complete; the connection is closed on exit


def structure_event(provider: str, data: object, cls: type[_T], what: str) -> _T:
    """``data`` as ``cls``, or ``MalformedStream`` naming every wrong field."""
    try:
        return structure(data, cls)
    except Exception as exc:  # cattrs raises several kinds; nothing awaits here
        raise MalformedStream(
            f"{provider}: {what} does not fit the format: {describe_error(exc)}",
            provider=provider,
        ) from None


def make_tool_call(call_id: str, name: str, raw_arguments: str) -> ToolCall:
    """A ``ToolCall`` with its arguments parsed, or the reason they did not."""
    if not raw_arguments.strip():
        # A tool without parameters may get no argument text at all.
        return ToolCall(call_id, name, {}, raw_arguments)
    try:
        arguments = json.loads(raw_arguments)
    except (ValueError, RecursionError) as exc:
        return ToolCall(
            call_id, name, {}, raw_arguments, f"arguments are not valid JSON: {exc}"
        )
    if not isinstance(arguments, dict):
        return ToolCall(
            call_id,
            name,
            {},
            raw_arguments,
            f"arguments must be a JSON object, got {json_kind(arguments)}",
        )
    return ToolCall(call_id, name, arguments, raw_arguments)
