"""A chat request, as the conversation layer builds it for any provider.

These values say what to ask, not how: each provider turns a
``ChatRequest`` into its own wire JSON (OpenAI chat completions, Anthropic
messages). A conversation's history is a tuple of ``ChatMessage``: the
assistant's turns carry the ``ToolCall`` values its stream yielded, and each
tool result answers one of them by ``tool_call_id``.
"""

from __future__ import annotations

from typing import Any, Literal, final

import attrs

from .._validation import non_negative_number, positive_int
from ._stream import ToolCall

Role = Literal["system", "user", "assistant", "tool"]
"""Who speaks in a ``ChatMessage``."""

_ROLES = ("system", "user", "assistant", "tool")


def _check_message(message: ChatMessage) -> None:
    if message.role not in _ROLES:
        raise ValueError(
            f"role must be one of {', '.join(_ROLES)}, got {message.role!r}"
        )
    if message.tool_calls and message.role != "assistant":
        raise ValueError(
            f"only assistant messages carry tool_calls, got role {message.role!r}"
        )
    if message.role == "tool" and not message.tool_call_id:
        raise ValueError("a tool message needs the tool_call_id it answers")
    if message.role != "tool" and message.tool_call_id is not None:
        raise ValueError(
            f"only tool messages carry a tool_call_id, got role {message.role!r}"
        )


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    calls = tuple(value)
    for call in calls:
        if not isinstance(call, ToolCall):
            raise TypeError(f"tool_calls must hold ToolCall values, got {call!r}")
    return calls


@final
@attrs.frozen
class ChatMessage:
    """One turn of a conversation.

    Attributes:
        role: ``"system"``, ``"user"``, ``"assistant"`` or ``"tool"``.
        content: The text. An assistant turn that only calls tools may
            leave it empty.
        tool_calls: The calls an assistant turn made (assistant only).
        tool_call_id: The call a tool result answers (tool only, required).
        name: An optional participant name (OpenAI's ``name``; Anthropic
            has no such field and ignores it).
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    tool_call_id: str | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        _check_message(self)


@final
@attrs.frozen
class ToolSpec:
    """A tool the model may call.

    Attributes:
        name: The tool's name, as the model will call it.
        description: What it does, for the model.
        parameters: A JSON schema for its arguments (an ``"object"`` schema).
    """

    name: str
    description: str
    parameters: dict[str, Any]


def _messages(value: Any) -> tuple[ChatMessage, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    messages = tuple(value)
    for message in messages:
        if not isinstance(message, ChatMessage):
            raise TypeError(f"messages must hold ChatMessage values, got {message!r}")
    return messages


def _tools(value: Any) -> tuple[ToolSpec, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    tools = tuple(value)
    for tool in tools:
        if not isinstance(tool, ToolSpec):
            raise TypeError(f"tools must hold ToolSpec values, got {tool!r}")
    return tools


@final
@attrs.frozen
class ChatRequest:
    """Everything one LLM call needs, whatever the provider.

    Attributes:
        messages: The conversation so far, oldest first.
        tools: The tools the model may call.
        max_tokens: The most tokens to generate, or ``None`` for the
            provider's default (Anthropic requires one; its provider fills
            in its own default).
        temperature: The sampling temperature, or ``None`` for the default.
        system: A system prompt, sent before the messages (as OpenAI's
            first system message, as Anthropic's top-level ``system``).
    """

    messages: tuple[ChatMessage, ...] = attrs.field(converter=_messages)
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_tools)
    max_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_int)
    )
    temperature: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_number)
    )
    system: str | None = None
