"""The events a provider's stream yields, the same for every wire format.

A stream yields text and reasoning deltas as they arrive, each tool call
once and complete, then ``Finish`` and (when the provider reports it)
``Usage``, and ends. Anything else (a status error, a disconnect, a stream
cut short, an event that makes no sense) is raised as a ``ProviderError``
from ``trio_dispatch.providers``, never yielded.
"""

from __future__ import annotations

from typing import Any, TypeAlias, final

import attrs


@final
@attrs.frozen
class TextDelta:
    """The next piece of the assistant's visible answer."""

    text: str


@final
@attrs.frozen
class ReasoningDelta:
    """The next piece of the model's reasoning (thinking), when it shows it."""

    text: str


@final
@attrs.frozen
class ToolCall:
    """One complete tool call, yielded once its arguments have all arrived.

    The arguments arrive as JSON text in pieces and are parsed once, at the
    end. When the text is not a JSON object, ``arguments`` is empty and
    ``arguments_error`` says what was wrong, so the conversation can answer
    the model with an error tool result instead of failing the turn.

    Attributes:
        id: The provider's id for the call; a tool result answers it.
        name: The tool's name.
        arguments: The parsed arguments (``{}`` when they did not parse).
        raw_arguments: The arguments exactly as the model wrote them; empty
            for a call built by hand, which is sent as ``arguments``.
        arguments_error: Why ``raw_arguments`` is not a JSON object, or
            ``None`` when it is.
    """

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    raw_arguments: str = ""
    arguments_error: str | None = None


@final
@attrs.frozen
class Usage:
    """Token counts for one request, normalised so the four parts add up.

    The parts never overlap: the prompt cost ``input_tokens`` at the full
    rate, ``cache_read_tokens`` read from the provider's prompt cache and
    ``cache_write_tokens`` written to it. (OpenAI's ``prompt_tokens``
    includes its ``cached_tokens``; they are taken out of ``input_tokens``
    here. Anthropic already reports the parts apart.)

    Attributes:
        input_tokens: Prompt tokens neither read from nor written to the cache.
        output_tokens: Generated tokens, reasoning included.
        cache_read_tokens: Prompt tokens read from the cache.
        cache_write_tokens: Prompt tokens written to the cache.
    """

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token, cached or not."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens


@final
@attrs.frozen
class Finish:
    """Why the model stopped.

    ``reason`` is normalised across providers: ``"stop"`` (a natural end or
    a stop sequence), ``"tool_calls"`` (it wants tool results), ``"length"``
    (it hit the token limit) or ``"content_filter"``; any other value is
    the provider's own, unchanged.
    """

    reason: str


StreamEvent: TypeAlias = TextDelta | ReasoningDelta | ToolCall | Usage | Finish
"""Anything a provider's stream yields."""
