"""What both HTTP providers do alike, tested once per wire format.

Status errors and ``Retry-After``, failures of the connection and of the
body, timeouts, closing and cancellation, redaction of the key, request
headers, a lent or owned client, arguments and repr: the same code runs
for both formats, so every test here runs for each, through the table in
``_wires.py``. Where the formats differ in what they say (a path, a
terminator, an error body's shape), a small table beside the test holds
each format's expectation. In-memory tests replay a body through
``httpx2.MockTransport``; the rest run through loopback sockets against the
fake LLM server.

Then, in memory, for each format: what a provider accepts and sends (a
content type in any case, a key or header value that cannot be sent,
refused without showing it), the key redacted in every spelling a server
may echo it and wherever an excerpt cuts it, and nothing but a typed
``ProviderError`` escaping a provider, however its HTTP client, the body
or the encoding fails; and through a dispatcher, one such bad call failing
only its own turn.
"""

from __future__ import annotations

import ast
import itertools
import json
import logging
import re
import socket
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import pytest
import trio
import trio.testing

import trio_dispatch.providers
from trio_dispatch import (
    Conversation,
    ConversationOptions,
    Provider,
    ProviderError,
    Tool,
    TurnResult,
    open_dispatcher,
)
from trio_dispatch._wire._anthropic import AnthropicDecoder
from trio_dispatch._wire._openai import OpenAIDecoder
from trio_dispatch._wire._sse import ServerSentEvent
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
)
from trio_dispatch.providers import (
    AnthropicProvider,
    AuthenticationError,
    BadRequest,
    MalformedStream,
    OpenAIProvider,
    Overloaded,
    ProviderConnectionError,
    RateLimited,
    RequestFailed,
    ServerError,
    StreamInterrupted,
)
from trio_dispatch.testing import FakeReply, FakeScript, Fault, open_fake_llm_server

from .._helpers import chain
from .._wires import HELLO, SSE_HEADERS, WIRES, Wire, collect

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator

    from trio_dispatch.testing import FakeLLMServer

    from .._wires import HTTPProvider


@pytest.fixture(params=WIRES, ids=lambda wire: wire.name)
def wire(request: pytest.FixtureRequest) -> Wire:
    param: Wire = request.param
    return param


@pytest.fixture
async def server(wire: Wire) -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server(api_key=wire.key) as fake:
        yield fake


# -- what a stream holds ---------------------------------------------------------


async def test_no_terminator_is_interrupted(wire: Wire) -> None:
    events: list[StreamEvent] = []
    body = wire.text_stream("a", terminator=False)
    with pytest.raises(
        StreamInterrupted,
        match=rf"^{wire.name}: the stream ended without {re.escape(wire.terminator)}$",
    ) as caught:
        async with wire.replaying(body).stream(HELLO) as stream:
            async for event in stream:
                events.append(event)
    assert events == [TextDelta("a"), Finish("stop")]  # what came stands
    assert caught.value.retryable


async def test_invalid_tool_arguments_become_an_arguments_error(wire: Wire) -> None:
    events = await collect(wire.replaying(wire.tool_stream("call_1", "f", '{"a": ')))
    tool_call = events[0]
    assert isinstance(tool_call, ToolCall)
    assert (tool_call.id, tool_call.name, tool_call.arguments) == ("call_1", "f", {})
    assert tool_call.raw_arguments == '{"a": '
    assert tool_call.arguments_error is not None
    assert tool_call.arguments_error.startswith("arguments are not valid JSON: ")
    assert events[1:] == [Finish("tool_calls"), *wire.usage]


async def test_tool_arguments_that_are_not_an_object(wire: Wire) -> None:
    events = await collect(wire.replaying(wire.tool_stream("call_1", "f", "[1, 2]")))
    assert events == [
        ToolCall(
            "call_1", "f", {}, "[1, 2]", "arguments must be a JSON object, got array"
        ),
        Finish("tool_calls"),
        *wire.usage,
    ]


async def test_a_tool_without_arguments(wire: Wire) -> None:
    events = await collect(wire.replaying(wire.tool_stream("call_1", "now", "")))
    assert events == [
        ToolCall("call_1", "now", {}, ""),
        Finish("tool_calls"),
        *wire.usage,
    ]


async def test_a_json_answer_to_a_stream_is_malformed_on_entry(wire: Wire) -> None:
    provider = wire.replaying(
        b'{"choices": []}', headers={"content-type": "application/json"}
    )
    with pytest.raises(
        MalformedStream,
        match=r"expected an event stream, got HTTP 200 with content-type 'application/json'",
    ):
        async with provider.stream(HELLO):
            pytest.fail("entered")


# -- error bodies and the key in them ----------------------------------------------

