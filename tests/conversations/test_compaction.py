"""Compaction's choices, as the pure functions they are."""

from __future__ import annotations

import pytest

from trio_dispatch import SUMMARY_PREFIX, ConversationOptions
from trio_dispatch._conversations._compaction import (
    choose_cut,
    compaction_cut,
    summary_message,
    summary_request,
)
from trio_dispatch.messages import ChatMessage, ChatRequest, ToolCall, ToolSpec

SUMMARY = ChatMessage("system", SUMMARY_PREFIX + "earlier")
CALL = ToolCall("c1", "add", {"a": 1}, '{"a": 1}')
# Two plain exchanges, then one with a tool call: cut points at 0, 2 and 4.
HISTORY = (
    ChatMessage("user", "one"),
    ChatMessage("assistant", "1"),
    ChatMessage("user", "two"),
    ChatMessage("assistant", "2"),
    ChatMessage("user", "add"),
    ChatMessage("assistant", "", tool_calls=[CALL]),
    ChatMessage("tool", "2", tool_call_id="c1"),
    ChatMessage("assistant", "it is 2"),
)


@pytest.mark.parametrize(
    ("keep_recent", "cut"),
    [
        (0, 8),  # everything goes
        (1, 4),  # the cut moves back to the user message before the tool call
        (4, 4),
        (5, 2),
        (6, 2),
        (7, None),  # no user message after the first: nothing to cut
        (8, None),
        (100, None),
    ],
)
def test_the_cut_keeps_keep_recent_and_parts_no_tool_call_from_its_result(
    keep_recent: int, cut: int | None
) -> None:
    assert choose_cut(HISTORY, keep_recent) == cut


def test_a_previous_summary_alone_is_not_summarised_again() -> None:
    history = (SUMMARY, *HISTORY[2:4])
    assert choose_cut(history, 2) is None
    assert choose_cut(history, 0) == 3


def test_nothing_is_cut_from_an_empty_history() -> None:
    assert choose_cut((), 0) is None


QUESTION = ChatMessage("user", "q" * 6)
# The question, the messages' text, and the tool call's name and arguments.
CHARS = 6 + sum(len(m.content) for m in HISTORY) + len("add") + len('{"a": 1}')


@pytest.mark.parametrize(
    ("budget", "system_prompt", "cut"),
    [
        (None, None, None),  # never compacts
        (CHARS // 4, None, None),  # CHARS / 4 tokens: within the budget
        (CHARS // 4 - 1, None, 4),  # one token over
        (CHARS // 4, "abcd", 4),  # the system prompt counts too
    ],
)
def test_compaction_is_due_only_over_the_context_budget(
    budget: int | None, system_prompt: str | None, cut: int | None
) -> None:
    assert CHARS % 4 == 0  # so that the boundary is exact
    options = ConversationOptions(context_budget=budget, keep_recent=2)
    assert (
        compaction_cut(
            HISTORY, [QUESTION], system_prompt=system_prompt, options=options
        )
        == cut
    )


def test_the_summary_request_asks_about_the_older_messages_only() -> None:
    spec = ToolSpec("add", "adds", {"type": "object"})
    request = summary_request(
        HISTORY[:4], tools=(spec,), system_prompt="Be brief.", max_tokens=50
    )
    assert request == ChatRequest(
        messages=[*HISTORY[:4], request.messages[-1]],
        tools=(spec,),
        max_tokens=50,
        system="Be brief.",
    )
    assert request.messages[-1].role == "user"
    assert request.messages[-1].content.startswith("Summarise the conversation")


def test_the_summary_replaces_the_older_messages_as_one_system_message() -> None:
    assert summary_message("  they met  \n") == ChatMessage(
        "system", SUMMARY_PREFIX + "they met"
    )


@pytest.mark.parametrize("text", ["", "  \n\t"])
def test_an_empty_summary_replaces_nothing(text: str) -> None:
    assert summary_message(text) is None


def test_the_tool_definitions_count_in_the_estimate() -> None:
    # Every request declares the tools: a budget the messages alone fit in
    # can be exceeded by the definitions.
    spec = ToolSpec("add", "adds", {"type": "object"})
    options = ConversationOptions(context_budget=CHARS // 4, keep_recent=2)
    assert (
        compaction_cut(HISTORY, [QUESTION], system_prompt=None, options=options) is None
    )
    assert (
        compaction_cut(
            HISTORY, [QUESTION], system_prompt=None, tools=(spec,), options=options
        )
        == 4
    )


def test_the_turn_so_far_counts_and_only_earlier_messages_are_cut() -> None:
    # Mid-turn: the question, a tool call and its long result are the turn's;
    # the cut stays within what came before it.
    options = ConversationOptions(context_budget=CHARS // 4, keep_recent=0)
    turn = [
        QUESTION,
        ChatMessage("assistant", "", tool_calls=[ToolCall("c9", "read", {}, "{}")]),
        ChatMessage("tool", "x" * 100, tool_call_id="c9"),
    ]
    assert (
        compaction_cut(HISTORY, [QUESTION], system_prompt=None, options=options) is None
    )
    assert compaction_cut(HISTORY, turn, system_prompt=None, options=options) == 8
