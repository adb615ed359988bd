"""Anthropic's Messages API, streamed.

Everything the package knows of the format, in one place: the endpoint and
the headers (``ANTHROPIC``), the request body (``request_body``), the
stream's decoder (``AnthropicDecoder``) and encoder (``encode_stream``, for
the fake server), the error bodies, and the ``anthropic-ratelimit-*``
headers, read and written.

The wire format, as Anthropic documents it: ``POST {base_url}/v1/messages``
with ``x-api-key: <key>``, ``anthropic-version`` and ``"stream": true``
answers with named server-sent events::

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
added. ``AnthropicDecoder`` yields text and thinking as they come, a
``ToolCall`` at its block's ``content_block_stop`` (its JSON input
accumulated from ``input_json_delta``), ``Finish`` at the ``message_delta``
with the stop reason, and ``Usage`` at ``message_stop``. A stream that ends
before ``message_stop`` was cut short: ``StreamInterrupted``. It reads each
event by hand (why: ``_decoder.py``); one that does not fit its shape
(``EVENTS``) is refused with every wrong field named.

Rate limits come as ``anthropic-ratelimit-{requests,tokens,input-tokens,
output-tokens}-{limit,remaining,reset}``, resets as RFC 3339 times, and
``retry-after`` on a 429.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..messages import Finish, ReasoningDelta, TextDelta, Usage
from ._decoder import INT, TEXT, Field, Obj, WireDecoder, problems
from ._encode import (
    CachePlan,
    CacheSegment,
    ReplyPlan,
    WireEvent,
    marked,
    segment_text,
    sse,
)
from ._errors import error_for_type, make_tool_call
from ._format import Format
from ._headers import (
    HeaderReader,
    ceil_ms,
    figures,
    header_figures,
    http_date,
    reference_time,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._policy._ratelimits import RateLimitInfo
    from ..messages import ChatMessage, ChatRequest, StreamEvent
    from ._sse import ServerSentEvent


# -- the stream ----------------------------------------------------------------

_USAGE: Final = Obj(tuple(
    Field(name, INT)
    for name in (
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    )
))  # fmt: skip
_INDEX: Final = Field("index", INT, required=True, nullable=False)
#: Each event the decoder reads, as far as it reads it (other fields are ignored).
EVENTS: Final = {
    "message_start": Obj((
        Field("message", Obj((Field("usage", _USAGE),)), required=True, nullable=False),
    )),
    "content_block_start": Obj((
        _INDEX,
        Field("content_block", Obj((
            Field("type", TEXT, required=True, nullable=False),
            Field("id", TEXT),
            Field("name", TEXT),
            Field("text", TEXT),
            Field("thinking", TEXT),
        )), required=True, nullable=False),
    )),
    "content_block_delta": Obj((
        _INDEX,
        Field("delta", Obj((
            Field("type", TEXT, required=True, nullable=False),
            Field("text", TEXT),
            Field("thinking", TEXT),
            Field("partial_json", TEXT),
        )), required=True, nullable=False),
    )),
    "content_block_stop": Obj((_INDEX,)),
    "message_delta": Obj((
        Field("delta", Obj((Field("stop_reason", TEXT),)), required=True, nullable=False),
        Field("usage", _USAGE),
    )),
    "error": Obj((
        Field("error", Obj((
            Field("type", TEXT, required=True, nullable=False),
            Field("message", TEXT, nullable=False),
        )), required=True, nullable=False),
    )),
}  # fmt: skip

_STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}

# Which field of a delta carries its payload; other delta types (the
# thinking block's signature_delta, citations) carry nothing we yield.
_DELTA_FIELDS: Final = {
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


def _is_text(value: object) -> bool:
    return value is None or type(value) is str


class AnthropicDecoder(WireDecoder):
    """Messages stream events in, stream events out; see the module notes."""

    _terminator = "message_stop"

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        super().__init__(provider, redact)
        self._blocks: dict[int, _Block] = {}
        # The last count of each kind, by its wire name; _saw_usage: any came.
        self._usage: dict[str, int] = {}
        self._saw_usage = False
        self._finished = False
        self._handlers: dict[str, Callable[[dict[str, Any]], list[StreamEvent]]] = {
            "message_start": self._on_message_start,
            "content_block_start": self._on_block_start,
            "content_block_delta": self._on_block_delta,
            "content_block_stop": self._on_block_stop,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
            "error": self._on_error,
        }

    def _on_payload(self, payload: object, event: ServerSentEvent) -> list[StreamEvent]:
        kind = payload.get("type") if type(payload) is dict else None
        if type(kind) is not str:
            raise self._malformed(
                f"an event has no type: {self._redact(event.data)[:80]!r}"
            )
        handler = self._handlers.get(kind)
        if handler is None:
            return []  # ping, and event types added after this was written
        assert type(payload) is dict
        return handler(payload)

    def _check(self, payload: dict[str, Any]) -> None:
        """Refuse ``payload`` unless it fits its type's shape (a rare event's check)."""
        kind = payload["type"]
        if problems(payload, EVENTS[kind]):
            raise self._misfit(payload, EVENTS[kind], f"a {kind} event")

    def _on_error(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._check(payload)
        error = payload["error"]
        raise error_for_type(self._provider, error["type"], error.get("message", ""))

    def _on_message_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._check(payload)
        self._on_usage(payload["message"].get("usage"))
        return []

    def _on_usage(self, usage: dict[str, Any] | None) -> None:
        # message_delta's counts are cumulative, so the last one seen wins.
        if usage is not None:
            self._saw_usage = True
            for field in _USAGE.fields:
                count = usage.get(field.name)
                if count is not None:
                    self._usage[field.name] = count

    def _on_block_start(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._check(payload)
        index = payload["index"]
        content = payload["content_block"]
        if index in self._blocks:
            raise self._malformed(f"content block {index} started twice")
        kind = content["type"]
        block = _Block(kind)
        self._blocks[index] = block
        if kind == "tool_use":
            if not content.get("id") or not content.get("name"):
                raise self._malformed(
                    f"tool_use block {index} arrived without its id and name"
                )
            block.id, block.name = content["id"], content["name"]
        elif kind == "text" and content.get("text"):
            return [TextDelta(content["text"])]
        elif kind == "thinking" and content.get("thinking"):
            return [ReasoningDelta(content["thinking"])]
        return []

    def _on_block_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        index = payload.get("index")
        delta = payload.get("delta")
        # type(), not isinstance(): a bool is an int, and not an index.
        if type(index) is not int or type(delta) is not dict:
            raise self._misfit(
                payload, EVENTS["content_block_delta"], "a content_block_delta event"
            )
        kind = delta.get("type")
        if len(delta) == 2:
            # The commonest shapes, {"type": "text_delta", "text": ...} and
            # its thinking twin, have no other field to check.
            block = self._blocks.get(index)
            if block is not None and not block.stopped:
                if kind == "text_delta":
                    value = delta.get("text")
                    if type(value) is str:
                        return [TextDelta(value)] if value else []
                elif kind == "thinking_delta":
                    value = delta.get("thinking")
                    if type(value) is str:
                        return [ReasoningDelta(value)] if value else []
        if not (
            type(kind) is str
            and _is_text(delta.get("text"))
            and _is_text(delta.get("thinking"))
            and _is_text(delta.get("partial_json"))
        ):
            raise self._misfit(
                payload, EVENTS["content_block_delta"], "a content_block_delta event"
            )
        block = self._blocks.get(index)
        if block is None:
            raise self._malformed(
                f"a content_block_delta for block {index}, which never started"
            )
        if block.stopped:
            raise self._malformed(
                f"a content_block_delta for block {index} after its stop"
            )
        return self._on_delta(block, index, kind, delta)

    def _on_delta(
        self, block: _Block, index: int, kind: str, delta: dict[str, Any]
    ) -> list[StreamEvent]:
        """What a checked delta of an open block yields."""
        field = _DELTA_FIELDS.get(kind)
        if field is None:
            return []
        value = delta.get(field)
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
        self._check(payload)
        index = payload["index"]
        block = self._blocks.get(index)
        if block is None:
            raise self._malformed(
                f"a content_block_stop for block {index}, which never started"
            )
        if block.stopped:
            # Two stops would make two calls with one id, which the API
            # then refuses for good when their results come back.
            raise self._malformed(f"content block {index} stopped twice")
        block.stopped = True
        if block.type != "tool_use":
            return []
        return [make_tool_call(block.id, block.name, "".join(block.json_parts))]

    def _on_message_delta(self, payload: dict[str, Any]) -> list[StreamEvent]:
        self._check(payload)
        self._on_usage(payload.get("usage"))
        reason = payload["delta"].get("stop_reason")
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


# -- the stream, written (the fake server's) -------------------------------------

_WIRE_STOP: Final = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def encode_stream(plan: ReplyPlan, *, include_usage: bool = True) -> list[WireEvent]:
    """``plan`` as the events of a stream, ``message_stop`` last.

    ``include_usage`` is OpenAI's; a Messages stream always says its usage.
    """

    def event(
        name: str,
        *,
        token: bool = False,
        events: tuple[StreamEvent, ...] = (),
        malformed: str | None = None,
        **fields: object,
    ) -> WireEvent:
        data = sse({"type": name, **fields}, name)
        return WireEvent(data, token, events, malformed)

    events = [
        event(
            "message_start",
            message={
                "id": f"msg_{plan.message_id}",
                "type": "message",
                "role": "assistant",
                "model": plan.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": plan.input_tokens,
                    "cache_creation_input_tokens": plan.cache_write,
                    "cache_read_input_tokens": plan.cache_read,
                    "output_tokens": 1,
                },
            },
        ),
        event("ping"),
    ]
    index = 0
    word_blocks: list[tuple[str, list[str], Callable[[str], StreamEvent]]] = [
        ("thinking", plan.reasoning, ReasoningDelta),
        ("text", plan.text, TextDelta),
    ]
    for kind, block_words, meaning in word_blocks:
        if not block_words:
            continue
        events.append(
            event(
                "content_block_start",
                index=index,
                content_block={"type": kind, kind: ""},
            )
        )
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": f"{kind}_delta", kind: word},
                events=(meaning(word),),
            )
            for word in block_words
        )
        if kind == "thinking":
            events.append(
                event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "signature_delta", "signature": "ZmFrZQ=="},
                )
            )
        events.append(event("content_block_stop", index=index))
        index += 1
    for call, tool_call in zip(plan.calls, plan.tool_calls(), strict=True):
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        missing = f"tool_use block {index} arrived without its id and name"
        events.append(
            event(
                "content_block_start",
                index=index,
                content_block=block,
                malformed=None if call.id and call.name else missing,
            )
        )
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
            for piece in ["", *call.pieces]
        )
        events.append(event("content_block_stop", index=index, events=(tool_call,)))
        index += 1
    events.append(
        event(
            "message_delta",
            delta={
                "stop_reason": _WIRE_STOP.get(plan.finish, plan.finish),
                "stop_sequence": None,
            },
            usage={"output_tokens": plan.output_tokens},
            events=(Finish(plan.finish),),
        )
    )
    usage = Usage(
        input_tokens=plan.input_tokens,
        output_tokens=plan.output_tokens,
        cache_read_tokens=plan.cache_read,
        cache_write_tokens=plan.cache_write,
    )
    events.append(event("message_stop", events=(usage,)))
    return events


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """An error answer's JSON body."""
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": "req_fake",
    }


