"""The fake server's wire encoders, without a socket.

Each encoder is checked twice: for the shape of what it writes, and by a
round trip, its bytes read back by our own providers' decoders (alone,
event by event, and whole through ``OpenAIProvider`` and
``AnthropicProvider`` over an in-memory transport), which must yield what
the reply says and what each event claims to mean.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx2
import pytest

from trio_dispatch._wire._anthropic import AnthropicDecoder
from trio_dispatch._wire._openai import OpenAIDecoder
from trio_dispatch._wire._sse import ServerSentEvent
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    Usage,
)
from trio_dispatch.providers import (
    AnthropicProvider,
    MalformedStream,
    OpenAIProvider,
    Overloaded,
    RateLimited,
    ServerError,
)
from trio_dispatch.testing import FakeReply, FakeToolCall, Fault
from trio_dispatch.testing._encoders import (
    MALFORMED,
    encode_reply,
    error_event,
    header_number,
    status_fault_answer,
    words,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import ProviderError
    from trio_dispatch._wire._encode import WireEvent
    from trio_dispatch.messages import StreamEvent
    from trio_dispatch.testing import FaultKind, WireFormat

WIRES: list[WireFormat] = ["openai", "anthropic"]
HELLO = ChatRequest([ChatMessage("user", "Hello")])


def encode(
    reply: FakeReply, wire: WireFormat, *, include_usage: bool = True
) -> list[WireEvent]:
    """``reply`` encoded as the first answer of a fresh server."""
    return encode_reply(
        reply,
        wire,
        model="fake-model",
        estimated_input_tokens=7,
        include_usage=include_usage,
        ids=itertools.count(1),
    )


def body_of(events: list[WireEvent]) -> bytes:
    return b"".join(event.data for event in events)


def parse(data: bytes) -> ServerSentEvent:
    """One server-sent event's bytes, as the SSE reader hands it over."""
    assert data.endswith(b"\n\n")
    fields = dict(
        line.split(": ", 1) for line in data.decode().removesuffix("\n\n").split("\n")
    )
    return ServerSentEvent(event=fields.get("event", "message"), data=fields["data"])


def events_of(body: bytes) -> list[tuple[str, str]]:
    """``(event name, data)`` of every server-sent event in a whole body."""
    events = []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields.get("event", ""), fields["data"]))
    return events


def openai_chunks(body: bytes) -> list[Any]:
    return [json.loads(data) for _, data in events_of(body) if data != "[DONE]"]


def openai_text(body: bytes, field: str = "content") -> str:
    return "".join(
        chunk["choices"][0]["delta"].get(field) or ""
        for chunk in openai_chunks(body)
        if chunk["choices"]
    )


def decoder_for(wire: WireFormat) -> OpenAIDecoder | AnthropicDecoder:
    return OpenAIDecoder("p") if wire == "openai" else AnthropicDecoder("p")


