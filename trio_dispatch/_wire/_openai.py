"""OpenAI-compatible chat completions, streamed (OpenAI, vLLM, DeepSeek...).

Everything the package knows of the format, in one place: the endpoint and
the key header (``OPENAI``), the request body (``request_body``), the
stream's decoder (``OpenAIDecoder``) and encoder (``encode_stream``, for the
fake server), the error bodies, the ``x-ratelimit-*`` headers, read and
written, and the ``priority`` field by which a self-hosted server (vLLM,
SGLang) orders its own queue (``with_priority``).

The wire format, as OpenAI documents it: ``POST {base_url}/chat/completions``
with ``Authorization: Bearer <key>`` and ``"stream": true`` answers with
server-sent events whose data is a ``chat.completion.chunk`` (shortened
here)::

    data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}
    data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}
    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
           "id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}
    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
           "function":{"arguments":"{\\"a\\": 1}"}}]}}]}
    data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}
    data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,
           "prompt_tokens_details":{"cached_tokens":0}}}
    data: [DONE]

A tool call arrives in fragments keyed by ``index``: the id and name first,
then the arguments' JSON text in pieces. The last usage chunk comes only
with ``stream_options.include_usage`` and has no choices. Reasoning models
served by vLLM or DeepSeek send ``delta.reasoning_content`` (or
``delta.reasoning``). An error after the status line arrives as a chunk
holding an ``error`` object.

``OpenAIDecoder`` turns that into stream events: text and reasoning deltas
as they come; each ``ToolCall`` once its choice's ``finish_reason`` arrives,
then ``Finish``, then ``Usage``; the stream ends at ``[DONE]``. A stream
without ``[DONE]`` (or that reaches it without a finish reason) was cut
short: ``StreamInterrupted``. Only choice 0 is read; we never ask for more.
It reads each chunk by hand, checking every field as it goes (why by hand:
``_decoder.py``); a chunk that does not fit ``CHUNK`` is refused with every
wrong field named.

Rate limits come as ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
on every answer, resets as Go durations (``12ms``, ``6m0s``), and
``retry-after`` with ``retry-after-ms`` on a 429.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs

from .._exceptions import StreamInterrupted
from ..messages import Finish, ReasoningDelta, TextDelta, ToolCall, Usage
from ._decoder import INT, TEXT, Arr, Field, Obj, WireDecoder
from ._encode import CachePlan, CacheSegment, ReplyPlan, WireEvent, segment_text, sse
from ._errors import error_for_status, error_for_type, error_kind, make_tool_call
from ._format import Format
from ._headers import (
    HeaderReader,
    ceil_ms,
    figures,
    header_figures,
    reference_time,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime

    from .._policy._ratelimits import RateLimitInfo
    from ..messages import ChatMessage, ChatRequest, StreamEvent
    from ._sse import ServerSentEvent


# -- the stream --------------------------------------------------------------

_USAGE: Final = Obj((
    Field("prompt_tokens", INT, required=True, nullable=False),
    Field("completion_tokens", INT, required=True, nullable=False),
    Field("prompt_tokens_details", Obj((Field("cached_tokens", INT),))),
))  # fmt: skip
_TOOL_CALL: Final = Obj((
    Field("index", INT, required=True, nullable=False),
    Field("id", TEXT),
    Field("function", Obj((Field("name", TEXT), Field("arguments", TEXT)))),
))  # fmt: skip
_DELTA: Final = Obj((
    Field("content", TEXT),
    Field("reasoning_content", TEXT),
    Field("reasoning", TEXT),
    Field("tool_calls", Arr(_TOOL_CALL)),
))  # fmt: skip
#: A chunk, as far as the decoder reads it (other fields are ignored).
CHUNK: Final = Obj((
    Field("choices", Arr(Obj((
        Field("index", INT, nullable=False),
        Field("delta", _DELTA),
        Field("finish_reason", TEXT),
    ))), required=True, nullable=False),
    Field("usage", _USAGE),
))  # fmt: skip

_FINISH_REASONS: Final = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "function_call": "tool_calls",  # the deprecated spelling
}


# A tool-call fragment, flattened: (index, id, function name, arguments).
_Fragment: TypeAlias = tuple[int, str | None, str | None, str | None]
# A choice, read: (index, reasoning, content, fragments, finish reason).
_Read: TypeAlias = tuple[int, str | None, str | None, list[_Fragment], str | None]


@attrs.define
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = attrs.Factory(list)


class OpenAIDecoder(WireDecoder):
    """Chat completion chunks in, stream events out; see the module notes."""

    _terminator = "[DONE]"

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        super().__init__(provider, redact)
        self._calls: dict[int, _PartialCall] = {}
        self._finished = False
        self._usage: Usage | None = None
        self._usage_sent = False

    def _on_text(self, text: str) -> list[StreamEvent] | None:
        return self._on_done() if text == "[DONE]" else None

    def _on_payload(self, payload: object, event: ServerSentEvent) -> list[StreamEvent]:
        if type(payload) is not dict:
            raise self._misfit(payload, CHUNK, "a chunk")
        if (
            event.event == "error"
            or payload.get("error") is not None
            or payload.get("object") == "error"
        ):
            self._raise_if_error(payload, event.event)
        choices = payload.get("choices")
        usage = payload.get("usage")
        read = _read_choices(choices) if type(choices) is list else None
        counts = None if usage is None else _read_usage(usage)
        if read is None or (usage is not None and counts is None):
            raise self._misfit(payload, CHUNK, "a chunk")
        events: list[StreamEvent] = []
        for index, reasoning, content, fragments, finish in read:
            if index != 0:
                continue
            events += self._on_delta(reasoning, content, fragments)
            if finish is not None and not self._finished:
                self._finished = True
                events += self._tool_calls()
                events.append(Finish(_FINISH_REASONS.get(finish, finish)))
        if counts is not None:
            self._usage = counts
        if self._finished and self._usage is not None and not self._usage_sent:
            # Held until after Finish, and sent once: some servers repeat it.
            events.append(self._usage)
            self._usage_sent = True
        return events

    def _on_done(self) -> list[StreamEvent]:
        self._done = True
        if not self._finished:
            raise StreamInterrupted(
                f"{self._provider}: the stream reached [DONE] without a finish_reason",
                provider=self._provider,
            )
        events: list[StreamEvent] = list(self._tool_calls())
        if self._usage is not None and not self._usage_sent:
            events.append(self._usage)
            self._usage_sent = True
        return events

    def _on_delta(
        self,
        reasoning: str | None,
        content: str | None,
        fragments: list[_Fragment],
    ) -> list[StreamEvent]:
        """What a delta yields and accumulates."""
        events: list[StreamEvent] = []
        if reasoning:
            events.append(ReasoningDelta(reasoning))
        if content:
            events.append(TextDelta(content))
        for index, call_id, name, arguments in fragments:
            call = self._calls.setdefault(index, _PartialCall())
            if call_id:
                call.id = call_id
            # Strings accumulate, as the official SDK does: a name could be
            # split too, though OpenAI sends it whole.
            if name:
                call.name += name
            if arguments:
                call.arguments.append(arguments)
        return events

    def _tool_calls(self) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for index in sorted(self._calls):
            call = self._calls.pop(index)
            for field, value in (("id", call.id), ("function name", call.name)):
                if not value:
                    raise self._malformed(
                        f"tool call {index} arrived without its {field}"
                    )
            calls.append(make_tool_call(call.id, call.name, "".join(call.arguments)))
        return calls

    def _raise_if_error(self, payload: dict[str, Any], event_name: str) -> None:
        error: object = payload.get("error")
        if error is None and payload.get("object") == "error":
            error = payload  # vLLM's flat error object
        if error is None and event_name == "error":
            error = payload
        if error is None:
            return
        if not isinstance(error, dict):
            raise error_for_type(self._provider, "error", str(error))
        message = error.get("message")
        text = message if isinstance(message, str) else ""
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and code >= 400:
            error_type = error.get("type")
            raise error_for_status(
                self._provider,
                code,
                error_type=error_type if isinstance(error_type, str) else None,
                message=text,
                retry_after=None,
            )
        raise error_for_type(self._provider, error_kind(error) or "error", text)


def _is_text(value: object) -> bool:
    return value is None or type(value) is str


def _read_choices(choices: list[Any]) -> list[_Read] | None:
    """Each choice of a chunk, read; ``None`` if one does not fit ``CHUNK``.

    The hot path: every check is written out (``type() is``, not a helper
    call, and not ``isinstance``, since a bool is an int and not an index).
    """
    read: list[_Read] = []
    for choice in choices:
        if type(choice) is not dict:
            return None
        index = choice.get("index", 0)
        delta = choice.get("delta")
        finish = choice.get("finish_reason")
        if type(index) is not int or (finish is not None and type(finish) is not str):
            return None
        if delta is None:
            read.append((index, None, None, [], finish))
            continue
        if type(delta) is not dict:
            return None
        content = delta.get("content")
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        elif (other := delta.get("reasoning")) is not None and type(other) is not str:
            return None
        tool_calls = delta.get("tool_calls")
        fragments = [] if tool_calls is None else _read_fragments(tool_calls)
        if (
            fragments is None
            or (content is not None and type(content) is not str)
            or (reasoning is not None and type(reasoning) is not str)
        ):
            return None
        read.append((index, reasoning, content, fragments, finish))
    return read


def _read_fragments(tool_calls: object) -> list[_Fragment] | None:
    """A delta's ``tool_calls``, flattened; ``None`` if they do not fit."""
    if type(tool_calls) is not list:
        return None
    fragments: list[_Fragment] = []
    for item in tool_calls:
        if type(item) is not dict:
            return None
        index = item.get("index")
        call_id = item.get("id")
        function = item.get("function")
        if function is None:
            name = arguments = None
        elif type(function) is dict:
            name = function.get("name")
            arguments = function.get("arguments")
        else:
            return None
        if not (
            type(index) is int
            and _is_text(call_id)
            and _is_text(name)
            and _is_text(arguments)
        ):
            return None
        fragments.append((index, call_id, name, arguments))
    return fragments


