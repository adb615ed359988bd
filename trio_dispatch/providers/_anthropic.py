"""Anthropic's Messages API, streamed.

The wire format, as Anthropic documents it: ``POST {base_url}/v1/messages``
with ``"stream": true`` answers with named server-sent events::

    message_start         message.usage: input_tokens, output_tokens,
                          cache_creation_input_tokens, cache_read_input_tokens
    content_block_start   index, content_block: text | thinking | tool_use (id, name)
    content_block_delta   index, delta: text_delta (text), thinking_delta
                          (thinking), input_json_delta (partial_json),
                          signature_delta (ignored)
    content_block_stop    index
    message_delta         delta.stop_reason, usage.output_tokens (cumulative)
    message_stop          the terminator
    ping                  keep-alive
    error                 error: {type: overloaded_error, ..., message}

Unknown event types are ignored: the documentation says new ones may be
added. ``_AnthropicDecoder`` yields text and thinking as they come, a
``ToolCall`` at its block's ``content_block_stop`` (its JSON input
accumulated from ``input_json_delta``), ``Finish`` at the ``message_delta``
with the stop reason, and ``Usage`` at ``message_stop``. A stream that ends
before ``message_stop`` was cut short: ``StreamInterrupted``.

Almost every event is a ``content_block_delta``, and one process decodes
every stream of a fleet, so those take a fast path: plain dict lookups that
check every field ``_ContentBlockDelta`` would. One it does not fully
recognise (a field of the wrong type, a block that never started or has
stopped) goes through the full path, the attrs classes below structured by
cattrs, whose messages name the wrong field; both paths share the state
changes, and a property test holds them to the same events and errors.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar, final

import attrs

from .._validation import check_limit, check_text
from .._wire import error_for_type, make_tool_call
from ..messages import Finish, ReasoningDelta, TextDelta, Usage
from ._checks import check_header_value
from ._decode import WireDecoder, parse_json_data, structure_event
from ._http import ProviderBase
from ._ratelimit_headers import anthropic_rate_limits

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import httpx2

    from .._provider import RateLimitObserver, RateLimitReporter
    from ..messages import ChatMessage, ChatRequest, StreamEvent
    from ._sse import ServerSentEvent


_T = TypeVar("_T")


# -- the wire, as attrs values (extra fields are ignored) --------------------


@attrs.frozen
class _Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


@attrs.frozen
class _Message:
    usage: _Usage | None = None


@attrs.frozen
class _MessageStart:
    message: _Message


@attrs.frozen
class _ContentBlock:
    type: str
    id: str | None = None
    name: str | None = None
    text: str | None = None
    thinking: str | None = None


@attrs.frozen
class _ContentBlockStart:
    index: int
    content_block: _ContentBlock


@attrs.frozen
class _BlockDelta:
    type: str
    text: str | None = None
    thinking: str | None = None
    partial_json: str | None = None


@attrs.frozen
class _ContentBlockDelta:
    index: int
    delta: _BlockDelta


@attrs.frozen
class _ContentBlockStop:
    index: int


@attrs.frozen
class _MessageDeltaBody:
    stop_reason: str | None = None


@attrs.frozen
class _MessageDelta:
    delta: _MessageDeltaBody
    usage: _Usage | None = None


@attrs.frozen
class _ErrorBody:
    type: str
    message: str = ""


@attrs.frozen
class _Error:
    error: _ErrorBody


_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

# Which field of a delta carries its payload; other delta types (the
# thinking block's signature_delta, citations) carry nothing we yield.
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


@attrs.define
class _Block:
    type: str
    id: str = ""
    name: str = ""
    json_parts: list[str] = attrs.Factory(list)
    stopped: bool = False


class _AnthropicDecoder(WireDecoder):
    """Messages stream events in, stream events out; see the module notes."""

    _terminator = "message_stop"

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        super().__init__(provider, redact)
        self._blocks: dict[int, _Block] = {}
        # The last count of each kind, by its wire name; _saw_usage: any came.
        self._usage: dict[str, int] = {}
        self._saw_usage = False
        self._finished = False

    def _feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        if not event.data.strip():
            return []
        payload = parse_json_data(self._provider, event, self._redact)
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            raise self._malformed(
                f"an event has no type: {self._redact(event.data)[:80]!r}"
            )
        kind = payload["type"]
        if kind == "error":
            error = self._structure(payload, _Error).error
            raise error_for_type(self._provider, error.type, error.message)
        handlers: dict[str, Callable[[dict[str, Any]], list[StreamEvent]]] = {
            "message_start": self._on_message_start,
            "content_block_start": self._on_block_start,
            "content_block_delta": self._on_block_delta,
            "content_block_stop": self._on_block_stop,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
        }
        handler = handlers.get(kind)
        if handler is None:
            return []  # ping, and event types added after this was written
        return handler(payload)

    def _structure(self, payload: dict[str, Any], cls: type[_T]) -> _T:
        return structure_event(
            self._provider, payload, cls, f"a {payload['type']} event"
        )

    def _on_message_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._on_usage(self._structure(payload, _MessageStart).message.usage)
        return []

    def _on_usage(self, usage: _Usage | None) -> None:
        # message_delta's counts are cumulative, so the last one seen wins.
        if usage is not None:
            self._saw_usage = True
            counts = attrs.asdict(usage).items()
            self._usage.update((kind, n) for kind, n in counts if n is not None)

    def _on_block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        start = self._structure(payload, _ContentBlockStart)
        if start.index in self._blocks:
            raise self._malformed(f"content block {start.index} started twice")
        content = start.content_block
        block = _Block(content.type)
        self._blocks[start.index] = block
        if content.type == "tool_use":
            if not content.id or not content.name:
                raise self._malformed(
                    f"tool_use block {start.index} arrived without its id and name"
                )
            block.id, block.name = content.id, content.name
        elif content.type == "text" and content.text:
            return [TextDelta(content.text)]
        elif content.type == "thinking" and content.thinking:
            return [ReasoningDelta(content.thinking)]
        return []

    def _fast(  # noqa: PLR0911 (the hot path, kept flat)
        self, payload: object, event: ServerSentEvent
    ) -> list[StreamEvent] | None:
        """A ``content_block_delta``'s events, or ``None`` to take the full path.

        Checks every field ``_ContentBlockDelta`` would, and that its block
        is open; leaves everything else (and every message) to the full path.
        """
        if (
            not isinstance(payload, dict)
            or payload.get("type") != "content_block_delta"
        ):
            return None
        index = payload.get("index")
        delta = payload.get("delta")
        # type(), not isinstance(): a bool is an int, and not an index.
        if type(index) is not int or not isinstance(delta, dict):
            return None
        block = self._blocks.get(index)
        if block is None or block.stopped:
            return None
        kind = delta.get("type")
        if len(delta) == 2:
            # The commonest shapes, {"type": "text_delta", "text": ...} and
            # its thinking twin, have no other field to check.
            if kind == "text_delta":
                value = delta.get("text")
                if isinstance(value, str):
                    return [TextDelta(value)] if value else []
            elif kind == "thinking_delta":
                value = delta.get("thinking")
                if isinstance(value, str):
                    return [ReasoningDelta(value)] if value else []
        text = delta.get("text")
        thinking = delta.get("thinking")
        partial_json = delta.get("partial_json")
        if not (
            isinstance(kind, str)
            and (text is None or isinstance(text, str))
            and (thinking is None or isinstance(thinking, str))
            and (partial_json is None or isinstance(partial_json, str))
        ):
            return None
        field = _DELTA_FIELDS.get(kind)
        if field is None:
            return []
        return self._on_delta(block, index, kind, field, delta.get(field))

    def _on_block_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        delta_event = self._structure(payload, _ContentBlockDelta)
        block = self._blocks.get(delta_event.index)
        if block is None:
            raise self._malformed(
                f"a content_block_delta for block {delta_event.index}, "
                "which never started"
            )
        if block.stopped:
            raise self._malformed(
                f"a content_block_delta for block {delta_event.index} after its stop"
            )
        delta = delta_event.delta
        field = _DELTA_FIELDS.get(delta.type)
        if field is None:
            return []
        return self._on_delta(
            block, delta_event.index, delta.type, field, getattr(delta, field)
        )

    def _on_delta(
        self, block: _Block, index: int, kind: str, field: str, value: str | None
    ) -> list[StreamEvent]:
        """What a block's delta yields, whichever path decoded it."""
        if value is None:
            raise self._malformed(f"a {kind} without {field} (block {index})")
        if kind == "input_json_delta":
            block.json_parts.append(value)
            return []
        if not value:
            return []
        if kind == "text_delta":
            return [TextDelta(value)]
        return [ReasoningDelta(value)]

    def _on_block_stop(self, payload: dict[str, Any]) -> list[StreamEvent]:
        stop = self._structure(payload, _ContentBlockStop)
        block = self._blocks.get(stop.index)
        if block is None:
            raise self._malformed(
                f"a content_block_stop for block {stop.index}, which never started"
            )
        if block.stopped:
            # Two stops would make two calls with one id, which the API
            # then refuses for good when their results come back.
            raise self._malformed(f"content block {stop.index} stopped twice")
        block.stopped = True
        if block.type != "tool_use":
            return []
        return [make_tool_call(block.id, block.name, "".join(block.json_parts))]

    def _on_message_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        message_delta = self._structure(payload, _MessageDelta)
        self._on_usage(message_delta.usage)
        reason = message_delta.delta.stop_reason
        if reason is None or self._finished:
            return []
        self._finished = True
        return [Finish(_STOP_REASONS.get(reason, reason))]

    def _on_message_stop(self, _payload: dict[str, Any]) -> list[StreamEvent]:
        self._done = True
        if not self._finished:
            raise self._malformed("message_stop arrived before any stop_reason")
        if not self._saw_usage:
            return []
        counts = self._usage
        return [
            Usage(
                input_tokens=counts.get("input_tokens", 0),
                output_tokens=counts.get("output_tokens", 0),
                cache_read_tokens=counts.get("cache_read_input_tokens", 0),
                cache_write_tokens=counts.get("cache_creation_input_tokens", 0),
            )
        ]