# Each API's answer to a wrong key, echoing it, and what it becomes.
ECHOED_KEY_ERRORS = {
    "openai": (
        {
            "error": {
                "message": "Incorrect API key provided: {key}.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        "openai: HTTP 401 invalid_request_error (invalid_api_key): "
        "Incorrect API key provided: [redacted].",
    ),
    "anthropic": (
        {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "invalid x-api-key {key}",
            },
        },
        "anthropic: HTTP 401 authentication_error: invalid x-api-key [redacted]",
    ),
}


async def test_redacts_a_key_the_server_echoes(wire: Wire) -> None:
    shape, expected = ECHOED_KEY_ERRORS[wire.name]
    body = json.dumps(shape).replace("{key}", wire.key)
    assert wire.key in body
    provider = wire.replaying(body, 401, {"content-type": "application/json"})
    with pytest.raises(AuthenticationError) as caught:
        await collect(provider)
    assert str(caught.value) == expected


async def test_redacts_a_key_echoed_inside_the_stream(wire: Wire) -> None:
    body = wire.error_event_stream("api_error", f"bad {wire.key}")
    with pytest.raises(ServerError) as caught:
        await collect(wire.replaying(body))
    assert str(caught.value) == f"{wire.name}: api_error in the stream: bad [redacted]"


async def test_a_non_json_error_body_is_shown_as_text(wire: Wire) -> None:
    provider = wire.replaying(
        "<html>  Bad\n gateway </html>", 502, {"content-type": "text/html"}
    )
    with pytest.raises(
        ServerError, match=rf"^{wire.name}: HTTP 502: <html> Bad gateway </html>$"
    ):
        await collect(provider)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": "quota exhausted"}', "HTTP 400: quota exhausted"),
        ('["odd"]', 'HTTP 400: ["odd"]'),
        (
            '{"error": {"code": "bad_thing"}}',
            'HTTP 400 bad_thing: {"error": {"code": "bad_thing"}}',
        ),
        ("", "HTTP 400"),
    ],
)
async def test_error_bodies_of_other_shapes(
    wire: Wire, body: str, message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        await collect(wire.replaying(body, 400, {"content-type": "application/json"}))
    assert str(caught.value) == f"{wire.name}: {message}"


async def test_an_error_body_is_read_only_so_far(wire: Wire) -> None:
    huge = (
        b'{"type":"error","error":{"type":"api_error","message":"'
        + b"x" * 200_000
        + b'"}}'
    )
    with pytest.raises(ServerError) as caught:
        await collect(wire.replaying(huge, 500, {"content-type": "application/json"}))
    # Cut at 64 KiB, so not JSON any more; shown as text, shortened.
    assert str(caught.value).startswith(f'{wire.name}: HTTP 500: {{"type":"error"')
    assert str(caught.value).endswith("...")
    assert len(str(caught.value)) < 600


# -- what httpx2 raises -------------------------------------------------------------


def raising(wire: Wire, exc: Exception) -> Provider:
    """A provider whose transport fails every request with ``exc``."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        raise exc

    return wire.provider(
        client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        connect_timeout=3,
        read_timeout=7,
    )


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            httpx2.ConnectTimeout("t"),
            "could not connect within 3 s (POST api.test{path})",
        ),
        (
            httpx2.PoolTimeout("t"),
            "no free connection within 3 s (POST api.test{path})",
        ),
        (
            httpx2.WriteTimeout("t"),
            "could not send the request within 7 s (POST api.test{path})",
        ),
        (httpx2.ReadTimeout("t"), "no response within 7 s (POST api.test{path})"),
        (
            httpx2.ConnectError("Name or service not known"),
            "could not reach api.test: Name or service not known",
        ),
        (
            httpx2.RemoteProtocolError(""),
            "could not reach api.test: RemoteProtocolError",
        ),
    ],
)
async def test_failures_before_the_response(
    wire: Wire, exc: Exception, message: str
) -> None:
    with pytest.raises(ProviderConnectionError) as caught:
        await collect(raising(wire, exc))
    assert str(caught.value) == f"{wire.name}: " + message.format(path=wire.path)
    assert caught.value.retryable
    assert caught.value.__context__ is None  # nothing of httpx2 rides along


class _Failing(httpx2.AsyncByteStream):
    """A body that sends one chunk, then fails with ``exc``."""

    def __init__(self, first: bytes, exc: Exception) -> None:
        self._first = first
        self._exc = exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._first
        raise self._exc


@pytest.mark.parametrize(
    ("exc", "error", "message"),
    [
        (
            httpx2.ReadError("reset"),
            StreamInterrupted,
            "the connection dropped in the middle of the stream",
        ),
        (
            httpx2.RemoteProtocolError("incomplete chunked read"),
            StreamInterrupted,
            "the connection dropped in the middle of the stream",
        ),
        (
            httpx2.ReadTimeout("t"),
            ProviderConnectionError,
            "the stream stalled: no data for 60 s",
        ),
        (
            httpx2.WriteError("w"),
            ProviderConnectionError,
            "the stream failed: WriteError",
        ),
    ],
)
async def test_failures_in_the_middle_of_the_stream(
    wire: Wire, exc: Exception, error: type[ProviderError], message: str
) -> None:
    first = wire.text_stream("a", finish=False, terminator=False).encode()

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=SSE_HEADERS, stream=_Failing(first, exc))

    provider = wire.provider(
        client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    )
    received: list[StreamEvent] = []
    with pytest.raises(error) as caught:
        async with provider.stream(HELLO) as events:
            async for event in events:
                received.append(event)
    assert received == [TextDelta("a")]
    assert str(caught.value) == f"{wire.name}: {message}"


class _Paced(httpx2.AsyncByteStream):
    """A body of ``parts``: bytes to send, or seconds to wait before the next."""

    def __init__(self, parts: Iterable[bytes | float]) -> None:
        self._parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            if isinstance(part, bytes):
                # A socket's read is a checkpoint even when bytes are there.
                await trio.lowlevel.checkpoint()
                yield part
            else:
                await trio.sleep(part)


KEEPALIVE = b": keepalive\n\n"


def paced(wire: Wire, parts: Iterable[bytes | float], **kwargs: Any) -> HTTPProvider:  # noqa: ANN401 (the constructor's keywords)
    """A provider whose every answer is ``parts``, paced on the trio clock."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=SSE_HEADERS, stream=_Paced(parts))

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return wire.provider(client=client, **kwargs)


async def test_a_stream_of_comments_alone_stalls_at_the_read_timeout(
    wire: Wire, autojump_clock: trio.testing.MockClock
) -> None:
    # Bytes every 0.25 s, but no event after the first: the read timeout
    # counts time without an event, not without a byte.
    first = wire.text_stream("a", finish=False, terminator=False).encode()
    trickle: Iterable[bytes | float] = itertools.cycle([0.25, KEEPALIVE])
    provider = paced(wire, itertools.chain([first], trickle), read_timeout=1)
    with trio.fail_after(30):  # unfixed, the stream never ends
        async with provider, provider.stream(HELLO) as events:
            assert await events.__anext__() == TextDelta("a")
            started = trio.current_time()
            with pytest.raises(
                ProviderConnectionError,
                match=rf"^{wire.name}: the stream stalled: no data for 1 s$",
            ):
                await events.__anext__()
            assert trio.current_time() - started == 1.0


async def test_events_within_the_read_timeout_keep_a_slow_stream_alive(
    wire: Wire, autojump_clock: trio.testing.MockClock
) -> None:
    # An event every 0.75 s, with comments between: 1 s never passes without one.
    whole = wire.text_stream("a", "b", "c").encode()
    events = [event + b"\n\n" for event in whole.split(b"\n\n") if event.strip()]
    parts: list[bytes | float] = [events[0]]
    for event in events[1:]:
        parts += [0.5, KEEPALIVE, 0.25, event]
    provider = paced(wire, parts, read_timeout=1)
    async with provider:
        received = await collect(provider)
    assert [e for e in received if isinstance(e, TextDelta)] == [
        TextDelta("a"),
        TextDelta("b"),
        TextDelta("c"),
    ]
    assert isinstance(received[-1], Finish | Usage)
    assert trio.current_time() == 0.75 * (len(events) - 1)


async def test_a_consumer_slower_than_the_read_timeout_is_no_stall(
    wire: Wire, autojump_clock: trio.testing.MockClock
) -> None:
    # The server has sent every event, one a chunk; the consumer works 3 s
    # between reads. Only time spent waiting on the server counts.
    whole = wire.text_stream("a", "b", "c").encode()
    parts: list[bytes | float] = [
        event + b"\n\n" for event in whole.split(b"\n\n") if event.strip()
    ]
    provider = paced(wire, parts, read_timeout=1)
    received: list[StreamEvent] = []
    async with provider, provider.stream(HELLO) as events:
        async for event in events:
            received.append(event)
            await trio.sleep(3)
    assert [e for e in received if isinstance(e, TextDelta)] == [
        TextDelta("a"),
        TextDelta("b"),
        TextDelta("c"),
    ]


async def test_quiet_time_adds_up_across_reads_that_end_no_event(
    wire: Wire, autojump_clock: trio.testing.MockClock
) -> None:
    # 0.6 s of comments, a consumer pause of 5 s (not counted), then 0.6 s
    # more: 1.2 s without an event while reading, past the 1 s timeout.
    first = wire.text_stream("a", finish=False, terminator=False).encode()
    parts: list[bytes | float] = [first, 0.6, KEEPALIVE, 0.6, KEEPALIVE]
    provider = paced(wire, parts, read_timeout=1)
    async with provider, provider.stream(HELLO) as events:
        assert await events.__anext__() == TextDelta("a")
        await trio.sleep(5)
        started = trio.current_time()
        with pytest.raises(
            ProviderConnectionError,
            match=rf"^{wire.name}: the stream stalled: no data for 1 s$",
        ):
            await events.__anext__()
        assert trio.current_time() - started == 1.0


async def test_connection_refused(wire: Wire) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    async with wire.provider(base_url=f"http://127.0.0.1:{port}") as provider:
        with pytest.raises(
            ProviderConnectionError,
            match=rf"^{wire.name}: could not reach 127\.0\.0\.1: ",
        ) as caught:
            await collect(provider)
    assert caught.value.retryable


# -- over real sockets: the request ------------------------------------------------


async def test_the_request_asks_for_a_stream_and_its_key_stays_in_its_header(
    wire: Wire, server: FakeLLMServer
) -> None:
    async with wire.over(server) as provider:
        await collect(provider)
    (recorded,) = server.requests
    assert recorded.format == wire.name
    assert recorded.path == wire.path
    assert recorded.authenticated
    assert recorded.headers["accept"] == "text/event-stream"
    assert recorded.headers["content-type"] == "application/json"
    assert wire.key_header not in recorded.headers  # the server keeps no secrets


async def test_extra_headers_reach_the_wire_and_never_replace_the_providers_own(
    wire: Wire, server: FakeLLMServer
) -> None:
    extra = {"X-Route": "eu-1", "Content-Type": "text/plain"}
    async with wire.over(server, extra_headers=extra) as provider:
        await collect(provider)
    (recorded,) = server.requests
    assert recorded.headers["x-route"] == "eu-1"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.authenticated


def test_extra_headers_that_are_not_strings_are_refused(wire: Wire) -> None:
    with pytest.raises(
        TypeError, match=r"^extra_headers must map header names to strings$"
    ):
        wire.provider(extra_headers={"x": 1})


@pytest.mark.parametrize("request_", ["hello", {"messages": []}, None])
async def test_a_request_that_is_not_a_chat_request_is_refused_at_once(
    wire: Wire, server: FakeLLMServer, request_: object
) -> None:
    async with wire.over(server) as provider:
        with pytest.raises(
            TypeError,
            match=rf"^request must be a ChatRequest, got {re.escape(repr(request_))}$",
        ):
            provider.stream(request_)  # type: ignore[arg-type]
    assert server.statistics().requests_total == 0


async def test_nothing_is_sent_before_enter(wire: Wire, server: FakeLLMServer) -> None:
    async with wire.over(server) as provider:
        stream = provider.stream(HELLO)
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().requests_total == 0
        async with stream as events:
            assert server.statistics().requests_total == 1
            received = [e async for e in events]
    assert received[-2] == Finish("stop")
    assert isinstance(received[-1], Usage)
    assert received[-1].output_tokens == 6


# -- over real sockets: status errors ----------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error", "status", "retry_after"),
    [
        (Fault("rate_limit", retry_after=2), RateLimited, 429, 2.0),
        (
            Fault("rate_limit", retry_after=30, retry_after_ms=250),
            RateLimited,
            429,
            0.25,
        ),
        (Fault("rate_limit"), RateLimited, 429, None),
        (Fault("unavailable", retry_after=1), Overloaded, 503, 1.0),
        (Fault("unavailable"), Overloaded, 503, None),
        (Fault("overloaded", retry_after_ms=1500), Overloaded, 529, 1.5),
        (Fault("overloaded", retry_after=7), Overloaded, 529, 7.0),
        (Fault("overloaded"), Overloaded, 529, None),
        (Fault("server_error"), ServerError, 500, None),
    ],
)
async def test_status_faults(
    wire: Wire,
    server: FakeLLMServer,
    *,
    fault: Fault,
    error: type[ProviderError],
    status: int,
    retry_after: float | None,
) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=fault)))
    reports: list[tuple[str, float | None]] = []
    entered = False
    async with wire.over(
        server, id="primary", on_rate_limit=lambda p, s: reports.append((p, s))
    ) as provider:
        with pytest.raises(error) as caught:
            async with provider.stream(HELLO):
                entered = True
    assert not entered  # a status error is raised from __aenter__
    exc = caught.value
    assert exc.retryable
    assert exc.provider == "primary"
    assert exc.status_code == status
    assert str(exc).startswith(f"primary: HTTP {status} ")
    if isinstance(exc, RateLimited | Overloaded):
        assert exc.retry_after == retry_after
        assert reports == [("primary", retry_after)]
    else:
        assert reports == []
    assert server.statistics().responses_by_status == {status: 1}


