"""``wrap_provider`` over real sockets: slots around streams, as the server sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import open_dispatcher, wrap_provider
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta
from trio_dispatch.providers import OpenAIProvider, RateLimited, ServerError
from trio_dispatch.testing import FakeReply, FakeScript, Fault, open_fake_llm_server

from .._rigs import echo, eventually, last_text, open_rig

if TYPE_CHECKING:
    from trio_dispatch import Provider
    from trio_dispatch.messages import StreamEvent


def question(text: str) -> ChatRequest:
    """A one-message request."""
    return ChatRequest(messages=[ChatMessage("user", text)])


async def collect(provider: Provider, text: str) -> list[StreamEvent]:
    """Every event of the answer to ``text``."""
    async with provider.stream(question(text)) as events:
        return [event async for event in events]


async def test_the_slot_is_held_from_before_the_request_to_after_the_last_event() -> (
    None
):
    async with open_rig(echo(latency=0.05), limit=1) as rig:
        limited = wrap_provider(rig.provider, rig.dispatcher, conversation_id="c")
        answers: dict[str, list[StreamEvent]] = {}

        async def ask(text: str) -> None:
            answers[text] = await collect(limited, text)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "one")
            await eventually(lambda: len(rig.server.requests) == 1)
            nursery.start_soon(ask, "two")
            stats = rig.dispatcher.statistics
            await eventually(lambda: stats().providers["openai"].waiting == 1)
            # The second waits for the slot: nothing of it reached the server.
            assert len(rig.server.requests) == 1

        assert answers["one"][0] == TextDelta("re:")
        assert Finish("stop") in answers["two"]
        assert [last_text(r) for r in rig.server.requests] == ["one", "two"]
        assert rig.server.statistics().peak_in_flight == 1
        await eventually(lambda: rig.in_flight() == 0)
        provider_stats = rig.dispatcher.statistics().providers["openai"]
        assert (provider_stats.granted_total, provider_stats.released_total) == (2, 2)


async def test_leaving_the_stream_early_gives_the_slot_back_and_hangs_up() -> None:
    slow = FakeReply(text="word " * 200, tokens_per_second=200)
    async with open_rig(FakeScript(default=slow)) as rig:
        limited = wrap_provider(rig.provider, rig.dispatcher)
        async with limited.stream(question("hello")) as events:
            async for event in events:
                assert event == TextDelta("word")
                break
        await eventually(lambda: rig.in_flight() == 0)
        await eventually(lambda: rig.server.statistics().client_disconnects == 1)


async def test_an_error_gives_the_slot_back() -> None:
    script = FakeScript(default=FakeReply(fault=Fault("server_error")))
    async with open_rig(script) as rig:
        limited = wrap_provider(rig.provider, rig.dispatcher)
        with pytest.raises(ServerError):
            await collect(limited, "hello")
        await eventually(lambda: rig.in_flight() == 0)
        assert not rig.dispatcher.statistics().providers["openai"].paused


async def test_a_rate_limit_pauses_the_provider_until_retry_after() -> None:
    script = FakeScript(
        replies=(FakeReply(fault=Fault("rate_limit", retry_after_ms=300)),)
    )
    async with open_rig(script, limit=2) as rig:
        limited = wrap_provider(rig.provider, rig.dispatcher)
        with pytest.raises(RateLimited) as caught:
            await collect(limited, "hello")
        reported_at = trio.current_time()
        assert caught.value.retry_after == pytest.approx(0.3)
        await eventually(lambda: rig.dispatcher.statistics().providers["openai"].paused)
        paused_until = rig.dispatcher.statistics().providers["openai"].paused_until
        assert paused_until is not None
        assert paused_until <= reported_at + 0.3
        await collect(limited, "again")  # waits for the pause, though a slot is free
        first, second = rig.server.requests
        assert second.arrived_at >= paused_until >= first.arrived_at + 0.3


async def test_a_stream_cancelled_while_waiting_is_never_sent() -> None:
    async with open_rig(echo()) as rig:
        limited = wrap_provider(rig.provider, rig.dispatcher)
        async with rig.dispatcher.slot(rig.provider.id):
            with trio.move_on_after(0.05) as scope:
                await collect(limited, "hello")
            assert scope.cancelled_caught
        await eventually(lambda: rig.in_flight() == 0)
        stats = rig.dispatcher.statistics().providers["openai"]
        assert (stats.withdrawn_total, stats.granted_total) == (1, 1)
        assert rig.server.requests == []


async def test_the_older_started_at_goes_first() -> None:
    async with open_rig(echo(), limit=1) as rig:
        now = trio.current_time()
        old = wrap_provider(rig.provider, rig.dispatcher, started_at=now - 10)
        new = wrap_provider(rig.provider, rig.dispatcher, started_at=now - 5)
        stats = rig.dispatcher.statistics
        plug = rig.dispatcher.slot(rig.provider.id, started_at=now - 20)
        async with trio.open_nursery() as nursery, plug:
            nursery.start_soon(collect, new, "new")
            await eventually(lambda: stats().providers["openai"].waiting == 1)
            nursery.start_soon(collect, old, "old")
            await eventually(lambda: stats().providers["openai"].waiting == 2)
        assert [last_text(r) for r in rig.server.requests] == ["old", "new"]


async def test_an_unlimited_provider_streams_through_at_once() -> None:
    async with (
        open_fake_llm_server(echo()) as server,
        OpenAIProvider(
            base_url=server.openai_base_url, api_key="k", model="fake"
        ) as provider,
        open_dispatcher(unknown_providers="allow") as dispatcher,
    ):
        limited = wrap_provider(provider, dispatcher, conversation_id="c", started_at=1)
        assert limited.id == "openai"
        assert repr(limited).startswith("<wrap_provider OpenAIProvider(")
        assert TextDelta("re:") in await collect(limited, "hello")
        stats = dispatcher.statistics().providers
        assert list(stats) == ["openai"]
        openai = stats["openai"]
        assert (openai.limit, openai.in_flight, openai.granted_total) == (None, 0, 1)
        assert len(server.requests) == 1
