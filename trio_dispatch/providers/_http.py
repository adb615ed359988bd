"""The HTTP half every provider shares: send, check the status, read SSE.

A provider supplies its wire format's path, headers, body and decoder
(``WireDecoder``, in ``_decode.py``). Everything else lives here, once:

* ``ProviderBase`` holds the httpx2 client (owned or lent), the timeouts,
  the key and the rate-limit hooks (``RateLimitHooks``, in ``.._hooks``),
  and its repr shows no key. Every answer's headers are read once,
  whatever its status: their rate-limit figures travel with the answer
  (``EventStream.rate_limits``, or the status error's ``rate_limits``) and
  go to ``on_rate_limits``. What it is made with is checked in
  ``_checks.py``.
* ``EventStream`` is what ``stream()`` returns: an async context manager
  that sends the request on entry, raises the typed status error there,
  iterates events, and closes the response on exit, shielded, whatever
  happened. The body's bytes go through ``SSEDecoder`` (``_sse.py``), then
  through the wire format's decoder. The read timeout counts the time
  spent reading without an event, not without a byte: a server that sends
  only comments (``: keepalive``) stalls like one that sends nothing, and
  a consumer's own time between reads is never a stall.
* What goes wrong becomes a ``ProviderError`` subclass right where it is
  caught, through the mappings in ``_errors.py``, and is raised after the
  ``except`` clause, so the httpx2 exception (which holds the request, key
  header included) is not kept as its ``__context__``.
"""

from __future__ import annotations

import collections
import contextlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Self, final

import httpx2
import trio

from .._exceptions import MalformedStream, ProviderError, RequestFailed
from .._integrations._hooks import RateLimitHooks
from .._provider import PROVIDER_USAGE, STREAM_USAGE
from .._util import wrong_with
from .._validation import check_seconds, redact_url
from ..messages._chat import check_chat_request
from ._checks import check_api_key, check_base_url, check_headers, check_secret_text
from ._errors import (
    ERROR_BODY_LIMIT,
    Redactor,
    client_type_error,
    content_type_error,
    read_error,
    send_error,
    stalled_error,
    status_error,
)
from ._ratelimit_headers import MalformedHeaderLog
from ._sse import EventTooLarge, SSEDecoder

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

    from .._policy._ratelimits import RateLimitInfo
    from .._provider import RateLimitObserver, RateLimitReporter
    from ..messages import ChatRequest, StreamEvent
    from ._decode import WireDecoder
    from ._sse import ServerSentEvent

# Closing a response never waits on the peer for long, but it is cleanup,
# so it runs shielded (cancellation is level-triggered) and bounded.
_CLOSE_TIMEOUT: Final = 5.0
# After the terminator we read on to the end of the body, so the connection
# can be reused; a server that holds it open gets this long, then we close.
_DRAIN_TIMEOUT: Final = 0.5


