"""Streamed turns, bounded tool loops, and compaction in the middle of a turn.

The turn's events go from the conversation's actor to the reader's task;
leaving the block early cancels the turn like a cancelled ``ask``. These
run over real loopback HTTP against the fake server in both wire formats,
and in virtual time with ``ScriptedProvider`` where the timing is asserted.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing

from trio_dispatch import (
    SUMMARY_PREFIX,
    ConversationOptions,
    Retrying,
    ToolResult,
    TooManyToolRounds,
    TurnFinished,
    TurnResult,
    open_dispatcher,
)
from trio_dispatch.messages import ChatMessage, ReasoningDelta, TextDelta, ToolCall
from trio_dispatch.providers import ServerError
from trio_dispatch.testing import (
    FakeReply,
    FakeRequest,
    FakeScript,
    FakeToolCall,
    Fault,
    ScriptedProvider,
)

from .._rigs import (
    ADD,
    add,
    answers_tools,
    eventually,
    last_text,
    open_rig,
    quick,
    roles,
    texts_of,
    tool,
    tools_then,
)

if TYPE_CHECKING:
    from trio_dispatch import Conversation, TurnEvent


CALL = FakeToolCall("add", {"a": 2, "b": 3}, id="c1")


async def read_all(conversation: Conversation, text: str) -> list[TurnEvent]:
    """Every event of one streamed turn."""
    async with conversation.stream(text) as turn:
        return [event async for event in turn]


def kinds(events: list[TurnEvent]) -> list[str]:
    """The events' kinds in order, runs of one kind counted once."""
    return [kind for kind, _ in itertools.groupby(type(e).__name__ for e in events)]


def untimed(result: TurnResult) -> TurnResult:
    """``result`` without its times (real time differs from run to run)."""
    return attrs.evolve(result, started_at=0.0, finished_at=0.0)


def tool_results_in(request: FakeRequest) -> bool:
    """Whether the request ends with tool results, in memory or on the wire."""
    if request.chat is not None:
        return request.chat.messages[-1].role == "tool"
    return answers_tools(request)


def last_text_in(request: FakeRequest) -> str:
    """The text of the request's last message, in memory or on the wire."""
    if request.chat is not None:
        return request.chat.messages[-1].content
    return last_text(request)


def tools_then_in_memory(call: FakeToolCall, answer: str, **reply: Any) -> FakeScript:  # noqa: ANN401 (FakeReply fields)
    """``tools_then`` for ``ScriptedProvider``, which records no wire body."""

    def choose(request: FakeRequest) -> FakeReply:
        if tool_results_in(request):
            return FakeReply(text=answer, **reply)
        return FakeReply(text="", tool_calls=(call,), **reply)

    return FakeScript(choose=choose)


# -- streamed turns -----------------------------------------------------------


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_streamed_turn_yields_deltas_the_call_its_result_then_the_result(
    wire: str,
) -> None:
    script = tools_then((CALL,), "it is 5", reasoning="let me think")
    async with open_rig(script, wire=wire) as rig:
        conversation = rig.start(tools=[ADD])
        async with conversation.stream("what is 2 + 3?") as turn:
            events = [event async for event in turn]
        assert kinds(events) == [
            "ReasoningDelta",
            "ToolCall",
            "ToolResult",
            "ReasoningDelta",
            "TextDelta",
            "TurnFinished",
        ]
        history = conversation.history
        call = history[1].tool_calls[0]
        assert [e for e in events if isinstance(e, ToolCall)] == [call]
        assert [e for e in events if isinstance(e, ToolResult)] == [
            ToolResult(call=call, content="5")
        ]
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        assert reasoning == "let me think" * 2
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "it is 5"
        assert events[-1] == TurnFinished(turn.result)
        assert turn.result.text == "it is 5"
        assert (turn.result.llm_calls, turn.result.tool_calls) == (2, 1)

        # ask() is the same turn read to its end.
        other = rig.start(tools=[ADD])
        asked = await other.ask("what is 2 + 3?")
        # Usage aside: on Anthropic the first turn's prefix is in the prompt
        # cache now (OpenAI's cache key is per conversation), so more is read.
        assert attrs.evolve(untimed(asked), usage=turn.result.usage) == untimed(
            turn.result
        )
        assert asked.usage.prompt_tokens == turn.result.usage.prompt_tokens
        assert asked.usage.output_tokens == turn.result.usage.output_tokens
        if wire == "anthropic":
            assert asked.usage.cache_read_tokens > turn.result.usage.cache_read_tokens
        else:
            assert asked.usage == turn.result.usage
        assert other.history == history


