"""Where a provider's typed errors come from: every mapping, in one place.

What httpx2 raises and what an HTTP answer says become ``ProviderError``
subclasses here and nowhere else in this package, as httpx maps httpcore's
exceptions in one module::

    making the provider             client_type_error
      a legacy httpx.AsyncClient      TypeError: use httpx2.AsyncClient
    sending the request             send_error
      httpx2.ConnectTimeout,          ProviderConnectionError: could not
      PoolTimeout, WriteTimeout,        connect / no free connection / could
      ReadTimeout                       not send / no response within N s
      other httpx2.TransportError     ProviderConnectionError: could not reach
      anything else                   RequestFailed: the HTTP client failed
    the status line                 content_type_error, status_error
      2xx, not text/event-stream      MalformedStream
      any other status                error_for_status, with the error body's
                                        type and message and Retry-After
    reading the body                read_error
      httpx2.TimeoutException         ProviderConnectionError: stalled
      no event for the read timeout   stalled_error (the same), raised by
        (comments, or nothing)          EventStream
      httpx2.ReadError,               StreamInterrupted: the connection dropped
      RemoteProtocolError
      other httpx2.TransportError     ProviderConnectionError: the stream failed
      httpx2.DecodingError            MalformedStream
      anything else                   RequestFailed: the stream failed
    an error event in the stream    error_for_type (called by the decoders)

``error_for_status``, ``error_for_type`` and ``error_details``, the
vocabulary and error bodies of both APIs, live in ``trio_dispatch._wire``,
which loads no HTTP library: ``trio_dispatch.testing.ScriptedProvider``
raises exactly what they make.

Every function here returns the error; the caller raises it after its
``except`` clause, not in it: httpx2's exception holds the request, key
header included, and would ride along as ``__context__`` (``from None``
only hides it). And no error text shows the API key: ``Redactor`` finds it
in every spelling JSON allows, and every text taken from the server or from
httpx2 passes through it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Final, final

import httpx2

from .._exceptions import (
    MalformedStream,
    ProviderConnectionError,
    ProviderError,
    RequestFailed,
    StreamInterrupted,
)
from .._wire._errors import error_details, error_for_status, shorten
from .._wire._retry_after import parse_retry_after

if TYPE_CHECKING:
    from collections.abc import Callable

# An error body is read for its message only; never all of a huge one.
ERROR_BODY_LIMIT: Final = 64 * 1024
_REDACTED: Final = "[redacted]"
# The longest spelling of a key character in JSON text: ``\u002f``.
_LONGEST_SPELLING: Final = 6


@final
class Redactor:
    """Replaces one API key, however JSON spells it, in error texts.

    Called with a text, it returns the text redacted; a provider passes it
    to its decoder as the ``redact`` function.
    """

    __slots__ = ("_bytes", "_text", "slack")

    def __init__(self, key: str) -> None:
        pattern = _key_pattern(key)
        self._text = re.compile(pattern)
        self._bytes = re.compile(pattern.encode("ascii"))
        #: How far the key's longest spelling can run past a cut.
        self.slack: Final = _LONGEST_SPELLING * len(key)

    def __call__(self, text: str) -> str:
        """``text`` with the key, however JSON spells it, replaced."""
        return self._text.sub(_REDACTED, text)

    def cut(self, body: bytes, limit: int) -> bytes:
        """``body`` cut at ``limit`` bytes, with the key redacted first.

        A key that straddles the cut is kept whole, to be redacted, so
        ``body`` must run past ``limit`` by ``slack`` bytes (or end). Then
        a key the end of ``body`` cuts off starts past ``limit``, and goes
        with the rest.
        """
        end = min(len(body), limit)
        for match in self._bytes.finditer(body):
            if match.end() > end:
                if match.start() < end:
                    end = match.end()
                break
        return self._bytes.sub(_REDACTED.encode(), body[:end])

    def scrub(self, error: ProviderError) -> None:
        """Redact ``error``'s message in place.

        For errors a decoder made from what the server sent: a server could
        echo the key in an error event.
        """
        error.args = tuple(
            self(arg) if isinstance(arg, str) else arg for arg in error.args
        )


def _key_pattern(key: str) -> str:
    """A regular expression matching every spelling of ``key`` in JSON text.

    A server that echoes the key inside a JSON string may escape any of its
    characters as ``\\uXXXX`` (hex digits in either case), and ``/``, ``"``
    and ``\\`` also as ``\\/``, ``\\"`` and ``\\\\``, in any mix. Keys are
    printable ASCII (``check_api_key``), so no other escape applies, and
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


