"""A turn does not fail for a rate limit while waiting would succeed.

A rate limit (429, 529, 503) of a limited provider pauses it, and the
conversation's call waits the pause out in the provider's queue, keeping
its turn's place, for ``ConversationOptions.rate_limit_patience`` from the
first one, without using up ``max_attempts`` (meant for broken calls).
Exact times, in virtual time, with the scripted provider; and one fleet
over loopback against a quota.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import (
    ConversationOptions,
    Dispatcher,
    Retrying,
    TurnFinished,
    open_dispatcher,
)
from trio_dispatch.lowlevel import open_dispatcher_with
from trio_dispatch.providers import OpenAIProvider, RateLimited, ServerError
from trio_dispatch.testing import (
    FakeQuotas,
    FakeReply,
    FakeScript,
    Fault,
    ScriptedProvider,
    open_fake_llm_server,
)

from .._backend_rigs import Made
from .._helpers import unknown_provider
from .._rigs import run_agents

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from trio_dispatch import TurnEvent
    from trio_dispatch.testing import FakeRequest

OK = FakeReply(text="ok")


def limited(retry_after: float = 10.0) -> FakeReply:
    """A 429 asking to wait ``retry_after`` seconds."""
    return FakeReply(fault=Fault("rate_limit", retry_after=retry_after))


def noting(times: list[float]) -> Callable[[FakeRequest], None]:
    """A script's ``choose`` that notes when each request arrives."""

    def choose(request: FakeRequest) -> None:
        times.append(request.arrived_at)

    return choose


def scripted(
    replies: Sequence[FakeReply], times: list[float], default: FakeReply = OK
) -> ScriptedProvider:
    """A provider answering ``replies`` then ``default``, noting arrivals."""
    script = FakeScript(choose=noting(times), replies=tuple(replies), default=default)
    return ScriptedProvider(script, id="p")


async def test_rate_limits_of_a_limited_provider_use_up_no_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([limited()] * 6, times)
    options = ConversationOptions(max_attempts=2, retry_backoff=100.0)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        result = await conversation.ask("hello")
    # Each attempt goes when the pause ends: no backoff of its own.
    assert times == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert (result.text, result.llm_calls, result.retries) == ("ok", 7, 6)
    assert result.finished_at == 60.0


async def test_waiting_out_a_rate_limit_emits_retrying_with_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([limited(5.0), limited(5.0)], times)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        events: list[TurnEvent] = []
        async with conversation.stream("hello") as turn:
            events.extend([event async for event in turn])
    retries = [event for event in events if isinstance(event, Retrying)]
    assert [(event.attempt, event.delay) for event in retries] == [(1, 0.0), (2, 0.0)]
    assert all(isinstance(event.error, RateLimited) for event in retries)
    assert isinstance(events[-1], TurnFinished)
    assert events[-1].result.finished_at == 10.0


async def test_patience_running_out_in_the_queue_raises_rate_limited_then(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([], times, default=limited())
    options = ConversationOptions(rate_limit_patience=35.0)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        with pytest.raises(RateLimited, match=r"^p: HTTP 429 .*\(retry after 10 s\)$"):
            await conversation.ask("hello")
        # Cut while waiting for the pause to end at 40: nothing more sent.
        assert trio.current_time() == 35.0
        stats = conversation.statistics()
        assert dispatcher.statistics().providers["p"].waiting == 0
    assert times == [0.0, 10.0, 20.0, 30.0]
    assert (stats.turns_failed, stats.llm_calls, stats.retries) == (1, 4, 3)


async def test_patience_running_out_during_a_call_raises_its_rate_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    slow = FakeReply(latency=5.0, fault=Fault("rate_limit", retry_after=10))
    provider = scripted([], times, default=slow)
    options = ConversationOptions(rate_limit_patience=12.0)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        with pytest.raises(RateLimited):
            await conversation.ask("hello")
        # 429s at 5 (patience until 17) and at 20, past it: raised then.
        assert trio.current_time() == 20.0
    assert times == [0.0, 15.0]


async def test_patience_ending_as_the_pause_ends_sends_nothing_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([], times, default=limited())
    options = ConversationOptions(rate_limit_patience=30.0)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        with pytest.raises(RateLimited):
            await conversation.ask("hello")
        assert trio.current_time() == 30.0
    assert times == [0.0, 10.0, 20.0]


async def test_no_patience_waits_as_long_as_it_takes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([limited(60.0)] * 30, times)
    options = ConversationOptions(rate_limit_patience=None)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        result = await conversation.ask("hello")
    assert (result.text, result.retries, result.finished_at) == ("ok", 30, 1800.0)


async def test_a_rate_limit_with_no_pause_backs_off_rather_than_spinning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([limited(0.0)] * 3, times)
    options = ConversationOptions(max_attempts=1, retry_backoff=0.5, seed=3)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        result = await conversation.ask("hello")
    assert (result.text, result.retries) == ("ok", 3)
    # "Retry after 0 s": each attempt still waits, a backoff or a pause.
    assert all(later - earlier >= 0.25 for earlier, later in itertools.pairwise(times))


async def test_broken_calls_still_use_up_the_attempts_between_rate_limits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broken = FakeReply(fault=Fault("server_error"))
    times: list[float] = []
    replies = [broken, limited(), broken, limited(), broken]
    provider = scripted(replies, times)
    options = ConversationOptions(max_attempts=3, retry_backoff=1.0, max_backoff=1.0)
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, options=options)
        with pytest.raises(ServerError):
            await conversation.ask("hello")
    # The third broken call is the third attempt: the two 429s were free.
    assert len(times) == 5


