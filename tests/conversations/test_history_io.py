"""Histories that last: starting from one, and saving one as JSON and back.

A history keeps the rules an LLM API holds it to (every tool call answered
right after it, every result answering a call), so one that breaks them is
refused where it enters, naming the message and the rule.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import dump_history, load_history, open_dispatcher
from trio_dispatch._converter import unstructure
from trio_dispatch.messages import ChatMessage, ToolCall
from trio_dispatch.testing import FakeReply, FakeScript, FakeToolCall, ScriptedProvider

from .._helpers import task_names
from .._rigs import messages_of, open_rig, roles, texts_of, tool

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch.testing import FakeRequest

# -- generated valid histories ------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
    ),
    max_leaves=8,
)
NAMES = st.none() | st.text(min_size=1, max_size=8)


@st.composite
def histories(draw: st.DrawFn) -> list[ChatMessage]:
    """Valid histories: exchanges, some with tool calls, maybe a summary first."""
    messages: list[ChatMessage] = []
    if draw(st.booleans()):
        messages.append(ChatMessage("system", draw(st.text())))
    ids = iter(range(1_000_000))
    for _ in range(draw(st.integers(0, 4))):
        messages.append(ChatMessage("user", draw(st.text()), name=draw(NAMES)))
        for _ in range(draw(st.integers(0, 2))):  # rounds of tools
            calls = [
                ToolCall(
                    id=f"call-{next(ids)}",
                    name=draw(st.text(min_size=1, max_size=8)),
                    arguments=draw(st.dictionaries(st.text(), JSON_VALUES, max_size=3)),
                    raw_arguments=draw(st.text(max_size=10)),
                    arguments_error=draw(st.none() | st.text(max_size=10)),
                )
                for _ in range(draw(st.integers(1, 3)))
            ]
            messages.append(ChatMessage("assistant", draw(st.text()), tool_calls=calls))
            for call in draw(st.permutations(calls)):
                messages.append(
                    ChatMessage("tool", draw(st.text()), tool_call_id=call.id)
                )
        if draw(st.booleans()):
            messages.append(ChatMessage("assistant", draw(st.text())))
    return messages


@settings(deadline=None, max_examples=200)
@given(histories())
def test_a_dumped_history_loads_back_equal(history: list[ChatMessage]) -> None:
    text = dump_history(history)
    assert json.loads(text)["version"] == 1
    assert load_history(text) == tuple(history)
    assert load_history(text.encode()) == tuple(history)


# -- refusals -----------------------------------------------------------------

CALL_A = ToolCall("a", "add", {"x": 1})
CALL_B = ToolCall("b", "add", {"x": 2})
USER = ChatMessage("user", "hi")
CALLS_AB = ChatMessage("assistant", "", tool_calls=[CALL_A, CALL_B])


def result(call_id: str) -> ChatMessage:
    """A tool result answering ``call_id``."""
    return ChatMessage("tool", "ok", tool_call_id=call_id)


def nested(depth: int) -> list[Any]:
    """An empty list inside ``depth`` lists."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