async def test_ask_returns_exactly_what_the_stream_finishes_with(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = tools_then_in_memory(
        CALL, "it is 5", latency=1.0, time_to_first_token=0.5, tokens_per_second=10
    )
    results: list[TurnResult] = []
    for streamed in (True, False):
        provider = ScriptedProvider(script, id="memory")
        async with open_dispatcher({"memory": 1}) as dispatcher:
            conversation = dispatcher.start_conversation(provider, tools=[ADD])
            start = trio.current_time()
            if streamed:
                events = await read_all(conversation, "what is 2 + 3?")
                assert isinstance(events[-1], TurnFinished)
                result = events[-1].result
            else:
                result = await conversation.ask("what is 2 + 3?")
            # Each run starts at its own clock time; rounded, since the
            # differences of those floats differ in their last bits.
            results.append(attrs.evolve(
                result,
                started_at=round(result.started_at - start, 9),
                finished_at=round(result.finished_at - start, 9),
            ))  # fmt: skip
    assert results[0] == results[1]
    assert (results[0].started_at, results[0].finished_at) == (0.0, 3.5)
    assert results[0].text == "it is 5"


async def test_deltas_reach_the_reader_as_they_arrive(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(
        text="a b c", latency=1.0, time_to_first_token=0.5, tokens_per_second=2
    )
    provider = ScriptedProvider(FakeScript(default=reply), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        start = trio.current_time()
        seen: list[tuple[float, str]] = []
        async with conversation.stream("go") as turn:
            async for event in turn:
                if isinstance(event, TextDelta):
                    seen.append((trio.current_time() - start, event.text))
    assert "".join(text for _, text in seen) == "a b c"
    # The first at latency + time to first token, not at the end.
    assert seen[0][0] == 1.5
    assert seen[-1][0] > seen[0][0]
    assert turn.result.finished_at - start == seen[-1][0]


async def test_a_reader_that_stops_reading_holds_the_turn_back_not_memory(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(text=" ".join(["word"] * 100), tokens_per_second=1000)
    provider = ScriptedProvider(FakeScript(default=reply), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        async with conversation.stream("go") as turn:
            await trio.sleep(100)
            await trio.testing.wait_all_tasks_blocked()
            # The actor waits for the reader, with the slot (and the stream).
            stats = conversation.statistics()
            assert (stats.running, stats.turns_completed) == (True, 0)
            assert dispatcher.statistics().providers["memory"].in_flight == 1
            events = [event async for event in turn]
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == reply.text
        assert conversation.statistics().turns_completed == 1


async def test_a_retry_is_announced_and_the_answer_starts_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(
            FakeReply(text="lost words", fault=Fault("disconnect", after_events=2)),
        ),
        default=FakeReply(text="ok"),
    )
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, options=ConversationOptions(retry_backoff=1.0, seed=1)
        )
        events = await read_all(conversation, "go")
    assert kinds(events) == ["TextDelta", "Retrying", "TextDelta", "TurnFinished"]
    retry = next(e for e in events if isinstance(e, Retrying))
    assert retry.attempt == 1
    assert 0.5 <= retry.delay <= 1.0
    after = events[events.index(retry) + 1 :]
    assert "".join(e.text for e in after if isinstance(e, TextDelta)) == "ok"
    assert isinstance(events[-1], TurnFinished)
    assert (events[-1].result.text, events[-1].result.retries) == ("ok", 1)


async def test_a_failed_turn_raises_from_the_stream_and_keeps_the_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(FakeReply(text="first"),),
        default=FakeReply(fault=Fault("server_error")),
    )
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, options=ConversationOptions(max_attempts=1)
        )
        await conversation.ask("one")
        before = conversation.history
        async with conversation.stream("two") as turn:
            with pytest.raises(ServerError):
                async for _event in turn:
                    pass
            with pytest.raises(RuntimeError, match=r"^the turn has not finished$"):
                _ = turn.result
        assert conversation.history == before
        assert conversation.statistics().turns_failed == 1


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_leaving_a_stream_mid_answer_cancels_the_turn_and_keeps_the_history(
    wire: str,
) -> None:
    slow = FakeReply(text=" ".join(["word"] * 40), tokens_per_second=20)
    script = FakeScript(
        choose=lambda request: slow if last_text(request) == "long" else None,
        default=FakeReply(text="short"),
    )
    async with open_rig(script, wire=wire) as rig:
        conversation = rig.start()
        await conversation.ask("hello")
        before = conversation.history
        async with conversation.stream("long") as turn:
            async for event in turn:
                if isinstance(event, TextDelta):
                    break
        assert conversation.history == before
        await eventually(lambda: conversation.statistics().turns_cancelled == 1)
        await eventually(lambda: rig.in_flight() == 0)
        assert conversation.history == before
        result = await conversation.ask("again")
        assert result.text == "short"
        assert texts_of(rig.server.requests[-1]) == ["hello", "short", "again"]
        assert roles(conversation.history) == ["user", "assistant"] * 2


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_leaving_a_stream_mid_tool_cancels_the_tool_and_keeps_the_history(
    wire: str,
) -> None:
    started = trio.Event()
    cancelled = trio.Event()

    async def wait(arguments: dict[str, Any]) -> str:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    script = tools_then((FakeToolCall("wait", {}, id="w1"),), "waited")
    async with open_rig(script, wire=wire) as rig:
        conversation = rig.start(tools=[tool("wait", wait)])
        async with conversation.stream("wait please") as turn:
            async for event in turn:
                if isinstance(event, ToolCall):
                    await started.wait()
                    break
        with trio.fail_after(3):
            await cancelled.wait()
        assert conversation.history == ()
        await eventually(lambda: conversation.statistics().turns_cancelled == 1)
        assert len(rig.server.requests) == 1
        assert rig.in_flight() == 0


async def test_a_turn_stream_is_entered_once_and_read_inside_its_block() -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(text="ok")), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        with pytest.raises(TypeError, match=r"^text must be a string, got 5$"):
            conversation.stream(5)  # type: ignore[arg-type]  # (checked at run time)
        turn = conversation.stream("hi")
        assert repr(turn) == f"<TurnStream of {conversation.id!r} new>"
        with pytest.raises(
            RuntimeError,
            match=r"^enter the turn stream \(async with\) before reading it$",
        ):
            await turn.__anext__()
        async with turn:
            events = [event async for event in turn]
            assert [event async for event in turn] == []
        assert events[-1] == TurnFinished(turn.result)
        with pytest.raises(RuntimeError, match=r"^the turn stream was left$"):
            await turn.__anext__()
        with pytest.raises(
            RuntimeError, match=r"^a turn stream can be entered only once$"
        ):
            async with turn:
                pass
        assert conversation.statistics().turns_completed == 1