async def test_an_unlimited_provider_keeps_a_bounded_number_of_attempts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    provider = scripted([], times, default=limited(5.0))
    async with open_dispatcher({}) as dispatcher:
        with unknown_provider(provider.id):
            conversation = dispatcher.start_conversation(provider)
        with pytest.raises(RateLimited):
            await conversation.ask("hello")
    # Nothing pauses it: max_attempts (4), each backoff at least Retry-After.
    assert len(times) == 4
    assert all(later - earlier >= 5.0 for earlier, later in itertools.pairwise(times))


async def test_a_rate_limited_turn_keeps_its_place_ahead_of_younger_turns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []
    refused: list[str] = []

    def choose(request: FakeRequest) -> FakeReply | None:
        assert request.chat is not None
        text = request.chat.messages[-1].content
        order.append(text)
        if text == "old" and not refused:
            refused.append(text)
            return FakeReply(latency=5.0, fault=Fault("rate_limit", retry_after=10))
        return FakeReply(text=f"re: {text}", latency=1.0)

    provider = ScriptedProvider(FakeScript(choose=choose), id="p")
    async with open_dispatcher({"p": 1}) as dispatcher:
        old = dispatcher.start_conversation(provider)
        young = dispatcher.start_conversation(provider)
        answers: dict[str, float] = {}

        async def ask(conversation_text: str, conversation: object) -> None:
            result = await conversation.ask(conversation_text)  # type: ignore[attr-defined]  # a Conversation
            answers[conversation_text] = result.finished_at

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "old", old)
            await trio.sleep(1.0)
            # Queued behind the first call, before its 429 at 5 s.
            nursery.start_soon(ask, "young", young)
    # The old turn's second call, queued after the young one, goes first
    # when the pause ends at 15 s: its turn started earlier.
    assert order == ["old", "old", "young"]
    assert answers == {"old": 16.0, "young": 17.0}


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, "rate_limit_patience must be a non-negative number of seconds, got -1"),
        (float("inf"), ValueError, "rate_limit_patience must be a non-negative number of seconds, got inf"),
        ("60", TypeError, "rate_limit_patience must be a non-negative number of seconds, got '60'"),
    ],
)  # fmt: skip
def test_rate_limit_patience_is_checked(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=rf"^{message}$"):
        ConversationOptions(rate_limit_patience=value)  # type: ignore[arg-type]  # the point of the test
    assert ConversationOptions().rate_limit_patience == 300.0
    assert ConversationOptions(rate_limit_patience=None).rate_limit_patience is None


async def test_conversations_wait_out_a_quota_without_learning_and_all_complete() -> (
    None
):
    """10 conversations x 4 turns against 30 requests/min, over loopback.

    ``learn_budgets=False``: the dispatcher learns nothing from the figures,
    so the quota answers 429s, and the turns wait them out. Real time (real
    sockets): about 20 s, what the quota takes for 40 requests.
    """
    script = FakeScript(default=FakeReply(text="fine", latency=0.3))
    async with (
        open_fake_llm_server(
            script, quotas=FakeQuotas(requests_per_minute=30)
        ) as server,
        OpenAIProvider(
            id="openai", base_url=server.openai_base_url, api_key="sk-...", model="m"
        ) as openai,
        open_dispatcher({"openai": 8}, learn_budgets=False) as dispatcher,
    ):
        completed, failed = await run_agents(dispatcher, openai, agents=10, turns=4)
        stats = server.statistics()
    assert failed == []
    assert completed == 40
    assert stats.responses_by_status[200] == 40


async def test_waiting_out_a_rate_limit_reads_the_pause_of_its_provider_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    times: list[float] = []
    made = Made()
    async with open_dispatcher_with(made, {"p": 1, "q": 1}) as dispatcher:
        assert isinstance(dispatcher, Dispatcher)  # the one users get
        async with dispatcher.slot("q"):
            pass
        conversation = dispatcher.start_conversation(scripted([limited(5.0)], times))
        result = await conversation.ask("hello")
        # The pause was read off p's backend alone: q's was never asked.
        assert made.backends["q"].calls["statistics"] == 0
        assert made.backends["p"].calls["statistics"] == 1
    assert times == [0.0, 5.0]
    assert (result.llm_calls, result.retries) == (2, 1)