async def test_overloaded_529_body(wire: Wire, server: FakeLLMServer) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=Fault("overloaded"))))
    async with wire.over(server) as provider:
        with pytest.raises(Overloaded) as caught:
            await collect(provider)
    assert str(caught.value) == f"{wire.name}: HTTP 529 overloaded_error: Overloaded"


# What the fake server says to a wrong key, in each API's words.
WRONG_KEY_MESSAGES = {
    "openai": "missing or invalid Authorization",
    "anthropic": "missing or invalid x-api-key",
}


async def test_wrong_key_is_an_authentication_error(
    wire: Wire, server: FakeLLMServer
) -> None:
    reports: list[object] = []
    provider = wire.over(
        server, api_key="sk-wrong", on_rate_limit=lambda *a: reports.append(a)
    )
    async with provider:
        with pytest.raises(AuthenticationError) as caught:
            await collect(provider)
    assert not caught.value.retryable
    assert caught.value.status_code == 401
    assert str(caught.value) == (
        f"{wire.name}: HTTP 401 authentication_error: {WRONG_KEY_MESSAGES[wire.name]}"
    )
    assert reports == []


# Each format's likely mistake: OpenAI's base URL ends in /v1, Anthropic's
# does not. What to add to the server's root, and the path that then 404s.
WRONG_BASE_URLS = {
    "openai": ("", "/chat/completions"),
    "anthropic": ("/v1", "/v1/v1/messages"),
}


async def test_a_wrong_base_url_is_a_bad_request(
    wire: Wire, server: FakeLLMServer
) -> None:
    suffix, path = WRONG_BASE_URLS[wire.name]
    async with wire.over(server, base_url=server.base_url + suffix) as provider:
        with pytest.raises(
            BadRequest,
            match=rf"^{wire.name}: HTTP 404 not_found_error: no route: {path}$",
        ) as caught:
            await collect(provider)
    assert not caught.value.retryable
    assert caught.value.status_code == 404


# -- over real sockets: failures in the middle of the stream -------------------------

# The events each format's fake stream of "one two" sends between the last
# word and its terminator, by their type names.
BEFORE_THE_TERMINATOR = {
    "openai": ["Finish", "Usage"],  # the usage chunk comes before [DONE]
    "anthropic": ["Finish"],  # Usage comes at message_stop
}
# How each format's decoder says the fake server's broken event is not JSON.
NOT_JSON = {
    "openai": r"\(Unterminated string",
    "anthropic": r"\(Expecting property name",
}


@pytest.mark.parametrize(
    ("fault", "words", "error", "message"),
    [
        (
            Fault("disconnect"),
            1,
            StreamInterrupted,
            r"^{name}: the connection dropped in the middle of the stream$",
        ),
        (
            Fault("truncate"),
            None,
            StreamInterrupted,
            r"^{name}: the stream ended without {terminator}$",
        ),
        (
            Fault("malformed"),
            2,
            MalformedStream,
            r"^{name}: an event's data is not valid JSON {not_json}",
        ),
        (
            Fault("stream_error"),
            0,
            Overloaded,
            r"^{name}: overloaded_error in the stream: the fake server failed mid-stream$",
        ),
        (
            Fault("stream_error", error_type="rate_limit_error"),
            1,
            RateLimited,
            r"^{name}: rate_limit_error in the stream: the fake server failed mid-stream$",
        ),
        (
            Fault("stream_error", error_type="api_error", message="boom"),
            0,
            ServerError,
            r"^{name}: api_error in the stream: boom$",
        ),
    ],
    ids=[
        "disconnect",
        "truncate",
        "malformed",
        "error event",
        "rate limit event",
        "api error event",
    ],
)
async def test_stream_faults(
    wire: Wire,
    server: FakeLLMServer,
    *,
    fault: Fault,
    words: int | None,
    error: type[ProviderError],
    message: str,
) -> None:
    """A fault after ``words`` words (``None``: just before the terminator)."""
    if words is not None:
        # The first events of each stream carry no word.
        fault = attrs.evolve(fault, after_events=wire.preamble + words)
        before = ["one", " two"][:words]
    else:
        before = ["one", " two", *BEFORE_THE_TERMINATOR[wire.name]]
    server.set_script(FakeScript(default=FakeReply(text="one two", fault=fault)))
    pattern = message.format(
        name=wire.name,
        terminator=re.escape(wire.terminator),
        not_json=NOT_JSON[wire.name],
    )
    received: list[str] = []
    async with wire.over(server) as provider:
        with pytest.raises(error, match=pattern) as caught:
            async with provider.stream(HELLO) as events:
                async for event in events:
                    received.append(
                        event.text
                        if isinstance(event, TextDelta)
                        else type(event).__name__
                    )
    assert caught.value.retryable
    assert received == before
    await server.wait_idle()


async def test_a_stall_ends_at_the_read_timeout(
    wire: Wire, server: FakeLLMServer
) -> None:
    stall = Fault("stall", after_events=wire.preamble + 1)
    server.set_script(FakeScript(default=FakeReply(fault=stall)))
    provider = wire.over(server, read_timeout=0.2)
    async with provider, provider.stream(HELLO) as events:
        assert await events.__anext__() == TextDelta("Hello")
        started = trio.current_time()
        with pytest.raises(
            ProviderConnectionError,
            match=rf"^{wire.name}: the stream stalled: no data for 0\.2 s$",
        ):
            await events.__anext__()
        waited = trio.current_time() - started
    assert 0.15 <= waited < 1.0
    stats = await server.wait_idle()
    assert stats.client_disconnects == 1


async def test_no_headers_within_the_read_timeout(
    wire: Wire, server: FakeLLMServer
) -> None:
    server.set_script(FakeScript(default=FakeReply(latency=5)))
    async with wire.over(server, read_timeout=0.1) as provider:
        with pytest.raises(
            ProviderConnectionError,
            match=rf"^{wire.name}: no response within 0\.1 s"
            rf" \(POST 127\.0\.0\.1{re.escape(wire.path)}\)$",
        ):
            async with provider.stream(HELLO):
                pytest.fail("entered")


# -- over real sockets: leaving, closing, sharing ----------------------------------


async def test_leaving_early_closes_the_response(
    wire: Wire, server: FakeLLMServer
) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    server.set_script(FakeScript(default=FakeReply(text=words, tokens_per_second=50)))
    async with wire.over(server) as provider:
        async with provider.stream(HELLO) as events:
            async for event in events:
                assert event == TextDelta("w0")
                break
        with trio.fail_after(2):
            stats = await server.wait_idle()
    assert stats.client_disconnects == 1
    assert stats.completed == 0


