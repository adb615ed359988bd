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
import re
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeVar, final

import httpx
import trio
from httpx_sse import EventSource, ServerSentEvent

from .._converter import describe_error, structure
from .._exceptions import (
    MalformedStream,
    Overloaded,
    ProviderConnectionError,
    ProviderError,
    RateLimited,
    RequestFailed,
    StreamInterrupted,
)
from .._validation import check_seconds
from .._wire import error_for_status
from ._retry_after import parse_retry_after

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
    from types import TracebackType

    from .._provider import RateLimitReporter
    from ..messages import StreamEvent

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
# The longest spelling of a key character in JSON text: ``\u002f``.
_LONGEST_SPELLING: Final = 6

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


@final
class _EventSource(EventSource):
    """httpx-sse's event reader, without its own content-type check.

    That check is case-sensitive, though media types are not: it refused
    ``Text/Event-Stream`` with an ``SSEError`` (a transport error, so every
    request failed and was retried). ``_check_status`` has already checked
    the content type, case-insensitively and with parameters allowed, so
    that check is the only one.
    """

    def _check_content_type(self) -> None:
        pass


def _check_text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a non-empty string, got {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def _character_class(char: str) -> str:
    """What ``char`` is, in words that do not repeat it."""
    if char in "\r\n":
        return "a line break"
    if char == "\t":
        return "a tab"
    if char == "\0":
        return "a NUL character"
    if char == " ":
        return "a space"
    if char.isascii():
        return "a control character"
    return "a non-ASCII character"


def _check_api_key(value: object) -> str:
    """An API key: printable ASCII, no whitespace; never echoed in an error.

    A trailing line break (what ``open(path).read()`` leaves) is refused,
    not stripped: a secret is sent exactly as given or not at all, and a
    file that holds more than the key may be damaged in other ways too.
    The error says which kind of character is wrong and where, never the
    key or any part of it.
    """
    if not isinstance(value, str):
        raise TypeError("api_key must be a non-empty string")
    if not value:
        raise ValueError("api_key must be a non-empty string")
    rule = "api_key must be printable ASCII without spaces"
    bad = [index for index, char in enumerate(value) if not "!" <= char <= "~"]
    if not bad:
        return value
    if value[bad[0] :] in ("\n", "\r", "\r\n"):
        raise ValueError(
            f"{rule}, got a line break at the end (strip a key read from a file)"
        )
    raise ValueError(f"{rule}, got {_character_class(value[bad[0]])} at index {bad[0]}")


def _check_header_value(value: str, name: str) -> str:
    """A header value h11 will send: printable ASCII, inner spaces allowed.

    Never echoed: a header may carry a credential. Without this check, h11
    refuses the value when the request is sent, and its error shows it.
    """
    for index, char in enumerate(value):
        inner = 0 < index < len(value) - 1
        if "!" <= char <= "~" or (char in " \t" and inner):
            continue
        what = _character_class(char)
        if char in " \t":
            what = "leading or trailing whitespace"
        raise ValueError(f"{name} must be printable ASCII, got {what} at index {index}")
    return value


# RFC 9110's tchar: what a header name may be made of.
_TOKEN_CHARACTERS: Final = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def _check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Extra headers, names lowercased; values checked but never echoed."""
    checked: dict[str, str] = {}
    for name, value in dict(headers or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError("extra_headers must map header names to strings")
        if not name or not _TOKEN_CHARACTERS.issuperset(name):
            raise ValueError(f"extra_headers names must be HTTP tokens, got {name!r}")
        checked[name.lower()] = _check_header_value(value, f"extra_headers[{name!r}]")
    return checked


def _key_pattern(key: str) -> str:
    """A regular expression matching every spelling of ``key`` in JSON text.

    A server that echoes the key inside a JSON string may escape any of its
    characters as ``\\uXXXX`` (hex digits in either case), and ``/``, ``"``
    and ``\\`` also as ``\\/``, ``\\"`` and ``\\\\``, in any mix. Keys are
    printable ASCII (``_check_api_key``), so no other escape applies, and
    every spelling is ASCII: the same pattern serves text and bytes.
    """
    parts: list[str] = []
    for char in key:
        digits = "".join(
            f"[{digit}{digit.upper()}]" if digit.isalpha() else digit
            for digit in f"{ord(char):04x}"
        )
        spellings = [re.escape(char), r"\\u" + digits]
        if char in '/"\\':
            spellings.append(re.escape("\\" + char))
        parts.append("(?:" + "|".join(spellings) + ")")
    return "".join(parts)


def _check_base_url(value: object) -> str:
    """A URL httpx can send to, with a host; paths are appended to it.

    Checked whole here, since httpx would only refuse it when a request is
    built, with an error outside the ``ProviderError`` tree.
    """
    url = _check_text(value, "base_url")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
    for index, char in enumerate(url):
        # Checked here rather than by httpx, whose wording varies by version.
        if char <= " " or char == "\x7f":
            raise ValueError(
                f"base_url must be a valid URL, got {url!r}"
                f" (a control character or space at index {index})"
            )
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL as exc:
        reason = str(exc).rstrip(".")
        reason = reason[:1].lower() + reason[1:]
        raise ValueError(
            f"base_url must be a valid URL, got {url!r} ({reason})"
        ) from None
    if not host:
        raise ValueError(f"base_url must name a host, got {url!r}")
    if "?" in url or "#" in url:
        # The request's path is appended to base_url, after a query would be.
        raise ValueError(f"base_url must not have a query or fragment, got {url!r}")
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
        self._api_key = _check_api_key(api_key)
        pattern = _key_pattern(self._api_key)
        self._key_text = re.compile(pattern)
        self._key_bytes = re.compile(pattern.encode("ascii"))
        self._model = _check_text(model, "model")
        connect = check_seconds(connect_timeout, "connect_timeout", positive=True)
        read = check_seconds(read_timeout, "read_timeout", positive=True)
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
        body: Callable[[], dict[str, Any]],
        decoder: WireDecoder,
    ) -> EventStream:
        """The stream of one request: ``body`` is built and encoded here."""
        try:
            content = json.dumps(body()).encode()
        except RecursionError:
            reason = "it nests too deeply"
        except (TypeError, ValueError) as exc:
            reason = str(exc)  # names a type, or a circular reference
        else:
            request = self._client.build_request(
                "POST",
                url,
                headers={
                    "accept": "text/event-stream",
                    "cache-control": "no-store",
                    **headers,
                },
                content=content,
                timeout=self._timeout,
            )
            return EventStream(self, request, decoder)
        raise RequestFailed(
            f"{self._id}: the request cannot be encoded as JSON: {reason}",
            provider=self._id,
        )

    # -- used by EventStream ------------------------------------------------

    def _redact(self, text: str) -> str:
        """``text`` with the key, however JSON spells it, replaced."""
        return self._key_text.sub(_REDACTED, text)

    def _redact_and_cut(self, body: bytes, limit: int) -> bytes:
        """``body`` cut at ``limit`` bytes, with the key redacted first.

        A key that straddles the cut is kept whole, to be redacted, so
        ``body`` must run past ``limit`` by a key's longest spelling (or
        end). Then a key the end of ``body`` cuts off starts past ``limit``,
        and goes with the rest.
        """
        end = min(len(body), limit)
        for match in self._key_bytes.finditer(body):
            if match.end() > end:
                if match.start() < end:
                    end = match.end()
                break
        return self._key_bytes.sub(_REDACTED.encode(), body[:end])

    def _report(self, error: ProviderError) -> None:
        if isinstance(error, RateLimited | Overloaded) and self._on_rate_limit:
            self._on_rate_limit(self._id, error.retry_after)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        if self._client.is_closed:
            raise RequestFailed(
                f"{self._id}: the HTTP client is closed", provider=self._id
            )
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
        except Exception as exc:
            # Whatever else the client raises (a lent transport's own error,
            # a client closed as we sent) fails this request, not the
            # dispatcher. Cancelled and KeyboardInterrupt are BaseExceptions,
            # as is any group holding one, so they are never caught here.
            error = RequestFailed(
                f"{self._id}: the HTTP client failed: {_describe(exc, self._redact)}",
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
        # Redacted before any cut, and again once JSON is decoded: a key
        # cut in two, or spelled with escapes, would slip past.
        slack = _LONGEST_SPELLING * len(self._api_key)
        body = await _read_bounded(response, _ERROR_BODY_LIMIT + slack)
        body = self._redact_and_cut(body, _ERROR_BODY_LIMIT)
        error_type, message = error_details(body, self._redact)
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


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
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


def _describe(exc: Exception, redact: Callable[[str], str]) -> str:
    """An unexpected exception in one line: its type, and its message redacted."""
    detail = _shorten(redact(str(exc)))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _timeout_text(exc: httpx.TimeoutException, timeout: httpx.Timeout) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return f"could not connect within {timeout.connect:g} s"
    if isinstance(exc, httpx.PoolTimeout):
        return f"no free connection within {timeout.pool:g} s"
    if isinstance(exc, httpx.WriteTimeout):
        return f"could not send the request within {timeout.write:g} s"
    return f"no response within {timeout.read:g} s"


def error_details(
    body: bytes, redact: Callable[[str], str] = str
) -> tuple[str | None, str]:
    """``(error type, message)`` from an error body, in either API's shape.

    Both OpenAI (``{"error": {"message", "type", "code"}}``) and Anthropic
    (``{"type": "error", "error": {"type", "message"}}``) nest the details
    under ``error``; anything else is shown as text. What JSON decoding
    gives is passed through ``redact`` before it is shortened.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, _shorten(redact(text))
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        error_type = error.get("type")
        code = error.get("code")
        message = error.get("message")
        kind = error_type if isinstance(error_type, str) and error_type else None
        if isinstance(code, str) and code and code != kind:
            kind = f"{kind} ({code})" if kind else code
        text = message if isinstance(message, str) else text
        return (None if kind is None else redact(kind)), _shorten(redact(text))
    if isinstance(error, str):
        return None, _shorten(redact(error))
    return None, _shorten(redact(text))


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MESSAGE_LIMIT:
        return text[: _MESSAGE_LIMIT - 3] + "..."
    return text


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
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
    # Raised out here, not in the except clause: the JSONDecodeError holds
    # the whole data, key and all, and would ride along as __context__.
    data = redact(event.data)  # before the cut, which could halve a key
    excerpt = data if len(data) <= 80 else data[:77] + "..."
    raise MalformedStream(
        f"{provider}: an event's data is not valid JSON ({reason}): {excerpt!r}",
        provider=provider,
    )


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
        self._events = _EventSource(self._response).aiter_sse()
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
                except Exception as exc:
                    # As in _send: anything else fails this stream only, and
                    # Cancelled (a BaseException) is never caught.
                    failure = RequestFailed(
                        f"{self._provider.id}: the stream failed:"
                        f" {_describe(exc, self._provider._redact)}",
                        provider=self._provider.id,
                    )
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
            except Exception:  # not BaseException: Cancelled goes on
                pass  # the answer is complete; the connection is closed on exit


def structure_event(provider: str, data: object, cls: type[_T], what: str) -> _T:
    """``data`` as ``cls``, or ``MalformedStream`` naming every wrong field."""
    try:
        return structure(data, cls)
    except Exception as exc:  # cattrs raises several kinds; nothing awaits here
        problem = describe_error(exc)
    # Out here, as in parse_json_data: cattrs' errors may hold the values.
    raise MalformedStream(
        f"{provider}: {what} does not fit the format: {problem}", provider=provider
    )
