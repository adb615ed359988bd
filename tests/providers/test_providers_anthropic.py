"""``AnthropicProvider``: Messages streaming over real HTTP.

Parser tests replay recorded streams from ``tests/fixtures`` through
``httpx2.MockTransport``: ``anthropic_text.sse`` and
``anthropic_tool_use.sse`` are anthropic-sdk-python's fixtures
(``tests/lib/streaming/fixtures/basic_response.txt``,
``tool_use_response.txt``); ``anthropic_thinking.sse`` is the full event
trace in Anthropic's extended-thinking documentation, and
``anthropic_overloaded_error.sse`` the error event its streaming
documentation shows. The rest runs through loopback sockets against the
fake LLM server. What both providers do alike (errors, timeouts, closing,
keys, arguments) is tested once for each format in ``test_providers.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from trio_dispatch.providers import (
    AuthenticationError,
    BadRequest,
    MalformedStream,
    Overloaded,
    RateLimited,
    ServerError,
)
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    open_fake_llm_server,
)

from .._wires import (
    ANTHROPIC,
    HELLO,
    START,
    STOP,
    block_delta,
    block_start,
    block_stop,
    collect,
    fixture,
    message_delta,
)
from .._wires import anthropic_sse as sse
from .._wires import anthropic_text_stream as text_stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import ProviderError
    from trio_dispatch.testing import FakeLLMServer

replaying = ANTHROPIC.replaying
provider_for = ANTHROPIC.over


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server(api_key=ANTHROPIC.key) as fake:
        yield fake


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
    assert recorded.path == "/v1/messages"
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
        "system": [
            {
                "type": "text",
                "text": "Be brief.\n\nMention the source.",
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "temperature": 0.5,
    }
    assert recorded.headers["anthropic-version"] == "2023-06-01"


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


# -- arguments -------------------------------------------------------------------


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
    ],
)
def test_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ANTHROPIC.provider(**kwargs)