async def test_cancellation_mid_stream_closes_the_response(
    wire: Wire, server: FakeLLMServer
) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    server.set_script(FakeScript(default=FakeReply(text=words, tokens_per_second=50)))
    seen: list[StreamEvent] = []
    async with wire.over(server) as provider:
        with trio.CancelScope() as scope:
            async with provider.stream(HELLO) as events:
                async for event in events:
                    seen.append(event)
                    scope.cancel()
        assert scope.cancelled_caught
        with trio.fail_after(2):
            stats = await server.wait_idle()
    assert seen == [TextDelta("w0")]
    assert stats.client_disconnects == 1


async def test_cancellation_while_waiting_for_data_closes_the_response(
    wire: Wire, server: FakeLLMServer
) -> None:
    stall = Fault("stall", after_events=wire.preamble + 1)
    server.set_script(FakeScript(default=FakeReply(fault=stall)))
    async with wire.over(server) as provider:
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                async with provider.stream(HELLO) as events:
                    async for _ in events:
                        pass

            nursery.start_soon(consume)
            with trio.fail_after(2):
                await server.wait_until(
                    lambda stats: stats.responses_by_status.get(200) == 1
                )
                # The consumer now waits for the next event, which never comes.
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        with trio.fail_after(2):
            stats = await server.wait_idle()
    assert stats.client_disconnects == 1


async def test_a_stream_is_entered_once_and_read_inside(
    wire: Wire, server: FakeLLMServer
) -> None:
    async with wire.over(server) as provider:
        stream = provider.stream(HELLO)
        async with stream as events:
            await events.__anext__()
            with pytest.raises(
                RuntimeError, match=r"^a provider stream can be entered only once$"
            ):
                await stream.__aenter__()
        with pytest.raises(
            RuntimeError,
            match=r"^iterate a provider stream inside its async with block$",
        ):
            await events.__anext__()


async def test_after_the_end_the_iterator_stays_ended(
    wire: Wire, server: FakeLLMServer
) -> None:
    async with wire.over(server) as provider, provider.stream(HELLO) as events:
        assert len([e async for e in events]) == 8
        with pytest.raises(StopAsyncIteration):
            await events.__anext__()


async def test_a_finished_stream_leaves_its_connection_for_the_next(
    wire: Wire, server: FakeLLMServer
) -> None:
    async with wire.over(server) as provider:
        await collect(provider)
        await collect(provider)
        async with provider.stream(HELLO) as events:
            await events.__anext__()  # and leave early: that connection closes
        await collect(provider)
    first, second, third, fourth = (r.client for r in server.requests)
    assert first is not None
    assert first == second == third  # the body was read to its end, then reused
    assert fourth != third


async def test_a_lent_client_stays_open(wire: Wire, server: FakeLLMServer) -> None:
    async with httpx2.AsyncClient() as client:
        async with wire.over(server, client=client) as provider:
            await collect(provider)
        assert not client.is_closed
        async with wire.over(server, client=client) as provider:
            await collect(provider)
    assert server.statistics().completed == 2


async def test_an_owned_client_is_closed(wire: Wire) -> None:
    provider = wire.provider(base_url="http://127.0.0.1:9/v1")
    await provider.aclose()
    # A typed error that fails one turn, not a RuntimeError that stops the
    # dispatcher.
    with pytest.raises(
        RequestFailed, match=rf"^{wire.name}: the HTTP client is closed$"
    ):
        await collect(provider)


async def test_many_requests_share_the_provider(
    wire: Wire, server: FakeLLMServer
) -> None:
    async with wire.over(server) as provider:
        results: list[list[StreamEvent]] = []

        async def one() -> None:
            results.append(await collect(provider))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one)
    assert len(results) == 5
    assert all(events[-2] == Finish("stop") for events in results)


# -- keys and arguments -------------------------------------------------------------


async def test_the_key_never_shows(
    wire: Wire, server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = wire.over(server, read_timeout=0.2)
    assert wire.key not in repr(provider)
    after = wire.preamble + 1
    faults = [
        Fault("rate_limit", retry_after=1),
        Fault("server_error"),
        Fault("unavailable"),
        Fault("overloaded"),
        Fault("disconnect", after_events=after),
        Fault("truncate"),
        Fault("malformed", after_events=after),
        Fault("stall", after_events=after),
        Fault("stream_error", after_events=after, error_type="rate_limit_error"),
    ]
    server.set_script(FakeScript(replies=tuple(FakeReply(fault=f) for f in faults)))
    errors: list[ProviderError] = []
    async with provider:
        for _ in faults:
            with pytest.raises(ProviderError) as caught:
                await collect(provider)
            errors.append(caught.value)
        async with provider.stream(HELLO) as stream:
            assert wire.key not in repr(stream)
        async with wire.over(server, api_key="sk-other") as other:
            with pytest.raises(AuthenticationError) as caught:
                await collect(other)
        errors.append(caught.value)
    assert len({type(e) for e in errors}) == 7
    for error in errors:
        assert wire.key not in str(error)
        assert wire.key not in repr(error)
        assert wire.key not in repr(vars(error))
    assert wire.key not in caplog.text
    assert all(wire.key not in repr(r) for r in server.requests)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"base_url": "api.openai.com/v1"},
            ValueError,
            r"^base_url must start with http:// or https://, got 'api\.openai\.com/v1'$",
        ),
        (
            {"base_url": "ftp://x"},
            ValueError,
            r"^base_url must start with http:// or https://, got 'ftp://x'$",
        ),
        ({"api_key": ""}, ValueError, r"^api_key must be a non-empty string$"),
        ({"model": ""}, ValueError, r"^model must be a non-empty string, got ''$"),
        ({"id": ""}, ValueError, r"^id must be a non-empty string, got ''$"),
        ({"id": 3}, TypeError, r"^id must be a non-empty string, got int$"),
        (
            {"read_timeout": 0},
            ValueError,
            r"^read_timeout must be a positive number of seconds, got 0$",
        ),
        (
            {"connect_timeout": float("nan")},
            ValueError,
            r"^connect_timeout must be a positive number of seconds, got nan$",
        ),
        (
            {"read_timeout": "5"},
            TypeError,
            r"^read_timeout must be a positive number of seconds, got '5'$",
        ),
        (
            {"client": object()},
            TypeError,
            r"^client must be an httpx2\.AsyncClient, got object$",
        ),
        ({"on_rate_limit": 3}, TypeError, r"^on_rate_limit must be callable$"),
    ],
)
def test_arguments_are_checked(
    wire: Wire, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        wire.provider(**kwargs)


def test_a_bad_key_is_not_echoed(wire: Wire) -> None:
    with pytest.raises(TypeError) as caught:
        wire.provider(api_key=None)
    assert str(caught.value) == "api_key must be a non-empty string"


# The keywords each test provider is made with, and its repr: a trailing
# slash is dropped, and Anthropic's base URL has a default.
REPRS: dict[str, tuple[dict[str, Any], str]] = {
    "openai": (
        {"base_url": "https://x/v1/", "model": "m"},
        "OpenAIProvider(id='openai', base_url='https://x/v1', model='m')",
    ),
    "anthropic": (
        {"model": "claude"},
        "AnthropicProvider(id='anthropic', base_url='https://api.anthropic.com', model='claude')",
    ),
}


def test_is_a_provider(wire: Wire) -> None:
    kwargs, expected = REPRS[wire.name]
    provider: Provider = wire.provider_class(api_key=wire.key, **kwargs)
    assert provider.id == wire.name
    assert repr(provider) == expected


def test_the_providers_package_exports_every_public_name_once() -> None:
    package = trio_dispatch.providers
    exported = list(package.__all__)
    assert exported == sorted(exported)
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)