@asynccontextmanager
async def replaying(
    wire: WireFormat,
    body: bytes,
    status: int = 200,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> AsyncIterator[OpenAIProvider | AnthropicProvider]:
    """A provider of ``wire`` whose requests are answered with ``body``, in memory."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        content_type = "text/event-stream" if status == 200 else "application/json"
        return httpx2.Response(
            status,
            headers=[(b"content-type", content_type.encode()), *(headers or [])],
            content=body,
        )

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client:
        if wire == "openai":
            yield OpenAIProvider(
                "p", base_url="http://x/v1", api_key="k", model="m", client=client
            )
        else:
            yield AnthropicProvider(
                "p", base_url="http://x", api_key="k", model="m", client=client
            )


async def decoded(wire: WireFormat, body: bytes) -> list[StreamEvent]:
    """What our provider of ``wire`` makes of a 200 answer with ``body``."""
    async with (
        replaying(wire, body) as provider,
        provider.stream(HELLO) as events,
    ):
        return [event async for event in events]


# -- round trips -------------------------------------------------------------------

CALL = FakeToolCall("f", {"x": 1, "y": [2, "three"]}, id="c1")
REPLIES = {
    "text": FakeReply(text="Hi there, you"),
    "reasoning": FakeReply(text="Yes.", reasoning="Think it  over.\n"),
    "empty": FakeReply(text=""),
    "whitespace": FakeReply(text="  \t "),
    "one tool call": FakeReply(text="", tool_calls=(CALL,)),
    "text and calls": FakeReply(
        text="let me see",
        tool_calls=(
            CALL,
            FakeToolCall("g", {}, id="c2"),
            FakeToolCall("h", raw_arguments='{"broken": ', id="c3"),
            FakeToolCall("k", raw_arguments="[1, 2]", id="c4"),
            FakeToolCall("m", raw_arguments="", id="c5"),
        ),
        argument_chunks=4,
    ),
    "made-up ids": FakeReply(text="", tool_calls=(FakeToolCall("f"),) * 2),
    "one piece": FakeReply(text="", tool_calls=(CALL,), argument_chunks=1),
    "length": FakeReply(text="cut", finish="length"),
    "unknown finish": FakeReply(text="odd", finish="weird"),
    "usage": FakeReply(
        text="x",
        input_tokens=10,
        output_tokens=4,
        cache_read_tokens=3,
        cache_write_tokens=2,
    ),
}
ROUND_TRIPS = [
    pytest.param(wire, reply, id=f"{wire}-{name}")
    for name, reply in REPLIES.items()
    for wire in WIRES
]
# Anthropic says content_filter as "refusal"; the decoder normalises it back.
ROUND_TRIPS += [
    pytest.param(wire, FakeReply(finish="content_filter"), id=f"{wire}-filter")
    for wire in WIRES
]


@pytest.mark.parametrize(("wire", "reply"), ROUND_TRIPS)
def test_each_encoded_event_means_to_the_decoder_what_it_says(
    wire: WireFormat, reply: FakeReply
) -> None:
    decoder = decoder_for(wire)
    for event in encode(reply, wire):
        assert event.malformed is None
        assert decoder.feed(parse(event.data)) == list(event.events)
    assert decoder.done
    assert decoder.end_of_stream() == []


def expected_events(wire: WireFormat, reply: FakeReply) -> list[StreamEvent]:
    """What a reply means, worked out from the reply alone."""
    expected: list[StreamEvent] = [ReasoningDelta(w) for w in words(reply.reasoning)]
    expected += [TextDelta(w) for w in words(reply.text)]
    ids = itertools.count(1)
    for call in reply.tool_calls:
        prefix = "call" if wire == "openai" else "toolu"
        call_id = call.id if call.id is not None else f"{prefix}_fake_{next(ids)}"
        text = (
            json.dumps(call.arguments)
            if call.raw_arguments is None
            else call.raw_arguments
        )
        try:
            arguments = json.loads(text) if text.strip() else {}
        except ValueError:
            arguments = None
        if isinstance(arguments, dict):
            expected.append(ToolCall(call_id, call.name, arguments, text))
        else:
            # The decoders' reason is checked by their own tests.
            expected.append(ToolCall(call_id, call.name, {}, text, "(a reason)"))
    expected.append(
        Finish(reply.finish or ("tool_calls" if reply.tool_calls else "stop"))
    )
    chunks = (
        len(words(reply.reasoning))
        + len(words(reply.text))
        + sum(piece_count(call, reply) for call in reply.tool_calls)
    )
    usage = Usage(
        input_tokens=7 if reply.input_tokens is None else reply.input_tokens,
        output_tokens=chunks if reply.output_tokens is None else reply.output_tokens,
        cache_read_tokens=reply.cache_read_tokens,
        cache_write_tokens=reply.cache_write_tokens,
    )
    if wire == "openai":  # the cache writes are part of the prompt
        usage = Usage(
            usage.input_tokens + usage.cache_write_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
        )
    expected.append(usage)
    return expected


def piece_count(call: FakeToolCall, reply: FakeReply) -> int:
    """How many pieces a call's arguments come in: at most ``argument_chunks``."""
    text = call.raw_arguments
    if text is None:
        text = json.dumps(call.arguments)
    size = max(1, math.ceil(len(text) / reply.argument_chunks))
    return math.ceil(len(text) / size)


def without_reasons(events: list[StreamEvent]) -> list[StreamEvent]:
    return [
        ToolCall(e.id, e.name, e.arguments, e.raw_arguments, "(a reason)")
        if isinstance(e, ToolCall) and e.arguments_error is not None
        else e
        for e in events
    ]


@pytest.mark.parametrize(("wire", "reply"), ROUND_TRIPS)
async def test_the_encoded_stream_decodes_to_the_replys_events(
    wire: WireFormat, reply: FakeReply
) -> None:
    events = await decoded(wire, body_of(encode(reply, wire)))
    assert without_reasons(events) == expected_events(wire, reply)


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (FakeToolCall("f", id=""), {"openai": "id", "anthropic": "id and name"}),
        (
            FakeToolCall("", id="c1"),
            {"openai": "function name", "anthropic": "id and name"},
        ),
    ],
    ids=["no id", "no name"],
)
def test_a_tool_call_without_id_or_name_is_marked_malformed_as_decoded(
    wire: WireFormat, call: FakeToolCall, problem: dict[str, str]
) -> None:
    decoder = decoder_for(wire)
    for event in encode(FakeReply(text="a", tool_calls=(call,)), wire):
        if event.malformed is not None:
            break
        assert decoder.feed(parse(event.data)) == list(event.events)
    else:
        pytest.fail("no event is marked malformed")
    block = "tool call 0" if wire == "openai" else "tool_use block 1"
    assert event.malformed == f"{block} arrived without its {problem[wire]}"
    with pytest.raises(MalformedStream, match=rf"^p: {re.escape(event.malformed)}$"):
        decoder.feed(parse(event.data))