def client_type_error(client: object) -> TypeError:
    """The error for a ``client=`` that is not an ``httpx2.AsyncClient``.

    A legacy ``httpx`` client is recognised by its type's module, so httpx
    is not imported to tell (it may not be installed).
    """
    cls = type(client)
    if cls.__module__.partition(".")[0] == "httpx":
        return TypeError(
            f"client must be an httpx2.AsyncClient, got httpx.{cls.__name__}: "
            "trio-dispatch uses httpx2, httpx's maintained line; "
            "use httpx2.AsyncClient instead"
        )
    return TypeError(f"client must be an httpx2.AsyncClient, got {cls.__name__}")


def send_error(
    provider: str,
    exc: Exception,
    request: httpx2.Request,
    timeout: httpx2.Timeout,
    redact: Callable[[str], str],
) -> ProviderError:
    """The typed error for ``exc``, raised by the client sending ``request``.

    Whatever the client raises that is not httpx2's own (a lent transport's
    error, a client closed as we sent) fails this request, not the
    dispatcher: ``RequestFailed``.
    """
    if isinstance(exc, httpx2.TimeoutException):
        return ProviderConnectionError(
            f"{provider}: {_timeout_text(exc, timeout)} "
            f"(POST {request.url.host}{request.url.path})",
            provider=provider,
        )
    if isinstance(exc, httpx2.TransportError):
        detail = redact(str(exc)) or type(exc).__name__
        return ProviderConnectionError(
            f"{provider}: could not reach {request.url.host}: {detail}",
            provider=provider,
        )
    return RequestFailed(
        f"{provider}: the HTTP client failed: {_describe(exc, redact)}",
        provider=provider,
    )


def _timeout_text(exc: httpx2.TimeoutException, timeout: httpx2.Timeout) -> str:
    if isinstance(exc, httpx2.ConnectTimeout):
        return f"could not connect within {timeout.connect:g} s"
    if isinstance(exc, httpx2.PoolTimeout):
        return f"no free connection within {timeout.pool:g} s"
    if isinstance(exc, httpx2.WriteTimeout):
        return f"could not send the request within {timeout.write:g} s"
    return f"no response within {timeout.read:g} s"


def content_type_error(
    provider: str, status: int, content_type: str
) -> MalformedStream | None:
    """``MalformedStream`` unless a 2xx answer is an event stream.

    Media types are matched without regard to case, parameters allowed.
    """
    if content_type.partition(";")[0].strip().lower() == "text/event-stream":
        return None
    return MalformedStream(
        f"{provider}: expected an event stream, got HTTP {status} "
        f"with content-type {content_type!r}",
        provider=provider,
        status_code=status,
    )


def status_error(
    provider: str, status: int, headers: httpx2.Headers, body: bytes, redact: Redactor
) -> ProviderError:
    """The typed error for an error status, from its headers and body.

    ``body`` is the start of the error body: ``ERROR_BODY_LIMIT`` bytes and
    ``redact.slack`` more (or all of it, if shorter).
    """
    # Redacted before any cut, and again once JSON is decoded: a key
    # cut in two, or spelled with escapes, would slip past.
    body = redact.cut(body, ERROR_BODY_LIMIT)
    error_type, message = error_details(body, redact)
    retry_after = parse_retry_after(headers, time.time())
    return error_for_status(
        provider,
        status,
        error_type=error_type,
        message=message,
        retry_after=retry_after,
    )


def stalled_error(provider: str, read_timeout: float) -> ProviderConnectionError:
    """The error of a stream that sent no event for ``read_timeout`` seconds.

    Whether it sent nothing at all or only comments (``: keepalive``), the
    stream holds a slot and answers nothing.
    """
    return ProviderConnectionError(
        f"{provider}: the stream stalled: no data for {read_timeout:g} s",
        provider=provider,
    )


def read_error(
    provider: str, exc: Exception, read_timeout: float, redact: Callable[[str], str]
) -> ProviderError:
    """The typed error for ``exc``, raised reading a stream's body.

    Anything that is not httpx2's own fails this stream only:
    ``RequestFailed``.
    """
    if isinstance(exc, httpx2.TimeoutException):
        return stalled_error(provider, read_timeout)
    if isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError):
        return StreamInterrupted(
            f"{provider}: the connection dropped in the middle of the stream",
            provider=provider,
        )
    if isinstance(exc, httpx2.TransportError):
        return ProviderConnectionError(
            f"{provider}: the stream failed: {type(exc).__name__}", provider=provider
        )
    # A corrupt compressed body: httpx2 raises this between its own body
    # generators, abandoning the inner ones, so trio will also warn about
    # them; there is no reaching them from here. No test makes httpx2 do it.
    if isinstance(exc, httpx2.DecodingError):  # pragma: no cover
        return MalformedStream(
            f"{provider}: the stream's body could not be decoded", provider=provider
        )
    return RequestFailed(
        f"{provider}: the stream failed: {_describe(exc, redact)}", provider=provider
    )


def _describe(exc: Exception, redact: Callable[[str], str]) -> str:
    """An unexpected exception in one line: its type, and its message redacted."""
    detail = shorten(redact(str(exc)))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