# -- the request -------------------------------------------------------------


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    """The content blocks of a user, assistant or tool message."""
    blocks: list[dict[str, Any]] = []
    if message.role == "tool":
        blocks.append(
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
            }
        )
    elif message.content:  # the API refuses empty text blocks
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        for call in message.tool_calls
    )
    return blocks


# A fresh dict at each use: the body is the caller's to change.
def _ephemeral() -> dict[str, str]:
    return {"type": "ephemeral"}


def request_body(model: str, max_tokens: int, request: ChatRequest) -> dict[str, Any]:
    """The JSON body of a streaming Messages request for ``request``.

    The system prompt goes top-level, joined with any system messages in
    the history (the API has no system role). Tool results become
    ``tool_result`` blocks of a user turn and tool calls ``tool_use``
    blocks of the assistant's; consecutive turns of one role are merged,
    since the API wants user and assistant to alternate.

    Prompt caching: a ``cache_control`` breakpoint goes on the last tool,
    on the system prompt and on the last block of the request's stable
    prefix (its first ``stable_prefix`` messages), each only when there is
    one: at most three of the API's four. The API caches the prefix up to
    each breakpoint, and a later request whose prefix matches reads it.
    """
    system = [request.system] if request.system else []
    messages: list[dict[str, Any]] = []
    stable_end: dict[str, Any] | None = None
    for index, message in enumerate(request.messages):
        if index == request.stable_prefix and messages:
            stable_end = messages[-1]["content"][-1]
        if message.role == "system":
            system.append(message.content)
            continue
        blocks = _blocks(message)
        if not blocks:
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    if request.stable_prefix == len(request.messages) and messages:
        stable_end = messages[-1]["content"][-1]
    if stable_end is not None:
        stable_end["cache_control"] = _ephemeral()
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens or max_tokens,
        "messages": messages,
        "stream": True,
    }
    if system:
        # As a block, since only a block takes a breakpoint.
        body["system"] = [
            {"type": "text", "text": "\n\n".join(system), "cache_control": _ephemeral()}
        ]
    if request.tools:
        body["tools"] = [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.parameters,
            }
            for tool in request.tools
        ]
        body["tools"][-1]["cache_control"] = _ephemeral()
    sampling = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop_sequences": None if request.stop is None else list(request.stop),
    }
    body.update((key, value) for key, value in sampling.items() if value is not None)
    if request.extra:
        # Last, and never over a field set above: ChatRequest refuses those.
        body.update(request.extra)
    return body