# -- bounded tool loops -------------------------------------------------------


def tool_forever(latency: float = 0.0) -> FakeScript:
    """A model that calls ``add`` for ever, except to answer "stop"."""

    def choose(request: FakeRequest) -> FakeReply:
        if not tool_results_in(request) and last_text_in(request) == "stop":
            return FakeReply(text="stopped", latency=latency)
        call = FakeToolCall("add", {"a": 1, "b": 1})
        return FakeReply(text="", tool_calls=(call,), latency=latency)

    return FakeScript(choose=choose)


def test_max_tool_rounds_has_a_bounded_default() -> None:
    assert ConversationOptions().max_tool_rounds == 16


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_turn_past_max_tool_rounds_fails_and_keeps_the_history(
    wire: str,
) -> None:
    runs = 0

    async def counting_add(arguments: dict[str, Any]) -> str:
        nonlocal runs
        runs += 1
        return await add(arguments)

    adder = attrs.evolve(ADD, run=counting_add)
    async with open_rig(tool_forever(), wire=wire) as rig:
        conversation = rig.start(tools=[adder], options=quick(max_tool_rounds=2))
        await conversation.ask("stop")
        before = conversation.history
        with pytest.raises(
            TooManyToolRounds,
            match=r"^the model asked for tools after 2 rounds \(max_tool_rounds is 2\)$",
        ) as caught:
            with trio.fail_after(10):  # unbounded, the loop would never end
                await conversation.ask("add for ever")
        assert caught.value.rounds == 2
        assert runs == 2  # the third round's tools never ran
        assert len(rig.server.requests) == 1 + 3
        assert conversation.history == before
        stats = conversation.statistics()
        assert (stats.turns_completed, stats.turns_failed) == (1, 1)
        # The conversation goes on.
        assert (await conversation.ask("stop")).text == "stopped"