def httpx_exceptions_named(source: str) -> set[str]:
    """The httpx2 exception classes ``source`` names as ``httpx2.Name``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "httpx2"
        ):
            continue
        value = getattr(httpx2, node.attr, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            found.add(node.attr)
    return found


def test_the_checker_finds_httpx_exceptions() -> None:
    source = (
        "import httpx2\n"
        "client: httpx2.AsyncClient\n"
        "timeout = httpx2.Timeout(1.0)\n"
        "try:\n    pass\nexcept (httpx2.ReadError, httpx2.HTTPError):\n    pass\n"
    )
    assert httpx_exceptions_named(source) == {"ReadError", "HTTPError"}


def test_httpx_exceptions_become_typed_errors_in_one_module() -> None:
    package = Path(trio_dispatch.providers.__file__).parent
    named = {
        path.stem: found
        for path in sorted(package.glob("*.py"))
        if (found := httpx_exceptions_named(path.read_text(encoding="utf-8")))
    }
    assert named == {
        # A base URL httpx2 cannot parse is a bad argument: ValueError.
        "_checks": {"InvalidURL"},
        "_errors": {
            "ConnectTimeout",
            "DecodingError",
            "PoolTimeout",
            "ReadError",
            "RemoteProtocolError",
            "TimeoutException",
            "TransportError",
            "WriteTimeout",
        },
    }


# -- in memory: helpers of both formats --------------------------------------------


def openai_body() -> bytes:
    chunks: list[object] = [
        {"choices": [{"index": 0, "delta": {"content": "hello"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    lines = [json.dumps(chunk) for chunk in chunks] + ["[DONE]"]
    return "".join(f"data: {line}\n\n" for line in lines).encode()


def anthropic_events(*events: dict[str, Any]) -> bytes:
    return "".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events
    ).encode()


def anthropic_body() -> bytes:
    return anthropic_events(
        {
            "type": "message_start",
            "message": {"usage": {"input_tokens": 3, "output_tokens": 0}},
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "hello"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    )


def make_openai(client: httpx2.AsyncClient, key: str = "k") -> Provider:
    return OpenAIProvider(base_url="http://x/v1", api_key=key, model="m", client=client)


def make_anthropic(client: httpx2.AsyncClient, key: str = "k") -> Provider:
    return AnthropicProvider(base_url="http://x", api_key=key, model="m", client=client)


WIRE_FORMATS = [
    pytest.param(make_openai, openai_body, id="openai"),
    pytest.param(make_anthropic, anthropic_body, id="anthropic"),
]
MAKERS = [
    pytest.param(make_openai, id="openai"),
    pytest.param(make_anthropic, id="anthropic"),
]


# -- in memory: an event stream's content type, in any case ------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "TEXT/EVENT-STREAM",
        "Text/Event-Stream",
        "text/Event-Stream; charset=utf-8",
        "Text/Event-Stream;Charset=UTF-8",
        'TEXT/EVENT-STREAM ; charset="utf-8"',
    ],
)
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_an_event_stream_content_type_is_matched_in_any_case(
    make: Callable[[httpx2.AsyncClient], Provider],
    body: Callable[[], bytes],
    content_type: str,
) -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200, headers={"content-type": content_type}, content=body()
        )

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        events = await collect(make(client))
    assert events == [
        TextDelta("hello"),
        Finish("stop"),
        Usage(input_tokens=3, output_tokens=1),
    ]


# -- in memory: keys and header values that cannot be sent -------------------------

SECRET = "sk-Zq8vXw3Lp9RtYb6N"


def leaks(exc: BaseException, secret: str) -> list[str]:
    """Every four-character piece of ``secret`` that ``exc`` shows anywhere."""
    shown = " ".join([str(exc), repr(exc), repr(exc.args)])
    pieces = {secret[i : i + 4] for i in range(len(secret) - 3)}
    return sorted(piece for piece in pieces if piece in shown)


CONSTRUCTORS = [
    pytest.param(
        lambda **kw: OpenAIProvider(**{"base_url": "http://x/v1", "model": "m", **kw}),
        id="openai",
    ),
    pytest.param(
        lambda **kw: AnthropicProvider(**{"base_url": "http://x", "model": "m", **kw}),
        id="anthropic",
    ),
]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (SECRET + "\n", r"a line break at the end \(strip a key read from a file\)"),
        (SECRET + "\r", r"a line break at the end \(strip a key read from a file\)"),
        (SECRET + "\r\n", r"a line break at the end \(strip a key read from a file\)"),
        (SECRET[:7] + "\n" + SECRET[7:], r"a line break at index 7"),
        (SECRET + "\n\n", r"a line break at index 19"),
        (SECRET[:7] + "\r" + SECRET[7:], r"a line break at index 7"),
        (SECRET[:7] + "\t" + SECRET[7:], r"a tab at index 7"),
        (SECRET + "\t", r"a tab at index 19"),
        (SECRET[:7] + "\0" + SECRET[7:], r"a NUL character at index 7"),
        (SECRET + "\0", r"a NUL character at index 19"),
        (SECRET[:7] + "\x7f" + SECRET[7:], r"a control character at index 7"),
        (SECRET[:7] + "\x1b" + SECRET[7:], r"a control character at index 7"),
        (" " + SECRET, r"a space at index 0"),
        (SECRET[:7] + "é" + SECRET[7:], r"a non-ASCII character at index 7"),
        (SECRET[:7] + "\u2028" + SECRET[7:], r"a non-ASCII character at index 7"),
        (SECRET[:7] + "\U0001f511" + SECRET[7:], r"a non-ASCII character at index 7"),
    ],
)
@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_a_key_that_cannot_be_sent_is_refused_without_showing_it(
    make: Callable[..., Provider], key: str, message: str
) -> None:
    rule = r"^api_key must be printable ASCII without spaces, got "
    with pytest.raises(ValueError, match=rf"{rule}{message}$") as caught:
        make(api_key=key)
    assert leaks(caught.value, key) == []
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Bearer " + SECRET + "\n", r"a line break at index 26"),
        ("Bearer " + SECRET + "\r\n", r"a line break at index 26"),
        ("Bearer\t" + SECRET + "\0", r"a NUL character at index 26"),
        ("Bearer " + SECRET + "é", r"a non-ASCII character at index 26"),
        ("Bearer " + SECRET + "\x01", r"a control character at index 26"),
        (" Bearer " + SECRET, r"leading or trailing whitespace at index 0"),
        ("Bearer " + SECRET + "\t", r"leading or trailing whitespace at index 26"),
    ],
)
@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_an_extra_header_value_that_cannot_be_sent_is_refused_without_showing_it(
    make: Callable[..., Provider], value: str, message: str
) -> None:
    rule = r"^extra_headers\['X-Proxy-Auth'\] must be printable ASCII, got "
    with pytest.raises(ValueError, match=rf"{rule}{message}$") as caught:
        make(api_key="k", extra_headers={"X-Proxy-Auth": value})
    assert leaks(caught.value, SECRET) == []


@pytest.mark.parametrize("name", ["", "x proxy", "x:proxy", "x\nproxy", "é"])
@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_an_extra_header_name_that_is_not_a_token_is_refused(
    make: Callable[..., Provider], name: str
) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^extra_headers names must be HTTP tokens, got {re.escape(repr(name))}$",
    ):
        make(api_key="k", extra_headers={name: "v"})


def test_an_anthropic_version_that_cannot_be_sent_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^anthropic_version must be printable ASCII, got a line break at index 10$",
    ):
        AnthropicProvider(api_key="k", model="m", anthropic_version="2023-06-01\n")


async def test_a_header_value_with_inner_spaces_is_sent_as_it_is() -> None:
    seen: list[httpx2.Headers] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers)
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=openai_body()
        )

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        provider = OpenAIProvider(
            base_url="http://x/v1",
            api_key=SECRET,
            model="m",
            client=client,
            extra_headers={"X-Proxy-Auth": "Bearer\t a b"},
        )
        await collect(provider)
    assert seen[0]["x-proxy-auth"] == "Bearer\t a b"
    assert seen[0]["authorization"] == f"Bearer {SECRET}"


# -- in memory: the key, redacted in any spelling and across a cut -----------------

# Printable ASCII with every character JSON may escape short: / " and \.
KEY = 'sk-Zq8v/Xw3"Lp9\\RtYb6N'


def escaped(key: str, which: Callable[[int], bool], upper: bool = False) -> str:
    """``key`` as JSON string content, the characters ``which`` picks as \\uXXXX."""
    out = []
    for index, char in enumerate(key):
        if which(index):
            out.append(f"\\u{ord(char):04X}" if upper else f"\\u{ord(char):04x}")
        else:
            out.append(json.dumps(char)[1:-1])
    return "".join(out)


# Every way a JSON string can spell KEY, and the raw key (for text bodies).
JSON_SPELLINGS = {
    "short escapes": json.dumps(KEY)[1:-1],
    "escaped slash": json.dumps(KEY)[1:-1].replace("/", "\\/"),
    "all \\u, lower": escaped(KEY, lambda i: True),
    "all \\u, upper": escaped(KEY, lambda i: True, upper=True),
    "every other \\u": escaped(KEY, lambda i: i % 2 == 0),
    "one \\u": escaped(KEY, lambda i: i == 5),
}
TEXT_SPELLINGS = {"raw": KEY, **JSON_SPELLINGS}


def answering(
    make: Callable[..., Provider],
    status: int,
    body: bytes,
    content_type: str = "application/json",
) -> Provider:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            status, headers={"content-type": content_type}, content=body
        )

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    return make(client, KEY)


async def failure(provider: Provider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert [type(e) for e in chain(caught.value)] == [type(caught.value)]
    assert leaks(caught.value, KEY) == []
    assert KEY not in repr(vars(caught.value))
    return caught.value


@pytest.mark.parametrize("spelling", JSON_SPELLINGS.values(), ids=JSON_SPELLINGS)
@pytest.mark.parametrize("make", MAKERS)
async def test_a_key_echoed_json_escaped_in_an_error_body_is_redacted(
    make: Callable[..., Provider], spelling: str
) -> None:
    error = (
        '{"error": {"type": "invalid_request_error", "code": "' + spelling + '", '
        '"message": "bad key '
        + spelling
        + '; upstream: {\\"key\\": \\"'
        + json.dumps(spelling)[1:-1]
        + '\\"}"}}'
    )
    provider = answering(make, 401, error.encode())
    exc = await failure(provider)
    assert str(exc) == (
        f"{provider.id}: HTTP 401 invalid_request_error ([redacted]): "
        'bad key [redacted]; upstream: {"key": "[redacted]"}'
    )


@pytest.mark.parametrize("spelling", TEXT_SPELLINGS.values(), ids=TEXT_SPELLINGS)
@pytest.mark.parametrize("make", MAKERS)
async def test_a_key_echoed_in_any_spelling_in_a_text_error_body_is_redacted(
    make: Callable[..., Provider], spelling: str
) -> None:
    text = f"upstream refused {spelling}, and said so"
    provider = answering(make, 403, text.encode(), "text/plain")
    exc = await failure(provider)
    assert str(exc) == (
        f"{provider.id}: HTTP 403: upstream refused [redacted], and said so"
    )


LIMIT = 64 * 1024  # what of an error body is kept


@pytest.mark.parametrize("spelling", TEXT_SPELLINGS.values(), ids=TEXT_SPELLINGS)
@pytest.mark.parametrize("before_the_cut", [1, 5, 12])
@pytest.mark.parametrize("make", MAKERS)
async def test_a_key_that_straddles_the_error_body_cut_is_redacted_whole(
    make: Callable[..., Provider],
    before_the_cut: int,
    spelling: str,
) -> None:
    # Whitespace collapses in the message, so what was kept at the cut shows.
    error = b" " * (LIMIT - before_the_cut) + spelling.encode() + b" and more" * 99
    provider = answering(make, 500, error, "text/plain")
    exc = await failure(provider)
    assert str(exc) == f"{provider.id}: HTTP 500: [redacted]"


@pytest.mark.parametrize("spelling", TEXT_SPELLINGS.values(), ids=TEXT_SPELLINGS)
@pytest.mark.parametrize(
    "starts_at",
    # The body is read a key's longest spelling (6 bytes a character) past
    # the cut, so a key can be cut in two there too; it lies past the cut.
    [LIMIT, LIMIT + 3, LIMIT + 6 * len(KEY) - 5],
    ids=["at the cut", "past the cut", "across the end of the read"],
)
@pytest.mark.parametrize("make", MAKERS)
async def test_a_key_past_the_error_body_cut_is_dropped_with_it(
    make: Callable[..., Provider],
    starts_at: int,
    spelling: str,
) -> None:
    error = b"x" * 10 + b" " * (starts_at - 10) + spelling.encode() + b" more" * 99
    provider = answering(make, 500, error, "text/plain")
    exc = await failure(provider)
    assert str(exc) == f"{provider.id}: HTTP 500: xxxxxxxxxx"


@pytest.mark.parametrize("make", MAKERS)
async def test_a_malformed_event_holding_the_key_carries_no_context_holding_it(
    make: Callable[..., Provider],
) -> None:
    data = 'not json, "' + JSON_SPELLINGS["all \\u, lower"] + '" ' + KEY
    provider = answering(make, 200, f"data: {data}\n\n".encode(), "text/event-stream")
    exc = await failure(provider)
    assert str(exc) == (
        f"{provider.id}: an event's data is not valid JSON (Expecting value): "
        "'not json, \"[redacted]\" [redacted]'"
    )


async def test_an_openai_chunk_holding_the_key_carries_no_context_holding_it() -> None:
    chunk = {"choices": [{"index": KEY, "delta": {}}]}
    provider = answering(
        make_openai, 200, f"data: {json.dumps(chunk)}\n\n".encode(), "text/event-stream"
    )
    exc = await failure(provider)
    assert str(exc).startswith("openai: a chunk does not fit the format: ")


@pytest.mark.parametrize("spelling", JSON_SPELLINGS.values(), ids=JSON_SPELLINGS)
@pytest.mark.parametrize("make", MAKERS)
async def test_a_key_echoed_escaped_in_an_error_event_is_redacted(
    make: Callable[..., Provider], spelling: str
) -> None:
    # Escaped twice, as a JSON document quoted inside the error's message:
    # decoding the event leaves the key in this spelling.
    message = f'upstream said {{"key": "{spelling}"}}'
    event = {"type": "error", "error": {"type": "api_error", "message": message}}
    data = json.dumps(event)
    provider = answering(
        make, 200, f"event: error\ndata: {data}\n\n".encode(), "text/event-stream"
    )
    exc = await failure(provider)
    assert str(exc) == (
        f'{provider.id}: api_error in the stream: upstream said {{"key": "[redacted]"}}'
    )


# An Anthropic key, long enough to be cut in an excerpt of an error.
ANTHROPIC_KEY = "sk-ant-api03-SECRETSECRETSECRETSECRET0123456789"


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body
    )


async def test_a_status_error_never_holds_part_of_the_key() -> None:
    # The key straddles a 500-character cut.
    message = "x" * (497 - len(ANTHROPIC_KEY) + 4) + ANTHROPIC_KEY

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = {"error": {"message": message, "type": "invalid_request_error"}}
        return httpx2.Response(400, json=body)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=ANTHROPIC_KEY, model="m", client=client
        )
        with pytest.raises(ProviderError) as info:
            async with provider.stream(HELLO):
                pass  # pragma: no cover
    assert ANTHROPIC_KEY[:12] not in str(info.value)


async def test_a_malformed_event_excerpt_never_holds_part_of_the_key() -> None:
    body = b"data: " + ("x" * 40 + ANTHROPIC_KEY + "y" * 30).encode() + b"\n\n"
    transport = httpx2.MockTransport(lambda request: sse_response(body))
    async with httpx2.AsyncClient(transport=transport) as client:
        provider = OpenAIProvider(
            base_url="http://x/v1", api_key=ANTHROPIC_KEY, model="m", client=client
        )
        with pytest.raises(MalformedStream) as info:
            async with provider.stream(HELLO) as events:
                async for _ in events:
                    pass  # pragma: no cover
    assert ANTHROPIC_KEY[:12] not in str(info.value)


class BreaksMidStream(httpx2.AsyncByteStream):
    """A body that sends one event, then loses the connection."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'event: ping\ndata: {"type": "ping"}\n\n'
        raise httpx2.ReadError("connection reset")


