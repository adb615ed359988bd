"""The fake LLM's wire encoders: a scripted reply in, bytes out.

The counterpart of the providers' decoders; pure functions, no trio and no
ASGI. ``encode_reply`` turns a ``FakeReply`` into the server-sent events of
OpenAI's or Anthropic's stream, each marked if it carries a token (for
pacing) and with the stream events our decoders yield for it, which
``ScriptedProvider`` plays in memory; the round-trip tests hold the
decoders and this module to them.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import attrs

from .._wire import make_tool_call
from ..messages import Finish, ReasoningDelta, TextDelta, Usage

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..messages import StreamEvent, ToolCall
    from ._script import FakeReply, FakeToolCall, Fault, WireFormat


@attrs.frozen
class WireEvent:
    """One server-sent event's bytes, and what our decoders make of it.

    Whether it carries a token, the stream events the decoders yield for
    it, and why they refuse it as ``MalformedStream``, if they do.
    """

    data: bytes
    token: bool = False
    events: tuple[StreamEvent, ...] = ()
    malformed: str | None = None


def encode_reply(
    reply: FakeReply,
    wire: WireFormat,
    *,
    model: str,
    estimated_input_tokens: int,
    include_usage: bool,
    ids: Iterator[int],
) -> list[WireEvent]:
    """The events of ``reply``'s stream in ``wire``'s format, terminator last.

    ``estimated_input_tokens`` stands for a reply without ``input_tokens``;
    ``include_usage`` is OpenAI's ``stream_options.include_usage``; ``ids``
    number the message and the tool calls without an id.
    """
    reasoning = words(reply.reasoning)
    text = words(reply.text)
    calls = [
        (call, _call_id(wire, call, ids), pieces(call, reply))
        for call in reply.tool_calls
    ]
    chunks = len(reasoning) + len(text) + sum(len(p) for _, _, p in calls)
    input_tokens = reply.input_tokens
    if input_tokens is None:
        input_tokens = estimated_input_tokens
    output_tokens = chunks if reply.output_tokens is None else reply.output_tokens
    finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
    plan = _Plan(
        model=model,
        message_id=f"fake-{next(ids)}",
        reasoning=reasoning,
        text=text,
        calls=calls,
        finish=finish,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read=reply.cache_read_tokens,
        cache_write=reply.cache_write_tokens,
    )
    if wire == "openai":
        return _openai_events(plan, include_usage=include_usage)
    return _anthropic_events(plan)


def _call_id(wire: WireFormat, call: FakeToolCall, ids: Iterator[int]) -> str:
    if call.id is not None:
        return call.id
    prefix = "call" if wire == "openai" else "toolu"
    return f"{prefix}_fake_{next(ids)}"


def error_body(wire: WireFormat, error_type: str, message: str) -> dict[str, Any]:
    """An error response's JSON body, in ``wire``'s shape."""
    if wire == "anthropic":
        return {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": "req_fake",
        }
    return {
        "error": {"message": message, "type": error_type, "param": None, "code": None}
    }


#: Per format, the error type and default message of each status fault.
STATUS_ERRORS: dict[WireFormat, dict[str, tuple[str, str]]] = {
    "openai": {
        "rate_limit": ("rate_limit_exceeded", "Rate limit reached for requests."),
        "server_error": ("server_error", "The server had an error."),
        "unavailable": ("service_unavailable", "The engine is overloaded."),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
    "anthropic": {
        "rate_limit": (
            "rate_limit_error",
            "Number of requests has exceeded your rate limit.",
        ),
        "server_error": ("api_error", "Internal server error"),
        "unavailable": ("overloaded_error", "Service unavailable"),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
}


def status_fault_answer(
    wire: WireFormat, fault: Fault
) -> tuple[int, list[tuple[bytes, bytes]], dict[str, Any]]:
    """A status fault's ``(status, retry headers, error body)``."""
    status = fault.status
    assert status is not None
    error_type, message = STATUS_ERRORS[wire][fault.kind]
    headers: list[tuple[bytes, bytes]] = []
    if fault.retry_after is not None:
        headers.append((b"retry-after", header_number(fault.retry_after)))
    if fault.retry_after_ms is not None:
        headers.append((b"retry-after-ms", header_number(fault.retry_after_ms)))
    return status, headers, error_body(wire, error_type, fault.message or message)


