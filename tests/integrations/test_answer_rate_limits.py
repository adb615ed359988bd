"""Rate-limit figures travel with the answer: learned budgets with nothing wired.

A provider's opened stream (``rate_limits``) and its status errors (the
``rate_limits`` of a ``ProviderError``) carry what the answer's headers said
of the account's limits. ``wrap_provider`` and conversations read them
there and tell the dispatcher, so a provider made as the README shows,
without ``on_rate_limits=`` or ``on_rate_limit=``, paces the dispatcher by
its quota. A provider given those callbacks too is counted once.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import Quota, RateLimitInfo, open_dispatcher, wrap_provider
from trio_dispatch.events import Paused, RateLimitsReceived
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider, RateLimited
from trio_dispatch.testing import (
    FakeQuotas,
    FakeReply,
    FakeScript,
    Fault,
    ScriptedProvider,
    open_fake_llm_server,
)

from .._rigs import run_agents

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher, Provider
    from trio_dispatch.events import DispatchEvent as Event
    from trio_dispatch.messages import StreamEvent

FIGURES = RateLimitInfo(
    requests=Quota(limit=600, remaining=100, reset=50.0),
    tokens=Quota(limit=60_000, remaining=40_000, reset=20.0),
)


def question(text: str = "hello") -> ChatRequest:
    """A one-message request."""
    return ChatRequest(messages=[ChatMessage("user", text)], max_tokens=10)


class Figured:
    """A provider whose opened stream carries ``FIGURES``, and nothing else says so."""

    id = "p"

    def stream(self, request: ChatRequest) -> AsyncIterator[FiguredEvents]:
        return self._stream(request)  # type: ignore[return-value]  # a context manager

    @asynccontextmanager
    async def _stream(self, request: ChatRequest) -> AsyncIterator[FiguredEvents]:
        await trio.lowlevel.checkpoint()
        yield FiguredEvents([TextDelta("hi"), Finish("stop")])


class FiguredEvents:
    """An answer's events, and its figures as ``rate_limits``."""

    rate_limits = FIGURES

    def __init__(self, events: list[StreamEvent]) -> None:
        self.events = events

    def __aiter__(self) -> FiguredEvents:
        return self

    async def __anext__(self) -> StreamEvent:
        await trio.lowlevel.checkpoint()
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)


async def read(provider: Provider, request: ChatRequest) -> list[StreamEvent]:
    """Every event of the answer to ``request``."""
    async with provider.stream(request) as events:
        return [event async for event in events]


async def drained(dispatcher: Dispatcher, seen: list[Event]) -> None:
    """Let the scheduler handle what was sent to it, and the events arrive."""
    await trio.testing.wait_all_tasks_blocked()
    dispatcher.statistics()
    await trio.testing.wait_all_tasks_blocked()


async def test_the_figures_of_an_opened_stream_teach_the_dispatcher_unwired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 4}) as dispatcher:
        provider = wrap_provider(Figured(), dispatcher)  # type: ignore[arg-type]  # a Provider
        async with dispatcher.events() as subscription:
            seen: list[Event] = []

            async def collect() -> None:
                async for event in subscription:
                    seen.append(event)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                assert await read(provider, question()) == [
                    TextDelta("hi"),
                    Finish("stop"),
                ]
                await drained(dispatcher, seen)
                nursery.cancel_scope.cancel()
        budget = dispatcher.statistics().providers["p"].budget
    received = [event for event in seen if isinstance(event, RateLimitsReceived)]
    assert [event.info for event in received] == [FIGURES]
    # Learned: the server's figures, which count this answered request.
    assert budget is not None
    assert budget.requests_available == 100
    assert budget.tokens_available == 40_000


async def test_a_status_error_carries_its_figures_and_pauses_the_dispatcher_unwired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(replies=(FakeReply(fault=Fault("rate_limit", retry_after=7)),))
    scripted = ScriptedProvider(script, id="p")  # no callbacks
    async with open_dispatcher({"p": 2}) as dispatcher:
        provider = wrap_provider(scripted, dispatcher)
        with pytest.raises(RateLimited) as caught:
            await read(provider, question())
        assert caught.value.rate_limits == RateLimitInfo(retry_after=7.0)
        stats = dispatcher.statistics().providers["p"]
        assert stats.paused
        assert stats.paused_until == 7.0
        await read(provider, question())  # waits for the pause
        assert trio.current_time() == 7.0