async def test_a_failed_connection_carries_no_httpx_error_holding_the_key() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=request)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=ANTHROPIC_KEY, model="m", client=client
        )
        with pytest.raises(ProviderConnectionError) as info:
            async with provider.stream(HELLO):
                pass  # pragma: no cover
    # httpx2's exceptions hold the request, whose x-api-key header is the key.
    assert not [e for e in chain(info.value) if isinstance(e, httpx2.HTTPError)]


async def test_a_dropped_stream_carries_no_httpx_error_holding_the_key() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, stream=BreaksMidStream())

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=ANTHROPIC_KEY, model="m", client=client
        )
        with pytest.raises(StreamInterrupted) as info:
            async with provider.stream(HELLO) as events:
                async for _ in events:
                    pass  # pragma: no cover
    assert not [e for e in chain(info.value) if isinstance(e, httpx2.HTTPError)]


# -- in memory: nothing but a typed error escapes ----------------------------------


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        (
            "http://[::1/v1",
            r"^base_url must be a valid URL, got 'http://\[::1/v1' "
            r"\(invalid port: ':1'\)$",
        ),
        (
            "https://\x00x/v1",
            r"^base_url must be a valid URL, got 'https://\\x00x/v1'"
            r" \(a control character or space at index 8\)$",
        ),
        (
            "http://a b/v1",
            r"^base_url must be a valid URL, got 'http://a b/v1'"
            r" \(a control character or space at index 8\)$",
        ),
        (
            "http://ab/v1\x7f",
            r"^base_url must be a valid URL, got 'http://ab/v1\\x7f'"
            r" \(a control character or space at index 12\)$",
        ),
        ("http://", r"^base_url must name a host, got 'http://'$"),
        ("https:///v1", r"^base_url must name a host, got 'https:///v1'$"),
        (
            "http://x/v1?key=1",
            r"^base_url must not have a query or fragment, got 'http://x/v1\?key=\*\*\*'$",
        ),
        (
            "http://x/v1#top",
            r"^base_url must not have a query or fragment, got 'http://x/v1#top'$",
        ),
    ],
)
@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_a_base_url_httpx_would_refuse_is_refused_when_the_provider_is_made(
    make: Callable[..., Provider], base_url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make(api_key="k", base_url=base_url)


PROXY_PASSWORD = "pr0xy-pa55w0rd"


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        (
            f"https://user:{PROXY_PASSWORD}@proxy/v1?api-key=s3cr3t-k3y",
            "base_url must not have a query or fragment,"
            " got 'https://***@proxy/v1?api-key=***'",
        ),
        (
            f"ftp://user:{PROXY_PASSWORD}@proxy/v1",
            "base_url must start with http:// or https://, got 'ftp://***@proxy/v1'",
        ),
        (
            f"https://user:{PROXY_PASSWORD}@proxy/v1\x00",
            "base_url must be a valid URL, got 'https://***@proxy/v1\\x00'"
            " (a control character or space at index 36)",
        ),
        (
            # A '/' in the password, not percent-encoded: httpx2 reads a
            # port out of the password, and says so.
            f"https://user:{PROXY_PASSWORD}/x@proxy/v1",
            "base_url must be a valid URL, got '<a URL with credentials>'",
        ),
    ],
)
@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_a_refused_base_url_is_shown_without_its_credentials(
    make: Callable[..., Provider], base_url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$") as caught:
        make(api_key="k", base_url=base_url)
    assert leaks(caught.value, PROXY_PASSWORD) == []
    assert "s3cr3t" not in str(caught.value)


@pytest.mark.parametrize("make", CONSTRUCTORS)
async def test_a_base_url_with_credentials_is_shown_without_them(
    make: Callable[..., Provider],
) -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=request)

    base_url = f"https://user:{PROXY_PASSWORD}@proxy/v1"
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)) as client:
        provider = make(api_key="k", base_url=base_url, client=client)
        assert isinstance(provider, OpenAIProvider | AnthropicProvider)
        assert provider.base_url == base_url  # what requests go to, as given
        assert repr(provider) == (
            f"{type(provider).__name__}(id={provider.id!r},"
            " base_url='https://***@proxy/v1', model='m')"
        )
        with pytest.raises(ProviderError) as caught:
            await collect(provider)
    assert str(caught.value) == (
        f"{provider.id}: could not reach proxy: connection refused"
    )
    assert leaks(caught.value, PROXY_PASSWORD) == []


