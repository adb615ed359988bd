"""``OpenAIProvider``: chat completions streaming over real HTTP.

Two kinds of test. Parser tests replay recorded streams from
``tests/fixtures`` through ``httpx.MockTransport`` (a socket adds nothing
there): ``openai_text.sse``, ``openai_tool_call.sse`` and
``openai_parallel_tool_calls.sse`` are openai-python's recordings of the
live API (``.inline-snapshot/external/038a5c69c34c…``, ``dae1b261f197…``,
``453df473e962…``); ``openai_deepseek_reasoning.sse`` is built in DeepSeek's
documented shape (``reasoning_content``, ``usage: null`` on every chunk,
cached prompt tokens). Everything else runs through loopback sockets
against the fake LLM server.
"""

from __future__ import annotations

import json
import logging
import socket
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing

import trio_dispatch.providers
from trio_dispatch import Provider, ProviderError
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from trio_dispatch.providers import (
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
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    Fault,
    open_fake_llm_server,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from trio_dispatch.testing import FakeLLMServer

FIXTURES = Path(__file__).parent / "fixtures"
KEY = "sk-test-KEY-7f3a9c1e5b-DO-NOT-LEAK"
HELLO = ChatRequest([ChatMessage("user", "Hello")])
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server(api_key=KEY) as fake:
        yield fake


def provider_for(server: FakeLLMServer, **kwargs: Any) -> OpenAIProvider:  # noqa: ANN401 (the constructor's keywords)
    options: dict[str, Any] = {
        "base_url": server.openai_base_url,
        "api_key": KEY,
        "model": "gpt-test",
    }
    options.update(kwargs)
    return OpenAIProvider(**options)


async def collect(
    provider: Provider, request: ChatRequest = HELLO
) -> list[StreamEvent]:
    async with provider.stream(request) as events:
        return [event async for event in events]


def replaying(
    body: bytes | str,
    status: int = 200,
    headers: dict[str, str] | None = None,
    on_rate_limit: Callable[[str, float | None], None] | None = None,
) -> OpenAIProvider:
    """A provider whose every request is answered with ``body``, in memory."""
    content = body.encode() if isinstance(body, str) else body

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or SSE_HEADERS, content=content)

    return OpenAIProvider(
        base_url="https://api.test/v1",
        api_key=KEY,
        model="m",
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        on_rate_limit=on_rate_limit,
    )


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse(*chunks: object) -> str:
    """An OpenAI stream body: each chunk as JSON, or a raw string as it is."""
    lines = [c if isinstance(c, str) else json.dumps(c) for c in chunks]
    return "".join(f"data: {line}\n\n" for line in lines)


def delta(
    content: str | None = None, finish: str | None = None, **fields: object
) -> dict[str, Any]:
    d: dict[str, object] = dict(fields)
    if content is not None:
        d["content"] = content
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


# -- recorded streams ------------------------------------------------------


async def test_recorded_text_stream() -> None:
    events = await collect(replaying(fixture("openai_text.sse")))
    assert all(isinstance(e, TextDelta) for e in events[:-2])
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == (
        "I'm unable to provide real-time updates, including current weather "
        "information. For the latest weather in San Francisco, I recommend checking "
        "a reliable weather website or app such as the Weather Channel, BBC Weather, "
        "or a local San Francisco news station."
    )
    assert len(events) == 47 + 2  # the empty first content is not an event
    assert events[-2:] == [Finish("stop"), Usage(input_tokens=14, output_tokens=47)]


async def test_recorded_tool_call_with_arguments_in_pieces() -> None:
    events = await collect(replaying(fixture("openai_tool_call.sse")))
    assert events == [
        ToolCall(
            "call_5uxEBMFySqqQGu02I5QHA8k6",
            "get_weather",
            {"city": "New York City"},
            '{"city":"New York City"}',
        ),
        Finish("tool_calls"),
        Usage(input_tokens=44, output_tokens=16),
    ]


