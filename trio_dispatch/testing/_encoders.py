"""The fake LLM's answers: a scripted reply or fault in, bytes out.

Pure functions, no trio and no ASGI. ``encode_reply`` turns a
``FakeReply`` into a ``ReplyPlan`` (its words, tool-call pieces and token
counts) and has the wire format's own encoder (``trio_dispatch._wire``)
write it as server-sent events, each marked if it carries a token (for
pacing) and with the stream events our decoders yield for it, which
``ScriptedProvider`` plays in memory; the round-trip tests hold the
decoders and the encoders to them. Faults are written in the format's
words too (``status_fault_answer``, ``error_event``, ``MALFORMED``).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from .._wire import FORMATS
from .._wire._encode import PlannedCall, ReplyPlan

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._wire._encode import WireEvent
    from ._script import FakeReply, FakeToolCall, Fault, WireFormat


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
        PlannedCall(_call_id(wire, call, ids), call.name, pieces(call, reply))
        for call in reply.tool_calls
    ]
    chunks = len(reasoning) + len(text) + sum(len(call.pieces) for call in calls)
    input_tokens = reply.input_tokens
    if input_tokens is None:
        input_tokens = estimated_input_tokens
    output_tokens = chunks if reply.output_tokens is None else reply.output_tokens
    finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
    plan = ReplyPlan(
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
    return FORMATS[wire].encode_stream(plan, include_usage=include_usage)


def _call_id(wire: WireFormat, call: FakeToolCall, ids: Iterator[int]) -> str:
    if call.id is not None:
        return call.id
    return f"{FORMATS[wire].call_id_prefix}_fake_{next(ids)}"


def error_body(wire: WireFormat, error_type: str, message: str) -> dict[str, Any]:
    """An error response's JSON body, in ``wire``'s shape."""
    return FORMATS[wire].error_body(error_type, message)


def status_fault_answer(
    wire: WireFormat, fault: Fault
) -> tuple[int, list[tuple[bytes, bytes]], dict[str, Any]]:
    """A status fault's ``(status, retry headers, error body)``."""
    status = fault.status
    assert status is not None
    error_type, message = FORMATS[wire].status_errors[fault.kind]
    headers: list[tuple[bytes, bytes]] = []
    if fault.retry_after is not None:
        headers.append((b"retry-after", header_number(fault.retry_after)))
    if fault.retry_after_ms is not None:
        headers.append((b"retry-after-ms", header_number(fault.retry_after_ms)))
    return status, headers, error_body(wire, error_type, fault.message or message)


#: What a ``"malformed"`` fault sends: an event whose data is not JSON.
MALFORMED: dict[str, bytes] = {
    name: wire.malformed_event for name, wire in FORMATS.items()
}


#: A ``"stream_error"`` fault's message, unless the fault gives one.
STREAM_ERROR_MESSAGE = "the fake server failed mid-stream"


def error_event(wire: WireFormat, fault: Fault) -> bytes:
    """What a ``"stream_error"`` fault sends: an error event in ``wire``'s shape."""
    return FORMATS[wire].error_event(
        fault.error_type, fault.message or STREAM_ERROR_MESSAGE
    )


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