#: What a ``"malformed"`` fault sends: an event whose data is not JSON.
MALFORMED: dict[WireFormat, bytes] = {
    "openai": b'data: {"choices": [{"index": 0, "delta": {"content": "oops\n\n',
    "anthropic": (
        b"event: content_block_delta\n"
        b'data: {"type": "content_block_delta", "index": 0,\n\n'
    ),
}


#: A ``"stream_error"`` fault's message, unless the fault gives one.
STREAM_ERROR_MESSAGE = "the fake server failed mid-stream"


def error_event(wire: WireFormat, fault: Fault) -> bytes:
    """What a ``"stream_error"`` fault sends: an error event in ``wire``'s shape."""
    message = fault.message or STREAM_ERROR_MESSAGE
    if wire == "anthropic":
        payload = {
            "type": "error",
            "error": {"type": fault.error_type, "message": message},
        }
        return sse(payload, "error")
    return sse(error_body(wire, fault.error_type, message))


def sse(payload: object, event: str | None = None) -> bytes:
    """One server-sent event: ``payload`` as JSON data, with its name if given."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


def header_number(value: float) -> bytes:
    """A number as a header value: plain digits, never an exponent."""
    return (f"{value:.3f}".rstrip("0").rstrip(".") or "0").encode()


_WORD = re.compile(r"\s*\S+")


def words(text: str) -> list[str]:
    """``text`` in word-sized chunks that join back to exactly ``text``."""
    found = _WORD.findall(text)
    rest = text[sum(map(len, found)) :]
    if rest:
        if found:
            found[-1] += rest
        else:
            found = [rest]
    return found


def pieces(call: FakeToolCall, reply: FakeReply) -> list[str]:
    """A tool call's argument text, cut in ``reply.argument_chunks`` pieces."""
    text = call.raw_arguments
    if text is None:
        text = json.dumps(call.arguments)
    size = max(1, math.ceil(len(text) / reply.argument_chunks))
    return [text[i : i + size] for i in range(0, len(text), size)]


@attrs.frozen
class _Plan:
    model: str
    message_id: str
    reasoning: list[str]
    text: list[str]
    calls: list[tuple[FakeToolCall, str, list[str]]]
    finish: str
    input_tokens: int
    output_tokens: int
    cache_read: int
    cache_write: int


def _openai_events(plan: _Plan, *, include_usage: bool) -> list[WireEvent]:
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
    for index, (call, call_id, pieces) in enumerate(plan.calls):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        events.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces
        )
    # The decoder completes the calls at the finish reason, in index order.
    missing = [
        f"tool call {index} arrived without its {field}"
        for index, (call, call_id, _) in enumerate(plan.calls)
        for field, value in (("id", call_id), ("function name", call.name))
        if not value
    ]
    events.append(
        chunk(
            {},
            plan.finish,
            token=False,
            events=(*_tool_calls(plan), Finish(plan.finish)),
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


_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _anthropic_events(plan: _Plan) -> list[WireEvent]:
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
    for (call, call_id, pieces), tool_call in zip(
        plan.calls, _tool_calls(plan), strict=True
    ):
        block = {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}
        missing = f"tool_use block {index} arrived without its id and name"
        events.append(
            event(
                "content_block_start",
                index=index,
                content_block=block,
                malformed=None if call_id and call.name else missing,
            )
        )
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
            for piece in ["", *pieces]
        )
        events.append(event("content_block_stop", index=index, events=(tool_call,)))
        index += 1
    events.append(
        event(
            "message_delta",
            delta={
                "stop_reason": _ANTHROPIC_STOP.get(plan.finish, plan.finish),
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


def _tool_calls(plan: _Plan) -> list[ToolCall]:
    """The plan's tool calls, as the decoders make them from their pieces."""
    return [
        make_tool_call(call_id, call.name, "".join(pieces))
        for call, call_id, pieces in plan.calls
    ]
