"""One metering path: an answer's figures reach the dispatcher once, in order.

A provider's callbacks (``on_rate_limits``, ``on_rate_limit``), the
dispatcher's own methods or any others, are for its calls made without a
slot. An answer the dispatcher meters (``wrap_provider``, conversations)
calls none of them: the meter tells the dispatcher, once, the answer's
start first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import Quota, RateLimitInfo, open_dispatcher, wrap_provider
from trio_dispatch._integrations._hooks import RateLimitHooks
from trio_dispatch.events import RateLimitsReceived
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta
from trio_dispatch.providers import RateLimited
from trio_dispatch.testing import FakeReply, FakeScript, Fault, ScriptedProvider

from .._events import record
from .._helpers import Hooked

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher, Provider
    from trio_dispatch.events import DispatchEvent

FIGURES = RateLimitInfo(tokens=Quota(limit=60_000, remaining=50_000, reset=10.0))
REQUEST = ChatRequest([ChatMessage("user", "x" * 400)], max_tokens=1000)


async def figures_received(
    dispatcher: Dispatcher, provider: Provider
) -> list[RateLimitsReceived]:
    """The ``RateLimitsReceived`` events of one call read through ``provider``."""
    seen: list[DispatchEvent] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(record, dispatcher, seen)
        async with provider.stream(REQUEST) as events:
            assert [event async for event in events] == [
                TextDelta("hi"),
                Finish("stop"),
            ]
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return [event for event in seen if isinstance(event, RateLimitsReceived)]


async def test_a_metered_answer_tells_the_dispatcher_once_its_start_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        dispatcher.observe_rate_limits(
            "p", RateLimitInfo(tokens=Quota(limit=60_000, remaining=60_000, reset=0.0))
        )
        hooks = RateLimitHooks("p", None, dispatcher.observe_rate_limits)
        provider = wrap_provider(Hooked(hooks, FIGURES), dispatcher)
        received = await figures_received(dispatcher, provider)
        assert [event.info for event in received] == [FIGURES]
        budget = dispatcher.statistics().providers["p"].budget
        assert budget is not None
        # The server's 50,000 count this request, whose answer had started
        # when they were told: it is not taken again.
        assert budget.tokens_available == 50_000


async def test_the_callbacks_tell_of_an_answer_made_without_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        hooks = RateLimitHooks("p", None, dispatcher.observe_rate_limits)
        received = await figures_received(dispatcher, Hooked(hooks, FIGURES))
        assert [event.info for event in received] == [FIGURES]


async def test_a_metered_answer_calls_none_of_its_providers_callbacks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    told: list[object] = []
    async with open_dispatcher({"p": 1}, default_pause=2.0) as dispatcher:
        hooks = RateLimitHooks(
            "p", lambda *report: told.append(report), lambda *seen: told.append(seen)
        )
        provider = wrap_provider(Hooked(hooks, FIGURES), dispatcher)
        received = await figures_received(dispatcher, provider)
        # The dispatcher is told by the meter, and shows it as an event.
        assert [event.info for event in received] == [FIGURES]
        scripted = ScriptedProvider(
            FakeScript(replies=(FakeReply(fault=Fault("rate_limit")),)),
            id="p",
            on_rate_limit=lambda *report: told.append(report),
        )
        with pytest.raises(RateLimited):
            async with wrap_provider(scripted, dispatcher).stream(REQUEST):
                pass
        assert dispatcher.statistics().providers["p"].paused_until == 2.0
    assert told == []