def _read_usage(usage: object) -> Usage | None:
    """A chunk's usage as ``Usage``; ``None`` if it does not fit."""
    if type(usage) is not dict:
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached: object = None
    if details is not None:
        if type(details) is not dict:
            return None
        cached = details.get("cached_tokens")
    if cached is None:
        cached = 0
    if (
        type(prompt) is not int
        or type(completion) is not int
        or type(cached) is not int
    ):
        return None
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=completion,
        cache_read_tokens=cached,
    )


# -- the request -------------------------------------------------------------


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    # The model's own text when we have it, even if it did
                    # not parse: the history should say what it said.
                    "arguments": call.raw_arguments or json.dumps(call.arguments),
                },
            }
            for call in message.tool_calls
        ]
        if not message.content:
            wire["content"] = None
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def request_body(model: str, request: ChatRequest) -> dict[str, Any]:
    """The JSON body of a streaming chat completion for ``request``.

    ``request.cache_key`` goes out as ``prompt_cache_key``.
    """
    messages: list[dict[str, Any]] = []
    if request.system is not None:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_wire_message(message) for message in request.messages)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
    optional = {
        # ``max_tokens`` rather than the newer ``max_completion_tokens``:
        # every OpenAI-compatible server (vLLM, llama.cpp, DeepSeek) takes it.
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": None if request.stop is None else list(request.stop),
        # Routes the conversation's calls to one prompt cache; OpenAI caches
        # the longest prefix seen before, which the conversation keeps stable.
        "prompt_cache_key": request.cache_key,
    }
    body.update((key, value) for key, value in optional.items() if value is not None)
    if request.extra:
        # Last, and never over a field set above (ChatRequest refuses
        # those) but ``prompt_cache_key``: a key given there is meant.
        body.update(request.extra)
    return body


