"""What the fake LLM server answers: its script, as attrs values.

A ``FakeScript`` chooses one ``FakeReply`` per request, streamed in
whichever wire format the request came in: what to stream, how fast, and
what to break (``fault``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final, get_args

import attrs

from .._validation import (
    non_negative_int,
    non_negative_number,
    non_negative_seconds,
    positive_int,
    positive_number,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._request import FakeRequest

FaultKind = Literal[
    "rate_limit",
    "server_error",
    "unavailable",
    "overloaded",
    "disconnect",
    "truncate",
    "malformed",
    "stall",
    "stream_error",
]
"""What a ``Fault`` breaks; see ``Fault``."""

_FAULT_KINDS = frozenset(get_args(FaultKind))

#: The HTTP status each status fault answers with.
FAULT_STATUS: dict[str, int] = {
    "rate_limit": 429,
    "server_error": 500,
    "unavailable": 503,
    "overloaded": 529,
}


def _fault_kind(_instance: object, _attribute: object, value: object) -> None:
    if value not in _FAULT_KINDS:
        kinds = ", ".join(sorted(_FAULT_KINDS))
        raise ValueError(f"kind must be one of {kinds}, got {value!r}")


@final
@attrs.frozen
class Fault:
    """Something for the server to get wrong, on purpose.

    Status faults answer at once with an error body in the request's wire
    format (and the retry headers, when given):

    * ``"rate_limit"``: 429 (``rate_limit_error`` / ``rate_limit_exceeded``);
    * ``"server_error"``: 500;
    * ``"unavailable"``: 503;
    * ``"overloaded"``: 529 with Anthropic's ``overloaded_error`` body.

    Stream faults start a normal 200 stream and strike after
    ``after_events`` events (``None``: just before the terminator):

    * ``"disconnect"``: the server drops the connection;
    * ``"truncate"``: the body ends cleanly, without the terminator;
    * ``"malformed"``: one event whose data is not valid JSON, then the
      rest of the stream as if nothing happened;
    * ``"stall"``: nothing more is sent, and the response never ends (the
      client's read timeout has to fire);
    * ``"stream_error"``: an error event of ``error_type`` (Anthropic's
      ``event: error``, OpenAI's ``{"error": ...}`` chunk), then the end.

    Attributes:
        kind: Which fault.
        after_events: For stream faults, how many events go out first.
        retry_after: For status faults, ``Retry-After`` in seconds.
        retry_after_ms: For status faults, ``retry-after-ms``, in
            milliseconds.
        error_type: For ``"stream_error"``, the error's type.
        message: The error message, instead of the default one.
    """

    kind: FaultKind = attrs.field(validator=_fault_kind)
    after_events: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_int)
    )
    retry_after: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_seconds)
    )
    retry_after_ms: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_number)
    )
    error_type: str = "overloaded_error"
    message: str | None = None

    @property
    def status(self) -> int | None:
        """The HTTP status a status fault answers with; ``None`` otherwise."""
        return FAULT_STATUS.get(self.kind)


@final
@attrs.frozen
class FakeToolCall:
    """A tool call for the fake model to make.

    Its ``arguments`` are streamed as JSON in pieces, or ``raw_arguments``
    instead (for arguments that are not valid JSON); the server makes up an
    ``id`` when it is ``None``.
    """

    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    id: str | None = None
    raw_arguments: str | None = None


@final
@attrs.frozen
class FakeReply:
    """One scripted answer.

    The text and the reasoning (``reasoning_content`` deltas for OpenAI, a
    thinking block for Anthropic) are streamed a word at a time, each tool
    call's arguments in ``argument_chunks`` pieces.

    Attributes:
        input_tokens: Reported uncached prompt tokens; ``None`` estimates
            them from the request (a token per four characters).
        output_tokens: Reported output tokens; ``None`` counts the chunks.
        cache_read_tokens: Reported prompt tokens read from the cache.
        cache_write_tokens: Reported prompt tokens written to it (OpenAI
            counts them as prompt). When both are 0 and ``input_tokens`` is
            ``None``, the fake server reports what its own prompt cache
            read and wrote; a ``ScriptedProvider`` has no cache.
        finish: The normalised finish reason; ``None`` picks
            ``"tool_calls"`` when there are tool calls, else ``"stop"``.
        latency: Seconds before the response headers.
        time_to_first_token: Seconds between the headers and the first token.
        tokens_per_second: The pace of the tokens after the first; ``None``
            sends them as fast as it can.
    """

    text: str = "Hello from the fake LLM server."
    reasoning: str = ""
    tool_calls: tuple[FakeToolCall, ...] = ()
    input_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_int)
    )
    output_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_int)
    )
    cache_read_tokens: int = attrs.field(default=0, validator=non_negative_int)
    cache_write_tokens: int = attrs.field(default=0, validator=non_negative_int)
    finish: str | None = None
    latency: float = attrs.field(default=0.0, validator=non_negative_seconds)
    time_to_first_token: float = attrs.field(
        default=0.0, validator=non_negative_seconds
    )
    tokens_per_second: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_number)
    )
    argument_chunks: int = attrs.field(default=3, validator=positive_int)
    fault: Fault | None = None


@final
@attrs.frozen
class FakeScript:
    """How the fake server picks the reply to each request.

    ``choose(request)`` first (``None`` falls through), then the ``replies``
    in order, one per request, then ``default``.
    """

    default: FakeReply = FakeReply()
    replies: tuple[FakeReply, ...] = ()
    choose: Callable[[FakeRequest], FakeReply | None] | None = None
