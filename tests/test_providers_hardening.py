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


# ------------------------------------------------------------------ keys and headers

SECRET = "sk-Zq8vXw3Lp9RtYb6N"


def leaks(exc: BaseException, secret: str) -> list[str]:
    """Every four-character piece of ``secret`` that ``exc`` shows anywhere."""
    shown = " ".join([str(exc), repr(exc), repr(exc.args)])
    pieces = {secret[i : i + 4] for i in range(len(secret) - 3)}
    return sorted(piece for piece in pieces if piece in shown)


PROVIDERS = [
    pytest.param(
        lambda **kw: OpenAIProvider(base_url="http://x/v1", model="m", **kw),
        id="openai",
    ),
    pytest.param(
        lambda **kw: AnthropicProvider(base_url="http://x", model="m", **kw),
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
@pytest.mark.parametrize("make", PROVIDERS)
def test_a_key_that_cannot_be_sent_is_refused_without_showing_it(
    make: Callable[..., Provider], key: str, message: str
) -> None:
    with pytest.raises(
        ValueError, match=r"^api_key must be printable ASCII without spaces, got "
    ) as caught:
        make(api_key=key)
    assert caught.match(
        rf"^api_key must be printable ASCII without spaces, got {message}$"
    )
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
def test_an_extra_header_value_that_cannot_be_sent_is_refused_without_showing_it(
    value: str, message: str
) -> None:
    with pytest.raises(
        ValueError, match=r"^extra_headers\['X-Proxy-Auth'\] must "
    ) as caught:
        OpenAIProvider(
            base_url="http://x/v1",
            api_key="k",
            model="m",
            extra_headers={"X-Proxy-Auth": value},
        )
    assert caught.match(
        rf"^extra_headers\['X-Proxy-Auth'\] must be printable ASCII, got {message}$"
    )
    assert leaks(caught.value, SECRET) == []


@pytest.mark.parametrize("name", ["", "x proxy", "x:proxy", "x\nproxy", "é"])
def test_an_extra_header_name_that_is_not_a_token_is_refused(name: str) -> None:
    with pytest.raises(
        ValueError, match=r"^extra_headers names must be HTTP tokens, got .+$"
    ):
        OpenAIProvider(
            base_url="http://x/v1",
            api_key="k",
            model="m",
            extra_headers={name: "v"},
        )


def test_an_anthropic_version_that_cannot_be_sent_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^anthropic_version must be printable ASCII, got a line break at index 10$",
    ):
        AnthropicProvider(api_key="k", model="m", anthropic_version="2023-06-01\n")


async def test_a_header_value_with_inner_spaces_is_sent_as_it_is() -> None:
    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=openai_body()
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
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