def error_event(error_type: str, message: str) -> bytes:
    """An ``error`` event in the stream."""
    payload = {"type": "error", "error": {"type": error_type, "message": message}}
    return sse(payload, "error")


# -- prompt caching (the fake server's) -------------------------------------------


def cache_plan(body: dict[str, Any]) -> CachePlan | None:
    """How the API caches ``body``'s prompt, or ``None`` without a breakpoint.

    Tools, the system prompt, then each content block; the prefix up to
    each ``cache_control`` breakpoint is cached, and the longest cached
    prefix ending at or before the last one read (looking back over all
    blocks, not 20).
    """
    segments: list[CacheSegment] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        segments.extend(CacheSegment(segment_text(t), marked(t)) for t in tools)
    system = body.get("system")
    if isinstance(system, list):
        segments.extend(CacheSegment(segment_text(b), marked(b)) for b in system)
    elif system is not None:
        segments.append(CacheSegment(segment_text(system)))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        role = segment_text(message.get("role"))
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content]
        segments.extend(
            CacheSegment(role + segment_text(block), marked(block)) for block in blocks
        )
    written = [index for index, segment in enumerate(segments) if segment.marked]
    if not written:
        return None
    return CachePlan(
        store=(), segments=segments, last=written[-1], written=written, explicit=True
    )


