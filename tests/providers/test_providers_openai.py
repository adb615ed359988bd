"""``OpenAIProvider``: chat completions streaming over real HTTP.

Two kinds of test. Parser tests replay recorded streams from
``tests/fixtures`` through ``httpx2.MockTransport`` (a socket adds nothing
there): ``openai_text.sse``, ``openai_tool_call.sse`` and
``openai_parallel_tool_calls.sse`` are openai-python's recordings of the
live API (``.inline-snapshot/external/038a5c69c34c…``, ``dae1b261f197…``,
``453df473e962…``); ``openai_deepseek_reasoning.sse`` is built in DeepSeek's
documented shape (``reasoning_content``, ``usage: null`` on every chunk,
cached prompt tokens). The rest runs through loopback sockets against the
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
    BadRequest,
    MalformedStream,
    Overloaded,
    RateLimited,
    ServerError,
    StreamInterrupted,
)
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    open_fake_llm_server,
)

from .._wires import HELLO, OPENAI, collect, fixture
from .._wires import openai_delta as delta
from .._wires import openai_sse as sse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import ProviderError
    from trio_dispatch.testing import FakeLLMServer

replaying = OPENAI.replaying
provider_for = OPENAI.over


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server(api_key=OPENAI.key) as fake:
        yield fake


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


async def test_done_without_a_finish_reason_is_interrupted() -> None:
    with pytest.raises(StreamInterrupted, match=r"without a finish_reason$"):
        await collect(replaying(sse(delta("a"), "[DONE]")))


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
    assert recorded.path == "/v1/chat/completions"  # the trailing slash dropped
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
    assert recorded.headers["openai-organization"] == "org-1"


# -- arguments -------------------------------------------------------------------


def test_extra_headers_are_checked() -> None:
    with pytest.raises(
        TypeError, match=r"^extra_headers must map header names to strings$"
    ):
        OPENAI.provider(extra_headers={"x": 1})