BROKEN = [
    pytest.param(
        [USER, result("a")],
        "history message 1: a tool result without its call: none right before it has id 'a'",
        id="result-without-call",
    ),
    pytest.param(
        [USER, CALLS_AB, result("a")],
        "history message 1: tool call 'b' has no result right after it",
        id="call-without-result-at-the-end",
    ),
    pytest.param(
        [USER, CALLS_AB, USER],
        "history message 1: tool calls 'a', 'b' have no result right after it",
        id="calls-without-results-before-the-next-message",
    ),
    pytest.param(
        [USER, CALLS_AB, result("a"), result("b"), result("a")],
        "history message 4: a second result for tool call 'a'",
        id="second-result",
    ),
    pytest.param(
        [USER, CALLS_AB, result("a"), result("b"), USER, result("a")],
        "history message 5: a second result for tool call 'a'",
        id="result-after-the-block",
    ),
    pytest.param(
        [USER, CALLS_AB, result("a"), result("b"), CALLS_AB],
        "history message 4: tool call id 'a' is used twice",
        id="repeated-call-id",
    ),
    pytest.param(
        [USER, ChatMessage("assistant", "", tool_calls=[ToolCall("", "add")])],
        "history message 1: a tool call needs an id",
        id="empty-call-id",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("history", "message"), BROKEN)
def test_a_history_breaking_a_rule_is_refused_on_load(
    history: list[ChatMessage], message: str
) -> None:
    text = json.dumps(
        {"version": 1, "messages": [unstructure(item) for item in history]}
    )
    with pytest.raises(ValueError, match=rf"^{_escaped(message)}$"):
        load_history(text)
    with pytest.raises(ValueError, match=rf"^{_escaped(message)}$"):
        dump_history(history)


@pytest.mark.parametrize(("history", "message"), BROKEN)
async def test_a_history_breaking_a_rule_is_refused_at_the_start(
    history: list[ChatMessage], message: str
) -> None:
    provider = ScriptedProvider(id="memory")
    async with open_dispatcher() as dispatcher:
        before = task_names()
        with pytest.raises(ValueError, match=rf"^{_escaped(message)}$"):
            dispatcher.start_conversation(provider, history=history)
        assert task_names() == before  # nothing started


def _escaped(message: str) -> str:
    return re.escape(message)


GOOD = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "history is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("[]", "history must be a JSON object with a version and messages, got array"),
        (json.dumps({"messages": []}), "history has no version"),
        (json.dumps({"version": 2, "messages": []}), "history version must be 1, got 2"),
        (json.dumps({"version": "1", "messages": []}), "history version must be 1, got '1'"),
        (json.dumps({"version": True, "messages": []}), "history version must be 1, got True"),
        (json.dumps({"version": 1}), "history messages must be an array, got null"),
        (json.dumps({"version": 1, "messages": [GOOD, 5]}), "history message 1 must be an object, got number"),
        (
            json.dumps({"version": 1, "messages": [GOOD, {"role": "robot", "content": "x"}]}),
            "history message 1: unknown role 'robot' (the roles are system, user, assistant, tool)",
        ),
        (
            json.dumps({"version": 1, "messages": [{"role": "user", "content": 5}]}),
            "history message 0: expected a string, got number @ $.content",
        ),
        (
            json.dumps({"version": 1, "messages": [{"role": "tool", "content": "x"}]}),
            "history message 0: a tool message needs the tool_call_id it answers",
        ),
        ("[" * 100_000 + "]" * 100_000, "history is nested too deeply to read"),
        (
            json.dumps({"version": 1, "messages": [{"role": "user", "content": "x", "name": "NEST"}]})
            .replace('"NEST"', "[" * 100_000 + "]" * 100_000),
            "history is nested too deeply to read",
        ),
    ],
)  # fmt: skip
def test_a_malformed_history_is_refused_on_load(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{_escaped(message)}$"):
        load_history(text)


@pytest.mark.parametrize(
    ("function", "argument", "error", "message"),
    [
        (load_history, 5, TypeError, "text must be a string or bytes, got 5"),
        (dump_history, "hi", TypeError, "history must be an iterable of ChatMessage values, got 'hi'"),
        (dump_history, [USER, "hi"], TypeError, "history message 1 must be a ChatMessage, got 'hi'"),
        (dump_history, [ChatMessage("assistant", "", tool_calls=[ToolCall("n", "f", {"x": float("nan")})]), result("n")],
         ValueError, "history message 0: its tool call arguments hold a value JSON cannot carry"),
        (dump_history, [USER, ChatMessage("assistant", "", tool_calls=[ToolCall("n", "f", {"x": nested(5000)})]), result("n")],
         ValueError, "history message 1: its tool call arguments are nested too deeply"),
    ],
)  # fmt: skip
def test_history_functions_check_their_arguments(
    function: Callable[[Any], object],
    argument: object,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=rf"^{_escaped(message)}$"):
        function(argument)


class CountedId(str):
    """A tool call id that counts how often any id is compared with it."""

    __slots__ = ()
    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_checking_a_message_of_many_tool_calls_compares_each_id_a_few_times() -> None:
    # Results answered last call first: a list's `in` compares each with
    # every call still pending, n * n / 2 in all; a set or dict, once each.
    n = 2_000
    calls = [ToolCall(CountedId(f"call_{i}"), "add") for i in range(n)]
    answers = [result(CountedId(f"call_{i}")) for i in reversed(range(n))]
    history = [USER, ChatMessage("assistant", "", tool_calls=calls), *answers]
    CountedId.compared = 0
    text = dump_history(history)
    assert CountedId.compared <= 3 * n
    assert load_history(text) == tuple(history)
    with pytest.raises(
        ValueError,
        match=r"^history message 1: tool calls 'call_0', 'call_1' have no result right after it$",
    ):
        dump_history(
            [USER, ChatMessage("assistant", "", tool_calls=calls), *answers[:-2]]
        )


# -- starting from a history, and resuming after a restart -------------------


async def test_a_conversation_starts_from_a_history_and_exports_it() -> None:
    history = [USER, CALLS_AB, result("b"), result("a"), ChatMessage("assistant", "2")]
    script = FakeScript(default=FakeReply(text="3"))
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, history=iter(history))
        assert conversation.history == tuple(history)
        await conversation.ask("and now?")
        exported = conversation.export_history()
    assert load_history(exported) == (
        *history,
        ChatMessage("user", "and now?"),
        ChatMessage("assistant", "3"),
    )
    (request,) = provider.requests  # the history went out with the question
    assert request.messages[:5] == tuple(history)