async def test_a_provider_given_the_callbacks_too_is_counted_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(FakeReply(fault=Fault("rate_limit", retry_after=3)), FakeReply())
    )
    async with open_dispatcher({"p": 2}) as dispatcher:
        scripted = ScriptedProvider(
            script,
            id="p",
            on_rate_limit=dispatcher.report_rate_limit,
            on_rate_limits=dispatcher.observe_rate_limits,
        )
        provider = wrap_provider(scripted, dispatcher)
        seen: list[Event] = []
        async with dispatcher.events() as subscription:

            async def collect() -> None:
                async for event in subscription:
                    seen.append(event)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                with pytest.raises(RateLimited):
                    await read(provider, question())
                await read(provider, question())
                await drained(dispatcher, seen)
                nursery.cancel_scope.cancel()
    received = [event for event in seen if isinstance(event, RateLimitsReceived)]
    paused = [event for event in seen if isinstance(event, Paused)]
    assert [event.info for event in received] == [RateLimitInfo(retry_after=3.0)]
    assert [(event.at, event.retry_after) for event in paused] == [(0.0, 3.0)]


async def test_a_rate_limit_inside_a_stream_is_reported_once_with_the_callback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fault = Fault("stream_error", error_type="rate_limit_error", after_events=1)
    script = FakeScript(replies=(FakeReply(text="a b c", fault=fault),))
    async with open_dispatcher({"p": 2}, default_pause=2.0) as dispatcher:
        scripted = ScriptedProvider(
            script, id="p", on_rate_limit=dispatcher.report_rate_limit
        )
        provider = wrap_provider(scripted, dispatcher)
        seen: list[Event] = []
        async with dispatcher.events() as subscription:

            async def collect() -> None:
                async for event in subscription:
                    seen.append(event)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect)
                with pytest.raises(RateLimited):
                    await read(provider, question())
                await drained(dispatcher, seen)
                nursery.cancel_scope.cancel()
    paused = [event for event in seen if isinstance(event, Paused)]
    assert [(event.at, event.until, event.retry_after) for event in paused] == [
        (0.0, 2.0, None)
    ]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_an_http_answer_carries_its_figures_on_the_stream_and_the_error(
    wire: str,
) -> None:
    quotas = FakeQuotas(requests_per_minute=2)
    async with open_fake_llm_server(quotas=quotas) as server:
        provider: OpenAIProvider | AnthropicProvider = (
            OpenAIProvider(
                base_url=server.openai_base_url, api_key="sk-test", model="fake"
            )
            if wire == "openai"
            else AnthropicProvider(
                base_url=server.anthropic_base_url, api_key="sk-test", model="fake"
            )
        )
        async with provider:
            await check_figures(provider)


async def check_figures(provider: OpenAIProvider | AnthropicProvider) -> None:
    """Two answers within a quota of 2 requests, then a 429: their figures."""
    stream = provider.stream(question())
    before = stream.rate_limits
    async with stream as events:
        info = stream.rate_limits
        assert Finish("stop") in [event async for event in events]
    assert before is None
    assert info is not None
    assert info.requests is not None
    assert (info.requests.limit, info.requests.remaining) == (2, 1)
    await read(provider, question())
    with pytest.raises(RateLimited) as caught:
        await read(provider, question())
    refused = caught.value.rate_limits
    assert refused is not None
    assert refused.requests is not None
    assert refused.requests.remaining == 0
    assert refused.retry_after == caught.value.retry_after


async def test_the_readme_conversation_shape_learns_a_quota_with_nothing_wired() -> (
    None
):
    """30 conversations x 10 turns against 240 requests/min, over loopback.

    The provider and the dispatcher are made as the README's conversation
    quickstart makes them, and nothing else is configured: every turn
    completes, and at most 2% of the requests are answered 429. Real time
    (real sockets): about 15 s, what the quota takes for 300 requests.
    """
    script = FakeScript(default=FakeReply(text="It is 21 °C and sunny.", latency=0.3))
    async with (
        open_fake_llm_server(
            script, quotas=FakeQuotas(requests_per_minute=240)
        ) as server,
        OpenAIProvider(
            id="openai",
            base_url=server.openai_base_url,
            api_key="sk-...",
            model="gpt-4o-mini",
        ) as openai,
        open_dispatcher({"openai": 8}) as dispatcher,
    ):
        completed, failed = await run_agents(dispatcher, openai, agents=30, turns=10)
        stats = server.statistics()
    assert failed == []
    assert completed == 300
    refused = stats.responses_by_status.get(429, 0)
    assert stats.requests_total == 300 + refused
    assert refused <= 0.02 * stats.requests_total