@pytest.mark.parametrize("make", MAKERS)
async def test_a_lent_client_closed_by_its_owner_fails_the_request_with_a_typed_error(
    make: Callable[..., Provider],
) -> None:
    sent: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)  # pragma: no cover (nothing is sent)
        return httpx2.Response(200)  # pragma: no cover

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        provider = make(client, KEY)
    with pytest.raises(RequestFailed) as caught:
        await collect(provider)
    assert str(caught.value) == f"{provider.id}: the HTTP client is closed"
    assert not caught.value.retryable
    assert sent == []


class Boom(Exception):
    """What a transport we were lent might raise, undocumented."""


def raising_answer(exc: BaseException) -> Callable[[httpx2.Request], httpx2.Response]:
    def answer(request: httpx2.Request) -> httpx2.Response:
        raise exc

    return answer


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (Boom(f"bad key {KEY}"), "Boom: bad key [redacted]"),
        (RuntimeError(), "RuntimeError"),
        (httpx2.TooManyRedirects("Exceeded maximum allowed redirects."), None),
        (httpx2.InvalidURL("Invalid port: ':1'"), "InvalidURL: Invalid port: ':1'"),
        (
            ExceptionGroup("several", [Boom("a"), ValueError("b")]),
            "ExceptionGroup: several (2 sub-exceptions)",
        ),
    ],
)
@pytest.mark.parametrize("make", MAKERS)
async def test_an_unexpected_error_from_the_http_client_fails_the_request_with_a_typed_error(
    make: Callable[..., Provider],
    exc: Exception,
    shown: str | None,
) -> None:
    shown = shown or f"{type(exc).__name__}: {exc}"
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising_answer(exc)))
    provider = make(client, KEY)
    error = await failure(provider)
    assert type(error) is RequestFailed
    assert not error.retryable
    assert str(error) == f"{provider.id}: the HTTP client failed: {shown}"


class BreaksOddly(httpx2.AsyncByteStream):
    """A body that sends what it is given, then fails in no documented way."""

    def __init__(self, sent: bytes) -> None:
        self._sent = sent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._sent
        raise Boom(f"lost {KEY}")


@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_an_unexpected_error_in_the_middle_of_a_stream_is_a_typed_error(
    make: Callable[..., Provider], body: Callable[[], bytes]
) -> None:
    first = body().partition(b"\n\n")[0] + b"\n\n"

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=BreaksOddly(first),
        )

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    provider = make(client, KEY)
    exc = await failure(provider)
    assert type(exc) is RequestFailed
    assert str(exc) == f"{provider.id}: the stream failed: Boom: lost [redacted]"


@pytest.mark.parametrize("make", MAKERS)
async def test_an_error_body_that_breaks_oddly_is_still_a_status_error(
    make: Callable[..., Provider],
) -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(503, stream=BreaksOddly(b"busy, try later"))

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    provider = make(client, KEY)
    exc = await failure(provider)
    assert str(exc) == f"{provider.id}: HTTP 503: busy, try later"


@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_an_unexpected_error_after_the_terminator_leaves_the_answer_whole(
    make: Callable[..., Provider], body: Callable[[], bytes]
) -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=BreaksOddly(body()),
        )

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        events = await collect(make(client, KEY))
    assert events == [
        TextDelta("hello"),
        Finish("stop"),
        Usage(input_tokens=3, output_tokens=1),
    ]


class Stop(BaseException):
    """Like KeyboardInterrupt: never to be caught on the way."""


@pytest.mark.parametrize(
    "exc",
    [Stop(), BaseExceptionGroup("mixed", [Stop(), Boom()])],
    ids=["base exception", "group holding one"],
)
@pytest.mark.parametrize("make", MAKERS)
async def test_base_exceptions_from_the_http_client_pass_through_as_they_are(
    make: Callable[..., Provider], exc: BaseException
) -> None:
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising_answer(exc)))
    with pytest.raises(BaseException) as caught:  # noqa: PT011 (checked by identity)
        await collect(make(client, KEY))
    assert caught.value is exc


@pytest.mark.parametrize("make", MAKERS)
async def test_a_cancelled_request_is_not_turned_into_a_provider_error(
    make: Callable[..., Provider],
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hang(request: httpx2.Request) -> httpx2.Response:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(hang))
    with trio.move_on_after(5) as scope:
        await collect(make(client, KEY))
    assert scope.cancelled_caught
    assert trio.current_time() == 5


