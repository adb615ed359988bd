"""``AnthropicProvider``: Messages streaming over real HTTP.

Parser tests replay recorded streams from ``tests/fixtures`` through
``httpx.MockTransport``: ``anthropic_text.sse`` and
``anthropic_tool_use.sse`` are anthropic-sdk-python's fixtures
(``tests/lib/streaming/fixtures/basic_response.txt``,
``tool_use_response.txt``); ``anthropic_thinking.sse`` is the full event
trace in Anthropic's extended-thinking documentation, and
``anthropic_overloaded_error.sse`` the error event its streaming
documentation shows. Everything else runs through loopback sockets against
the fake LLM server.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing

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
    AnthropicProvider,
    AuthenticationError,
    BadRequest,
    MalformedStream,
    Overloaded,
    ProviderConnectionError,
    RateLimited,
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
KEY = "sk-ant-test-KEY-0c4e8b2d6f-DO-NOT-LEAK"
HELLO = ChatRequest([ChatMessage("user", "Hello")])
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server(api_key=KEY) as fake:
        yield fake


def provider_for(server: FakeLLMServer, **kwargs: Any) -> AnthropicProvider:  # noqa: ANN401 (the constructor's keywords)
    options: dict[str, Any] = {
        "base_url": server.anthropic_base_url,
        "api_key": KEY,
        "model": "claude-test",
    }
    options.update(kwargs)
    return AnthropicProvider(**options)


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
) -> AnthropicProvider:
    """A provider whose every request is answered with ``body``, in memory."""
    content = body.encode() if isinstance(body, str) else body

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or SSE_HEADERS, content=content)

    return AnthropicProvider(
        api_key=KEY,
        model="m",
        client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        on_rate_limit=on_rate_limit,
    )


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def sse(*events: dict[str, Any] | str) -> str:
    """An Anthropic stream body; a raw string is sent as the data as it is."""
    out = []
    for event in events:
        if isinstance(event, str):
            out.append(f"event: unknown\ndata: {event}\n\n")
        else:
            out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
    return "".join(out)


START = {
    "type": "message_start",
    "message": {"usage": {"input_tokens": 7, "output_tokens": 1}},
}
STOP = {"type": "message_stop"}


def block_start(index: int, **block: object) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, **delta: object) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str | None, output_tokens: int = 3) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


def text_stream(*texts: str, stop_reason: str = "end_turn") -> str:
    return sse(
        START,
        block_start(0, type="text", text=""),
        *[block_delta(0, type="text_delta", text=t) for t in texts],
        block_stop(0),
        message_delta(stop_reason),
        STOP,
    )


# -- recorded streams ------------------------------------------------------


async def test_recorded_text_stream() -> None:
    events = await collect(replaying(fixture("anthropic_text.sse")))
    assert events == [
        TextDelta("Hello"),
        TextDelta(" there"),
        TextDelta("!"),
        Finish("stop"),
        Usage(input_tokens=11, output_tokens=6),
    ]


async def test_recorded_tool_use() -> None:
    events = await collect(replaying(fixture("anthropic_tool_use.sse")))
    assert events == [
        TextDelta("I"),
        TextDelta("'ll check the current weather in Paris for you."),
        ToolCall(
            "toolu_01NRLabsLyVHZPKxbKvkfSMn",
            "get_weather",
            {"location": "Paris"},
            '{"location": "Paris"}',
        ),
        Finish("tool_calls"),
        Usage(input_tokens=377, output_tokens=65),
    ]


async def test_documented_thinking_stream() -> None:
    events = await collect(replaying(fixture("anthropic_thinking.sse")))
    assert events == [
        ReasoningDelta(
            "I need to find the GCD of 1071 and 462 using the Euclidean algorithm."
            "\n\n1071 = 2 \u00d7 462 + 147"
        ),
        ReasoningDelta(
            "\n462 = 3 \u00d7 147 + 21\n147 = 7 \u00d7 21 + 0\n\nSo GCD(1071, 462) = 21"
        ),
        TextDelta("The greatest common divisor of 1071 and 462 is **21**."),
        Finish("stop"),
        # The documented trace reports no usage, so none is invented.
    ]


async def test_documented_overloaded_error_event() -> None:
    reports: list[tuple[str, float | None]] = []
    provider = replaying(
        fixture("anthropic_overloaded_error.sse"),
        on_rate_limit=lambda p, s: reports.append((p, s)),
    )
    async with provider.stream(HELLO) as events:  # the status was 200
        with pytest.raises(Overloaded) as caught:
            await events.__anext__()
    assert str(caught.value) == "anthropic: overloaded_error in the stream: Overloaded"
    assert caught.value.retryable
    assert caught.value.retry_after is None
    assert reports == [("anthropic", None)]


@pytest.mark.parametrize(
    ("stop_reason", "reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
async def test_stop_reasons_are_normalised(stop_reason: str, reason: str) -> None:
    events = await collect(replaying(text_stream("a", stop_reason=stop_reason)))
    assert events[1] == Finish(reason)


async def test_usage_counts_cache_reads_and_writes() -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 4,
                "cache_creation_input_tokens": 96,
                "cache_read_input_tokens": 900,
                "output_tokens": 1,
            }
        },
    }
    # message_delta's usage is cumulative; newer API versions repeat the
    # input counts there, sometimes as null.
    final = message_delta("end_turn", 21)
    final["usage"].update({"input_tokens": None, "cache_read_input_tokens": 900})
    events = await collect(replaying(sse(start, final, STOP)))
    assert events == [
        Finish("stop"),
        Usage(
            input_tokens=4,
            output_tokens=21,
            cache_read_tokens=900,
            cache_write_tokens=96,
        ),
    ]


async def test_unknown_events_and_deltas_are_ignored() -> None:
    body = sse(
        START,
        {"type": "ping"},
        {"type": "message_metadata", "whatever": [1, 2]},
        block_start(0, type="text", text=""),
        block_delta(0, type="citations_delta", citation={"x": 1}),
        block_delta(0, type="text_delta", text="ok"),
        block_stop(0),
        block_start(1, type="server_tool_use", id="srvtoolu_1", name="web_search"),
        block_delta(1, type="input_json_delta", partial_json='{"q": 1}'),
        block_stop(1),
        message_delta("end_turn"),
        STOP,
    )
    events = await collect(replaying(body))
    assert events == [TextDelta("ok"), Finish("stop"), Usage(7, 3)]


async def test_invalid_tool_input_becomes_an_arguments_error() -> None:
    body = sse(
        START,
        block_start(0, type="tool_use", id="toolu_1", name="f", input={}),
        block_delta(0, type="input_json_delta", partial_json='{"a": tru'),
        block_stop(0),
        message_delta("tool_use"),
        STOP,
    )
    tool_call = (await collect(replaying(body)))[0]
    assert isinstance(tool_call, ToolCall)
    assert (tool_call.id, tool_call.name, tool_call.arguments) == ("toolu_1", "f", {})
    assert tool_call.raw_arguments == '{"a": tru'
    assert tool_call.arguments_error is not None
    assert tool_call.arguments_error.startswith("arguments are not valid JSON: ")


async def test_a_tool_without_input() -> None:
    body = sse(
        START,
        block_start(0, type="tool_use", id="toolu_1", name="now", input={}),
        block_stop(0),
        message_delta("tool_use"),
        STOP,
    )
    events = await collect(replaying(body))
    assert events[0] == ToolCall("toolu_1", "now", {}, "")


# -- streams that make no sense ------------------------------------------------


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (
            [START, "{not json"],
            r"^anthropic: an event's data is not valid JSON \(Expecting property name",
        ),
        ([START, '{"no": "type"}'], r"^anthropic: an event has no type: "),
        (
            [
                START,
                {
                    "type": "content_block_delta",
                    "delta": {"type": "text_delta", "text": "x"},
                },
            ],
            r"^anthropic: a content_block_delta event does not fit the format: "
            r"required field missing @ \$\.index$",
        ),
        (
            [
                START,
                block_start(0, type="text", text=""),
                block_delta(0, type="text_delta"),
            ],
            r"^anthropic: a text_delta without text \(block 0\)$",
        ),
        (
            [START, block_delta(3, type="text_delta", text="x")],
            r"^anthropic: a content_block_delta for block 3, which never started$",
        ),
        (
            [START, block_stop(2)],
            r"^anthropic: a content_block_stop for block 2, which never started$",
        ),
        (
            [
                START,
                block_start(0, type="text", text=""),
                block_start(0, type="text", text=""),
            ],
            r"^anthropic: content block 0 started twice$",
        ),
        (
            [START, block_start(0, type="tool_use", name="f")],
            r"^anthropic: tool_use block 0 arrived without its id and name$",
        ),
        ([START, STOP], r"^anthropic: message_stop arrived before any stop_reason$"),
        (
            [{"type": "message_start", "message": {"usage": {"input_tokens": "many"}}}],
            r"expected an integer, got string @ \$\.message\.usage\.input_tokens$",
        ),
    ],
)
async def test_malformed_events_say_what_was_wrong(
    events: list[dict[str, Any] | str], message: str
) -> None:
    with pytest.raises(MalformedStream, match=message) as caught:
        await collect(replaying(sse(*events)))
    assert caught.value.retryable


async def test_no_message_stop_is_interrupted() -> None:
    body = text_stream("a").replace(
        'event: message_stop\ndata: {"type": "message_stop"}\n\n', ""
    )
    received: list[StreamEvent] = []
    with pytest.raises(
        StreamInterrupted, match=r"^anthropic: the stream ended without message_stop$"
    ):
        async with replaying(body).stream(HELLO) as events:
            async for event in events:
                received.append(event)
    assert received == [TextDelta("a"), Finish("stop")]


@pytest.mark.parametrize(
    ("error_type", "error"),
    [
        ("rate_limit_error", RateLimited),
        ("overloaded_error", Overloaded),
        ("api_error", ServerError),
        ("authentication_error", AuthenticationError),
        ("permission_error", AuthenticationError),
        ("invalid_request_error", BadRequest),
        ("request_too_large", BadRequest),
        ("something_new_error", ServerError),
    ],
)
async def test_error_events_by_type(
    error_type: str, error: type[ProviderError]
) -> None:
    body = sse(START, {"type": "error", "error": {"type": error_type, "message": "m"}})
    with pytest.raises(error, match=rf"^anthropic: {error_type} in the stream: m$"):
        await collect(replaying(body))


async def test_redacts_a_key_the_server_echoes() -> None:
    body = json.dumps(
        {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": f"invalid x-api-key {KEY}",
            },
        }
    )
    provider = replaying(body, 401, {"content-type": "application/json"})
    with pytest.raises(AuthenticationError) as caught:
        await collect(provider)
    assert str(caught.value) == (
        "anthropic: HTTP 401 authentication_error: invalid x-api-key [redacted]"
    )


async def test_redacts_a_key_echoed_inside_the_stream() -> None:
    error = {"type": "error", "error": {"type": "api_error", "message": f"bad {KEY}"}}
    with pytest.raises(ServerError) as caught:
        await collect(replaying(sse(START, error)))
    assert str(caught.value) == "anthropic: api_error in the stream: bad [redacted]"


async def test_an_error_body_is_read_only_so_far() -> None:
    huge = (
        b'{"type":"error","error":{"type":"api_error","message":"'
        + b"x" * 200_000
        + b'"}}'
    )
    with pytest.raises(ServerError) as caught:
        await collect(replaying(huge, 500, {"content-type": "application/json"}))
    # Cut at 64 KiB, so not JSON any more; shown as text, shortened.
    assert str(caught.value).startswith('anthropic: HTTP 500: {"type":"error"')
    assert str(caught.value).endswith("...")
    assert len(str(caught.value)) < 600


# -- over real sockets -----------------------------------------------------------


async def test_happy_path_over_http(server: FakeLLMServer) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(
                text="Checking both.",
                reasoning="Two tools.",
                tool_calls=(
                    FakeToolCall("get_weather", {"city": "Paris"}, id="toolu_a"),
                    FakeToolCall(
                        "get_time", {"zone": "CET", "format": "24h"}, id="toolu_b"
                    ),
                ),
                input_tokens=12,
                output_tokens=34,
                cache_read_tokens=500,
                cache_write_tokens=60,
                argument_chunks=5,
            )
        )
    )
    async with provider_for(server) as provider:
        events = await collect(provider)
    assert events == [
        ReasoningDelta("Two"),
        ReasoningDelta(" tools."),
        TextDelta("Checking"),
        TextDelta(" both."),
        ToolCall("toolu_a", "get_weather", {"city": "Paris"}, '{"city": "Paris"}'),
        ToolCall(
            "toolu_b",
            "get_time",
            {"zone": "CET", "format": "24h"},
            '{"zone": "CET", "format": "24h"}',
        ),
        Finish("tool_calls"),
        Usage(
            input_tokens=12,
            output_tokens=34,
            cache_read_tokens=500,
            cache_write_tokens=60,
        ),
    ]


async def test_request_json_shape(server: FakeLLMServer) -> None:
    weather = ToolCall("toolu_1", "get_weather", {"city": "Paris"}, '{"city":"Paris"}')
    clock = ToolCall("toolu_2", "get_time", {"zone": "CET"})
    request = ChatRequest(
        [
            ChatMessage("user", "Weather and time in Paris?"),
            ChatMessage("user", "Quickly, please.", name="ana"),  # merged into one turn
            ChatMessage("assistant", "Let me check.", tool_calls=(weather, clock)),
            ChatMessage("tool", "18 C, sunny", tool_call_id="toolu_1"),
            ChatMessage("tool", "14:00", tool_call_id="toolu_2"),
            ChatMessage("system", "Mention the source."),  # moved to the top
            ChatMessage("user", "And tomorrow?"),  # joins the tool results
        ],
        tools=[ToolSpec("get_weather", "Weather for a city", {"type": "object"})],
        temperature=0.5,
        system="Be brief.",
    )
    async with provider_for(server) as provider:
        await collect(provider, request)
    (recorded,) = server.requests
    assert recorded.format == "anthropic"
    assert recorded.path == "/v1/messages"
    assert recorded.authenticated
    assert recorded.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather and time in Paris?"},
                    {"type": "text", "text": "Quickly, please."},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "get_time",
                        "input": {"zone": "CET"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "18 C, sunny",
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "14:00",
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        "stream": True,
        "system": "Be brief.\n\nMention the source.",
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": {"type": "object"},
            }
        ],
        "temperature": 0.5,
    }
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    assert recorded.headers["accept"] == "text/event-stream"
    assert "x-api-key" not in recorded.headers


async def test_max_tokens_comes_from_the_request_or_the_provider(
    server: FakeLLMServer,
) -> None:
    async with provider_for(
        server, max_tokens=1000, anthropic_version="2024-01-01"
    ) as provider:
        await collect(provider)
        await collect(provider, ChatRequest([ChatMessage("user", "Hi")], max_tokens=50))
    first, second = server.requests
    assert first.body["max_tokens"] == 1000
    assert second.body["max_tokens"] == 50
    assert first.headers["anthropic-version"] == "2024-01-01"


async def test_an_assistant_turn_with_only_tool_calls_has_no_empty_text(
    server: FakeLLMServer,
) -> None:
    call = ToolCall("toolu_1", "f", {})
    request = ChatRequest(
        [
            ChatMessage("user", "go"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "done", tool_call_id="toolu_1"),
        ]
    )
    async with provider_for(server) as provider:
        await collect(provider, request)
    assert server.requests[0].body["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
    }


@pytest.mark.parametrize(
    ("fault", "error", "status", "retry_after"),
    [
        (Fault("rate_limit", retry_after=3), RateLimited, 429, 3.0),
        (Fault("rate_limit", retry_after=3, retry_after_ms=100), RateLimited, 429, 0.1),
        (Fault("overloaded"), Overloaded, 529, None),
        (Fault("overloaded", retry_after=7), Overloaded, 529, 7.0),
        (Fault("unavailable"), Overloaded, 503, None),
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
    provider = provider_for(server, on_rate_limit=lambda p, s: reports.append((p, s)))
    async with provider:
        with pytest.raises(error) as caught:
            async with provider.stream(HELLO):
                entered = True
    assert not entered
    exc = caught.value
    assert exc.retryable
    assert exc.status_code == status
    assert str(exc).startswith(f"anthropic: HTTP {status} ")
    if isinstance(exc, RateLimited | Overloaded):
        assert exc.retry_after == retry_after
        assert reports == [("anthropic", retry_after)]
    else:
        assert reports == []


async def test_overloaded_529_body(server: FakeLLMServer) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=Fault("overloaded"))))
    async with provider_for(server) as provider:
        with pytest.raises(Overloaded) as caught:
            await collect(provider)
    assert str(caught.value) == "anthropic: HTTP 529 overloaded_error: Overloaded"


async def test_wrong_key_is_an_authentication_error(server: FakeLLMServer) -> None:
    async with provider_for(server, api_key="sk-ant-wrong") as provider:
        with pytest.raises(AuthenticationError) as caught:
            await collect(provider)
    assert not caught.value.retryable
    assert (
        str(caught.value)
        == "anthropic: HTTP 401 authentication_error: missing or invalid x-api-key"
    )


async def test_a_base_url_with_v1_is_a_bad_request(server: FakeLLMServer) -> None:
    async with provider_for(server, base_url=server.base_url + "/v1") as provider:
        with pytest.raises(
            BadRequest,
            match=r"^anthropic: HTTP 404 not_found_error: no route: /v1/v1/messages$",
        ) as caught:
            await collect(provider)
    assert not caught.value.retryable
    assert caught.value.status_code == 404


@pytest.mark.parametrize(
    ("fault", "error", "message", "before"),
    [
        (
            Fault("disconnect", after_events=4),
            StreamInterrupted,
            r"^anthropic: the connection dropped in the middle of the stream$",
            ["one"],
        ),
        (
            Fault("truncate"),
            StreamInterrupted,
            r"^anthropic: the stream ended without message_stop$",
            ["one", " two", "Finish"],
        ),
        (
            Fault("malformed", after_events=5),
            MalformedStream,
            r"^anthropic: an event's data is not valid JSON",
            ["one", " two"],
        ),
        (
            Fault("stream_error", after_events=3),
            Overloaded,
            r"^anthropic: overloaded_error in the stream: the fake server failed mid-stream$",
            [],
        ),
        (
            Fault(
                "stream_error", after_events=3, error_type="api_error", message="boom"
            ),
            ServerError,
            r"^anthropic: api_error in the stream: boom$",
            [],
        ),
    ],
)
async def test_stream_faults(
    server: FakeLLMServer,
    fault: Fault,
    error: type[ProviderError],
    message: str,
    before: list[str],
) -> None:
    # Events: message_start, ping, content_block_start, then one per word.
    server.set_script(FakeScript(default=FakeReply(text="one two", fault=fault)))
    received: list[str] = []
    async with provider_for(server) as provider:
        with pytest.raises(error, match=message) as caught:
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


async def test_a_stall_ends_at_the_read_timeout(server: FakeLLMServer) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("stall", after_events=4)))
    )
    provider = provider_for(server, read_timeout=0.2)
    async with provider, provider.stream(HELLO) as events:
        assert await events.__anext__() == TextDelta("Hello")
        started = trio.current_time()
        with pytest.raises(
            ProviderConnectionError,
            match=r"^anthropic: the stream stalled: no data for 0\.2 s$",
        ):
            await events.__anext__()
        waited = trio.current_time() - started
    assert 0.15 <= waited < 1.0
    stats = await server.wait_idle()
    assert stats.client_disconnects == 1


async def test_leaving_early_closes_the_response(server: FakeLLMServer) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    server.set_script(FakeScript(default=FakeReply(text=words, tokens_per_second=50)))
    async with provider_for(server) as provider:
        async with provider.stream(HELLO) as events:
            assert await events.__anext__() == TextDelta("w0")
        with trio.fail_after(2):
            stats = await server.wait_idle()
    assert stats.client_disconnects == 1


async def test_cancellation_mid_stream_closes_the_response(
    server: FakeLLMServer,
) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("stall", after_events=4)))
    )
    async with provider_for(server) as provider:
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


async def test_the_key_never_shows(
    server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    faults = [
        Fault("rate_limit", retry_after=1),
        Fault("server_error"),
        Fault("unavailable"),
        Fault("overloaded"),
        Fault("disconnect", after_events=3),
        Fault("truncate"),
        Fault("malformed", after_events=3),
        Fault("stall", after_events=3),
        Fault("stream_error", after_events=3, error_type="rate_limit_error"),
    ]
    server.set_script(FakeScript(replies=tuple(FakeReply(fault=f) for f in faults)))
    errors: list[ProviderError] = []
    provider = provider_for(server, read_timeout=0.2)
    assert KEY not in repr(provider)
    async with provider:
        for _ in faults:
            with pytest.raises(ProviderError) as caught:
                await collect(provider)
            errors.append(caught.value)
        async with provider_for(server, api_key="sk-ant-other") as other:
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
            {"max_tokens": 0},
            ValueError,
            r"^max_tokens must be a positive integer, got 0$",
        ),
        (
            {"anthropic_version": ""},
            ValueError,
            r"^anthropic_version must be a non-empty string, got ''$",
        ),
        (
            {"base_url": "ftp://x"},
            ValueError,
            r"^base_url must start with http:// or https://, got 'ftp://x'$",
        ),
        ({"id": ""}, ValueError, r"^id must be a non-empty string, got ''$"),
        ({"id": 3}, TypeError, r"^id must be a non-empty string, got int$"),
    ],
)
def test_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {"api_key": KEY, "model": "m"}
    options.update(kwargs)
    with pytest.raises(error, match=message):
        AnthropicProvider(**options)


def test_is_a_provider() -> None:
    provider: Provider = AnthropicProvider(api_key=KEY, model="claude")
    assert provider.id == "anthropic"
    assert repr(provider) == (
        "AnthropicProvider(id='anthropic', base_url='https://api.anthropic.com', model='claude')"
    )
