"""A chat request, as the conversation layer builds it for any provider.

These values say what to ask, not how: each provider turns a
``ChatRequest`` into its own wire JSON (OpenAI chat completions, Anthropic
messages). A conversation's history is a tuple of ``ChatMessage``: the
assistant's turns carry the ``ToolCall`` values its stream yielded, and each
tool result answers one of them by ``tool_call_id``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeVar, final

import attrs

from .._validation import (
    non_negative_int,
    non_negative_number,
    one_of,
    positive_int,
    real_number,
    shown_value,
    string,
    text,
    validator,
)
from ._stream import ToolCall

Role = Literal["system", "user", "assistant", "tool"]
"""Who speaks in a ``ChatMessage``."""

_ROLES = ("system", "user", "assistant", "tool")

_T = TypeVar("_T")


def _check_speaker(message: ChatMessage) -> None:
    """What a message carries goes with its role: tool calls, a tool_call_id."""
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


def _tuple_of(kind: type[_T], name: str, value: Any) -> tuple[_T, ...]:  # noqa: ANN401 (a converter's input)
    """``value`` as a tuple of ``kind`` values, or ``TypeError`` naming the field."""
    items = tuple(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{name} must hold {kind.__name__} values, got {item!r}")
    return items


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    return _tuple_of(ToolCall, "tool_calls", value)


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

    role: Role = attrs.field(validator=one_of(*_ROLES))
    content: str = attrs.field(validator=string)
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    tool_call_id: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(string)
    )
    name: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(text)
    )

    def __attrs_post_init__(self) -> None:
        _check_speaker(self)


def _parameters(value: Any) -> dict[str, Any]:  # noqa: ANN401 (an attrs converter takes anything)
    """A tool's JSON schema, as a deep copy."""
    if not isinstance(value, Mapping):
        raise TypeError(f"parameters must be a JSON schema object, got {value!r}")
    _check_json(value, "parameters")
    copied: dict[str, Any] = json.loads(json.dumps(dict(value)))
    return copied


@final
@attrs.frozen
class ToolSpec:
    """A tool the model may call.

    Attributes:
        name: The tool's name, as the model will call it.
        description: What it does, for the model.
        parameters: A JSON schema for its arguments (an ``"object"`` schema),
            held as a copy.
    """

    name: str = attrs.field(validator=text)
    description: str = attrs.field(validator=string)
    parameters: dict[str, Any] = attrs.field(converter=_parameters)


def _messages(value: Any) -> tuple[ChatMessage, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    return _tuple_of(ChatMessage, "messages", value)


def _tools(value: Any) -> tuple[ToolSpec, ...]:  # noqa: ANN401 (an attrs converter takes anything)
    return _tuple_of(ToolSpec, "tools", value)


# -- request options -------------------------------------------------------

# What either wire format's request body sets itself: ``extra`` may not set
# these, in either format, so one ``RequestOptions`` means the same thing
# whichever provider it goes to.
_RESERVED_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "stream",
        "stream_options",
        "tools",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stop_sequences",
    }
)


def _check_temperature(value: object, name: str) -> None:
    rule = "a number from 0 to 2"
    number = real_number(value, name, rule)
    if not (math.isfinite(number) and 0 <= number <= 2):
        raise ValueError(f"{name} must be {rule}, got {shown_value(value)}")


def _check_top_p(value: object, name: str) -> None:
    rule = "a number above 0 and at most 1"
    number = real_number(value, name, rule)
    if not 0 < number <= 1:
        raise ValueError(f"{name} must be {rule}, got {shown_value(value)}")


def _stop(value: Any) -> tuple[str, ...] | None:  # noqa: ANN401 (an attrs converter takes anything)
    """Stop sequences as a tuple of non-empty strings; ``None`` for none."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise TypeError(f"stop must be a tuple of strings, got {value!r}")
    for item in value:
        if not isinstance(item, str):
            raise TypeError(f"stop must be a tuple of strings, got {item!r} in it")
        if not item:
            raise ValueError("stop sequences must be non-empty strings, got ''")
    if not value:
        raise ValueError("stop must hold at least one string, got ()")
    return tuple(value)


def _check_json(value: object, where: str) -> None:
    """``value`` is JSON: null, a boolean, a finite number, a string, an array, an object."""
    if value is None or isinstance(value, bool | str | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be JSON, got {value!r}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} must be JSON, got the key {key!r}")
            _check_json(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} must be JSON, got {type(value).__name__}")


def _extra(value: Any) -> dict[str, object] | None:  # noqa: ANN401 (an attrs converter takes anything)
    """Checked body fields, as a deep copy; ``None`` for none."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"extra must be a mapping of field names to JSON, got {value!r}"
        )
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"extra keys must be non-empty strings, got {key!r}")
        if not key:
            raise ValueError("extra keys must be non-empty strings, got ''")
        if key in _RESERVED_FIELDS:
            raise ValueError(f"extra must not set {key!r}: the request sets it")
        _check_json(item, f"extra[{key!r}]")
    # A copy through JSON: later changes to the caller's dicts change
    # nothing here, and what is held is exactly what will be sent.
    copied: dict[str, object] = json.loads(json.dumps(dict(value)))
    return copied