@final
class AnthropicProvider(ProviderBase):
    """Anthropic's Messages API, streamed over HTTP.

    Use it as an async context manager, or call ``aclose()``, to close the
    HTTP client it made; a client you lend it stays yours to close.

    Args:
        id: The provider's id, as the dispatcher knows it.
        base_url: The API root without the version, as the official SDK
            takes it; requests go to ``{base_url}/v1/messages``.
            Credentials in it are masked, as ``OpenAIProvider`` does.
        api_key: Sent as ``x-api-key``; checked, and never shown, as
            ``OpenAIProvider`` does.
        model: The model to ask for.
        anthropic_version: The ``anthropic-version`` header.
        max_tokens: Sent when the request has no ``max_tokens`` (the API
            requires one).
        extra_headers: More headers for every request (an ``anthropic-beta``
            flag, a proxy's routing header), checked as ``OpenAIProvider``
            checks them. The key, version and content type headers are
            always the provider's own.

    ``client``, ``connect_timeout``, ``read_timeout``, ``on_rate_limit`` and
    ``on_rate_limits`` are as for ``OpenAIProvider``.
    """

    def __init__(
        self,
        id: str = "anthropic",
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str,
        model: str,
        client: httpx2.AsyncClient | None = None,
        anthropic_version: str = "2023-06-01",
        max_tokens: int = 4096,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        extra_headers: Mapping[str, str] | None = None,
        on_rate_limit: RateLimitReporter | None = None,
        on_rate_limits: RateLimitObserver | None = None,
    ) -> None:
        check_text(anthropic_version, "anthropic_version")
        check_header_value(anthropic_version, "anthropic_version")
        check_limit(max_tokens, "max_tokens")
        # Last, once every argument is known good: it may make a client.
        super().__init__(
            id,
            base_url=base_url,
            api_key=api_key,
            model=model,
            client=client,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            extra_headers=extra_headers,
            on_rate_limit=on_rate_limit,
            on_rate_limits=on_rate_limits,
            path="/v1/messages",
            key_header=("x-api-key", ""),
            headers={"anthropic-version": anthropic_version},
            body=functools.partial(request_body, model, max_tokens),
            decoder=_AnthropicDecoder,
            read_rate_limits=anthropic_rate_limits,
        )
