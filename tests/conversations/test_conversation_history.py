"""What a conversation's history holds: complete turns only.

A turn that does not complete (cancelled or failed, wherever it was) leaves
the history exactly as it was before it, and asking again sends the
question once. These run an OpenAI provider over ``httpx2.MockTransport``
against a model in memory, so the whole system runs in virtual time and
every request body is checked as it went over the wire.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import SUMMARY_PREFIX, ConversationOptions, Tool, open_dispatcher
from trio_dispatch.messages import ChatMessage, ToolCall
from trio_dispatch.providers import OpenAIProvider, ServerError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from trio_dispatch import Conversation, Dispatcher

# -- a model in memory, over the wire ----------------------------------------------

Part = bytes | float
"""Bytes of a response body to send, or seconds to pause before the next."""


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    """One OpenAI streaming chunk."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def text_answer(text: str, pause: float) -> list[Part]:
    """An answer of ``text`` that pauses ``pause`` seconds halfway."""
    return [
        chunk({"role": "assistant", "content": ""}),
        pause,
        chunk({"content": text}),
        chunk({}, "stop"),
        DONE,
    ]


def tool_answer(calls: list[tuple[str, str]], pause: float) -> list[Part]:
    """An answer calling ``(id, name)`` tools, pausing ``pause`` seconds halfway."""
    fragments = [
        {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": "{}"},
        }
        for index, (call_id, name) in enumerate(calls)
    ]
    return [
        chunk({"role": "assistant", "content": ""}),
        pause,
        chunk({"tool_calls": fragments}),
        chunk({}, "tool_calls"),
        DONE,
    ]


@attrs.define(eq=False)
class _Body(httpx2.AsyncByteStream):
    """A response body sent part by part, pausing in virtual time."""

    parts: list[Part]

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        while self.parts:
            part = self.parts.pop(0)
            if isinstance(part, bytes):
                return part
            await trio.sleep(part)
        raise StopAsyncIteration


@attrs.define(eq=False)
class WireModel:
    """An OpenAI-compatible endpoint in memory: records bodies, answers by script.

    ``answer`` is given each request's JSON body and returns the parts to
    stream, or a whole ``httpx2.Response`` (an error).
    """

    answer: Callable[[dict[str, Any]], list[Part] | httpx2.Response]
    bodies: list[dict[str, Any]] = attrs.Factory(list)

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(json.loads(await request.aread()))
        answer = self.answer(self.bodies[-1])
        if isinstance(answer, httpx2.Response):
            return answer
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Body(answer)
        )


@attrs.frozen
class Rig:
    """The model, a dispatcher limiting its provider to one slot, a conversation."""

    model: WireModel
    dispatcher: Dispatcher
    conversation: Conversation

    def waiting(self) -> int:
        """Requests waiting for the provider's slot now."""
        return self.dispatcher.statistics().providers["openai"].waiting


@asynccontextmanager
async def open_rig(
    answer: Callable[[dict[str, Any]], list[Part] | httpx2.Response],
    **options: Any,  # noqa: ANN401 (passed to start_conversation)
) -> AsyncIterator[Rig]:
    """A rig whose model answers with ``answer``; ``options`` start the conversation."""
    model = WireModel(answer)
    transport = httpx2.MockTransport(model.handle)
    async with httpx2.AsyncClient(transport=transport) as client:
        provider = OpenAIProvider(
            base_url="http://model/v1", api_key="k", model="m", client=client
        )
        async with open_dispatcher({"openai": 1}) as dispatcher:
            conversation = dispatcher.start_conversation(provider, **options)
            yield Rig(model, dispatcher, conversation)


