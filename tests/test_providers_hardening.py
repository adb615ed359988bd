"""Regression tests at the provider edge: what a provider accepts and sends.

Each guards a bug found in review: a content type refused for its case,
API keys and header values that reached the wire (or an error message)
unchecked, a key that slipped past redaction in an escaped spelling or
across a cut, and failures outside the ``ProviderError`` tree that took a
whole dispatcher down with one call.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    TextDelta,
    Usage,
)
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch.providers import Provider

HI = ChatRequest([ChatMessage("user", "hi")])


def openai_body() -> bytes:
    chunks: list[object] = [
        {"choices": [{"index": 0, "delta": {"content": "hello"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    lines = [json.dumps(chunk) for chunk in chunks] + ["[DONE]"]
    return "".join(f"data: {line}\n\n" for line in lines).encode()


def anthropic_body() -> bytes:
    events: list[dict[str, Any]] = [
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
    ]
    return "".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events
    ).encode()


def make_openai(client: httpx.AsyncClient, key: str = "k") -> Provider:
    return OpenAIProvider(base_url="http://x/v1", api_key=key, model="m", client=client)


def make_anthropic(client: httpx.AsyncClient, key: str = "k") -> Provider:
    return AnthropicProvider(base_url="http://x", api_key=key, model="m", client=client)


WIRE_FORMATS = [
    pytest.param(make_openai, openai_body, id="openai"),
    pytest.param(make_anthropic, anthropic_body, id="anthropic"),
]


async def collect(provider: Provider, request: ChatRequest = HI) -> list[StreamEvent]:
    async with provider.stream(request) as events:
        return [event async for event in events]


# ------------------------------------------------------------------ content type


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
    make: Callable[[httpx.AsyncClient], Provider],
    body: Callable[[], bytes],
    content_type: str,
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": content_type}, content=body()
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        events = await collect(make(client))
    assert events == [
        TextDelta("hello"),
        Finish("stop"),
        Usage(input_tokens=3, output_tokens=1),
    ]
