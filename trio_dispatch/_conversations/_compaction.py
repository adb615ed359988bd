"""Compaction: replacing a conversation's older messages by a summary.

The choices are pure and live here: whether a turn's history is over the
context budget, where to cut it, the request that asks the model for the
summary, and the message that replaces what was cut. The summary call
itself belongs to the turn that needs it (``Conversation._compact_if_needed``),
which takes a slot for it like for any call of the turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._integrations._metering import prompt_chars
from ..messages import ChatMessage, ChatRequest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..messages import ToolSpec
    from ._options import ConversationOptions

SUMMARY_PREFIX: Final = "Summary of the conversation so far:\n\n"
"""How the summary message that replaces compacted messages begins."""

_SUMMARY_REQUEST: Final = (
    "Summarise the conversation so far for your own later use: the user's "
    "goals, the facts and decisions established, tool results that still "
    "matter, and what remains open. Reply with the summary only, in plain "
    "text, and do not call any tool."
)


def compaction_cut(
    history: Sequence[ChatMessage],
    turn: Sequence[ChatMessage],
    *,
    system_prompt: str | None,
    tools: Sequence[ToolSpec] = (),
    options: ConversationOptions,
) -> int | None:
    """Where ``history``'s older messages end, if the next call needs a cut.

    ``history`` is what came before the running turn, the only part a
    compaction may replace; ``turn`` is the turn so far (its question, then
    any answers that called tools and their results). A turn asks before
    each of its LLM calls, since tool results can grow it past the budget
    after it started.

    ``None`` when no compaction is due: no ``context_budget``, an estimate
    (characters / 4 of the system prompt, the tool definitions, the history
    and the turn) within it, or nothing worth summarising (see
    ``choose_cut``).
    """
    if options.context_budget is None:
        return None
    chars = prompt_chars(system_prompt, (*history, *turn), tools)
    if chars / 4 <= options.context_budget:
        return None
    return choose_cut(history, options.keep_recent)


def choose_cut(history: Sequence[ChatMessage], keep_recent: int) -> int | None:
    """Where older messages end: a user message, at least ``keep_recent`` back.

    Cutting only where a user message starts parts no tool call from its
    results. ``None`` when that leaves nothing worth summarising (nothing,
    or only the previous summary).
    """
    for cut in range(len(history) - keep_recent, 0, -1):
        if cut == len(history) or history[cut].role == "user":
            break
    else:
        return None
    if cut == 1 and history[0].role == "system":
        return None
    return cut


def summary_request(
    older: Sequence[ChatMessage],
    *,
    tools: tuple[ToolSpec, ...],
    system_prompt: str | None,
    max_tokens: int | None,
) -> ChatRequest:
    """The request that asks the model to summarise ``older``.

    It declares the conversation's tools, like every request of the
    conversation: the older messages may hold tool calls and results, which
    Anthropic refuses in a request that declares no tools.
    """
    return ChatRequest(
        messages=[*older, ChatMessage("user", _SUMMARY_REQUEST)],
        tools=tools,
        max_tokens=max_tokens,
        system=system_prompt,
    )


def summary_message(text: str) -> ChatMessage | None:
    """The message that replaces the older ones; ``None`` for an empty summary."""
    summary = text.strip()
    if not summary:
        return None
    return ChatMessage("system", SUMMARY_PREFIX + summary)