@pytest.mark.parametrize("wire", WIRES)
def test_the_malformed_event_is_malformed_to_the_decoder(wire: WireFormat) -> None:
    with pytest.raises(MalformedStream, match=r"^p: an event's data is not valid JSON"):
        decoder_for(wire).feed(parse(MALFORMED[wire]))


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("error_type", "error"),
    [
        ("rate_limit_error", RateLimited),
        ("overloaded_error", Overloaded),
        ("api_error", ServerError),
    ],
)
def test_an_error_event_raises_its_typed_error_when_decoded(
    wire: WireFormat, error_type: str, error: type[ProviderError]
) -> None:
    fault = Fault("stream_error", error_type=error_type, message="oops")
    with pytest.raises(error, match=rf"^p: {error_type} in the stream: oops$"):
        decoder_for(wire).feed(parse(error_event(wire, fault)))


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    ("kind", "error", "retry_after"),
    [
        ("rate_limit", RateLimited, 1.5),
        ("unavailable", Overloaded, 1.5),
        ("overloaded", Overloaded, 1.5),
        ("server_error", ServerError, None),
    ],
)
async def test_a_status_fault_raises_its_typed_error_when_answered(
    wire: WireFormat,
    kind: FaultKind,
    error: type[ProviderError],
    retry_after: float | None,
) -> None:
    status, headers, body = status_fault_answer(
        wire, Fault(kind, retry_after=2, retry_after_ms=1500)
    )
    async with replaying(wire, json.dumps(body).encode(), status, headers) as provider:
        with pytest.raises(error) as caught:
            async with provider.stream(HELLO):
                pass  # pragma: no cover (the status is raised on entry)
    assert caught.value.status_code == status
    assert getattr(caught.value, "retry_after", None) == retry_after


# -- the shape of the wire -----------------------------------------------------


def test_openai_stream_shape() -> None:
    reply = FakeReply(
        text="Hi there",
        input_tokens=10,
        output_tokens=4,
        cache_read_tokens=3,
        cache_write_tokens=2,
    )
    body = body_of(encode(reply, "openai"))
    events = events_of(body)
    assert events[-1] == ("", "[DONE]")
    chunks = openai_chunks(body)
    assert all(
        c["object"] == "chat.completion.chunk" and c["model"] == "fake-model"
        for c in chunks
    )
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
        {"content": " there"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [
        None,
        None,
        None,
        "stop",
    ]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 15,  # the cache counts are part of OpenAI's prompt
        "completion_tokens": 4,
        "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 3},
    }


def test_openai_usage_only_when_asked() -> None:
    body = body_of(encode(FakeReply(), "openai", include_usage=False))
    assert all("usage" not in chunk for chunk in openai_chunks(body))


