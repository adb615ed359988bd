"""``Dispatcher.transport``'s read timeout on an event stream, in virtual time.

A server that answers ``text/event-stream`` and then sends only comments
(``: keepalive``) restarts httpx's read timeout with every byte. Through
the transport the request's read timeout counts the time without an event
instead, as our own providers count it: past it the body is closed, the
slot goes back, and the read raises the read timeout of the request's httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import httpx2
import openai
import pytest
import trio
import trio.testing

from trio_dispatch import SlotHoldTimeout, open_dispatcher

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from trio_dispatch import Dispatcher

# Older httpx2 releases leave their own wrapper of a response's stream
# unclosed when the response is closed before its end, and the openai SDK
# the generators under a stream: trio warns when they are collected.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2)\.:ResourceWarning"
)

URL = "https://llm.test/v1/chat/completions"
SSE = {"content-type": "text/event-stream; charset=utf-8"}
KEEPALIVE = b": keepalive\n\n"
EVENT = b'data: {"n": 1}\n\n'


class Trickle:
    """A body sending ``script``'s chunks, each after its delay; notes its close."""

    def __init__(self, script: Iterable[tuple[float, bytes]]) -> None:
        self.script = script
        self.closed_at: float | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for delay, chunk in self.script:
            await trio.sleep(delay)
            yield chunk

    async def aclose(self) -> None:
        if self.closed_at is None:
            self.closed_at = trio.current_time()


class Trickle2(Trickle, httpx2.AsyncByteStream):
    """A ``Trickle`` for httpx2."""


class LegacyTrickle(Trickle, httpx.AsyncByteStream):
    """A ``Trickle`` for the legacy httpx."""


def keepalives(gap: float = 0.2) -> Iterable[tuple[float, bytes]]:
    """Comments, one every ``gap`` seconds, for ever."""
    while True:
        yield gap, KEEPALIVE


def in_flight(dispatcher: Dispatcher) -> int:
    return dispatcher.statistics().providers["p"].in_flight


def mock2(body: Trickle2, headers: dict[str, str] = SSE) -> httpx2.MockTransport:
    return httpx2.MockTransport(
        lambda _: httpx2.Response(200, headers=headers, stream=body)
    )


async def read_all(client: httpx2.AsyncClient) -> list[bytes]:
    """One streamed model call, read to its end: its chunks."""
    async with client.stream("POST", URL) as response:
        return [chunk async for chunk in response.aiter_raw()]


async def test_a_stream_of_comments_alone_fails_at_the_read_timeout_with_its_slot_back(
    autojump_clock: trio.abc.Clock,
) -> None:
    body = Trickle2(keepalives())
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body))
        async with httpx2.AsyncClient(
            transport=transport, timeout=httpx2.Timeout(30.0, read=1.0)
        ) as client:
            with pytest.raises(
                httpx2.ReadTimeout, match=r"^p: the stream stalled: no event for 1 s$"
            ):
                await read_all(client)
            assert trio.current_time() == 1.0
            assert in_flight(dispatcher) == 0
    assert body.closed_at == 1.0


async def test_a_legacy_stream_of_comments_alone_fails_at_the_read_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    body = LegacyTrickle(keepalives())
    async with open_dispatcher({"p": 1}) as dispatcher:
        inner = httpx.MockTransport(
            lambda _: httpx.Response(200, headers=SSE, stream=body)
        )
        async with httpx.AsyncClient(
            transport=dispatcher.transport("p", inner=inner),
            timeout=httpx.Timeout(30.0, read=1.5),
        ) as client:
            with pytest.raises(
                httpx.ReadTimeout, match=r"^p: the stream stalled: no event for 1.5 s$"
            ):
                async with client.stream("POST", URL) as response:
                    async for _ in response.aiter_raw():
                        pass
            assert trio.current_time() == 1.5
            assert in_flight(dispatcher) == 0
    assert body.closed_at == 1.5


async def test_events_within_the_read_timeout_keep_a_stream_alive_past_many(
    autojump_clock: trio.abc.Clock,
) -> None:
    # An event every 0.8 s, split across chunks and among comments: the
    # read timeout (1 s) counts from event to event, never from the start.
    script = [
        (0.2, KEEPALIVE),
        (0.2, b'data: {"n"'),
        (0.2, KEEPALIVE[:4]),
        (0.2, b": 1}\n\n"),
    ] * 10
    body = Trickle2(script)
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body))
        async with httpx2.AsyncClient(
            transport=transport, timeout=httpx2.Timeout(30.0, read=1.0)
        ) as client:
            chunks = await read_all(client)
            assert trio.current_time() == pytest.approx(8.0)
            assert len(chunks) == 40
            assert in_flight(dispatcher) == 0


