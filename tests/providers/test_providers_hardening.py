"""Regression tests at the provider edge: what a provider accepts and sends.

Each guards a bug found in review: a content type refused for its case,
API keys and header values that reached the wire (or an error message)
unchecked, a key that slipped past redaction in an escaped spelling or
across a cut, and failures outside the ``ProviderError`` tree that took a
whole dispatcher down with one call.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import (
    Conversation,
    ConversationOptions,
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
    OpenAIProvider,
    RequestFailed,
    ServerError,
)

from .._helpers import chain

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from trio_dispatch import Provider

HI = ChatRequest([ChatMessage("user", "hi")])


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


# ------------------------------------------------------------------ keys and headers

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


# ------------------------------------------------------------------ nothing else escapes


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


def raising(exc: BaseException) -> Callable[[httpx2.Request], httpx2.Response]:
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
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising(exc)))
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
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising(exc)))
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
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(raising(Boom())))
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


# ------------------------------------------------------------------ one bad call


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
        return httpx2.MockTransport(raising(Boom("no")))
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
