"""The official SDKs through ``Dispatcher.transport``, over real sockets.

The real ``openai`` (3.x) and ``anthropic`` (2.x) clients, on an
``httpx2.AsyncClient`` whose transport is the dispatcher's, against the
fake LLM server on loopback. The server's own statistics (peak in flight,
disconnects, arrival times) say what reached the wire; the dispatcher's
say what it granted. Real time: keep the latencies small.
"""

from __future__ import annotations

from contextlib import aclosing, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

import anthropic
import httpx
import httpx2
import openai
import pytest
import trio
import trio.testing

from trio_dispatch import SlotHoldTimeout, open_dispatcher
from trio_dispatch.testing import (
    FakeLLMServer,
    FakeReply,
    FakeScript,
    Fault,
    open_fake_llm_server,
)

from .._helpers import drop
from .._rigs import eventually, last_text

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from openai.types.chat import ChatCompletionChunk

    from trio_dispatch import Dispatcher
    from trio_dispatch.testing import FakeRequest

Wire = Literal["openai", "anthropic"]

# The openai SDK leaves the async generators under a stream unclosed when it
# stops at ``[DONE]`` (it does so without a transport too): trio warns when
# they are collected. Ours are closed, and not excused here.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)

TEXT = "one two three four five six"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@asynccontextmanager
async def open_sdks(
    script: FakeScript,
    *,
    limit: int,
    max_retries: int = 0,
    **dispatcher: Any,  # noqa: ANN401 (open_dispatcher's options)
) -> AsyncIterator[
    tuple[FakeLLMServer, Dispatcher, openai.AsyncOpenAI, anthropic.AsyncAnthropic]
]:
    """The fake server, a dispatcher, and both SDKs through its transports."""
    async with (
        open_fake_llm_server(script, api_key="sk-test") as server,
        open_dispatcher({"openai": limit, "anthropic": limit}, **dispatcher) as d,
        httpx2.AsyncClient(transport=d.transport("openai")) as openai_http,
        httpx2.AsyncClient(transport=d.transport("anthropic")) as anthropic_http,
    ):
        yield (
            server,
            d,
            openai.AsyncOpenAI(
                api_key="sk-test",
                base_url=server.openai_base_url,
                http_client=openai_http,
                max_retries=max_retries,
            ),
            anthropic.AsyncAnthropic(
                api_key="sk-test",
                base_url=server.anthropic_base_url,
                http_client=anthropic_http,
                max_retries=max_retries,
            ),
        )


async def openai_text(client: openai.AsyncOpenAI, prompt: str = "hi") -> str:
    """One streamed chat completion, read to its end: its text."""
    stream = await client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": prompt}], stream=True
    )
    parts: list[str] = []
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def anthropic_text(client: anthropic.AsyncAnthropic, prompt: str = "hi") -> str:
    """One streamed message, read to its end: its text."""
    async with client.messages.stream(
        model="fake", max_tokens=64, messages=[{"role": "user", "content": prompt}]
    ) as stream:
        return await stream.get_final_text()


def stats(dispatcher: Dispatcher, provider: str) -> tuple[int, int, int]:
    """``(in_flight, granted_total, released_total)`` of ``provider``."""
    s = dispatcher.statistics().providers[provider]
    return s.in_flight, s.granted_total, s.released_total


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_twenty_sdk_streams_never_exceed_the_limit_on_the_wire(
    wire: Wire,
) -> None:
    script = FakeScript(default=FakeReply(text=TEXT, tokens_per_second=400))
    texts: list[str] = []
    async with open_sdks(script, limit=3) as (server, dispatcher, oa, an):

        async def call() -> None:
            if wire == "openai":
                texts.append(await openai_text(oa))
            else:
                texts.append(await anthropic_text(an))

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(call)
        provider = dispatcher.statistics().providers[wire]
        served = await server.wait_idle()
    assert texts == [TEXT] * 20
    assert served.requests_total == served.completed == 20
    assert served.peak_in_flight <= 3
    assert (provider.granted_total, provider.released_total) == (20, 20)
    assert provider.peak_in_flight == 3
    assert provider.peak_waiting >= 1
    assert all(request.authenticated for request in server.requests)