# -- a self-hosted server's own queue ----------------------------------------
#
# Not OpenAI's: vLLM's OpenAI-compatible server reads ``priority``, an
# integer (default 0, bounded to a signed 64 bits), in the body of a chat
# completion and of a completion; started with ``--scheduling-policy
# priority`` it takes waiting requests lowest first, ties by arrival, and
# without it ignores the field (its older engine refused a nonzero one).
# SGLang reads the same field, highest first unless started with
# ``--schedule-low-priority-values-first``.

#: The body field the server orders its waiting requests by.
PRIORITY_FIELD: Final = "priority"
#: What vLLM accepts (``ge=-(2**63), le=2**63 - 1``).
PRIORITY_RANGE: Final = (-(2**63), 2**63 - 1)
#: The endpoints whose bodies take it, matched at the end of the path as
#: the transport matches a model call: chat completions and completions.
PRIORITY_PATHS: Final = ("/chat/completions", "/completions")


def priority_value(value: int) -> int:
    """``value`` as the server takes it: clamped to ``PRIORITY_RANGE``."""
    low, high = PRIORITY_RANGE
    return min(max(value, low), high)


def takes_priority(path: str, body: Mapping[str, object] | None) -> bool:
    """Whether a model call to ``path`` whose JSON body is ``body`` may get a priority.

    A chat completion or a completion (by its path, under any prefix)
    whose body is a JSON object with ``messages`` or ``prompt`` and no
    ``priority`` of its own: one the caller gave is the caller's.
    """
    return (
        body is not None
        and path.rstrip("/").endswith(PRIORITY_PATHS)
        and ("messages" in body or "prompt" in body)
        and PRIORITY_FIELD not in body
    )


