"""The providers on httpx2: what ``client=`` takes, and streams as the spec has them.

A legacy ``httpx.AsyncClient`` is refused at once, with a message that says
what to pass instead, and without importing httpx to tell. A stream's bytes
are read as the server-sent events specification says, whatever the
chunking, the line endings, a leading byte order mark or the charset the
``Content-Type`` names.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import httpx2
import pytest
import trio

from trio_dispatch.messages import TextDelta
from trio_dispatch.providers import MalformedStream

from .._wires import SSE_HEADERS, WIRES, Wire, collect

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch.messages import StreamEvent


@pytest.fixture(params=WIRES, ids=lambda wire: wire.name)
def wire(request: pytest.FixtureRequest) -> Wire:
    chosen: Wire = request.param
    return chosen


async def test_a_legacy_httpx_client_is_refused_with_what_to_use(wire: Wire) -> None:
    async with httpx.AsyncClient() as legacy:
        with pytest.raises(
            TypeError,
            match=r"^client must be an httpx2\.AsyncClient, got httpx\.AsyncClient: "
            r"trio-dispatch uses httpx2, httpx's maintained line; "
            r"use httpx2\.AsyncClient instead$",
        ):
            wire.provider(client=legacy)
        assert not legacy.is_closed  # nothing was done with it


def test_a_legacy_client_is_recognised_without_importing_httpx() -> None:
    code = (
        "import sys\n"
        "from trio_dispatch.providers import OpenAIProvider\n"
        "AsyncClient = type('AsyncClient', (), {'__module__': 'httpx._client'})\n"
        "try:\n"
        "    OpenAIProvider(base_url='https://api.test/v1', api_key='k',"
        " model='m', client=AsyncClient())\n"
        "except TypeError as exc:\n"
        "    print(exc)\n"
        "print('httpx' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        "client must be an httpx2.AsyncClient, got httpx.AsyncClient: "
        "trio-dispatch uses httpx2, httpx's maintained line; use httpx2.AsyncClient "
        "instead",
        "False",
    ]


# -- streams as the specification has them -------------------------------------


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def utf8(body: str) -> bytes:
    """``body`` with its JSON escapes of "\u00e9" sent as UTF-8 bytes."""
    encoded = body.encode().replace(b"\\u00e9", "\u00e9".encode())
    assert b"\xc3\xa9" in encoded
    return encoded


async def replay(
    wire: Wire, chunks: list[bytes], headers: dict[str, str] = SSE_HEADERS
) -> list[StreamEvent]:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=headers, stream=_Chunks(chunks))

    client = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    async with client, wire.provider(client=client) as provider:
        return await collect(provider)


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"], ids=["CRLF", "CR"])
async def test_a_stream_with_a_byte_order_mark_and_other_line_endings(
    wire: Wire, newline: bytes
) -> None:
    plain = wire.text_stream("Hel", "lo").encode()
    expected = await replay(wire, [plain])
    assert TextDelta("Hel") in expected
    body = b"\xef\xbb\xbf" + plain.replace(b"\n", newline)
    assert await replay(wire, [body]) == expected


async def test_a_stream_cut_into_single_bytes_gives_the_same_events(
    wire: Wire,
) -> None:
    body = b"\xef\xbb\xbf" + utf8(wire.text_stream("caf\u00e9", " ok"))
    body = body.replace(b"\n", b"\r\n")
    expected = await replay(wire, [body])
    assert TextDelta("caf\u00e9") in expected
    assert await replay(wire, [body[i : i + 1] for i in range(len(body))]) == expected


async def test_a_stream_is_utf8_whatever_charset_the_content_type_names(
    wire: Wire,
) -> None:
    body = utf8(wire.text_stream("caf\u00e9"))
    events = await replay(
        wire, [body], {"content-type": "text/event-stream; charset=iso-8859-1"}
    )
    assert TextDelta("caf\u00e9") in events


class _Endless(httpx2.AsyncByteStream):
    """A body that sends ``piece`` until closed, counting what was read of it."""

    def __init__(self, piece: bytes) -> None:
        self.piece = piece
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self.closed:
            await trio.lowlevel.checkpoint()
            self.sent += len(self.piece)
            yield self.piece

    async def aclose(self) -> None:
        self.closed = True


class _Streaming(httpx2.AsyncBaseTransport):
    """Answers with ``body``, unread (``MockTransport`` reads a body whole)."""

    def __init__(self, body: httpx2.AsyncByteStream) -> None:
        self.body = body

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=SSE_HEADERS, stream=self.body)


@pytest.mark.parametrize(
    "piece",
    [b"x" * 65_536, b"data: " + b"x" * 65_530 + b"\n"],
    ids=["a line never ended", "an event never ended"],
)
async def test_an_event_that_never_ends_fails_the_stream_at_its_bound(
    wire: Wire, piece: bytes
) -> None:
    body = _Endless(piece)
    client = httpx2.AsyncClient(transport=_Streaming(body))
    async with client, wire.provider(client=client) as provider:
        with pytest.raises(
            MalformedStream,
            match=r"a server-sent event grew past 16777216 bytes without ending$",
        ):
            await collect(provider)
    # Read up to the bound, not on and on, and closed.
    assert body.closed
    # (The held bytes are the values: a little less than the lines sent.)
    assert 16 * 1024 * 1024 < body.sent <= 16 * 1024 * 1024 + 2 * len(piece)
