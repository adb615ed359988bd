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
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider, ProviderError

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


# ------------------------------------------------------------------ redaction

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


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything behind it, through causes and contexts."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        current = stack.pop()
        if any(current is known for known in seen):
            continue
        seen.append(current)
        stack.extend(
            e for e in (current.__cause__, current.__context__) if e is not None
        )
    return seen


def answering(
    make: Callable[..., Provider],
    status: int,
    body: bytes,
    content_type: str = "application/json",
) -> Provider:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, headers={"content-type": content_type}, content=body
        )

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return make(client, KEY)


async def failure(provider: Provider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert [type(e) for e in chain(caught.value)] == [type(caught.value)]
    assert leaks(caught.value, KEY) == []
    assert KEY not in repr(vars(caught.value))
    return caught.value


@pytest.mark.parametrize("spelling", JSON_SPELLINGS.values(), ids=JSON_SPELLINGS)
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_key_echoed_json_escaped_in_an_error_body_is_redacted(
    make: Callable[..., Provider], body: Callable[[], bytes], spelling: str
) -> None:
    del body
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
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_key_echoed_in_any_spelling_in_a_text_error_body_is_redacted(
    make: Callable[..., Provider], body: Callable[[], bytes], spelling: str
) -> None:
    del body
    text = f"upstream refused {spelling}, and said so"
    exc = await failure(answering(make, 403, text.encode(), "text/plain"))
    assert str(exc).endswith(": HTTP 403: upstream refused [redacted], and said so")


LIMIT = 64 * 1024  # what of an error body is kept


@pytest.mark.parametrize("spelling", TEXT_SPELLINGS.values(), ids=TEXT_SPELLINGS)
@pytest.mark.parametrize("before_the_cut", [1, 5, 12])
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_key_that_straddles_the_error_body_cut_is_redacted_whole(
    make: Callable[..., Provider],
    body: Callable[[], bytes],
    before_the_cut: int,
    spelling: str,
) -> None:
    del body
    # Whitespace collapses in the message, so what was kept at the cut shows.
    error = b" " * (LIMIT - before_the_cut) + spelling.encode() + b" and more" * 99
    provider = answering(make, 500, error, "text/plain")
    exc = await failure(provider)
    assert str(exc) == f"{provider.id}: HTTP 500: [redacted]"


@pytest.mark.parametrize("spelling", TEXT_SPELLINGS.values(), ids=TEXT_SPELLINGS)
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_key_that_straddles_the_end_of_what_is_read_is_dropped_with_it(
    make: Callable[..., Provider], body: Callable[[], bytes], spelling: str
) -> None:
    del body
    # The body is read a key's longest spelling (6 bytes a character) past
    # the cut, so a key can be cut in two there too; it lies past the cut.
    read = LIMIT + 6 * len(KEY)
    error = b"x" * 10 + b" " * (read - 15) + spelling.encode() + b" and more" * 99
    provider = answering(make, 500, error, "text/plain")
    exc = await failure(provider)
    assert str(exc) == f"{provider.id}: HTTP 500: xxxxxxxxxx"


@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_malformed_event_holding_the_key_carries_no_context_holding_it(
    make: Callable[..., Provider], body: Callable[[], bytes]
) -> None:
    del body
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
@pytest.mark.parametrize(("make", "body"), WIRE_FORMATS)
async def test_a_key_echoed_escaped_in_an_error_event_is_redacted(
    make: Callable[..., Provider], body: Callable[[], bytes], spelling: str
) -> None:
    del body
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
