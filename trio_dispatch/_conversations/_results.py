"""What a streamed turn yields, as it happens: ``TurnEvent`` values.

``Conversation.stream`` yields, in order: the text and reasoning deltas of
each answer as they arrive (``TextDelta``, ``ReasoningDelta``), the tool
calls of an answer that calls tools once that answer is complete
(``ToolCall``, with the ids the history keeps), each tool's result as it
finishes (``ToolResult``), a ``Retrying`` when an LLM call failed and will
be sent again, and last ``TurnFinished`` with the turn's ``TurnResult``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, final

import attrs

from ..messages import ReasoningDelta, TextDelta, ToolCall

if TYPE_CHECKING:
    from .._exceptions import ProviderError
    from ..messages import Usage


@final
@attrs.frozen
class TurnResult:
    """How one turn of a conversation went.

    Attributes:
        text: The final answer's text (text the model wrote before calling
            tools stays in the history, not here).
        llm_calls: LLM requests the turn sent: tool-loop steps, retries and
            a compaction's summary call included.
        tool_calls: Tool calls the model made, refused ones included.
        retries: LLM requests sent again after a retryable error.
        usage: The tokens of every successful LLM call of the turn, summed.
        started_at: When the turn started (trio clock): the priority of all
            its LLM calls.
        finished_at: When the answer was complete (trio clock).
        finish_reason: Why the model ended its answer (``"stop"``,
            ``"length"`` when it ran out of ``max_tokens``...), or ``None``
            if the provider did not say.
    """

    text: str
    llm_calls: int
    tool_calls: int
    retries: int
    usage: Usage
    started_at: float
    finished_at: float
    finish_reason: str | None


@final
@attrs.frozen
class ToolResult:
    """A tool call's result, as the model will read it.

    Attributes:
        call: The call it answers (its ``id`` is the result's
            ``tool_call_id`` in the history).
        content: The tool's output, or ``"error: ..."`` when the call was
            refused or the tool failed.
    """

    call: ToolCall
    content: str


@final
@attrs.frozen
class Retrying:
    """An LLM call of the turn failed and will be sent again after ``delay``.

    The deltas streamed since the last ``ToolResult`` (or since the turn
    began) belonged to the failed attempt: the answer starts over.

    Attributes:
        attempt: The attempt that failed, the first being 1 (rate limits
            waited out count here, though not against ``max_attempts``).
        error: Why it failed.
        delay: Seconds of backoff before the next attempt: ``0.0`` for a
            rate limit of a limited provider, whose next attempt queues at
            once and goes when the dispatcher's pause ends (a backoff if
            the dispatcher did not pause).
    """

    attempt: int
    error: ProviderError
    delay: float


@final
@attrs.frozen
class TurnFinished:
    """The turn is complete and committed to the history; always the last event.

    Attributes:
        result: What ``Conversation.ask`` returns for the same turn.
    """

    result: TurnResult


TurnEvent: TypeAlias = (
    TextDelta | ReasoningDelta | ToolCall | ToolResult | Retrying | TurnFinished
)
"""Anything ``Conversation.stream`` yields."""
