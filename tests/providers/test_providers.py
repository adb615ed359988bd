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
from trio_dispatch import Provider, ProviderError
from trio_dispatch.messages import Finish, StreamEvent, TextDelta, ToolCall, Usage
from trio_dispatch.providers import (
    AuthenticationError,
    BadRequest,
    MalformedStream,
    Overloaded,
    ProviderConnectionError,
    RateLimited,
    RequestFailed,
    ServerError,
    StreamInterrupted,
)
from trio_dispatch.testing import FakeReply, FakeScript, Fault, open_fake_llm_server

from .._wires import HELLO, SSE_HEADERS, WIRES, Wire, collect

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

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