def test_openai_tool_calls_in_pieces() -> None:
    calls = (
        FakeToolCall("f", {"a": 1, "b": "two"}),
        FakeToolCall("g", raw_arguments='{"broken": '),
    )
    reply = FakeReply(text="", tool_calls=calls, argument_chunks=3)
    chunks = openai_chunks(body_of(encode(reply, "openai", include_usage=False)))
    fragments = [
        fragment
        for chunk in chunks
        for fragment in chunk["choices"][0]["delta"].get("tool_calls", [])
    ]
    heads = [f for f in fragments if "id" in f]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [(0, "f"), (1, "g")]
    assert all(
        h["id"].startswith("call_fake_") and h["type"] == "function" for h in heads
    )
    pieces: dict[int, list[str]] = {0: [], 1: []}
    for fragment in fragments:
        if "id" not in fragment:
            pieces[fragment["index"]].append(fragment["function"]["arguments"])
    assert len(pieces[0]) == 3
    assert "".join(pieces[0]) == '{"a": 1, "b": "two"}'
    assert "".join(pieces[1]) == '{"broken": '
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_reasoning_content() -> None:
    body = body_of(encode(FakeReply(text="Yes.", reasoning="Think it over."), "openai"))
    assert openai_text(body, "reasoning_content") == "Think it over."
    assert openai_text(body) == "Yes."


@pytest.mark.parametrize(
    "text", ["  leading and trailing  ", "tabs\tand\nnew lines\n\n", "one", " ", ""]
)
def test_words_join_back_exactly(text: str) -> None:
    assert "".join(words(text)) == text
    assert openai_text(body_of(encode(FakeReply(text=text), "openai"))) == text


def test_anthropic_stream_shape() -> None:
    reply = FakeReply(
        text="Hi there",
        reasoning="Hmm.",
        tool_calls=(FakeToolCall("f", {"x": 1}, id="toolu_given"),),
        input_tokens=10,
        output_tokens=4,
        cache_read_tokens=3,
        cache_write_tokens=2,
        argument_chunks=2,
    )
    events = events_of(body_of(encode(reply, "anthropic")))
    names = [name for name, _ in events]
    data = [json.loads(d) for _, d in events]
    assert all(name == d["type"] for name, d in zip(names, data, strict=True))
    assert names == [
        "message_start",
        "ping",
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",  # the signature
        "content_block_stop",
        "content_block_start",  # text
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert data[0]["message"]["model"] == "fake-model"
    assert data[0]["message"]["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 2,
        "cache_read_input_tokens": 3,
        "output_tokens": 1,
    }
    assert data[2]["content_block"] == {"type": "thinking", "thinking": ""}
    assert data[3]["delta"] == {"type": "thinking_delta", "thinking": "Hmm."}
    assert data[4]["delta"]["type"] == "signature_delta"
    assert [d["delta"]["text"] for d in data[7:9]] == ["Hi", " there"]
    assert data[10]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_given",
        "name": "f",
        "input": {},
    }
    assert "".join(d["delta"]["partial_json"] for d in data[11:14]) == '{"x": 1}'
    assert data[11]["delta"]["partial_json"] == ""  # as the API starts a tool's input
    assert [d["index"] for d in data[2:15] if "index" in d] == [0] * 4 + [1] * 4 + [
        2
    ] * 5
    assert data[15]["delta"]["stop_reason"] == "tool_use"
    assert data[15]["usage"] == {"output_tokens": 4}


@pytest.mark.parametrize(
    ("finish", "openai", "anthropic"),
    [
        (None, "stop", "end_turn"),
        ("length", "length", "max_tokens"),
        ("content_filter", "content_filter", "refusal"),
        ("tool_calls", "tool_calls", "tool_use"),
        ("weird", "weird", "weird"),
    ],
)
def test_finish_reasons_in_each_vocabulary(
    finish: str | None, openai: str, anthropic: str
) -> None:
    reply = FakeReply(finish=finish)
    chunks = openai_chunks(body_of(encode(reply, "openai", include_usage=False)))
    assert chunks[-1]["choices"][0]["finish_reason"] == openai
    data = [json.loads(d) for _, d in events_of(body_of(encode(reply, "anthropic")))]
    assert data[-2]["delta"]["stop_reason"] == anthropic


def test_tokens_are_marked_for_pacing() -> None:
    reply = FakeReply(text="a b", reasoning="c", tool_calls=(CALL,))
    for wire in WIRES:
        events = encode(reply, wire)
        # Per call: its head (OpenAI) or its empty first piece (Anthropic),
        # then its pieces.
        assert sum(event.token for event in events) == 3 + 1 + 3, wire
        assert not events[0].token
        assert not events[-1].token


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.25, b"0.25"), (2.0, b"2"), (1_000_000.0, b"1000000"), (0.0, b"0")],
)
def test_retry_headers_are_plain_numbers(seconds: float, header: bytes) -> None:
    assert header_number(seconds) == header