async def test_recorded_parallel_tool_calls() -> None:
    events = await collect(replaying(fixture("openai_parallel_tool_calls.sse")))
    assert events == [
        ToolCall(
            "call_lQnnsesjFMWMQ5IeWPHzR4th",
            "GetWeatherArgs",
            {"city": "Edinburgh", "country": "UK", "units": "c"},
            '{"city": "Edinburgh", "country": "UK", "units": "c"}',
        ),
        ToolCall(
            "call_2xjOUgaCdiwAcl9ZBL9LyMUU",
            "get_stock_price",
            {"ticker": "AAPL", "exchange": "NASDAQ"},
            '{"ticker": "AAPL", "exchange": "NASDAQ"}',
        ),
        Finish("tool_calls"),
        Usage(input_tokens=149, output_tokens=60),
    ]


async def test_reasoning_content_and_cached_prompt_tokens() -> None:
    events = await collect(replaying(fixture("openai_deepseek_reasoning.sse")))
    assert events == [
        ReasoningDelta("Okay"),
        ReasoningDelta(", the user says hi."),
        TextDelta("Hello"),
        TextDelta("!"),
        Finish("stop"),
        # prompt_tokens 11 includes the 6 cached ones; Usage keeps them apart.
        Usage(input_tokens=5, output_tokens=8, cache_read_tokens=6),
    ]


async def test_reasoning_field_spelled_reasoning() -> None:
    body = sse(
        delta(reasoning="hmm"),
        delta(reasoning_content="one", reasoning="one"),  # both: not twice
        delta("ok", "stop"),
        "[DONE]",
    )
    events = await collect(replaying(body))
    assert events == [
        ReasoningDelta("hmm"),
        ReasoningDelta("one"),
        TextDelta("ok"),
        Finish("stop"),
    ]


async def test_usage_in_the_finish_chunk_is_sent_once() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    body = sse(
        {**delta("a"), "usage": None},
        {**delta(finish="length"), "usage": usage},
        {"choices": [], "usage": usage},  # some servers repeat it
        "[DONE]",
    )
    events = await collect(replaying(body))
    assert events == [TextDelta("a"), Finish("length"), Usage(3, 2)]


async def test_legacy_function_call_finish_reason_is_normalised() -> None:
    body = sse(delta(finish="function_call"), "[DONE]")
    assert await collect(replaying(body)) == [Finish("tool_calls")]


async def test_unknown_finish_reason_passes_through() -> None:
    body = sse(delta(finish="eos_token"), "[DONE]")
    assert await collect(replaying(body)) == [Finish("eos_token")]


async def test_choices_other_than_the_first_are_ignored() -> None:
    body = sse(
        {
            "choices": [
                {"index": 1, "delta": {"content": "other"}, "finish_reason": None}
            ]
        },
        delta("mine", "stop"),
        "[DONE]",
    )
    assert await collect(replaying(body)) == [TextDelta("mine"), Finish("stop")]


async def test_invalid_tool_arguments_become_an_arguments_error() -> None:
    call = {
        "index": 0,
        "id": "call_1",
        "function": {"name": "f", "arguments": '{"a": '},
    }
    body = sse(delta(tool_calls=[call]), delta(finish="tool_calls"), "[DONE]")
    events = await collect(replaying(body))
    tool_call = events[0]
    assert isinstance(tool_call, ToolCall)
    assert tool_call.arguments == {}
    assert tool_call.raw_arguments == '{"a": '
    assert tool_call.arguments_error is not None
    assert tool_call.arguments_error.startswith("arguments are not valid JSON: ")
    assert events[1:] == [Finish("tool_calls")]


async def test_tool_arguments_that_are_not_an_object() -> None:
    call = {
        "index": 0,
        "id": "call_1",
        "function": {"name": "f", "arguments": "[1, 2]"},
    }
    body = sse(delta(tool_calls=[call]), delta(finish="tool_calls"), "[DONE]")
    (tool_call, _) = await collect(replaying(body))
    assert tool_call == ToolCall(
        "call_1", "f", {}, "[1, 2]", "arguments must be a JSON object, got array"
    )


async def test_a_tool_without_arguments() -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "now", "arguments": ""}}
    body = sse(delta(tool_calls=[call]), delta(finish="tool_calls"), "[DONE]")
    events = await collect(replaying(body))
    assert events[0] == ToolCall("call_1", "now", {}, "")


# -- streams that make no sense ------------------------------------------------


async def test_invalid_json_is_malformed() -> None:
    provider = replaying(sse(delta("a"), '{"choices": [', "[DONE]"))
    async with provider.stream(HELLO) as events:
        assert await events.__anext__() == TextDelta("a")
        with pytest.raises(
            MalformedStream, match=r"^openai: an event's data is not valid JSON"
        ):
            await events.__anext__()