async def test_a_stream_past_max_tool_rounds_raises_after_the_rounds_it_ran(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(tool_forever(latency=1.0), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, tools=[ADD], options=ConversationOptions(max_tool_rounds=1)
        )
        events: list[TurnEvent] = []
        async with conversation.stream("go") as turn:
            with trio.fail_after(100), pytest.raises(TooManyToolRounds):
                async for event in turn:
                    events.append(event)
        assert kinds(events) == ["ToolCall", "ToolResult"]
        assert conversation.history == ()
        assert trio.current_time() == 2.0  # two answers, one second each


# -- compaction mid-turn ------------------------------------------------------


async def read(arguments: dict[str, Any]) -> str:
    """A tool whose result is long."""
    await trio.lowlevel.checkpoint()
    return "x" * 400


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_tool_result_over_the_budget_compacts_before_the_next_call(
    wire: str,
) -> None:
    def choose(request: FakeRequest) -> FakeReply:
        text = last_text(request)
        if text.startswith("Summarise the conversation"):
            return FakeReply(text="they said hello")
        if answers_tools(request):
            return FakeReply(text="read")
        if text == "read it":
            return FakeReply(text="", tool_calls=(FakeToolCall("read", {}, id="r1"),))
        return FakeReply(text=f"re: {text}")

    async with open_rig(FakeScript(choose=choose), wire=wire) as rig:
        conversation = rig.start(
            tools=[tool("read", read)],
            options=quick(context_budget=60, keep_recent=0),
        )
        await conversation.ask("hello")
        result = await conversation.ask("read it")  # under budget when it starts
        assert result.text == "read"
        assert result.llm_calls == 3
        requests = rig.server.requests
        assert len(requests) == 4
        # The summary came between the tool's result and the next call.
        assert texts_of(requests[2])[:2] == ["hello", "re: hello"]
        assert last_text(requests[2]).startswith("Summarise the conversation")
        if wire == "openai":
            assert texts_of(requests[3])[0] == SUMMARY_PREFIX + "they said hello"
        else:  # Anthropic's system messages go to its top-level system
            (system,) = requests[3].body["system"]
            assert SUMMARY_PREFIX + "they said hello" in system["text"]
            assert texts_of(requests[3])[0] == "read it"
        assert answers_tools(requests[3])
        history = conversation.history
        assert roles(history) == ["system", "user", "assistant", "tool", "assistant"]
        assert history[0] == ChatMessage("system", SUMMARY_PREFIX + "they said hello")
        assert history[3] == ChatMessage("tool", "x" * 400, tool_call_id="r1")
        assert conversation.statistics().compactions == 1


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_failed_summary_is_tried_once_per_turn(wire: str) -> None:
    summaries = 0

    def choose(request: FakeRequest) -> FakeReply:
        nonlocal summaries
        if last_text(request).startswith("Summarise the conversation"):
            summaries += 1
            return FakeReply(text="")
        if answers_tools(request) and len(texts_of(request)) < 8:
            return FakeReply(text="", tool_calls=(FakeToolCall("read", {}),))
        if last_text(request) == "read it":
            return FakeReply(text="", tool_calls=(FakeToolCall("read", {}),))
        return FakeReply(text="done")

    async with open_rig(FakeScript(choose=choose), wire=wire) as rig:
        conversation = rig.start(
            tools=[tool("read", read)],
            options=quick(context_budget=60, keep_recent=0),
        )
        await conversation.ask("hello")
        result = await conversation.ask("read it")
    assert result.text == "done"
    assert summaries == 1
    stats = conversation.statistics()
    assert (stats.compactions, stats.compactions_failed) == (0, 1)


async def test_leaving_a_stream_still_queued_sends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(default=FakeReply(text="ok", latency=5.0))
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.ask, "first")
            await trio.testing.wait_all_tasks_blocked()
            async with conversation.stream("second"):
                assert conversation.statistics().queued == 1
        await trio.testing.wait_all_tasks_blocked()
        assert [r.messages[-1].content for r in provider.requests] == ["first"]
        assert conversation.history == (
            ChatMessage("user", "first"),
            ChatMessage("assistant", "ok"),
        )
        assert trio.current_time() == 5.0