def _merge_extra(
    base: dict[str, object] | None, over: dict[str, object] | None
) -> dict[str, object] | None:
    if base is None or over is None:
        return over if base is None else base
    return {**base, **over}


@final
@attrs.frozen
class RequestOptions:
    """How to sample an answer: one frozen value for every LLM call of a turn.

    Give one per conversation (``ConversationOptions.request_options``)
    and per turn (``Conversation.ask(text, options=...)`` and
    ``Conversation.stream(text, options=...)``): a turn's fields that are
    set win over the conversation's, field by field, and ``extra`` merges
    key by key, the turn's keys winning. ``None`` leaves a field to the
    conversation, then to the provider's default. Every field is checked
    when the value is made.

    Attributes:
        temperature: The sampling temperature, from 0 to 2 (OpenAI's
            range; Anthropic's is 0 to 1, and its API refuses more with a
            ``ProviderBadRequest``).
        top_p: Nucleus sampling: above 0 and at most 1.
        max_tokens: The most tokens to generate, a positive integer.
        stop: Stop sequences: a tuple (or list) of non-empty strings, sent
            as OpenAI's ``stop`` and Anthropic's ``stop_sequences``. Not
            capped here: OpenAI's own API takes at most 4 and refuses more,
            Anthropic and OpenAI-compatible servers (vLLM) take more.
        extra: More fields for the request body, as JSON values, added
            last: a provider's own settings (``tool_choice``, ``seed``,
            ``top_k``, ``response_format``...). A field that either wire
            format sets itself (``model``, ``messages``, ``system``,
            ``stream``, ``stream_options``, ``tools``, ``max_tokens``,
            ``temperature``, ``top_p``, ``stop``, ``stop_sequences``) is
            refused, so nothing the request sets is silently replaced.
    """

    temperature: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(_check_temperature))
    )
    top_p: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(_check_top_p))
    )
    max_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_int)
    )
    stop: tuple[str, ...] | None = attrs.field(default=None, converter=_stop)
    extra: dict[str, object] | None = attrs.field(default=None, converter=_extra)


def merge_options(base: RequestOptions, over: RequestOptions | None) -> RequestOptions:
    """``over``'s fields that are set, over ``base``'s; ``extra`` key by key."""
    if over is None:
        return base
    return RequestOptions(
        temperature=base.temperature if over.temperature is None else over.temperature,
        top_p=base.top_p if over.top_p is None else over.top_p,
        max_tokens=base.max_tokens if over.max_tokens is None else over.max_tokens,
        stop=base.stop if over.stop is None else over.stop,
        extra=_merge_extra(base.extra, over.extra),
    )


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
        top_p: Nucleus sampling, above 0 and at most 1, or ``None``.
        stop: Stop sequences (non-empty strings), or ``None``.
        extra: More request body fields, added last (see
            ``RequestOptions.extra``), or ``None``.
        stable_prefix: How many of ``messages``, from the first, will be
            sent again unchanged on the conversation's next calls: the
            prefix worth caching (Anthropic marks its end with a
            ``cache_control`` breakpoint). 0, the default, marks none.
        cache_key: A stable key for the conversation, sent as OpenAI's
            ``prompt_cache_key`` so its calls reach the same prompt cache;
            ``None`` sends none.
    """

    messages: tuple[ChatMessage, ...] = attrs.field(converter=_messages)
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_tools)
    max_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_int)
    )
    temperature: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_number)
    )
    system: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(string)
    )
    top_p: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(validator(_check_top_p))
    )
    stop: tuple[str, ...] | None = attrs.field(default=None, converter=_stop)
    extra: dict[str, object] | None = attrs.field(default=None, converter=_extra)
    stable_prefix: int = attrs.field(default=0, validator=non_negative_int)
    cache_key: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(text)
    )

    @stable_prefix.validator
    def _check_stable_prefix(self, _attribute: object, value: int) -> None:
        if value > len(self.messages):
            raise ValueError(
                "stable_prefix must be at most the number of messages"
                f" ({len(self.messages)}), got {value}"
            )


def check_chat_request(request: object) -> ChatRequest:
    """``request``, if it is a ``ChatRequest``: what a provider's ``stream`` takes."""
    if not isinstance(request, ChatRequest):
        raise TypeError(f"request must be a ChatRequest, got {request!r}")
    return request