async def slow_stream(
    client: openai.AsyncOpenAI,
) -> openai.AsyncStream[ChatCompletionChunk]:
    """An OpenAI stream that takes its time, not read yet."""
    return await client.chat.completions.create(
        model="fake", messages=MESSAGES, stream=True
    )


def chunks_of(
    stream: openai.AsyncStream[ChatCompletionChunk],
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The stream's own iterator, to read by hand and close."""
    return cast("AsyncGenerator[ChatCompletionChunk, None]", stream.__aiter__())


SLOW = FakeScript(
    default=FakeReply(text=" ".join(["word"] * 200), tokens_per_second=50)
)


async def test_closing_an_sdk_stream_early_gives_the_slot_back() -> None:
    async with open_sdks(SLOW, limit=1) as (server, dispatcher, oa, _an):
        stream = await slow_stream(oa)
        async with stream, aclosing(chunks_of(stream)) as chunks:
            await anext(chunks)
            assert stats(dispatcher, "openai") == (1, 1, 0)
        assert stats(dispatcher, "openai") == (0, 1, 1)
        await eventually(lambda: server.statistics().client_disconnects == 1)
        await eventually(lambda: server.statistics().in_flight == 0)
        # The slot is free: the next call goes.
        server.set_script(FakeScript(default=FakeReply(text=TEXT)))
        assert await openai_text(oa) == TEXT
        assert server.statistics().peak_in_flight == 1


async def test_an_sdk_stream_dropped_unclosed_gives_its_slot_back() -> None:
    # Limit 2: two SDK streams taken and left unread; one is dropped. Its
    # slot used to stay taken for ever, and the third call waited for ever.
    async with open_sdks(SLOW, limit=2) as (server, dispatcher, oa, _an):
        kept = await slow_stream(oa)
        dropped = [await slow_stream(oa)]
        assert stats(dispatcher, "openai") == (2, 2, 0)
        with pytest.warns(
            ResourceWarning, match=r"^a model call to 'openai' was never closed: "
        ):
            drop(dropped)
        server.set_script(FakeScript(default=FakeReply(text=TEXT)))
        with trio.fail_after(30):
            assert await openai_text(oa) == TEXT
        assert stats(dispatcher, "openai") == (1, 3, 2)
        await kept.close()
        assert stats(dispatcher, "openai") == (0, 3, 3)


async def test_cancelling_an_sdk_stream_gives_the_slot_back() -> None:
    async with open_sdks(SLOW, limit=1) as (server, dispatcher, oa, _an):
        chunks = 0
        with trio.CancelScope() as scope:
            stream = await slow_stream(oa)
            async with stream:
                async for _ in stream:
                    chunks += 1
                    if chunks == 3:
                        scope.cancel()
        assert scope.cancelled_caught
        assert stats(dispatcher, "openai") == (0, 1, 1)
        await eventually(lambda: server.statistics().client_disconnects == 1)
        await eventually(lambda: server.statistics().in_flight == 0)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_connection_lost_mid_stream_gives_the_slot_back(wire: Wire) -> None:
    script = FakeScript(
        default=FakeReply(text=TEXT, fault=Fault("disconnect", after_events=3))
    )
    async with open_sdks(script, limit=1) as (server, dispatcher, oa, an):
        if wire == "openai":
            with pytest.raises(openai.APIConnectionError):
                await openai_text(oa)
        else:
            # anthropic 2.17 wraps the dropped stream in its own connection
            # error; earlier 2.x let httpx2's error through. Either way the
            # slot must come back.
            with pytest.raises(
                (anthropic.APIConnectionError, httpx2.RemoteProtocolError)
            ):
                await anthropic_text(an)
        assert stats(dispatcher, wire) == (0, 1, 1)
        assert (await server.wait_idle()).peak_in_flight == 1


async def test_max_hold_ends_a_stalled_sdk_stream_and_gives_the_slot_back() -> None:
    script = FakeScript(
        default=FakeReply(text=TEXT, fault=Fault("stall", after_events=3))
    )
    async with open_sdks(script, limit=1, max_hold=0.3) as (
        server,
        dispatcher,
        oa,
        _an,
    ):
        started = trio.current_time()
        with pytest.raises(SlotHoldTimeout):
            await openai_text(oa)
        assert trio.current_time() - started >= 0.3
        assert stats(dispatcher, "openai") == (0, 1, 1)
        await eventually(lambda: server.statistics().client_disconnects == 1)
        await eventually(lambda: server.statistics().in_flight == 0)


async def test_max_hold_closes_an_sdk_stream_nobody_reads() -> None:
    async with open_sdks(SLOW, limit=1, max_hold=0.3) as (server, dispatcher, oa, _an):
        stream = await slow_stream(oa)
        async with stream, aclosing(chunks_of(stream)) as chunks:
            await anext(chunks)
            # Not reading: the server's stream is closed under us, the slot
            # goes back, and the next read says why.
            await eventually(lambda: server.statistics().client_disconnects == 1)
            assert stats(dispatcher, "openai") == (0, 1, 1)
            with pytest.raises(SlotHoldTimeout):
                await anext(chunks)
        # The server ends its side of the stream when it next writes.
        await eventually(lambda: server.statistics().in_flight == 0)


def arrivals(server: FakeLLMServer, prompt: str) -> list[FakeRequest]:
    """The requests whose last message was ``prompt``, in arrival order."""
    return [r for r in server.requests if last_text(r) == prompt]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_429_with_retry_after_pauses_every_call_of_the_provider(
    wire: Wire,
) -> None:
    def choose(request: FakeRequest) -> FakeReply | None:
        if last_text(request) == "first":
            return FakeReply(fault=Fault("rate_limit", retry_after=2))
        return None

    script = FakeScript(default=FakeReply(text=TEXT), choose=choose)
    async with open_sdks(script, limit=3) as (server, dispatcher, oa, an):
        with pytest.raises(
            openai.RateLimitError if wire == "openai" else anthropic.RateLimitError
        ) as raised:
            if wire == "openai":
                await openai_text(oa, "first")
            else:
                await anthropic_text(an, "first")
        # The answer reached the SDK as the server sent it.
        error = raised.value
        assert isinstance(error, openai.RateLimitError | anthropic.RateLimitError)
        assert error.status_code == 429
        assert error.response.headers["retry-after"] == "2"
        assert dispatcher.statistics().providers[wire].paused
        texts: list[str] = []

        async def call() -> None:
            if wire == "openai":
                texts.append(await openai_text(oa, "later"))
            else:
                texts.append(await anthropic_text(an, "later"))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(call)
    assert texts == [TEXT] * 3
    (limited,) = arrivals(server, "first")
    later = arrivals(server, "later")
    assert len(later) == 3
    # Server-side times: nothing reached the wire for two seconds.
    assert min(r.arrived_at for r in later) >= limited.arrived_at + 2.0


async def test_an_sdk_retry_of_a_429_waits_for_the_pause() -> None:
    # "b" is in flight first, and gets a 429 saying 2 s half a second after
    # it arrived; "a", sent once "b" has arrived, gets a 429 saying 1 s at
    # once. The SDK retries "a" after its own 1 s, outside the slot, when
    # the pause of "b" has begun: it queues again, and waits until it ends.
    def choose(request: FakeRequest) -> FakeReply | None:
        retry = request.headers.get("x-stainless-retry-count", "0")
        if last_text(request) == "a" and retry == "0":
            return FakeReply(fault=Fault("rate_limit", retry_after=1))
        if last_text(request) == "b":
            return FakeReply(latency=0.5, fault=Fault("rate_limit", retry_after=2))
        return None

    script = FakeScript(default=FakeReply(text=TEXT), choose=choose)
    async with open_sdks(script, limit=2) as (server, _dispatcher, oa, _an):
        retrying = oa.with_options(max_retries=1)
        texts: list[str] = []

        async def a() -> None:
            texts.append(await openai_text(retrying, "a"))

        async def b() -> None:
            with pytest.raises(openai.RateLimitError):
                await openai_text(oa, "b")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(b)
            # Ordered by what the server saw, not by time: a loaded machine
            # may take long to send "b".
            with trio.fail_after(10):
                while not arrivals(server, "b"):  # noqa: ASYNC110 (the server's record, across a socket)
                    await trio.sleep(0.005)
            nursery.start_soon(a)
    assert texts == [TEXT]
    first, retry = arrivals(server, "a")
    (other,) = arrivals(server, "b")
    assert first.arrived_at >= other.arrived_at
    assert retry.headers["x-stainless-retry-count"] == "1"
    # The SDK alone would have sent it again 1 s after the first answer;
    # the pause of "b" held it until 2 s after the answer of "b".
    assert retry.arrived_at >= other.arrived_at + 0.5 + 2.0


async def test_requests_that_run_no_model_pass_without_a_slot() -> None:
    async with open_sdks(SLOW, limit=1) as (server, dispatcher, oa, _an):
        stream = await slow_stream(oa)
        async with stream, aclosing(chunks_of(stream)) as chunks:
            await anext(chunks)
            # The only slot is held, yet listing models goes at once (the
            # fake server has no such route).
            with pytest.raises(openai.NotFoundError):
                await oa.models.list()
            assert stats(dispatcher, "openai") == (1, 1, 0)
        assert server.statistics().responses_by_status[404] == 1


async def test_a_legacy_httpx_transport_as_inner_holds_slots_too() -> None:
    script = FakeScript(default=FakeReply(text=TEXT, tokens_per_second=400))
    bodies: list[bytes] = []
    async with (
        open_fake_llm_server(script) as server,
        open_dispatcher({"legacy": 2}) as dispatcher,
    ):
        transport = dispatcher.transport("legacy", inner=httpx.AsyncHTTPTransport())
        assert isinstance(transport, httpx.AsyncBaseTransport)
        async with httpx.AsyncClient(transport=transport) as client:

            async def call() -> None:
                async with client.stream(
                    "POST",
                    f"{server.openai_base_url}/chat/completions",
                    headers={"authorization": "Bearer sk-test"},
                    json={"model": "fake", "messages": MESSAGES, "stream": True},
                ) as response:
                    bodies.append(await response.aread())

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(call)
        served = await server.wait_idle()
        assert stats(dispatcher, "legacy") == (0, 6, 6)
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
    assert served.completed == 6
    assert served.peak_in_flight <= 2


# -- a rate-limited call keeps its turn's place, in virtual time -----------------
#
# The fake server is served in the test's own trio run (``httpx2.ASGITransport``
# as the transport's inner one), so the SDKs' own retry sleeps and the
# dispatcher's pause run on the same virtual clock.

RETRY_LATE = 0.3


def asgi(server: FakeLLMServer) -> httpx2.ASGITransport:
    """The fake server, served in this trio run: no sockets, virtual time."""
    return httpx2.ASGITransport(app=server)  # type: ignore[arg-type]  # an ASGI app; its annotations are narrower than httpx2's


async def late_retries(request: httpx2.Request) -> None:
    """An SDK's retry that comes ``RETRY_LATE`` after its own sleep, as on a busy loop."""
    if request.headers.get("x-stainless-retry-count", "0") != "0":
        await trio.sleep(RETRY_LATE)


@asynccontextmanager
async def open_virtual_sdk(
    script: FakeScript,
    wire: Wire,
    *,
    max_retries: int = 2,
    **dispatcher: Any,  # noqa: ANN401 (open_dispatcher's options)
) -> AsyncIterator[tuple[FakeLLMServer, Dispatcher, Any]]:
    """A dispatcher limiting ``wire`` to 1, and that SDK through its transport.

    The server runs in this trio run; the SDK's retries come ``RETRY_LATE``
    after its own sleep.
    """
    server = FakeLLMServer(script, api_key="sk-test")
    async with (
        open_dispatcher({wire: 1}, **dispatcher) as d,
        httpx2.AsyncClient(
            transport=d.transport(wire, inner=asgi(server)),
            event_hooks={"request": [late_retries]},
        ) as http,
    ):
        sdk: Any
        if wire == "openai":
            sdk = openai.AsyncOpenAI(
                api_key="sk-test",
                base_url="http://fake.test/v1",
                http_client=http,
                max_retries=max_retries,
            )
        else:
            sdk = anthropic.AsyncAnthropic(
                api_key="sk-test",
                base_url="http://fake.test",
                http_client=http,
                max_retries=max_retries,
            )
        # The SDK reads its platform in a thread, once, at its first call:
        # the virtual clock must not run on meanwhile.
        with pytest.raises((openai.NotFoundError, anthropic.NotFoundError)):
            await sdk.models.list()
        yield server, d, sdk


async def sdk_text(sdk: Any, wire: Wire, prompt: str) -> str:  # noqa: ANN401 (either SDK)
    """One streamed answer of ``wire``'s SDK, read to its end: its text."""
    if wire == "openai":
        return await openai_text(sdk, prompt)
    return await anthropic_text(sdk, prompt)


def limited_once(name: str, *, latency: float = 1.0) -> FakeScript:
    """``name``'s first attempt waits ``latency``, then gets 429 with Retry-After: 1."""

    def choose(request: FakeRequest) -> FakeReply | None:
        retry = request.headers.get("x-stainless-retry-count", "0")
        if last_text(request) == name and retry == "0":
            return FakeReply(latency=latency, fault=Fault("rate_limit", retry_after=1))
        return None

    return FakeScript(default=FakeReply(text=TEXT, latency=1.0), choose=choose)


def seen(server: FakeLLMServer) -> list[tuple[str, float]]:
    """What the server received: each request's prompt and virtual arrival time."""
    return [(last_text(r), r.arrived_at) for r in server.requests]


async def start_turns(
    nursery: trio.Nursery,
    dispatcher: Dispatcher,
    calls: dict[str, Any],
) -> None:
    """Start each call in its own turn, 0.1 s apart, oldest first."""
    for name, call in calls.items():

        async def turn(call: Any = call, name: str = name) -> None:  # noqa: ANN401 (a call)
            with dispatcher.turn(conversation_id=name):
                await call()

        nursery.start_soon(turn)
        await trio.sleep(0.1)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_an_sdk_retry_of_a_429_keeps_its_turn_s_place_before_younger_turns(
    autojump_clock: trio.testing.MockClock, wire: Wire
) -> None:
    # Limit 1. Turn A (oldest) is sent at 0 and answered 429, Retry-After: 1,
    # at 1; turns B and C (younger) wait. The pause ends at 2; the SDK's
    # retry of A comes 0.3 s later. A's turn keeps its place meanwhile: the
    # slot waits for the retry instead of going to B.
    texts: dict[str, str] = {}
    async with open_virtual_sdk(limited_once("A"), wire) as (server, dispatcher, sdk):

        async def ask(name: str) -> None:
            texts[name] = await sdk_text(sdk, wire, name)

        async with trio.open_nursery() as nursery:
            await start_turns(nursery, dispatcher, {n: partial(ask, n) for n in "ABC"})
        stats = dispatcher.statistics().providers[wire]
    assert texts == dict.fromkeys("ABC", TEXT)
    assert seen(server) == [
        ("A", 0.0),
        ("A", 2.0 + RETRY_LATE),
        ("B", 3.0 + RETRY_LATE),
        ("C", 4.0 + RETRY_LATE),
    ]
    assert (stats.in_flight, stats.waiting) == (0, 0)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_place_kept_for_an_sdk_retry_that_never_comes_goes_after_retry_grace(
    autojump_clock: trio.testing.MockClock, wire: Wire
) -> None:
    # The SDK's retries are off: A's 429 reaches the caller, whose turn goes
    # on without a retry. Its place, granted at 2 when the pause ends, is
    # kept 0.5 s (retry_grace) for nothing, then given back: B goes at 2.5.
    async with open_virtual_sdk(
        limited_once("A"), wire, max_retries=0, retry_grace=0.5
    ) as (server, dispatcher, sdk):

        async def a() -> None:
            with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)):
                await sdk_text(sdk, wire, "A")
            await trio.sleep(10)

        async def ask(name: str) -> None:
            assert await sdk_text(sdk, wire, name) == TEXT

        async with trio.open_nursery() as nursery:
            await start_turns(
                nursery,
                dispatcher,
                {"A": a, "B": partial(ask, "B"), "C": partial(ask, "C")},
            )
        stats = dispatcher.statistics().providers[wire]
    assert seen(server) == [("A", 0.0), ("B", 2.5), ("C", 3.5)]
    # A, its kept place, B and C were granted, and each gave its slot back.
    assert (stats.granted_total, stats.released_total) == (4, 4)
    assert (stats.in_flight, stats.waiting) == (0, 0)