@pytest.mark.parametrize(
    ("chunk", "problem"),
    [
        ({"id": "x"}, r"required field missing @ \$\.choices"),
        (
            {"choices": [{"index": 0, "delta": {"content": 5}}]},
            r"expected a string, got number @ \$\.choices\[0\]\.delta\.content",
        ),
        ({"choices": "all"}, r"expected an array, got string @ \$\.choices"),
        (
            delta(tool_calls=[{"id": "c", "function": {"name": "f"}}]),
            r"required field missing @ \$\.choices\[0\]\.delta\.tool_calls\[0\]\.index",
        ),
        (
            {"choices": [], "usage": {"prompt_tokens": "3", "completion_tokens": 1}},
            r"expected an integer, got string @ \$\.usage\.prompt_tokens",
        ),
        ([1, 2], r"expected an object, got array @ \$"),
    ],
)
async def test_a_chunk_missing_fields_names_them(chunk: object, problem: str) -> None:
    with pytest.raises(
        MalformedStream, match=rf"^openai: a chunk does not fit the format: {problem}"
    ):
        await collect(replaying(sse(chunk, "[DONE]")))


async def test_a_tool_call_without_an_id_is_malformed() -> None:
    call = {"index": 0, "function": {"name": "f", "arguments": "{}"}}
    body = sse(delta(tool_calls=[call]), delta(finish="tool_calls"), "[DONE]")
    with pytest.raises(
        MalformedStream, match=r"^openai: tool call 0 arrived without its id$"
    ):
        await collect(replaying(body))


async def test_no_done_is_interrupted() -> None:
    events: list[StreamEvent] = []
    with pytest.raises(
        StreamInterrupted, match=r"^openai: the stream ended without \[DONE\]$"
    ) as caught:
        async with replaying(sse(delta("a"), delta(finish="stop"))).stream(
            HELLO
        ) as stream:
            async for event in stream:
                events.append(event)
    assert events == [TextDelta("a"), Finish("stop")]  # what came stands
    assert caught.value.retryable


async def test_done_without_a_finish_reason_is_interrupted() -> None:
    with pytest.raises(StreamInterrupted, match=r"without a finish_reason$"):
        await collect(replaying(sse(delta("a"), "[DONE]")))


async def test_a_json_answer_to_a_stream_is_malformed_on_entry() -> None:
    provider = replaying(
        b'{"choices": []}', headers={"content-type": "application/json"}
    )
    with pytest.raises(
        MalformedStream,
        match=r"expected an event stream, got HTTP 200 with content-type 'application/json'",
    ):
        async with provider.stream(HELLO):
            pytest.fail("entered")


