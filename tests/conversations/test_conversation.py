"""Conversation actors: tool turns, queued questions, priority, compaction, warm-up.

These run through real loopback sockets against the fake LLM server, in
real time (small latencies), except the checks of plain values and the few
that need answers no fake server sends, scripted in memory
(``httpx2.MockTransport``, ``ScriptedProvider``). A fleet of conversations
sharing one limited provider is held to that limit here too.
"""

from __future__ import annotations

import functools
import json
import math
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import (
    SUMMARY_PREFIX,
    Conversation,
    ConversationClosed,
    ConversationOptions,
    DispatcherClosed,
    DispatchError,
    Tool,
    TurnResult,
    open_dispatcher,
)
from trio_dispatch._wire._anthropic import request_body as anthropic_body
from trio_dispatch._wire._openai import request_body as openai_body
from trio_dispatch.lowlevel import Plumbing, check_arguments
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
)
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import (
    FakeReply,
    FakeRequest,
    FakeScript,
    FakeToolCall,
    Fault,
    ScriptedProvider,
    open_fake_llm_server,
)

from .._helpers import settle, task_names
from .._rigs import (
    ADD,
    answers_tools,
    echo,
    eventually,
    last_text,
    messages_of,
    open_rig,
    quick,
    roles,
    texts_of,
    tool,
    tools_then,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

# -- helpers ------------------------------------------------------------------


# -- tool turns ---------------------------------------------------------------


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_tool_turn_calls_the_tool_feeds_the_result_and_answers(
    wire: str,
) -> None:
    script = tools_then((FakeToolCall("add", {"a": 2, "b": 3}, id="c1"),), "it is 5")
    async with open_rig(script, wire=wire) as rig:
        conversation = rig.start(tools=[ADD], system_prompt="Be brief.")
        result = await conversation.ask("what is 2 + 3?")

        assert result.text == "it is 5"
        assert (result.llm_calls, result.tool_calls, result.retries) == (2, 1, 0)
        assert result.usage.output_tokens > 0
        assert result.started_at <= result.finished_at
        history = conversation.history
        assert roles(history) == ["user", "assistant", "tool", "assistant"]
        assert history[1].tool_calls[0].arguments == {"a": 2, "b": 3}
        assert history[2] == ChatMessage("tool", "5", tool_call_id="c1")
        assert history[3].content == "it is 5"

        first, second = rig.server.requests
        assert last_text(second) == "5"
        if wire == "openai":
            assert messages_of(first)[0] == {"role": "system", "content": "Be brief."}
            assert first.body["tools"][0]["function"]["name"] == "add"
        else:
            assert first.body["system"] == [
                {
                    "type": "text",
                    "text": "Be brief.",
                    "cache_control": {"type": "ephemeral"},
                }
            ]
            assert first.body["tools"][0]["name"] == "add"
        stats = conversation.statistics()
        assert (stats.turns_completed, stats.llm_calls, stats.tool_calls) == (1, 2, 1)
        assert stats.usage == result.usage
        assert stats.history_length == 4
        assert (stats.queued, stats.running, stats.closed) == (0, False, False)


async def test_parallel_tool_calls_run_at_the_same_time() -> None:
    running = 0
    peak = 0
    all_in = trio.Event()

    async def meet(arguments: dict[str, Any]) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 3:
            all_in.set()
        with trio.fail_after(2):  # only returns once all three run at once
            await all_in.wait()
        running -= 1
        return f"met {arguments['who']}"

    calls = tuple(FakeToolCall("meet", {"who": who}, id=who) for who in "abc")
    async with open_rig(tools_then(calls)) as rig:
        conversation = rig.start(
            tools=[tool("meet", meet, {"who": {"type": "string"}})]
        )
        result = await conversation.ask("meet everyone")

    assert peak == 3
    assert result.tool_calls == 3
    results = [m for m in conversation.history if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in results] == [
        ("a", "met a"),
        ("b", "met b"),
        ("c", "met c"),
    ]


def wire_tool_ids(
    wire: str, body: dict[str, Any]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The tool call ids a request body carried, and its results as ``(id, text)``."""
    calls: list[str] = []
    results: list[tuple[str, str]] = []
    for message in body["messages"]:
        if wire == "openai":
            calls.extend(call["id"] for call in message.get("tool_calls") or ())
            if message["role"] == "tool":
                results.append((message["tool_call_id"], message["content"]))
            continue
        for block in message["content"]:
            if block["type"] == "tool_use":
                calls.append(block["id"])
            elif block["type"] == "tool_result":
                results.append((block["tool_use_id"], block["content"]))
    return calls, results


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_repeated_tool_call_ids_are_renamed_so_each_call_has_one_result(
    wire: str,
) -> None:
    first = (
        FakeToolCall("add", {"a": 1, "b": 2}, id="dup"),
        FakeToolCall("add", {"a": 3, "b": 4}, id="dup"),
        FakeToolCall("add", {"a": 5, "b": 6}, id="dup_2"),  # the obvious rename
    )
    again = (FakeToolCall("add", {"a": 7, "b": 8}, id="dup"),)

    def choose(request: FakeRequest) -> FakeReply:
        if answers_tools(request):
            return FakeReply(text="done")
        calls = first if last_text(request) == "first" else again
        return FakeReply(text="", tool_calls=calls)

    async with open_rig(FakeScript(choose=choose), wire=wire) as rig:
        conversation = rig.start(tools=[ADD])
        await conversation.ask("first")
        await conversation.ask("again")
    bodies = [request.body for request in rig.server.requests]
    assert len(bodies) == 4
    # Each call once, each result once, paired with its own call.
    assert wire_tool_ids(wire, bodies[1]) == (
        ["dup", "dup_3", "dup_2"],
        [("dup", "3"), ("dup_3", "7"), ("dup_2", "11")],
    )
    # An id repeated from an earlier answer is renamed too: Anthropic wants
    # every tool_use id of a request unique.
    assert wire_tool_ids(wire, bodies[3]) == (
        ["dup", "dup_3", "dup_2", "dup_4"],
        [("dup", "3"), ("dup_3", "7"), ("dup_2", "11"), ("dup_4", "15")],
    )
    assert [call.id for call in conversation.history[1].tool_calls] == [
        "dup",
        "dup_3",
        "dup_2",
    ]


@attrs.define
class RecordingProvider:
    """A provider in memory: each request gets the next list of events."""

    answers: list[list[StreamEvent]]
    id: str = "memory"
    requests: list[ChatRequest] = attrs.Factory(list)

    def stream(self, request: ChatRequest) -> Any:  # noqa: ANN401 (an async context manager)
        self.requests.append(request)
        return self._stream(self.answers.pop(0))

    @asynccontextmanager
    async def _stream(
        self, events: list[StreamEvent]
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        async def each() -> AsyncIterator[StreamEvent]:
            for event in events:
                await trio.lowlevel.checkpoint()
                yield event

        yield each()


async def test_empty_tool_call_ids_get_ids_of_their_own() -> None:
    # Our providers refuse a call without an id; a provider of the user's
    # may pass one on.
    calls: list[StreamEvent] = [
        ToolCall("", "add", {"a": 1, "b": 2}),
        ToolCall("", "add", {"a": 3, "b": 4}),
        ToolCall("call_1", "add", {"a": 5, "b": 6}),
    ]
    done: list[StreamEvent] = [TextDelta("done"), Finish("stop")]
    provider = RecordingProvider([[*calls, Finish("tool_calls")], done])
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, tools=[ADD])
        result = await conversation.ask("go")
    assert result.text == "done"
    answered = provider.requests[1]
    expected = (
        ["call_2", "call_3", "call_1"],
        [("call_2", "3"), ("call_3", "7"), ("call_1", "11")],
    )
    assert wire_tool_ids("openai", openai_body("m", answered)) == expected
    assert wire_tool_ids("anthropic", anthropic_body("m", 100, answered)) == expected


async def test_wrong_tool_calls_go_back_to_the_model_as_errors() -> None:
    ran: list[dict[str, Any]] = []

    async def record(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        ran.append(arguments)
        return "recorded"

    async def explode(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        raise ValueError("the tool broke")

    async def silent(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        raise KeyError  # no message: the type's name is all there is

    calls = (
        FakeToolCall("nope", {}, id="unknown"),
        FakeToolCall("record", id="bad-json", raw_arguments='{"city": '),
        FakeToolCall("record", {"city": 7}, id="schema"),
        FakeToolCall("record", {"city": "Oslo", "extra": 1}, id="extra"),
        FakeToolCall("explode", {}, id="raises"),
        FakeToolCall("silent", {}, id="silent"),
        FakeToolCall("record", {"city": "Oslo"}, id="good"),
    )
    record_tool = tool(
        "record",
        record,
        {"city": {"type": "string"}},
        required=["city"],
        additionalProperties=False,
    )
    async with open_rig(tools_then(calls, "sorted")) as rig:
        conversation = rig.start(
            tools=[record_tool, tool("explode", explode), tool("silent", silent)]
        )
        result = await conversation.ask("go")

    assert result.text == "sorted"
    assert result.tool_calls == 7
    got = {m.tool_call_id: m.content for m in conversation.history if m.role == "tool"}
    assert got["unknown"] == (
        "error: unknown tool 'nope' (the tools are: 'record', 'explode', 'silent')"
    )
    assert got["bad-json"].startswith("error: arguments are not valid JSON: ")
    assert got["schema"] == (
        "error: invalid arguments for 'record': $.city: expected string, got number"
    )
    assert got["extra"] == (
        "error: invalid arguments for 'record': $: unexpected property 'extra'"
    )
    assert got["raises"] == "error: the tool broke"
    assert got["silent"] == "error: KeyError"
    assert got["good"] == "recorded"
    assert ran == [{"city": "Oslo"}]


def sse(payload: object) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def openai_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body
    )


# Arguments nested past any parser's recursion, through an OpenAI provider
# over httpx2.MockTransport: the model reads the error, as for any bad JSON.
async def test_deeply_nested_tool_arguments_go_back_to_the_model_as_an_error() -> None:
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    call = {"index": 0, "id": "call_1", "type": "function"}
    first = b"".join(
        [
            openai_chunk({"role": "assistant", "content": ""}),
            openai_chunk(
                {"tool_calls": [{**call, "function": {"name": "t", "arguments": deep}}]}
            ),
            openai_chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    )
    second = (
        openai_chunk({"content": "done"})
        + openai_chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )
    bodies = iter([first, second])

    async def run(arguments: dict[str, Any]) -> str:
        return "ran"  # pragma: no cover (the arguments never parse)

    tool = Tool(name="t", description="", parameters={"type": "object"}, run=run)
    transport = httpx2.MockTransport(lambda request: sse_response(next(bodies)))
    async with httpx2.AsyncClient(transport=transport) as client:
        provider = OpenAIProvider(
            base_url="http://x/v1", api_key="k", model="m", client=client
        )
        async with open_dispatcher({"openai": 1}) as dispatcher:
            conversation = dispatcher.start_conversation(provider, tools=[tool])
            result = await conversation.ask("go")
    assert result.text == "done"
    assert conversation.history[2].role == "tool"
    assert conversation.history[2].content.startswith("error: ")


async def test_a_tool_returning_no_string_is_an_error_for_the_model() -> None:
    async def number(arguments: dict[str, Any]) -> Any:  # noqa: ANN401 (wrong on purpose)
        await trio.lowlevel.checkpoint()
        return 42

    calls = (FakeToolCall("number", {}, id="n"),)
    async with open_rig(tools_then(calls)) as rig:
        conversation = rig.start(tools=[tool("number", number)])
        await conversation.ask("go")
    assert conversation.history[2].content == (
        "error: tool 'number' returned int, not a string"
    )


async def test_a_tool_asking_its_own_conversation_gets_an_error_not_a_deadlock() -> (
    None
):
    conversations: list[Conversation] = []

    async def recurse(arguments: dict[str, Any]) -> str:
        return (await conversations[0].ask("again")).text

    async with open_rig(tools_then((FakeToolCall("recurse", {}, id="r"),))) as rig:
        conversations.append(rig.start(tools=[tool("recurse", recurse)]))
        with trio.fail_after(3):
            await conversations[0].ask("go")
    assert conversations[0].history[2].content == (
        "error: a conversation cannot wait for itself (from a tool)"
    )


async def test_tool_arguments_are_a_copy_the_history_keeps_intact() -> None:
    async def vandal(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        arguments["items"].append("mine")
        return "ok"

    calls = (FakeToolCall("vandal", {"items": ["a"]}, id="v"),)
    async with open_rig(tools_then(calls)) as rig:
        conversation = rig.start(
            tools=[tool("vandal", vandal, {"items": {"type": "array"}})]
        )
        await conversation.ask("go")
    assert conversation.history[1].tool_calls[0].arguments == {"items": ["a"]}


async def test_reasoning_is_not_part_of_the_answer_and_the_finish_is_reported() -> None:
    reply = FakeReply(text="short", reasoning="let me think", finish="length")
    async with open_rig(FakeScript(default=reply)) as rig:
        conversation = rig.start(options=quick(max_tokens=5))
        result = await conversation.ask("go")
    assert (result.text, result.finish_reason) == ("short", "length")
    assert conversation.history[-1] == ChatMessage("assistant", "short")
    assert rig.server.requests[0].body["max_tokens"] == 5


# -- queued questions -----------------------------------------------------------


async def test_questions_asked_at_once_are_answered_in_order() -> None:
    async with open_rig(echo(latency=0.01), limit=3) as rig:
        conversation = rig.start()
        results: dict[str, TurnResult] = {}

        async def ask(text: str) -> None:
            results[text] = await conversation.ask(text)

        # Asked one after the other (trio starts sibling tasks in any order),
        # each while the first turn still runs.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "one")
            await eventually(lambda: conversation.statistics().running)
            for queued, text in enumerate(["two", "three"], start=1):
                nursery.start_soon(ask, text)
                await eventually(lambda q=queued: conversation.statistics().queued == q)  # type: ignore[misc]
            assert len(rig.server.requests) <= 1

        assert {text: result.text for text, result in results.items()} == {
            "one": "re: one",
            "two": "re: two",
            "three": "re: three",
        }
        assert results["one"].finished_at <= results["two"].started_at
        assert results["two"].finished_at <= results["three"].started_at
        assert [m.content for m in conversation.history] == [
            "one",
            "re: one",
            "two",
            "re: two",
            "three",
            "re: three",
        ]
        # One turn at a time, although the limit would allow three.
        assert rig.server.statistics().peak_in_flight == 1
        # Each request carried the whole history so far.
        assert [len(messages_of(r)) for r in rig.server.requests] == [1, 3, 5]


# -- a fleet sharing one limited provider ------------------------------------------

# Twenty conversations, each asking two questions that need a tool, against
# the fake server on loopback with a limit of three: the server itself must
# never see more than three requests at once, every turn must complete, and
# the dispatcher must end with no slot held.
CONVERSATIONS = 20
LIMIT = 3
QUESTIONS = 2


def model(request: FakeRequest) -> FakeReply:
    """Looks the question up with the tool, then answers with the result."""
    if answers_tools(request):
        return FakeReply(text=f"the answer is {last_text(request)}", latency=0.002)
    call = FakeToolCall("lookup", {"key": last_text(request)})
    return FakeReply(text="", tool_calls=(call,), latency=0.002)


async def lookup(arguments: dict[str, Any]) -> str:
    """A tool that takes a moment."""
    await trio.sleep(0.002)
    return str(arguments["key"]).upper()


async def test_a_fleet_never_exceeds_the_limit_and_every_turn_completes() -> None:
    results: dict[tuple[int, int], TurnResult] = {}
    async with open_rig(FakeScript(choose=model), limit=LIMIT) as rig:
        conversations = [
            rig.start(conversation_id=f"agent-{n}", tools=[tool("lookup", lookup)])
            for n in range(CONVERSATIONS)
        ]

        async def agent(n: int, conversation: Conversation) -> None:
            for q in range(QUESTIONS):
                results[n, q] = await conversation.ask(f"q{n}-{q}")

        async with trio.open_nursery() as nursery:
            for n, conversation in enumerate(conversations):
                nursery.start_soon(agent, n, conversation)

        await eventually(lambda: rig.in_flight() == 0)
        server = rig.server.statistics()
        stats = rig.dispatcher.statistics().providers["openai"]

    assert server.peak_in_flight <= LIMIT
    assert stats.peak_in_flight == LIMIT  # contended: every slot was used
    assert stats.in_flight == 0
    assert stats.waiting == 0
    calls = CONVERSATIONS * QUESTIONS * 2
    assert server.requests_total == stats.granted_total == stats.released_total == calls
    assert server.client_disconnects == 0
    assert len(results) == CONVERSATIONS * QUESTIONS
    for (n, q), result in results.items():
        assert result.text == f"the answer is Q{n}-{q}"
        assert (result.llm_calls, result.tool_calls, result.retries) == (2, 1, 0)
    for conversation in conversations:
        roles = [message.role for message in conversation.history]
        assert roles == ["user", "assistant", "tool", "assistant"] * QUESTIONS
        assert conversation.statistics().turns_completed == QUESTIONS


# -- priority -------------------------------------------------------------------


async def test_every_call_of_a_turn_carries_the_turns_start() -> None:
    """A turn in progress beats a turn that started later, for each of its calls.

    Limit 1. A's first call gets a tool call; while A's tool runs, a plug
    takes the slot and B asks. When A's tool is done, A's second call and
    B's first both wait; the plug lets go and A's second call (started
    earlier) must be sent before B's first.
    """
    tool_may_finish = trio.Event()

    async def slow(arguments: dict[str, Any]) -> str:
        await tool_may_finish.wait()
        return "slow result"

    def choose(request: FakeRequest) -> FakeReply:
        if answers_tools(request):
            return FakeReply(text="A done")
        if last_text(request) == "A":
            return FakeReply(text="", tool_calls=(FakeToolCall("slow", {}, id="s"),))
        return FakeReply(text="B done")

    async with open_rig(FakeScript(choose=choose), limit=1) as rig:
        a = rig.start(conversation_id="A", tools=[tool("slow", slow)])
        b = rig.start(conversation_id="B")
        results: dict[str, TurnResult] = {}

        async def ask(conversation: Conversation, text: str) -> None:
            results[text] = await conversation.ask(text)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, a, "A")
            await eventually(lambda: a.statistics().tool_calls == 1)
            await eventually(lambda: rig.in_flight() == 0)
            async with rig.dispatcher.slot(rig.provider.id):
                nursery.start_soon(ask, b, "B")
                stats = rig.dispatcher.statistics
                await eventually(lambda: stats().providers["openai"].waiting == 1)
                tool_may_finish.set()
                await eventually(lambda: stats().providers["openai"].waiting == 2)

        order = [
            "A-2" if answers_tools(r) else last_text(r) for r in rig.server.requests
        ]
        assert order == ["A", "A-2", "B"]
        assert results["A"].started_at < results["B"].started_at
        assert results["A"].llm_calls == 2


# A compaction's summary call is one of its turn's calls, so it carries the
# turn's start: read on a clock that moves at every reading, the turn's start
# and the call's own instant never coincide.
class TickingClock(trio.abc.Clock):
    """Moves a microsecond at every reading, as a real clock does between two."""

    def __init__(self) -> None:
        self.now = 0.0

    def start_clock(self) -> None:
        """Nothing to start."""

    def current_time(self) -> float:
        self.now += 1e-6
        return self.now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(0.0, deadline - self.now)


@pytest.fixture
def ticking_clock() -> TickingClock:
    """pytest-trio runs the test on any Clock a fixture gives it."""
    return TickingClock()


@pytest.mark.usefixtures("ticking_clock")
async def test_a_compaction_call_carries_its_turns_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float | None] = []
    slot = Plumbing.slot

    def recording(self: Plumbing, provider: str, **options: Any) -> Any:  # noqa: ANN401 (passes through)
        # What the slot takes, given or from the current turn: a
        # conversation takes its slots through the dispatcher's plumbing.
        taken = slot(self, provider, **options)
        seen.append(taken.started_at)
        return taken

    monkeypatch.setattr(Plumbing, "slot", recording)
    provider = ScriptedProvider(
        FakeScript(default=FakeReply(text="some words")), id="memory"
    )
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, options=ConversationOptions(context_budget=1, keep_recent=0)
        )
        await conversation.ask("first question")
        seen.clear()
        result = await conversation.ask("second question")
    assert conversation.statistics().compactions == 1
    # The summary call, then the answer: both with the turn's start.
    assert seen == [result.started_at, result.started_at]


# -- compaction -------------------------------------------------------------------


def compacting_model(summary: FakeReply) -> FakeScript:
    """Echoes questions; answers a summary request with ``summary``."""

    def choose(request: FakeRequest) -> FakeReply:
        if last_text(request).startswith("Summarise the conversation"):
            return summary
        return FakeReply(text=f"re: {last_text(request)}")

    return FakeScript(choose=choose)


async def test_compaction_replaces_older_messages_with_a_summary() -> None:
    async with open_rig(compacting_model(FakeReply(text="they said 1"))) as rig:
        conversation = rig.start(options=quick(context_budget=10, keep_recent=2))
        await conversation.ask("1" * 20)  # 5 tokens: under budget
        await conversation.ask("2" * 20)  # over, but only 2 messages: none to cut
        assert len(rig.server.requests) == 2
        await conversation.ask("3" * 20)  # over: the first pair goes
        granted = rig.dispatcher.statistics().providers["openai"].granted_total
        assert len(rig.server.requests) == granted == 4

        summary_request = rig.server.requests[2]
        assert texts_of(summary_request)[:2] == ["1" * 20, "re: " + "1" * 20]
        assert len(messages_of(summary_request)) == 3
        assert last_text(summary_request).startswith("Summarise the conversation")
        assert conversation.history == (
            ChatMessage("system", SUMMARY_PREFIX + "they said 1"),
            ChatMessage("user", "2" * 20),
            ChatMessage("assistant", "re: " + "2" * 20),
            ChatMessage("user", "3" * 20),
            ChatMessage("assistant", "re: " + "3" * 20),
        )
        # The turn's request started from the summary.
        assert texts_of(rig.server.requests[3])[0].startswith(SUMMARY_PREFIX)
        stats = conversation.statistics()
        assert (stats.compactions, stats.compactions_failed) == (1, 0)
        assert stats.llm_calls == 4


async def test_compaction_cuts_only_where_a_user_message_starts() -> None:
    calls = (FakeToolCall("add", {"a": 1, "b": 1}, id="t"),)

    def choose(request: FakeRequest) -> FakeReply:
        text = last_text(request)
        if text.startswith("Summarise the conversation"):
            return FakeReply(text="summary")
        if answers_tools(request) or text != "tools please":
            return FakeReply(text=f"re: {text}")
        return FakeReply(text="", tool_calls=calls)

    async with open_rig(FakeScript(choose=choose)) as rig:
        conversation = rig.start(
            tools=[ADD], options=quick(context_budget=100, keep_recent=2)
        )
        await conversation.ask("hello")
        await conversation.ask("tools please")
        assert roles(conversation.history) == [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        await conversation.ask("more" * 100)  # now over budget
    # keep_recent=2 would cut inside the tool turn; the cut moves back to its
    # user message, so the tool call stays with its result.
    assert roles(conversation.history) == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert conversation.history[0].content == SUMMARY_PREFIX + "summary"


@pytest.mark.parametrize(
    ("summary", "summary_calls"),
    [
        pytest.param(FakeReply(text=""), 1, id="empty"),
        pytest.param(FakeReply(fault=Fault("server_error")), 2, id="error"),
    ],
)
async def test_a_failed_summary_leaves_the_history_whole_and_the_turn_goes_on(
    summary: FakeReply, summary_calls: int
) -> None:
    async with open_rig(compacting_model(summary)) as rig:
        conversation = rig.start(
            options=quick(context_budget=1, keep_recent=0, max_attempts=2)
        )
        await conversation.ask("first")
        result = await conversation.ask("second")
    assert result.text == "re: second"
    assert result.llm_calls == 1 + summary_calls
    assert len(rig.server.requests) == 2 + summary_calls
    assert [m.content for m in conversation.history] == [
        "first",
        "re: first",
        "second",
        "re: second",
    ]
    stats = conversation.statistics()
    assert (stats.compactions, stats.compactions_failed) == (0, 1)


# -- warm-up --------------------------------------------------------------------


async def test_warm_primes_the_cache_through_the_scheduler_and_keeps_the_history() -> (
    None
):
    async with open_rig(echo(cache_read_tokens=7)) as rig:
        conversation = rig.start(tools=[ADD], system_prompt="system")
        usage = await conversation.warm()  # empty history: a stand-in question
        await conversation.ask("hi")
        history = conversation.history
        usage_after = await conversation.warm()

        assert isinstance(usage, Usage)
        assert usage.cache_read_tokens == 7
        assert usage_after.prompt_tokens > usage.prompt_tokens
        assert conversation.history == history
        warm_first, _, warm_after = rig.server.requests
        assert warm_first.body["max_tokens"] == 1
        assert warm_first.body["tools"][0]["function"]["name"] == "add"
        assert messages_of(warm_first)[0]["content"] == "system"
        assert len(messages_of(warm_first)) == 2  # the system prompt and a stand-in
        assert texts_of(warm_after) == ["system", "hi", "re: hi"]
        assert rig.dispatcher.statistics().providers["openai"].granted_total == 3
        assert conversation.statistics().warmups == 2


async def test_warm_waits_its_turn_behind_a_running_turn() -> None:
    async with open_rig(echo(latency=0.02)) as rig:
        conversation = rig.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.ask, "first")
            await eventually(lambda: conversation.statistics().running)
            await conversation.warm()
        # The warm-up saw the finished turn: it ran after it.
        assert texts_of(rig.server.requests[1]) == ["first", "re: first"]


# -- closing ----------------------------------------------------------------------


async def test_close_fails_the_running_and_queued_questions_and_later_ones() -> None:
    async with open_rig(echo(latency=5)) as rig:
        conversation = rig.start()
        errors: list[BaseException] = []

        async def ask(text: str) -> None:
            try:
                await conversation.ask(text)
            except ConversationClosed as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "running")
            await eventually(lambda: len(rig.server.requests) == 1)
            nursery.start_soon(ask, "queued")
            await eventually(lambda: conversation.statistics().queued == 1)
            conversation.close()
            conversation.close()  # idempotent
        assert [str(e) for e in errors] == [
            f"conversation {conversation.id!r} is closed"
        ] * 2
        assert conversation.closed
        with pytest.raises(ConversationClosed, match=r"^conversation '.*' is closed$"):
            await conversation.ask("later")
        with pytest.raises(ConversationClosed):
            await conversation.warm()
        await eventually(lambda: rig.in_flight() == 0)
        assert conversation.history == ()
        assert isinstance(ConversationClosed("x"), DispatchError)


async def test_closing_the_dispatcher_fails_waiting_and_later_questions() -> None:
    errors: list[BaseException] = []
    async with open_fake_llm_server(echo(latency=5)) as server:
        provider = OpenAIProvider(
            base_url=server.openai_base_url, api_key="k", model="fake"
        )
        async with (
            provider,
            trio.open_nursery() as outside,
            open_dispatcher({"openai": 1}) as dispatcher,
        ):
            conversation = dispatcher.start_conversation(provider)

            async def ask(text: str) -> None:
                try:
                    await conversation.ask(text)
                except DispatcherClosed as exc:
                    errors.append(exc)

            outside.start_soon(ask, "running")
            await eventually(lambda: len(server.requests) == 1)
            outside.start_soon(ask, "queued")
            await eventually(lambda: conversation.statistics().queued == 1)
    assert [str(e) for e in errors] == ["the dispatcher is closed"] * 2
    assert conversation.closed
    with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
        await conversation.ask("later")
    with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
        dispatcher.start_conversation(provider)


@pytest.mark.parametrize("tools", [1, 2])
async def test_closing_the_dispatcher_while_tools_run_gives_dispatcher_closed(
    tools: int,
) -> None:
    calls = tuple(FakeToolCall("slow", {}, id=f"c{i}") for i in range(tools))

    async def slow(arguments: dict[str, Any]) -> str:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    tool = Tool(name="slow", description="", parameters={"type": "object"}, run=slow)
    caught: list[BaseException] = []

    async def ask(conversation: Conversation) -> None:
        try:
            await conversation.ask("hi")
        except DispatcherClosed as exc:
            caught.append(exc)

    async with (
        trio.open_nursery() as outside,
        open_dispatcher({"memory": 1}) as dispatcher,
    ):
        reply = FakeReply(text="", tool_calls=calls)
        provider = ScriptedProvider(FakeScript(default=reply), id="memory")
        conversation = dispatcher.start_conversation(provider, tools=[tool])
        outside.start_soon(ask, conversation)
        await trio.testing.wait_all_tasks_blocked()
        assert conversation.statistics().tool_calls == tools
    assert [type(exc) for exc in caught] == [DispatcherClosed]


# -- arguments --------------------------------------------------------------------


async def _nothing(arguments: dict[str, Any]) -> str:
    await trio.lowlevel.checkpoint()
    return ""


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"conversation_id": ""}, ValueError, "conversation_id must be a non-empty string, got ''"),
        ({"conversation_id": 3}, TypeError, "conversation_id must be a non-empty string, got 3"),
        ({"tools": "add"}, TypeError, "tools must be an iterable of Tool values, got 'add'"),
        ({"tools": [object]}, TypeError, "tools must hold Tool values, got <class 'object'>"),
        ({"tools": [ADD, ADD]}, ValueError, "duplicate tool name 'add'"),
        ({"system_prompt": 1}, TypeError, "system_prompt must be a string or None, got 1"),
        ({"options": {"seed": 1}}, TypeError, "options must be a ConversationOptions or None, got {'seed': 1}"),
        ({"history": "hi"}, TypeError, "history must be an iterable of ChatMessage values, got 'hi'"),
        ({"history": [ChatMessage("tool", "5", tool_call_id="c1")]}, ValueError,
         "history message 0: a tool result without its call: none right before it has id 'c1'"),
    ],
)  # fmt: skip
async def test_start_conversation_checks_its_arguments_at_once(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with open_dispatcher() as dispatcher:
        provider = OpenAIProvider(base_url="http://x", api_key="k", model="m")
        async with provider:
            with pytest.raises(error, match=f"^{_escape(message)}$"):
                dispatcher.start_conversation(provider, **options)
            await settle()
            assert not [
                name
                for name in task_names()
                if name.startswith("trio_dispatch conversation")
            ]


@pytest.mark.parametrize("name", [f.name for f in attrs.fields(ConversationOptions)])
async def test_start_conversation_takes_its_settings_only_as_options(name: str) -> None:
    value = getattr(ConversationOptions(), name)
    async with open_dispatcher() as dispatcher:
        provider = OpenAIProvider(base_url="http://x", api_key="k", model="m")
        async with provider:
            with pytest.raises(
                TypeError,
                match=rf"^Dispatcher\.start_conversation\(\) got an unexpected"
                rf" keyword argument '{name}'$",
            ):
                dispatcher.start_conversation(provider, **{name: value})


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts must be a positive integer, got 0"),
        ({"max_attempts": 1.5}, TypeError, "max_attempts must be a positive integer, got 1.5"),
        ({"retry_backoff": -1}, ValueError, "retry_backoff must be a non-negative number of seconds, got -1"),
        ({"max_backoff": math.inf}, ValueError, "max_backoff must be a non-negative number of seconds, got inf"),
        ({"context_budget": 0}, ValueError, "context_budget must be a positive integer, got 0"),
        ({"keep_recent": -1}, ValueError, "keep_recent must be a non-negative integer, got -1"),
        ({"keep_recent": "x"}, TypeError, "keep_recent must be a non-negative integer, got 'x'"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be a positive integer, got 0"),
        ({"seed": "x"}, TypeError, "seed must be an integer or None, got 'x'"),
        ({"max_tool_rounds": 0}, ValueError, "max_tool_rounds must be a positive integer, got 0"),
        ({"max_tool_rounds": None}, TypeError, "max_tool_rounds must be a positive integer, got None"),
    ],
)  # fmt: skip
def test_conversation_options_check_their_fields_when_made(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{_escape(message)}$"):
        ConversationOptions(**options)


async def test_start_conversation_wants_a_provider() -> None:
    async with open_dispatcher() as dispatcher:
        with pytest.raises(
            TypeError, match=r"^provider must have an id and a stream method, got 3$"
        ):
            dispatcher.start_conversation(3)  # type: ignore[arg-type]  # wrong on purpose


async def test_ask_wants_text() -> None:
    async with open_rig() as rig:
        conversation = rig.start()
        with pytest.raises(TypeError, match=r"^text must be a string, got 3$"):
            await conversation.ask(3)  # type: ignore[arg-type]  # wrong on purpose


async def test_default_ids_are_unique_and_the_repr_names_the_conversation() -> None:
    async with open_rig() as rig:
        first, second = rig.start(), rig.start()
        assert first.id != second.id
        assert (
            repr(first)
            == f"<Conversation {first.id!r} open provider='openai' messages=0>"
        )
        first.close()
        assert "closed" in repr(first)


def _escape(text: str) -> str:
    return re.escape(text)


# -- tools and their schemas -------------------------------------------------------


def test_tool_spec_is_what_the_request_declares() -> None:
    assert ADD.spec() == ToolSpec(
        "add",
        "the add tool",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    )


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"name": "has space"}, ValueError, "tool name must be 1 to 64 letters, digits, '_' or '-', got 'has space'"),
        ({"name": ""}, ValueError, "tool name must be 1 to 64 letters, digits, '_' or '-', got ''"),
        ({"name": 5}, TypeError, "tool name must be 1 to 64 letters, digits, '_' or '-', got 5"),
        ({"description": None}, TypeError, "tool description must be a string, got None"),
        ({"parameters": []}, TypeError, "tool parameters must be a JSON schema dict, got []"),
        ({"parameters": {"type": "array"}}, ValueError, "tool parameters must be an object schema, got type 'array'"),
        ({"run": "run"}, TypeError, "tool run must be an async callable, got 'run'"),
    ],
)  # fmt: skip
def test_tool_checks_its_fields(
    fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    good: dict[str, Any] = {
        "name": "t",
        "description": "d",
        "parameters": {"type": "object"},
        "run": _nothing,
    }
    with pytest.raises(error, match=f"^{_escape(message)}$"):
        Tool(**(good | fields))


async def _never(arguments: dict[str, Any]) -> str:
    raise AssertionError  # pragma: no cover


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"type": "object", "properties": {"a": {"type": 5}}},
            r"^tool parameters: \$\.properties\.a\.type must be a type name or a list of them, got 5$",
        ),
        (
            {"type": "object", "properties": {"a": {"type": [["string"]]}}},
            r"^tool parameters: \$\.properties\.a\.type must be a type name or a list of them, got \[\['string'\]\]$",
        ),
        (
            {"type": "object", "required": [["a"]]},
            r"^tool parameters: \$\.required must be a list of names, got \[\['a'\]\]$",
        ),
        (
            {"type": "object", "properties": {"a": {"items": {"enum": "x"}}}},
            r"^tool parameters: \$\.properties\.a\.items\.enum must be a list, got 'x'$",
        ),
        (
            {"type": "object", "properties": {"a": {"enum": {1, 2}}}},
            r"^tool parameters must be JSON: Object of type set is not JSON serializable$",
        ),
        (
            {"type": "object", "properties": {"a": {"maximum": math.nan}}},
            r"^tool parameters must be JSON: Out of range float values are not JSON compliant(: nan)?$",
        ),
    ],
)
def test_a_tool_schema_the_checker_cannot_use_is_refused_when_the_tool_is_made(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Tool(name="t", description="", parameters=parameters, run=_never)


async def _prefixed(prefix: str, arguments: dict[str, Any]) -> str:
    await trio.lowlevel.checkpoint()
    return f"{prefix}{sorted(arguments)}"


class _AsyncCall:
    async def __call__(self, arguments: dict[str, Any]) -> str:
        return await _prefixed("called ", arguments)

    async def method(self, arguments: dict[str, Any]) -> str:
        return await _prefixed("method ", arguments)

    async def with_prefix(self, prefix: str, arguments: dict[str, Any]) -> str:
        return await _prefixed(prefix, arguments)


class _SyncCall:
    def __call__(self, arguments: dict[str, Any]) -> str:
        return "sync"

    def method(self, arguments: dict[str, Any]) -> str:
        return "sync"


def _sync(arguments: dict[str, Any]) -> str:
    return "sync"


def _sync_prefixed(prefix: str, arguments: dict[str, Any]) -> str:
    return prefix


async def _async_generator(arguments: dict[str, Any]) -> AsyncIterator[str]:
    yield "not awaitable"


@pytest.mark.parametrize(
    ("run", "answer"),
    [
        pytest.param(_nothing, "", id="async-function"),
        pytest.param(functools.partial(_prefixed, "p "), "p ['k']", id="partial"),
        pytest.param(
            functools.partial(functools.partial(_prefixed), "pp "),
            "pp ['k']",
            id="partial-of-partial",
        ),
        pytest.param(_AsyncCall(), "called ['k']", id="async-call-object"),
        pytest.param(
            functools.partial(_AsyncCall()), "called ['k']", id="partial-of-object"
        ),
        pytest.param(_AsyncCall().method, "method ['k']", id="bound-async-method"),
        pytest.param(
            functools.partial(_AsyncCall().with_prefix, "bp "),
            "bp ['k']",
            id="partial-of-bound-method",
        ),
    ],
)
async def test_tool_accepts_every_form_of_async_callable(
    run: Callable[[dict[str, Any]], Awaitable[str]], answer: str
) -> None:
    made = Tool(name="t", description="", parameters={"type": "object"}, run=run)
    assert await made.run({"k": 1}) == answer


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(_sync, id="function"),
        pytest.param(
            lambda arguments: _nothing(arguments),  # noqa: PLW0108 (sync, returns a coroutine: the case)
            id="lambda-returning-a-coroutine",
        ),
        pytest.param(functools.partial(_sync_prefixed, "p"), id="partial"),
        pytest.param(_SyncCall(), id="sync-call-object"),
        pytest.param(_SyncCall().method, id="bound-sync-method"),
        pytest.param(_AsyncCall, id="class-with-async-call"),
        pytest.param(_async_generator, id="async-generator-function"),
        pytest.param(print, id="builtin"),
    ],
)
def test_tool_refuses_a_synchronous_run_when_made(run: object) -> None:
    with pytest.raises(
        TypeError,
        match=f"^tool run must be an async callable, got {_escape(repr(run))}$",
    ):
        Tool(name="t", description="", parameters={"type": "object"}, run=run)  # type: ignore[arg-type]  # wrong on purpose


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"enum": ["fast", "slow"]},
        "maybe": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "point": {
            "type": "object",
            "properties": {"x": {"type": "number"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        "anything": {},
        "custom": {"type": "decimal"},
    },
    "required": ["name"],
}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"name": "n"}, None),
        ({"name": "n", "count": 3, "ratio": 1, "flag": True, "mode": "fast"}, None),
        ({"name": "n", "count": 3.0, "maybe": None, "tags": ["a"]}, None),
        ({"name": "n", "point": {"x": 1.5}, "extra": {"k": 1}, "anything": [1]}, None),
        ({"name": "n", "custom": "1.5", "unknown": "allowed"}, None),
        ({}, "$: missing required property 'name'"),
        ([], "$: expected object, got array"),
        ({"name": 1}, "$.name: expected string, got number"),
        ({"name": "n", "count": 1.5}, "$.count: expected integer, got number"),
        ({"name": "n", "count": True}, "$.count: expected integer, got boolean"),
        ({"name": "n", "ratio": "1"}, "$.ratio: expected number, got string"),
        ({"name": "n", "flag": 1}, "$.flag: expected boolean, got number"),
        ({"name": "n", "mode": "medium"}, "$.mode: expected one of 'fast', 'slow', got 'medium'"),
        ({"name": "n", "maybe": 1}, "$.maybe: expected string or null, got number"),
        ({"name": "n", "tags": ["a", 2]}, "$.tags[1]: expected string, got number"),
        ({"name": "n", "tags": "a"}, "$.tags: expected array, got string"),
        ({"name": "n", "point": {}}, "$.point: missing required property 'x'"),
        ({"name": "n", "point": {"x": 1, "y": 2}}, "$.point: unexpected property 'y'"),
        ({"name": "n", "extra": {"k": "v"}}, "$.extra.k: expected integer, got string"),
    ],
)  # fmt: skip
def test_check_arguments_covers_the_common_schema_subset(
    arguments: object, problem: str | None
) -> None:
    assert check_arguments(arguments, SCHEMA) == problem


def test_check_arguments_keeps_json_equality_in_enums() -> None:
    schema = {"enum": [1, True, None]}
    assert check_arguments(1.0, schema) is None
    assert check_arguments(True, schema) is None
    assert (
        check_arguments(False, schema) == "$: expected one of 1, True, None, got False"
    )
    long = "x" * 50
    assert check_arguments("y", {"enum": [long]}) == (
        f"$: expected one of '{'x' * 36}..., got 'y'"
    )


async def test_an_llm_call_is_counted_once_sent_not_while_it_waits_for_its_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(text="ok")), id="p")
    async with open_dispatcher({"p": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        results: list[TurnResult] = []

        async def ask() -> None:
            results.append(await conversation.ask("hello"))

        async with trio.open_nursery() as nursery, dispatcher.slot("p"):
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert dispatcher.statistics().providers["p"].waiting == 1
            # Waiting for its slot: nothing sent, nothing counted.
            assert conversation.statistics().llm_calls == 0
        stats = conversation.statistics()
    assert [(result.llm_calls, result.retries) for result in results] == [(1, 0)]
    assert (stats.llm_calls, stats.retries) == (1, 0)