async def test_bytes_that_end_no_event_do_not_move_the_stall_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    # An event, then an event's data that never ends: it stalls 1 s after
    # the first event, not after the last byte.
    script = [(0.5, EVENT), *[(0.2, b"data: more\n")] * 20]
    body = Trickle2(script)
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body))
        async with httpx2.AsyncClient(
            transport=transport, timeout=httpx2.Timeout(30.0, read=1.0)
        ) as client:
            with pytest.raises(httpx2.ReadTimeout):
                await read_all(client)
            assert trio.current_time() == 1.5
            assert in_flight(dispatcher) == 0
    assert body.closed_at == 1.5


async def test_time_the_reader_spends_between_reads_is_not_a_stall(
    autojump_clock: trio.abc.Clock,
) -> None:
    # As httpx's own read timeout: only the time spent waiting on the
    # server counts, not the reader's own work between its reads.
    body = Trickle2([(0.4, KEEPALIVE), (0.4, EVENT), (0.9, KEEPALIVE), (0.0, EVENT)])
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body))
        async with (
            httpx2.AsyncClient(
                transport=transport, timeout=httpx2.Timeout(30.0, read=1.0)
            ) as client,
            client.stream("POST", URL) as response,
        ):
            got: list[bytes] = []
            async for chunk in response.aiter_raw():
                got.append(chunk)
                await trio.sleep(5.0)
            assert got == [KEEPALIVE, EVENT, KEEPALIVE, EVENT]
            assert in_flight(dispatcher) == 0


@pytest.mark.parametrize(
    ("headers", "timeouts"),
    [
        (SSE, httpx2.Timeout(30.0, read=None)),
        ({"content-type": "application/json"}, httpx2.Timeout(30.0, read=1.0)),
    ],
    ids=["no-read-timeout", "not-an-event-stream"],
)
async def test_no_stall_rule_without_a_read_timeout_or_an_event_stream(
    autojump_clock: trio.abc.Clock, headers: dict[str, str], timeouts: httpx2.Timeout
) -> None:
    body = Trickle2([(0.2, KEEPALIVE)] * 50)
    async with open_dispatcher({"p": 1}) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body, headers))
        async with httpx2.AsyncClient(transport=transport, timeout=timeouts) as client:
            assert len(await read_all(client)) == 50
            assert trio.current_time() == pytest.approx(10.0)


async def test_max_hold_before_the_stall_deadline_still_ends_the_call(
    autojump_clock: trio.abc.Clock,
) -> None:
    body = Trickle2(keepalives())
    async with open_dispatcher({"p": 1}, max_hold=0.7) as dispatcher:
        transport = dispatcher.transport("p", inner=mock2(body))
        async with httpx2.AsyncClient(
            transport=transport, timeout=httpx2.Timeout(30.0, read=1.0)
        ) as client:
            with pytest.raises(SlotHoldTimeout):
                await read_all(client)
            assert trio.current_time() == 0.7
            assert in_flight(dispatcher) == 0
    assert body.closed_at == 0.7


def sdk(dispatcher: Dispatcher, body: Trickle2) -> openai.AsyncOpenAI:
    """The openai SDK through the dispatcher's transport, read timeout 1 s."""
    http = httpx2.AsyncClient(transport=dispatcher.transport("p", inner=mock2(body)))
    return openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="https://llm.test/v1",
        http_client=http,
        max_retries=0,
        timeout=httpx2.Timeout(30.0, read=1.0),
    )


MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


async def test_an_openai_stream_of_comments_alone_raises_its_timeout_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    body = Trickle2(keepalives())
    async with open_dispatcher({"p": 1}) as dispatcher:
        client = sdk(dispatcher, body)
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
        with pytest.raises(openai.APITimeoutError):
            async with stream:
                async for _ in stream:
                    pass
        assert trio.current_time() == 1.0
        assert in_flight(dispatcher) == 0
        await client.close()


async def test_an_openai_call_answered_with_comments_alone_raises_its_timeout_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    body = Trickle2(keepalives())
    async with open_dispatcher({"p": 1}) as dispatcher:
        client = sdk(dispatcher, body)
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert trio.current_time() == 1.0
        assert in_flight(dispatcher) == 0
        await client.close()