class ProviderBase:
    """What both HTTP providers share; see ``OpenAIProvider`` for the API."""

    def __init__(
        self,
        id: str,
        *,
        base_url: str,
        api_key: str,
        model: str,
        client: httpx2.AsyncClient | None,
        connect_timeout: float,
        read_timeout: float,
        extra_headers: Mapping[str, str] | None,
        on_rate_limit: RateLimitReporter | None,
        on_rate_limits: RateLimitObserver | None,
        path: str,
        key_header: tuple[str, str],
        headers: Mapping[str, str],
        body: Callable[[ChatRequest], dict[str, Any]],
        decoder: Callable[[str, Redactor], WireDecoder],
        read_rate_limits: Callable[..., RateLimitInfo],
    ) -> None:
        """The wire format's part: requests go to ``path`` under ``base_url``.

        Each carries the key as ``key_header`` (its name, and the text
        before the key), then ``headers``, the JSON ``body`` of the
        request, and is read by a fresh ``decoder(id, redact)``; the
        answer's headers by ``read_rate_limits``.
        """
        extra = check_headers(extra_headers)
        self._id = check_secret_text(id, "id")
        self._base_url = check_base_url(base_url)
        # Checked without echoing it: a key must not reach a message.
        self._api_key = check_api_key(api_key)
        self._redact = Redactor(self._api_key)
        self._model = check_secret_text(model, "model")
        connect = check_seconds(connect_timeout, "connect_timeout", positive=True)
        read = check_seconds(read_timeout, "read_timeout", positive=True)
        if client is not None and not isinstance(client, httpx2.AsyncClient):
            raise client_type_error(client)
        self._hooks = RateLimitHooks(
            self._id, on_rate_limit, on_rate_limits, model=self._model
        )
        self._read_timeout = read
        # Passed with every request, so a lent client gets our timeouts too;
        # the read timeout is what turns a stalled stream into an error.
        self._timeout = httpx2.Timeout(
            connect=connect, read=read, write=read, pool=connect
        )
        self._owns_client = client is None
        self._client = httpx2.AsyncClient() if client is None else client
        self._read_rate_limits = read_rate_limits
        self._url = f"{self._base_url}{path}"
        name, prefix = key_header
        # The same for every request: the key and every header are checked.
        self._headers = {
            "accept": "text/event-stream",
            "cache-control": "no-store",
            **extra,
            name: f"{prefix}{self._api_key}",
            **headers,
            "content-type": "application/json",
        }
        self._body = body
        self._decoder = decoder
        self._malformed_headers = MalformedHeaderLog(self._id, self._redact)

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
            f"{type(self).__name__}(id={self._id!r}, "
            f"base_url={redact_url(self._base_url)!r}, "
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

    async def __aexit__(self, *exc_info: object) -> None:
        with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await self.aclose()

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(PROVIDER_USAGE)

    def stream(self, request: ChatRequest) -> EventStream:
        """Stream the answer to ``request``; see ``Provider.stream``.

        Nothing is sent until the returned context manager is entered.

        Raises:
            TypeError: ``request`` is not a ``ChatRequest``.
        """
        check_chat_request(request)
        try:
            content = json.dumps(self._body(request)).encode()
        except RecursionError:
            reason = "it nests too deeply"
        except (TypeError, ValueError) as exc:
            reason = str(exc)  # names a type, or a circular reference
        else:
            http_request = self._client.build_request(
                "POST",
                self._url,
                headers=self._headers,
                content=content,
                timeout=self._timeout,
            )
            return EventStream(
                self, http_request, self._decoder(self._id, self._redact)
            )
        raise RequestFailed(
            f"{self._id}: the request cannot be encoded as JSON: {reason}",
            provider=self._id,
        )

    # -- used by EventStream ------------------------------------------------

    def _observe(
        self, headers: Mapping[str, str], hooks: RateLimitHooks
    ) -> RateLimitInfo | None:
        """What an answer's headers say of the limits; its ``hooks`` are told.

        Called once per answer, as soon as its headers are in. ``None`` if
        they say nothing.
        """
        info = self._read_rate_limits(
            headers, now=datetime.now(UTC), on_malformed=self._malformed_headers
        )
        if info.empty:
            return None
        hooks.observe(info)
        return info

    async def _send(
        self, request: httpx2.Request, hooks: RateLimitHooks
    ) -> tuple[httpx2.Response, RateLimitInfo | None]:
        """The answer to ``request``, and its rate-limit figures; or its error.

        ``hooks``: the answer's, told its figures and its rate limit.
        """
        if self._client.is_closed:
            raise RequestFailed(
                f"{self._id}: the HTTP client is closed", provider=self._id
            )
        # The typed error is raised after the except clause, not in it:
        # httpx2's exception holds the request, headers and key included, and
        # would ride along as __context__ (``from None`` only hides it).
        error: ProviderError | None = None
        try:
            response = await self._client.send(request, stream=True)
        except Exception as exc:
            # Whatever the client raises fails this request, not the
            # dispatcher. Cancelled and KeyboardInterrupt are BaseExceptions,
            # as is any group holding one, so they are never caught here.
            error = send_error(self._id, exc, request, self._timeout, self._redact)
        if error is not None:
            raise error
        checked = False
        try:
            info = self._observe(response.headers, hooks)
            await self._check_status(response, info, hooks)
            checked = True
        finally:
            if not checked:
                await _close_response(response, None)
        return response, info

    async def _check_status(
        self,
        response: httpx2.Response,
        info: RateLimitInfo | None,
        hooks: RateLimitHooks,
    ) -> None:
        """Raise the typed error of an answer that is not a stream of events.

        Every answer's status line and headers are first seen here; the
        error carries their rate-limit figures, ``info``.
        """
        status = response.status_code
        if 200 <= status < 300:
            content_type = response.headers.get("content-type", "")
            wrong = content_type_error(self._id, status, content_type)
            if wrong is not None:
                wrong.rate_limits = info
                raise wrong
            return
        # A key the limit cuts in two is read whole, to be redacted whole.
        limit = ERROR_BODY_LIMIT + self._redact.slack
        body = await _read_bounded(response, limit)
        error = status_error(self._id, status, response.headers, body, self._redact)
        error.rate_limits = info
        hooks.report(error)
        raise error