def wire_messages(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    """A request's messages as ``(role, content)``."""
    return [(message["role"], message["content"]) for message in body["messages"]]


def questions(body: dict[str, Any], text: str = "q") -> int:
    """How many times the user's question ``text`` went out in a request."""
    return wire_messages(body).count(("user", text))


def is_summary_request(body: dict[str, Any]) -> bool:
    """Whether a request is a compaction's summary call."""
    role, content = wire_messages(body)[-1]
    return role == "user" and (content or "").startswith("Summarise")


# -- one turn, with every step it can be at ------------------------------------------
#
# The turn under test asks "q" after a completed turn ("first"). With a
# context budget of 1, it first compacts; then the model calls the tool
# "step"; then it answers. Each step takes one virtual second, and a plug
# holds the only slot for the first half second:
#
#   0.0-0.5 waiting for a slot   1.5-2.5 streaming a tool call   3.5-4.5 streaming
#   0.5-1.5 compacting           2.5-3.5 running the tool        4.5     complete

PLUG = 0.5
DONE_AT = 4.5
POINTS = {
    # Where the turn is: (when, the requests it has sent by then).
    "waiting-for-a-slot": (0.25, []),
    "compacting": (1.0, ["summary"]),
    "streaming-a-tool-call": (2.0, ["summary", "turn"]),
    "running-a-tool": (3.0, ["summary", "turn"]),
    "streaming-after-the-tools": (4.0, ["summary", "turn", "turn"]),
}


def script(body: dict[str, Any]) -> list[Part] | httpx2.Response:
    """The model of the scenario above."""
    if is_summary_request(body):
        return text_answer("what happened", 1.0)
    role, content = wire_messages(body)[-1]
    if role == "tool":
        return text_answer("all done", 1.0)
    if content == "q":
        return tool_answer([("c1", "step")], 1.0)
    return text_answer(f"re: {content}", 0.0)


async def step(arguments: dict[str, Any]) -> str:
    """The scenario's tool: one virtual second of work."""
    await trio.sleep(1.0)
    return "stepped"


STEP = Tool(name="step", description="", parameters={"type": "object"}, run=step)
COMPACTING = ConversationOptions(context_budget=1, keep_recent=0)
OPTIONS: dict[str, Any] = {"tools": [STEP], "options": COMPACTING}
AFTER_Q = (
    ChatMessage("system", SUMMARY_PREFIX + "what happened"),
    ChatMessage("user", "q"),
    ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "step", {}, "{}")]),
    ChatMessage("tool", "stepped", tool_call_id="c1"),
    ChatMessage("assistant", "all done"),
)
"""The history once "q" has completed."""


async def hold_the_slot(dispatcher: Dispatcher, seconds: float) -> None:
    """A plug: hold the provider's only slot for ``seconds``."""
    async with dispatcher.slot("openai"):
        await trio.sleep(seconds)