def with_priority(content: bytes, value: int) -> bytes:
    """``content``, the bytes of a JSON object, with ``"priority": value`` first.

    Spliced after the object's opening brace, so the caller's bytes go on
    exactly as they were sent; ``content`` must be an object with at least
    one member and no ``priority`` (``takes_priority``), and start with its
    brace. ``value`` is clamped to ``PRIORITY_RANGE``.
    """
    member = f'"{PRIORITY_FIELD}":{priority_value(value)},'.encode()
    return b"{" + member + content[1:]


# -- the stream, written (the fake server's) -------------------------------------


def encode_stream(plan: ReplyPlan, *, include_usage: bool) -> list[WireEvent]:
    """``plan`` as the chunks of a stream, ``[DONE]`` last.

    ``include_usage``: the request's ``stream_options.include_usage``.
    """

    def payload(choices: list[object], **more: object) -> bytes:
        return sse(
            {
                "id": f"chatcmpl-{plan.message_id}",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": plan.model,
                "choices": choices,
                **more,
            }
        )

    def chunk(
        delta: dict[str, Any],
        finish: str | None = None,
        *,
        token: bool = True,
        events: tuple[StreamEvent, ...] = (),
        malformed: str | None = None,
    ) -> WireEvent:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return WireEvent(payload([choice]), token, events, malformed)

    events = [chunk({"role": "assistant", "content": ""}, token=False)]
    events.extend(
        chunk({"reasoning_content": word}, events=(ReasoningDelta(word),))
        for word in plan.reasoning
    )
    events.extend(
        chunk({"content": word}, events=(TextDelta(word),)) for word in plan.text
    )
    for index, call in enumerate(plan.calls):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        events.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in call.pieces
        )
    # The decoder completes the calls at the finish reason, in index order.
    missing = [
        f"tool call {index} arrived without its {field}"
        for index, call in enumerate(plan.calls)
        for field, value in (("id", call.id), ("function name", call.name))
        if not value
    ]
    events.append(
        chunk(
            {},
            plan.finish,
            token=False,
            events=(*plan.tool_calls(), Finish(plan.finish)),
            malformed=missing[0] if missing else None,
        )
    )
    if include_usage:
        prompt = plan.input_tokens + plan.cache_read + plan.cache_write
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": plan.output_tokens,
            "total_tokens": prompt + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": plan.cache_read},
        }
        # OpenAI counts the cache writes as plain prompt tokens.
        parts = Usage(
            input_tokens=plan.input_tokens + plan.cache_write,
            output_tokens=plan.output_tokens,
            cache_read_tokens=plan.cache_read,
        )
        events.append(WireEvent(payload([], usage=usage), events=(parts,)))
    events.append(WireEvent(b"data: [DONE]\n\n"))
    return events


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """An error answer's JSON body."""
    return {
        "error": {"message": message, "type": error_type, "param": None, "code": None}
    }