async def _read_bounded(response: httpx2.Response, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body, then close the response."""
    chunks: list[bytes] = []
    size = 0
    body = response.aiter_bytes()
    try:
        async for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    except Exception:  # not BaseException: Cancelled goes on
        pass  # the status says enough; the message is a courtesy
    finally:
        await _close_response(response, body)
    return b"".join(chunks)[:limit]


async def _close_response(
    response: httpx2.Response, body: AsyncIterator[object] | None
) -> None:
    """Close ``response``, then run its body iterator to its end. Shielded.

    httpx2 reads a body through a chain of async generators, and
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


@final
class EventStream:
    """One request's answer: entered to send, iterated for events.

    Returned by a provider's ``stream()``; see ``Provider`` for the rules.
    It may be entered once.

    Attributes:
        rate_limit_hooks: The callbacks the answer tells of its figures
            and its rate limit: the provider's, or none once a dispatcher
            meters it (``Meter.metered``).
    """

    def __init__(
        self, provider: ProviderBase, request: httpx2.Request, decoder: WireDecoder
    ) -> None:
        self._provider = provider
        self._request = request
        self._decoder = decoder
        self.rate_limit_hooks = provider._hooks
        self._state = "new"  # -> "open" -> "closed"
        self._finished = False
        self._pending: collections.deque[StreamEvent] = collections.deque()
        self._response: httpx2.Response | None = None
        self._body: AsyncGenerator[bytes, None] | None = None
        self._sse = SSEDecoder()
        # Server-sent events already decoded from the body, not yet fed.
        self._sse_pending: collections.deque[ServerSentEvent] = collections.deque()
        self._rate_limits: RateLimitInfo | None = None
        # Seconds of reading left before the stream has stalled unless an
        # event comes: reads that end no event use it up, an event fills it
        # again, and the consumer's time between reads is not counted.
        self._quiet_left = provider._read_timeout

    def __repr__(self) -> str:
        return f"<EventStream {self._provider.id!r} {self._state}>"

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(STREAM_USAGE)

    @property
    def rate_limits(self) -> RateLimitInfo | None:
        """What the answer's headers said of the account's rate limits.

        Set once entered; ``None`` before, or if the headers said nothing.
        """
        return self._rate_limits

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("a provider stream can be entered only once")
        self._state = "open"
        try:
            self._response, self._rate_limits = await self._provider._send(
                self._request, self.rate_limit_hooks
            )
        except BaseException:
            self._state = "closed"
            raise
        self._body = self._response.aiter_bytes()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._state = "closed"
        if self._response is not None:
            await _close_response(self._response, self._body)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamEvent:  # noqa: PLR0912, PLR0915 (the hot loop, kept whole)
        if self._state != "open":
            raise RuntimeError("iterate a provider stream inside its async with block")
        pending = self._pending
        if pending:
            await trio.lowlevel.checkpoint()
            return pending.popleft()
        if self._finished:
            await trio.lowlevel.checkpoint()
            raise StopAsyncIteration
        assert self._body is not None
        # Every chunk passes here: the body's next bytes are read in place,
        # not through a helper coroutine, the server-sent events of one read
        # wait in a deque, and a lone event (the common case) skips it.
        read = self._body.__anext__
        split = self._sse.feed
        queued = self._sse_pending
        decoder = self._decoder
        try:
            while True:
                if decoder.done:
                    await self._drain()
                    self._finished = True
                    raise StopAsyncIteration
                if queued:
                    events = decoder.feed(queued.popleft())
                else:
                    # Raised after the except clauses, as in _send: no httpx2
                    # exception (holding the request and its key) as
                    # __context__.
                    failure: ProviderError | None = None
                    # httpx2's read timeout restarts with every byte, even a
                    # comment's; this allowance only with an event.
                    began = trio.current_time()
                    with trio.move_on_at(began + self._quiet_left) as quiet:
                        try:
                            chunk = await read()
                        except StopAsyncIteration:
                            chunk = None
                        except Exception as exc:
                            # As in _send: whatever it is fails this stream
                            # only, and Cancelled (a BaseException) is never
                            # caught.
                            failure = read_error(
                                self._provider.id,
                                exc,
                                self._provider._read_timeout,
                                self._provider._redact,
                            )
                    if quiet.cancelled_caught:
                        failure = stalled_error(
                            self._provider.id, self._provider._read_timeout
                        )
                    if failure is not None:
                        raise failure
                    if chunk is None:
                        events = self._end_of_body()
                    else:
                        sses = split(chunk)
                        if not sses:
                            self._quiet_left -= trio.current_time() - began
                            continue
                        self._quiet_left = self._provider._read_timeout
                        if len(sses) > 1:
                            queued.extend(sses[1:])
                        events = decoder.feed(sses[0])
                if events:
                    break
        except (ProviderError, EventTooLarge) as caught:
            error = self._failed(caught)
            if error is caught:
                raise
            raise error from None
        if len(events) > 1:
            pending.extend(events[1:])
        return events[0]

    def _failed(self, caught: ProviderError | EventTooLarge) -> ProviderError:
        """The stream failed with ``caught``: its error, scrubbed and reported.

        An event too large to hold is a malformed stream.
        """
        self._finished = True
        error = (
            caught
            if isinstance(caught, ProviderError)
            else MalformedStream(
                f"{self._provider.id}: {caught}", provider=self._provider.id
            )
        )
        # A server could echo the key in an error event; it stops here.
        self._provider._redact.scrub(error)
        self.rate_limit_hooks.report(error)
        return error

    def _end_of_body(self) -> list[StreamEvent]:
        """The decoder's last events, or ``StopAsyncIteration`` if none.

        An event the body left unfinished (no blank line after it) is
        discarded, as the specification says.
        """
        self._finished = True
        events = self._decoder.end_of_stream()
        if not events:
            raise StopAsyncIteration
        return events

    async def _drain(self) -> None:
        """Read past the terminator to the end of the body, briefly.

        A body read to its end lets httpx2 reuse the connection; one that is
        not is closed on exit, which is also fine.
        """
        assert self._body is not None
        with trio.move_on_after(_DRAIN_TIMEOUT):
            try:
                async for _ in self._body:
                    pass
            except Exception:  # not BaseException: Cancelled goes on
                pass  # the answer is complete; the connection is closed on exit