async def ask_cancellable(
    conversation: Conversation,
    text: str,
    *,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ask ``text`` inside a scope handed to the starter, to cancel at will."""
    with trio.CancelScope() as scope:
        task_status.started(scope)
        await conversation.ask(text)


async def check_asking_again(rig: Rig, before: tuple[ChatMessage, ...]) -> None:
    """Asking "q" again sends it once and completes: nothing of the last try stayed."""
    assert rig.conversation.history == before
    sent = len(rig.model.bodies)
    started = trio.current_time()
    result = await rig.conversation.ask("q")
    assert result.finished_at - started == 4.0  # no plug this time
    again = rig.model.bodies[sent:]
    assert [questions(body) for body in again] == [0, 1, 1]
    assert is_summary_request(again[0])
    assert rig.conversation.history == AFTER_Q


async def test_a_turn_cancelled_waiting_for_its_first_slot_leaves_the_history_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No compaction: the question is the first thing the turn has.
    async with open_rig(script) as rig:
        await rig.conversation.ask("first")
        before = rig.conversation.history
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_slot, rig.dispatcher, 10.0)
            await trio.testing.wait_all_tasks_blocked()
            scope = await nursery.start(ask_cancellable, rig.conversation, "again")
            await trio.testing.wait_all_tasks_blocked()
            assert rig.waiting() == 1
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert rig.waiting() == 0
            assert rig.conversation.history == before
        assert trio.current_time() == 10.0
        assert len(rig.model.bodies) == 1  # nothing was sent for it
        result = await rig.conversation.ask("again")
    assert result.text == "re: again"
    assert wire_messages(rig.model.bodies[-1]) == [
        ("user", "first"),
        ("assistant", "re: first"),
        ("user", "again"),
    ]


@pytest.mark.parametrize(("cancel_at", "requests"), POINTS.values(), ids=list(POINTS))
async def test_a_turn_cancelled_anywhere_leaves_the_history_as_it_was(
    cancel_at: float, requests: list[str], autojump_clock: trio.testing.MockClock
) -> None:
    async with open_rig(script, **OPTIONS) as rig:
        await rig.conversation.ask("first")
        before = rig.conversation.history
        assert before == (
            ChatMessage("user", "first"),
            ChatMessage("assistant", "re: first"),
        )
        sent = len(rig.model.bodies)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_slot, rig.dispatcher, PLUG)
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            scope = await nursery.start(ask_cancellable, rig.conversation, "q")
            await trio.sleep_until(started + cancel_at)
            await trio.testing.wait_all_tasks_blocked()
            # The turn is where the point says, and has changed nothing yet.
            bodies = rig.model.bodies[sent:]
            kinds = ["summary" if is_summary_request(b) else "turn" for b in bodies]
            assert kinds == requests
            assert rig.waiting() == (1 if cancel_at < PLUG else 0)
            assert rig.conversation.history == before
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert trio.current_time() == started + cancel_at
            assert rig.waiting() == 0
            assert rig.conversation.history == before
        stats = rig.conversation.statistics()
        assert (stats.turns_cancelled, stats.turns_completed) == (1, 1)
        assert stats.compactions == 0  # the summary went with the turn
        assert len(rig.model.bodies) == sent + len(bodies)  # and nothing more
        await check_asking_again(rig, before)


async def test_a_turn_cancelled_between_tool_calls_leaves_the_history_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No compaction here: the tool round is the only thing the turn did.
    answers: list[list[Part] | httpx2.Response] = [
        tool_answer([("c1", "step")], 0.0),
        text_answer("all done", 0.0),
    ]
    async with open_rig(lambda body: answers.pop(0), tools=[STEP]) as rig:
        plug = trio.Event()

        async def plug_while_the_tool_runs() -> None:
            async with rig.dispatcher.slot("openai"):
                await plug.wait()

        async with trio.open_nursery() as nursery:
            scope = await nursery.start(ask_cancellable, rig.conversation, "go")
            await trio.sleep(0.5)  # the tool runs, the slot is free
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(plug_while_the_tool_runs)
            await trio.sleep(1.0)  # the tool is done; the next call waits
            await trio.testing.wait_all_tasks_blocked()
            assert rig.waiting() == 1
            assert len(rig.model.bodies) == 1
            assert rig.conversation.statistics().tool_calls == 1
            scope.cancel()
            plug.set()
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == 1.5
        assert len(rig.model.bodies) == 1  # the next call was never sent
        assert rig.conversation.history == ()
        assert len(answers) == 1  # the answer to the tool results: never asked for
        answers[0] = text_answer("re: go", 0.0)
        result = await rig.conversation.ask("go")
    assert result.text == "re: go"
    assert [questions(body, "go") for body in rig.model.bodies] == [1, 1]
    assert wire_messages(rig.model.bodies[-1]) == [("user", "go")]


async def test_a_turn_that_fails_after_compacting_leaves_the_history_as_it_was(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def failing(body: dict[str, Any]) -> list[Part] | httpx2.Response:
        if wire_messages(body)[-1][0] == "tool":
            return httpx2.Response(500, json={"error": {"message": "boom"}})
        return script(body)

    async with open_rig(
        failing, tools=[STEP], options=attrs.evolve(COMPACTING, max_attempts=1)
    ) as rig:
        await rig.conversation.ask("first")
        before = rig.conversation.history
        with pytest.raises(ServerError):
            await rig.conversation.ask("q")
        assert rig.conversation.history == before
        stats = rig.conversation.statistics()
        assert (stats.turns_failed, stats.compactions, stats.tool_calls) == (1, 0, 1)
        rig.model.answer = script
        await check_asking_again(rig, before)
    assert rig.conversation.statistics().compactions == 1


# -- the same, cancelled at any time --------------------------------------------------


async def _cancel_at(cancel_at: float) -> None:
    async with open_rig(script, **OPTIONS) as rig:
        await rig.conversation.ask("first")
        before = rig.conversation.history
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_slot, rig.dispatcher, PLUG)
            await trio.testing.wait_all_tasks_blocked()
            started = trio.current_time()
            with trio.move_on_at(started + cancel_at) as scope:
                result = await rig.conversation.ask("q")
            ended = trio.current_time()
            await trio.testing.wait_all_tasks_blocked()
            history = rig.conversation.history
        if scope.cancelled_caught:
            assert ended == started + cancel_at <= started + DONE_AT
            assert history == before
            await check_asking_again(rig, before)
        else:
            assert cancel_at > DONE_AT
            assert result.finished_at == ended == started + DONE_AT
            assert history == AFTER_Q


# Times in 64ths of a second: exact in binary, so virtual times add up
# exactly, and every step's start and end is one of them.
TIMES = st.integers(min_value=0, max_value=int((DONE_AT + 1) * 64)).map(
    lambda n: n / 64
)


@settings(deadline=None, max_examples=60)
@given(cancel_at=st.one_of(st.sampled_from([PLUG, 1.5, 2.5, 3.5, DONE_AT]), TIMES))
def test_a_turn_cancelled_at_any_time_leaves_the_history_as_it_was(
    cancel_at: float,
) -> None:
    trio.run(_cancel_at, cancel_at, clock=trio.testing.MockClock(autojump_threshold=0))