def error_event(error_type: str, message: str) -> bytes:
    """An error in the stream: a chunk holding an ``error`` object."""
    return sse(error_body(error_type, message))


# -- prompt caching (the fake server's) -------------------------------------------


def cache_plan(body: dict[str, Any]) -> CachePlan | None:
    """How the API caches ``body``'s prompt, or ``None`` without a cache key.

    Every prefix of the tools and messages, kept apart by
    ``prompt_cache_key``; a request reads the longest one cached.
    """
    cache_key = body.get("prompt_cache_key")
    if not isinstance(cache_key, str):
        return None
    segments = [
        CacheSegment(segment_text(item))
        for part in (body.get("tools"), body.get("messages"))
        if isinstance(part, list)
        for item in part
    ]
    return CachePlan(
        store=(cache_key,),
        segments=segments,
        last=len(segments) - 1,
        written=list(range(len(segments))),
        explicit=False,
    )


# -- the rate-limit headers ------------------------------------------------------

# Each quota's RateLimitInfo field, and its name in the headers.
_KINDS: Final = (("requests", "requests"), ("tokens", "tokens"))
_HEADER: Final = "x-ratelimit-{}-{}"


def read_rate_limits(
    headers: Mapping[str, str],
    *,
    now: datetime | None = None,
    on_malformed: Callable[[str, str], None] | None = None,
) -> RateLimitInfo:
    """The figures of the ``x-ratelimit-*`` and retry headers.

    Args:
        headers: The answer's headers; names are matched without regard
            to case.
        now: When the answer arrived (for a ``Retry-After`` given as an
            HTTP date); the system clock if not given.
        on_malformed: Told ``(header name, value)`` for each header that
            does not parse.

    Returns:
        The figures; ``RateLimitInfo().empty`` if the headers had none.
    """
    reader = HeaderReader(headers, on_malformed)
    return figures(reader, reference_time(None, now), _KINDS, _HEADER, reader.duration)


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset: ``12ms``, ``1s``, ``6m0s``, ``1h2m3.5s``."""
    ms = ceil_ms(seconds)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    whole, fraction = divmod(ms, 1000)
    text = f"{whole}" + (f".{fraction:03d}".rstrip("0") if fraction else "") + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


def rate_limit_headers(info: RateLimitInfo, wall_now: float) -> list[tuple[str, str]]:
    """The request and token quotas of ``info`` as headers (resets as durations)."""
    return header_figures(info, _HEADER, go_duration)


OPENAI: Final = Format(
    name="openai",
    path="/chat/completions",
    route="/v1/chat/completions",
    key_headers=(("Authorization", "Bearer"),),
    version_header=None,
    required_fields=("model", "messages"),
    usage_on_request=True,
    terminator="[DONE]",
    rate_limit_prefix="x-ratelimit-",
    retry_after_ms=True,
    decoder=OpenAIDecoder,
    read_rate_limits=read_rate_limits,
    rate_limit_headers=rate_limit_headers,
    encode_stream=encode_stream,
    cache_plan=cache_plan,
    error_body=error_body,
    error_event=error_event,
    status_errors={
        "rate_limit": ("rate_limit_exceeded", "Rate limit reached for requests."),
        "server_error": ("server_error", "The server had an error."),
        "unavailable": ("service_unavailable", "The engine is overloaded."),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
    refusal_error=("rate_limit_exceeded", "Rate limit reached for {reason}."),
    malformed_event=b'data: {"choices": [{"index": 0, "delta": {"content": "oops\n\n',
    call_id_prefix="call",
)