def deep(levels: int) -> dict[str, Any]:
    """An object nested ``levels`` deep, built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (deep(100_000), "it nests too deeply"),
        ({"a": {1, 2}}, "Object of type set is not JSON serializable"),
    ],
)
@pytest.mark.parametrize("make", MAKERS)
def test_a_request_that_cannot_be_encoded_fails_with_a_typed_error_before_sending(
    make: Callable[..., Provider],
    arguments: dict[str, Any],
    reason: str,
) -> None:
    call = ToolCall("call_1", "t", arguments)
    request = ChatRequest(
        [
            ChatMessage("user", "go"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "ok", tool_call_id="call_1"),
        ]
    )
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising_answer(Boom())))
    provider = make(client, KEY)
    with pytest.raises(RequestFailed) as caught:
        provider.stream(request)
    assert str(caught.value) == (
        f"{provider.id}: the request cannot be encoded as JSON: {reason}"
    )
    assert not caught.value.retryable


def openai_call(arguments: str) -> list[ServerSentEvent]:
    function = {"name": "t", "arguments": arguments}
    fragment = {"index": 0, "id": "call_1", "function": function}
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    return [ServerSentEvent(data=json.dumps(chunk)) for chunk in chunks]


def tool_use_block(arguments: str) -> list[dict[str, Any]]:
    """An Anthropic tool_use content block, its arguments in one delta."""
    return [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "call_1", "name": "t"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": arguments},
        },
        {"type": "content_block_stop", "index": 0},
    ]


def anthropic_call(arguments: str) -> list[ServerSentEvent]:
    return [ServerSentEvent(data=json.dumps(e)) for e in tool_use_block(arguments)]


DECODERS = [
    pytest.param(lambda: OpenAIDecoder("openai"), openai_call, id="openai"),
    pytest.param(lambda: AnthropicDecoder("anthropic"), anthropic_call, id="anthropic"),
]


def nested(levels: int) -> str:
    """JSON text: an object holding arrays and objects, ``levels`` deep in all."""
    text = "1"
    for level in range(levels - 1):
        text = f"[{text}]" if level % 2 else f'{{"a": {text}}}'
    return '{"a": ' + text + "}"


@pytest.mark.parametrize("levels", [101, 500, 800])
@pytest.mark.parametrize(("decoder", "events"), DECODERS)
def test_tool_arguments_nested_too_deep_are_refused_as_they_are_decoded(
    decoder: Callable[[], OpenAIDecoder | AnthropicDecoder],
    events: Callable[[str], list[ServerSentEvent]],
    levels: int,
) -> None:
    raw = nested(levels)
    assert json.loads(raw)  # it parses: only its depth is refused
    decoding = decoder()
    calls = [e for event in events(raw) for e in decoding.feed(event)]
    assert calls[0] == ToolCall(
        "call_1", "t", {}, raw, "arguments nest deeper than 100 levels"
    )


@pytest.mark.parametrize(("decoder", "events"), DECODERS)
def test_tool_arguments_nested_as_deep_as_allowed_are_kept(
    decoder: Callable[[], OpenAIDecoder | AnthropicDecoder],
    events: Callable[[str], list[ServerSentEvent]],
) -> None:
    raw = nested(100)
    decoding = decoder()
    calls = [e for event in events(raw) for e in decoding.feed(event)]
    assert calls[0] == ToolCall("call_1", "t", json.loads(raw), raw)


@pytest.mark.parametrize("make", MAKERS)
async def test_a_deeply_nested_error_body_is_still_a_status_error(
    make: Callable[..., Provider],
) -> None:
    provider = answering(make, 500, b'{"error": ' + b"[" * 100_000)
    exc = await failure(provider)
    assert type(exc) is ServerError
    assert str(exc) == f'{provider.id}: HTTP 500: {{"error": ' + "[" * 487 + "..."


# -- one bad call fails only its turn ----------------------------------------------


class Gated(httpx2.AsyncByteStream):
    """A body that sends its first event, then waits for ``gate``."""

    def __init__(self, body: bytes, gate: trio.Event) -> None:
        self._first, _, self._rest = body.partition(b"\n\n")
        self._gate = gate

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._first + b"\n\n"
        await self._gate.wait()
        yield self._rest


def anthropic_tool_call(arguments: str) -> bytes:
    return anthropic_events(
        {"type": "message_start", "message": {"usage": {"input_tokens": 1}}},
        *tool_use_block(arguments),
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        {"type": "message_stop"},
    )


def bad_transport(how: str) -> httpx2.MockTransport:
    """What makes the failing conversation's calls fail, by name."""
    stream = {"content-type": "text/event-stream"}
    if how in ("the transport raises", "the client is closed"):
        return httpx2.MockTransport(raising_answer(Boom("no")))
    if how == "the stream breaks oddly":
        return httpx2.MockTransport(
            lambda request: httpx2.Response(
                200, headers=stream, stream=BreaksOddly(anthropic_body()[:40])
            )
        )
    assert how == "the error body nests deep"
    return httpx2.MockTransport(
        lambda request: httpx2.Response(500, content=b"[" * 100_000)
    )


@pytest.mark.parametrize(
    ("how", "outcome"),
    [
        ("the client is closed", "RequestFailed: bad: the HTTP client is closed"),
        (
            "the transport raises",
            "RequestFailed: bad: the HTTP client failed: Boom: no",
        ),
        (
            "the stream breaks oddly",
            "RequestFailed: bad: the stream failed: Boom: lost [redacted]",
        ),
        (
            "the error body nests deep",
            "ServerError: bad: HTTP 500: " + "[" * 497 + "...",
        ),
    ],
)
async def test_one_bad_call_fails_only_its_turn_and_other_conversations_finish(
    how: str, outcome: str
) -> None:
    gate = trio.Event()
    good_transport = httpx2.MockTransport(
        lambda request: httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=Gated(openai_body(), gate),
        )
    )
    good_client = httpx2.AsyncClient(transport=good_transport)
    bad_client = httpx2.AsyncClient(transport=bad_transport(how))
    if how == "the client is closed":
        await bad_client.aclose()
    good = OpenAIProvider(
        "good", base_url="http://x/v1", api_key=KEY, model="m", client=good_client
    )
    bad = AnthropicProvider(
        "bad", base_url="http://x", api_key=KEY, model="m", client=bad_client
    )
    answers: list[TurnResult] = []
    async with open_dispatcher({"good": 2, "bad": 1}) as dispatcher:
        first = dispatcher.start_conversation(good)
        second = dispatcher.start_conversation(good)
        failing = dispatcher.start_conversation(
            bad, options=ConversationOptions(max_attempts=1)
        )

        async def ask(conversation: Conversation) -> None:
            answers.append(await conversation.ask("hi"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, first)
            nursery.start_soon(ask, second)
            await trio.testing.wait_all_tasks_blocked()
            # Both good turns are streaming, halfway, when the bad call fails.
            assert dispatcher.statistics().providers["good"].in_flight == 2
            with pytest.raises(ProviderError) as caught:
                await failing.ask("go")
            gate.set()
        assert f"{type(caught.value).__name__}: {caught.value}" == outcome
        assert [answer.text for answer in answers] == ["hello", "hello"]
        assert not failing.closed
        assert not dispatcher.closed
        # The conversations go on: the good one answers, the bad one fails again.
        assert (await first.ask("again")).text == "hello"
        with pytest.raises(type(caught.value)):
            await failing.ask("again")


async def test_deep_tool_arguments_never_stop_the_dispatcher() -> None:
    # Arguments nested just short of the recursion limit parse, and then the
    # next request cannot be encoded. Where that window lies depends on the
    # stack in use, so a range of depths is tried: on Python 3.11 it spans
    # the window and the parser's own limit. (Newer Pythons count JSON's
    # recursion apart, with other limits; the bound refuses these depths
    # there just the same.)
    depths = range(880, 1001)

    def bodies() -> Iterator[bytes]:
        for levels in depths:
            yield anthropic_tool_call(nested(levels))
            yield anthropic_body()

    answers = bodies()
    stream = {"content-type": "text/event-stream"}
    bad_transport = httpx2.MockTransport(
        lambda request: httpx2.Response(200, headers=stream, content=next(answers))
    )
    gate = trio.Event()
    good_transport = httpx2.MockTransport(
        lambda request: httpx2.Response(
            200, headers=stream, stream=Gated(openai_body(), gate)
        )
    )
    good = OpenAIProvider(
        "good",
        base_url="http://x/v1",
        api_key=KEY,
        model="m",
        client=httpx2.AsyncClient(transport=good_transport),
    )
    bad = AnthropicProvider(
        "bad",
        base_url="http://x",
        api_key=KEY,
        model="m",
        client=httpx2.AsyncClient(transport=bad_transport),
    )

    async def t(arguments: dict[str, Any]) -> str:
        raise AssertionError  # pragma: no cover (its arguments are refused)

    tool = Tool(name="t", description="", parameters={"type": "object"}, run=t)
    refusals: list[str] = []
    answered: list[TurnResult] = []
    async with open_dispatcher({"good": 1, "bad": 1}) as dispatcher:
        waiting = dispatcher.start_conversation(good)
        deep = dispatcher.start_conversation(bad, tools=[tool])

        async def ask() -> None:
            answered.append(await waiting.ask("hi"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert dispatcher.statistics().providers["good"].in_flight == 1
            for _ in depths:
                assert (await deep.ask("go")).text == "hello"
                refusals.append(deep.history[-2].content)
            gate.set()
        assert not dispatcher.closed
    assert [answer.text for answer in answered] == ["hello"]
    parsed = "error: arguments nest deeper than 100 levels"
    too_deep = "error: arguments are not valid JSON: maximum recursion depth exceeded"
    assert refusals[0] == parsed  # the sweep starts where arguments still parse
    assert all(r == parsed or r.startswith(too_deep) for r in refusals)