def results_in(request: FakeRequest) -> int:
    """How many tool results the request carries, in either wire format."""
    count = 0
    for message in messages_of(request):
        if message.get("role") == "tool":
            count += 1
        content = message.get("content")
        if isinstance(content, list):
            count += sum(block.get("type") == "tool_result" for block in content)
    return count


def stepping_model(request: FakeRequest) -> FakeReply:
    """An agent that takes one step per turn: it calls ``step``, then reports it."""
    done = results_in(request)
    last = messages_of(request)[-1]
    if last.get("role") == "tool" or (
        isinstance(last.get("content"), list)
        and last["content"][-1].get("type") == "tool_result"
    ):
        return FakeReply(text=f"step {done} done")
    call = FakeToolCall("step", {"n": done + 1}, id=f"s{done + 1}")
    return FakeReply(text="", tool_calls=(call,))


async def step(arguments: dict[str, Any]) -> str:
    """A tool: the result of step ``n``."""
    return f"result {arguments['n']}"


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_saved_history_resumes_its_tool_loop_in_a_new_dispatcher(
    wire: str,
) -> None:
    steps = [tool("step", step, {"n": {"type": "integer"}}, required=["n"])]
    async with open_rig(FakeScript(choose=stepping_model), wire=wire) as rig:
        conversation = rig.start(tools=steps, system_prompt="Take steps.")
        assert (await conversation.ask("start")).text == "step 1 done"
        saved = conversation.export_history()

    # A restart: a new server, provider and dispatcher, the same tools.
    async with open_rig(FakeScript(choose=stepping_model), wire=wire) as rig:
        resumed = rig.start(
            tools=steps, system_prompt="Take steps.", history=load_history(saved)
        )
        result = await resumed.ask("continue")
        assert result.text == "step 2 done"
        first, second = rig.server.requests
        # The model saw the first step's call and result, and took the next.
        assert results_in(first) == 1
        texts = [text for text in texts_of(first) if text not in ("", "Take steps.")]
        assert texts == ["start", "result 1", "step 1 done", "continue"]
        assert texts_of(second)[-1] == "result 2"
        history = resumed.history
        assert roles(history) == ["user", "assistant", "tool", "assistant"] * 2
        assert [call.id for m in history for call in m.tool_calls] == ["s1", "s2"]
        assert history[6] == ChatMessage("tool", "result 2", tool_call_id="s2")
        assert load_history(resumed.export_history()) == history