@pytest.mark.parametrize(
    ("chunk", "error", "text"),
    [
        (
            {
                "error": {
                    "message": "boom",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
            ServerError,
            "openai: server_error in the stream: boom",
        ),
        (
            {
                "error": {
                    "message": "slow down",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
            RateLimited,
            "openai: requests (rate_limit_exceeded) in the stream: slow down",
        ),
        (
            {"error": {"message": "busy", "type": "overloaded_error"}},
            Overloaded,
            "openai: overloaded_error in the stream: busy",
        ),
        (
            # vLLM's flat error object, with an HTTP status as its code
            {
                "object": "error",
                "message": "too long",
                "type": "BadRequestError",
                "code": 400,
            },
            BadRequest,
            "openai: HTTP 400 BadRequestError: too long",
        ),
    ],
)
async def test_an_error_chunk_raises_its_typed_error(
    chunk: dict[str, Any], error: type[ProviderError], text: str
) -> None:
    reports: list[tuple[str, float | None]] = []
    provider = replaying(
        sse(delta("a"), chunk), on_rate_limit=lambda p, s: reports.append((p, s))
    )
    with pytest.raises(error) as caught:
        await collect(provider)
    assert str(caught.value) == text
    expected_reports = [("openai", None)] if error in (RateLimited, Overloaded) else []
    assert reports == expected_reports


async def test_redacts_a_key_the_server_echoes() -> None:
    body = json.dumps(
        {
            "error": {
                "message": f"Incorrect API key provided: {KEY}.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        }
    )
    provider = replaying(body, 401, {"content-type": "application/json"})
    with pytest.raises(AuthenticationError) as caught:
        await collect(provider)
    assert str(caught.value) == (
        "openai: HTTP 401 invalid_request_error (invalid_api_key): "
        "Incorrect API key provided: [redacted]."
    )


async def test_a_non_json_error_body_is_shown_as_text() -> None:
    provider = replaying(
        "<html>  Bad\n gateway </html>", 502, {"content-type": "text/html"}
    )
    with pytest.raises(
        ServerError, match=r"^openai: HTTP 502: <html> Bad gateway </html>$"
    ):
        await collect(provider)


def raising(exc: Exception) -> OpenAIProvider:
    """A provider whose transport fails every request with ``exc``."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return OpenAIProvider(
        base_url="https://api.test/v1",
        api_key=KEY,
        model="m",
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        connect_timeout=3,
        read_timeout=7,
    )


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            httpx.ConnectTimeout("t"),
            "could not connect within 3 s (POST api.test/v1/chat/completions)",
        ),
        (
            httpx.PoolTimeout("t"),
            "no free connection within 3 s (POST api.test/v1/chat/completions)",
        ),
        (
            httpx.WriteTimeout("t"),
            "could not send the request within 7 s (POST api.test/v1/chat/completions)",
        ),
        (
            httpx.ReadTimeout("t"),
            "no response within 7 s (POST api.test/v1/chat/completions)",
        ),
        (
            httpx.ConnectError("Name or service not known"),
            "could not reach api.test: Name or service not known",
        ),
        (
            httpx.RemoteProtocolError(""),
            "could not reach api.test: RemoteProtocolError",
        ),
    ],
)
async def test_failures_before_the_response(exc: Exception, message: str) -> None:
    with pytest.raises(ProviderConnectionError) as caught:
        await collect(raising(exc))
    assert str(caught.value) == f"openai: {message}"
    assert caught.value.retryable
    assert caught.value.__context__ is None  # nothing of httpx rides along


class _Failing(httpx.AsyncByteStream):
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
            httpx.ReadError("reset"),
            StreamInterrupted,
            "the connection dropped in the middle of the stream",
        ),
        (
            httpx.RemoteProtocolError("incomplete chunked read"),
            StreamInterrupted,
            "the connection dropped in the middle of the stream",
        ),
        (
            httpx.ReadTimeout("t"),
            ProviderConnectionError,
            "the stream stalled: no data for 60 s",
        ),
        (
            httpx.WriteError("w"),
            ProviderConnectionError,
            "the stream failed: WriteError",
        ),
    ],
)
async def test_failures_in_the_middle_of_the_stream(
    exc: Exception, error: type[ProviderError], message: str
) -> None:
    first = sse(delta("a")).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE_HEADERS, stream=_Failing(first, exc))

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    provider = OpenAIProvider(
        base_url="https://api.test/v1", api_key=KEY, model="m", client=client
    )
    received: list[StreamEvent] = []
    with pytest.raises(error) as caught:
        async with provider.stream(HELLO) as events:
            async for event in events:
                received.append(event)
    assert received == [TextDelta("a")]
    assert str(caught.value) == f"openai: {message}"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": "quota exhausted"}', "openai: HTTP 400: quota exhausted"),
        ('["odd"]', 'openai: HTTP 400: ["odd"]'),
        (
            '{"error": {"code": "bad_thing"}}',
            'openai: HTTP 400 bad_thing: {"error": {"code": "bad_thing"}}',
        ),
        ("", "openai: HTTP 400"),
    ],
)
async def test_error_bodies_of_other_shapes(body: str, message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        await collect(replaying(body, 400, {"content-type": "application/json"}))
    assert str(caught.value) == message


# -- over real sockets -----------------------------------------------------------


async def test_happy_path_over_http(server: FakeLLMServer) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(
                text="The weather is",
                reasoning="Let me look.",
                tool_calls=(
                    FakeToolCall(
                        "get_weather", {"city": "Paris", "days": [1, 2]}, id="call_a"
                    ),
                    FakeToolCall("get_time", {"zone": "CET"}, id="call_b"),
                ),
                input_tokens=40,
                output_tokens=30,
                cache_read_tokens=10,
                argument_chunks=4,
            )
        )
    )
    async with provider_for(server) as provider:
        events = await collect(provider)
    assert events == [
        ReasoningDelta("Let"),
        ReasoningDelta(" me"),
        ReasoningDelta(" look."),
        TextDelta("The"),
        TextDelta(" weather"),
        TextDelta(" is"),
        ToolCall(
            "call_a",
            "get_weather",
            {"city": "Paris", "days": [1, 2]},
            '{"city": "Paris", "days": [1, 2]}',
        ),
        ToolCall("call_b", "get_time", {"zone": "CET"}, '{"zone": "CET"}'),
        Finish("tool_calls"),
        Usage(input_tokens=40, output_tokens=30, cache_read_tokens=10),
    ]
    assert server.statistics().completed == 1


async def test_request_json_shape(server: FakeLLMServer) -> None:
    weather = ToolCall("call_1", "get_weather", {"city": "Paris"}, '{"city":"Paris"}')
    clock = ToolCall(
        "call_2", "get_time", {"zone": "CET"}
    )  # built by hand: no raw text
    request = ChatRequest(
        [
            ChatMessage("user", "Weather and time in Paris?", name="ana"),
            ChatMessage("assistant", "", tool_calls=(weather, clock)),
            ChatMessage("tool", "18 C, sunny", tool_call_id="call_1"),
            ChatMessage("tool", "14:00", tool_call_id="call_2"),
            ChatMessage("assistant", "It is 18 C and 14:00."),
            ChatMessage("user", "Thanks"),
        ],
        tools=[
            ToolSpec(
                "get_weather",
                "Weather for a city",
                {"type": "object", "properties": {"city": {"type": "string"}}},
            )
        ],
        max_tokens=256,
        temperature=0.2,
        system="Be brief.",
    )
    provider = provider_for(
        server,
        base_url=server.openai_base_url + "/",
        extra_headers={"OpenAI-Organization": "org-1"},
    )
    async with provider:
        await collect(provider, request)
    (recorded,) = server.requests
    assert recorded.format == "openai"
    assert recorded.path == "/v1/chat/completions"
    assert recorded.authenticated
    assert recorded.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather and time in Paris?", "name": "ana"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city":"Paris"}',
                        },
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {
                            "name": "get_time",
                            "arguments": '{"zone": "CET"}',
                        },
                    },
                ],
            },
            {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
            {"role": "tool", "content": "14:00", "tool_call_id": "call_2"},
            {"role": "assistant", "content": "It is 18 C and 14:00."},
            {"role": "user", "content": "Thanks"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                    },
                },
            }
        ],
        "max_tokens": 256,
        "temperature": 0.2,
    }
    assert recorded.headers["accept"] == "text/event-stream"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.headers["openai-organization"] == "org-1"
    assert "authorization" not in recorded.headers  # the server keeps no secrets


async def test_nothing_is_sent_before_enter(server: FakeLLMServer) -> None:
    async with provider_for(server) as provider:
        stream = provider.stream(HELLO)
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().requests_total == 0
        async with stream as events:
            assert server.statistics().requests_total == 1
            received = [e async for e in events]
    assert received[-2] == Finish("stop")
    assert isinstance(received[-1], Usage)
    assert received[-1].output_tokens == 6


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
        (Fault("overloaded", retry_after_ms=1500), Overloaded, 529, 1.5),
        (Fault("server_error"), ServerError, 500, None),
    ],
)
async def test_status_faults(
    server: FakeLLMServer,
    fault: Fault,
    error: type[ProviderError],
    status: int,
    retry_after: float | None,
) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=fault)))
    reports: list[tuple[str, float | None]] = []
    entered = False
    async with provider_for(
        server, id="gpt", on_rate_limit=lambda p, s: reports.append((p, s))
    ) as provider:
        with pytest.raises(error) as caught:
            async with provider.stream(HELLO):
                entered = True
    assert not entered  # a status error is raised from __aenter__
    exc = caught.value
    assert exc.retryable
    assert exc.provider == "gpt"
    assert exc.status_code == status
    assert str(exc).startswith(f"gpt: HTTP {status} ")
    if isinstance(exc, RateLimited | Overloaded):
        assert exc.retry_after == retry_after
        assert reports == [("gpt", retry_after)]
    else:
        assert reports == []
    assert server.statistics().responses_by_status == {status: 1}


async def test_wrong_key_is_an_authentication_error(server: FakeLLMServer) -> None:
    reports: list[object] = []
    provider = provider_for(
        server, api_key="sk-wrong", on_rate_limit=lambda *a: reports.append(a)
    )
    async with provider:
        with pytest.raises(AuthenticationError) as caught:
            await collect(provider)
    assert not caught.value.retryable
    assert caught.value.status_code == 401
    assert (
        str(caught.value)
        == "openai: HTTP 401 authentication_error: missing or invalid Authorization"
    )
    assert reports == []


async def test_a_wrong_path_is_a_bad_request(server: FakeLLMServer) -> None:
    async with provider_for(server, base_url=server.base_url) as provider:  # no /v1
        with pytest.raises(
            BadRequest,
            match=r"^openai: HTTP 404 not_found_error: no route: /chat/completions$",
        ) as caught:
            await collect(provider)
    assert not caught.value.retryable


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        (
            Fault("disconnect", after_events=3),
            StreamInterrupted,
            r"^openai: the connection dropped in the middle of the stream$",
        ),
        (
            Fault("truncate"),
            StreamInterrupted,
            r"^openai: the stream ended without \[DONE\]$",
        ),
        (
            Fault("malformed", after_events=2),
            MalformedStream,
            r"^openai: an event's data is not valid JSON \(Unterminated string",
        ),
        (
            Fault("stream_error", after_events=2, error_type="rate_limit_error"),
            RateLimited,
            r"^openai: rate_limit_error in the stream: ",
        ),
    ],
)
async def test_stream_faults(
    server: FakeLLMServer, fault: Fault, error: type[ProviderError], message: str
) -> None:
    server.set_script(
        FakeScript(default=FakeReply(text="one two three four", fault=fault))
    )
    events: list[StreamEvent] = []
    async with provider_for(server) as provider:
        with pytest.raises(error, match=message) as caught:
            async with provider.stream(HELLO) as stream:
                async for event in stream:
                    events.append(event)
    assert caught.value.retryable
    if fault.after_events is not None:
        # The role chunk is not an event; each word is.
        assert events == [
            TextDelta(w) for w in ["one", " two", " three"][: fault.after_events - 1]
        ]
    await server.wait_idle()


async def test_a_stall_ends_at_the_read_timeout(server: FakeLLMServer) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("stall", after_events=2)))
    )
    provider = provider_for(server, read_timeout=0.2)
    async with provider, provider.stream(HELLO) as events:
        assert await events.__anext__() == TextDelta("Hello")
        started = trio.current_time()
        with pytest.raises(
            ProviderConnectionError,
            match=r"^openai: the stream stalled: no data for 0\.2 s$",
        ):
            await events.__anext__()
        waited = trio.current_time() - started
    assert 0.15 <= waited < 1.0
    stats = await server.wait_idle()
    assert stats.client_disconnects == 1


async def test_no_headers_within_the_read_timeout(server: FakeLLMServer) -> None:
    server.set_script(FakeScript(default=FakeReply(latency=5)))
    async with provider_for(server, read_timeout=0.1) as provider:
        with pytest.raises(
            ProviderConnectionError,
            match=r"^openai: no response within 0\.1 s \(POST 127\.0\.0\.1/v1/chat/completions\)$",
        ):
            async with provider.stream(HELLO):
                pytest.fail("entered")


async def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    async with OpenAIProvider(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, model="m"
    ) as provider:
        with pytest.raises(
            ProviderConnectionError, match=r"^openai: could not reach 127\.0\.0\.1: "
        ) as caught:
            await collect(provider)
    assert caught.value.retryable


async def test_leaving_early_closes_the_response(server: FakeLLMServer) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    server.set_script(FakeScript(default=FakeReply(text=words, tokens_per_second=50)))
    async with provider_for(server) as provider:
        async with provider.stream(HELLO) as events:
            async for event in events:
                assert event == TextDelta("w0")
                break
        with trio.fail_after(2):
            stats = await server.wait_idle()
    assert stats.client_disconnects == 1
    assert stats.completed == 0


async def test_cancellation_mid_stream_closes_the_response(
    server: FakeLLMServer,
) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    server.set_script(FakeScript(default=FakeReply(text=words, tokens_per_second=50)))
    seen: list[StreamEvent] = []
    async with provider_for(server) as provider:
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


async def test_a_stream_is_entered_once_and_read_inside(server: FakeLLMServer) -> None:
    async with provider_for(server) as provider:
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


async def test_after_the_end_the_iterator_stays_ended(server: FakeLLMServer) -> None:
    async with provider_for(server) as provider, provider.stream(HELLO) as events:
        assert len([e async for e in events]) == 8
        with pytest.raises(StopAsyncIteration):
            await events.__anext__()


async def test_a_finished_stream_leaves_its_connection_for_the_next(
    server: FakeLLMServer,
) -> None:
    async with provider_for(server) as provider:
        await collect(provider)
        await collect(provider)
        async with provider.stream(HELLO) as events:
            await events.__anext__()  # and leave early: that connection closes
        await collect(provider)
    first, second, third, fourth = (r.client for r in server.requests)
    assert first is not None
    assert first == second == third  # the body was read to its end, then reused
    assert fourth != third


async def test_a_lent_client_stays_open(server: FakeLLMServer) -> None:
    async with httpx.AsyncClient() as client:
        async with provider_for(server, client=client) as provider:
            await collect(provider)
        assert not client.is_closed
        async with provider_for(server, client=client) as provider:
            await collect(provider)
    assert server.statistics().completed == 2


async def test_an_owned_client_is_closed() -> None:
    provider = OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key=KEY, model="m")
    await provider.aclose()
    # A typed error that fails one turn, not a RuntimeError that stops the
    # dispatcher.
    with pytest.raises(RequestFailed, match=r"^openai: the HTTP client is closed$"):
        await collect(provider)


async def test_many_requests_share_the_provider(server: FakeLLMServer) -> None:
    async with provider_for(server) as provider:
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
    server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = provider_for(server, read_timeout=0.2)
    assert KEY not in repr(provider)
    faults = [
        Fault("rate_limit", retry_after=1),
        Fault("server_error"),
        Fault("unavailable"),
        Fault("overloaded"),
        Fault("disconnect", after_events=2),
        Fault("truncate"),
        Fault("malformed", after_events=2),
        Fault("stall", after_events=2),
        Fault("stream_error", after_events=2),
    ]
    server.set_script(FakeScript(replies=tuple(FakeReply(fault=f) for f in faults)))
    errors: list[ProviderError] = []
    async with provider:
        for _ in faults:
            with pytest.raises(ProviderError) as caught:
                await collect(provider)
            errors.append(caught.value)
        async with provider.stream(HELLO) as stream:
            assert KEY not in repr(stream)
        async with provider_for(server, api_key="sk-other") as other:
            with pytest.raises(AuthenticationError) as caught:
                await collect(other)
        errors.append(caught.value)
    assert len({type(e) for e in errors}) == 7
    for error in errors:
        assert KEY not in str(error)
        assert KEY not in repr(error)
        assert KEY not in repr(vars(error))
    assert KEY not in caplog.text
    assert all(KEY not in repr(r) for r in server.requests)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"base_url": "api.openai.com/v1"},
            ValueError,
            r"^base_url must start with http:// or https://, got 'api\.openai\.com/v1'$",
        ),
        ({"api_key": ""}, ValueError, r"^api_key must be a non-empty string$"),
        ({"model": ""}, ValueError, r"^model must be a non-empty string, got ''$"),
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
            r"^client must be an httpx\.AsyncClient, got object$",
        ),
        ({"on_rate_limit": 3}, TypeError, r"^on_rate_limit must be callable$"),
        (
            {"extra_headers": {"x": 1}},
            TypeError,
            r"^extra_headers must map header names to strings$",
        ),
    ],
)
def test_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {
        "base_url": "https://api.openai.com/v1",
        "api_key": KEY,
        "model": "m",
    }
    options.update(kwargs)
    with pytest.raises(error, match=message):
        OpenAIProvider(**options)


def test_a_bad_key_is_not_echoed() -> None:
    with pytest.raises(TypeError) as caught:
        OpenAIProvider(base_url="https://x/v1", api_key=None, model="m")  # type: ignore[arg-type]
    assert str(caught.value) == "api_key must be a non-empty string"


def test_is_a_provider() -> None:
    provider: Provider = OpenAIProvider(
        base_url="https://x/v1/", api_key=KEY, model="m"
    )
    assert provider.id == "openai"
    assert (
        repr(provider)
        == "OpenAIProvider(id='openai', base_url='https://x/v1', model='m')"
    )


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