# -- the rate-limit headers ------------------------------------------------------

# Each quota's RateLimitInfo field, and its name in the headers.
_KINDS: Final = (
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input_tokens", "input-tokens"),
    ("output_tokens", "output-tokens"),
)
_HEADER: Final = "anthropic-ratelimit-{1}-{0}"


def read_rate_limits(
    headers: Mapping[str, str],
    *,
    now: datetime | None = None,
    on_malformed: Callable[[str, str], None] | None = None,
) -> RateLimitInfo:
    """The figures of the ``anthropic-ratelimit-*`` and retry headers.

    Read as OpenAI's ``read_rate_limits`` reads its own (a naive ``now`` is
    UTC), but resets are RFC 3339 times, counted from the answer's own
    ``date`` header, or from ``now`` while it agrees with ``date`` to
    within the ``date`` header's resolution (whole seconds), or from
    ``now`` alone, or from the system clock.
    """
    reader = HeaderReader(headers, on_malformed)
    reference = reference_time(http_date(reader.get("date")), now)
    return figures(
        reader,
        reference,
        _KINDS,
        _HEADER,
        functools.partial(reader.instant, reference=reference),
    )


def rfc3339(wall: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the millisecond (``...:59.123Z``)."""
    ms = ceil_ms(wall)
    when = datetime.fromtimestamp(ms // 1000, UTC)
    fraction = ms % 1000
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{fraction:03d}" if fraction else "") + "Z"


def rate_limit_headers(info: RateLimitInfo, wall_now: float) -> list[tuple[str, str]]:
    """The request and token quotas of ``info`` as headers (resets as times)."""
    return header_figures(info, _HEADER, lambda reset: rfc3339(wall_now + reset))


ANTHROPIC: Final = Format(
    name="anthropic",
    path="/v1/messages",
    route="/v1/messages",
    # Its SDK sends either header since its 2.x line; x-api-key wins.
    key_headers=(("x-api-key", ""), ("Authorization", "Bearer")),
    version_header="anthropic-version",
    required_fields=("model", "messages", "max_tokens"),
    usage_on_request=False,
    terminator="message_stop",
    rate_limit_prefix="anthropic-ratelimit-",
    retry_after_ms=False,
    decoder=AnthropicDecoder,
    read_rate_limits=read_rate_limits,
    rate_limit_headers=rate_limit_headers,
    encode_stream=encode_stream,
    cache_plan=cache_plan,
    error_body=error_body,
    error_event=error_event,
    status_errors={
        "rate_limit": (
            "rate_limit_error",
            "Number of requests has exceeded your rate limit.",
        ),
        "server_error": ("api_error", "Internal server error"),
        "unavailable": ("overloaded_error", "Service unavailable"),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
    refusal_error=(
        "rate_limit_error",
        "This request would exceed your {reason} limit.",
    ),
    malformed_event=(
        b"event: content_block_delta\n"
        b'data: {"type": "content_block_delta", "index": 0,\n\n'
    ),
    call_id_prefix="toolu",
)
