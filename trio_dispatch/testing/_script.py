"""What a fake LLM is asked, what it answers, and how the answer is played.

A ``FakeScript`` chooses one ``FakeReply`` per ``FakeRequest``, streamed in
whichever wire format the request came in: what to stream, how fast, and
what to break (``fault``). The fake server and the scripted provider play
it by the same rules, so a script means the same over sockets and in
memory: the first token after ``time_to_first_token``, each later one
``1 / tokens_per_second`` after the one before; a stream fault strikes
before event ``after_events`` (or just before the terminator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast, final, get_args

import attrs

from .._validation import (
    non_negative_int,
    non_negative_number,
    non_negative_seconds,
    positive_int,
    positive_number,
)
from .._wire import FORMATS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..messages import ChatRequest

WireFormat = Literal["openai", "anthropic"]

#: The fake server's routes, and the wire format each one speaks.
ROUTES: dict[str, WireFormat] = {
    wire.route: cast("WireFormat", name) for name, wire in FORMATS.items()
}


@final
@attrs.frozen
class FakeRequest:
    """One request the fake server received, as it arrived (minus the key).

    ``body`` is the parsed JSON (``None`` if it was not JSON), ``headers``
    have lowercased names and none of the key headers (``authorization``,
    ``x-api-key``),
    and ``client`` is shared by the requests of one kept-alive connection.
    A ``ScriptedProvider`` makes one for its script's ``choose`` too, with
    no body and no headers, and the ``ChatRequest`` itself as ``chat``.
    """

    format: WireFormat
    path: str
    body: Any
    headers: Mapping[str, str]
    authenticated: bool
    arrived_at: float
    client: tuple[str, int] | None = None
    chat: ChatRequest | None = None

    @property
    def model(self) -> str | None:
        """The body's ``model``, if it is a string (what per-model quotas go by)."""
        body = self.body
        if isinstance(body, dict):
            model = body.get("model")
            if isinstance(model, str):
                return model
        return None


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
    format, with ``retry_after`` (seconds) and ``retry_after_ms`` as retry
    headers when given: ``"rate_limit"`` 429, ``"server_error"`` 500,
    ``"unavailable"`` 503, ``"overloaded"`` 529.

    Stream faults start a normal 200 stream and strike after
    ``after_events`` events (``None``: just before the terminator):
    ``"disconnect"`` drops the connection, ``"truncate"`` ends the body
    without the terminator, ``"malformed"`` sends one event that is not
    JSON and goes on, ``"stall"`` sends nothing more (the client's read
    timeout has to fire), ``"stream_error"`` sends an error event of
    ``error_type``, then ends. ``message`` replaces the default message.
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


def _a_script(_instance: object, _attribute: object, script: FakeScript) -> None:
    if not isinstance(script, FakeScript):
        raise TypeError(f"script must be a FakeScript, got {script!r}")


@attrs.define
class Playlist:
    """A ``FakeScript`` in play: how many of its ``replies`` are used."""

    script: FakeScript = attrs.field(validator=_a_script)
    used: int = 0

    def pick(self, request: FakeRequest) -> FakeReply:
        """The reply to ``request``: ``choose``'s, the next of ``replies``, or ``default``."""
        script = self.script
        if script.choose is not None:
            chosen = script.choose(request)
            if chosen is not None:
                return chosen
        if self.used < len(script.replies):
            self.used += 1
            return script.replies[self.used - 1]
        return script.default


def token_delay(reply: FakeReply, tokens_sent: int) -> float:
    """Seconds to wait before the next token, after ``tokens_sent`` of them."""
    if tokens_sent == 0:
        return reply.time_to_first_token
    if reply.tokens_per_second is None:
        return 0.0
    return 1 / reply.tokens_per_second


def strike_index(reply: FakeReply, events: int) -> int | None:
    """Before which of the ``events`` before the terminator its fault strikes.

    ``events`` means just before the terminator; ``None``, no stream fault.
    """
    fault = reply.fault
    if fault is None:
        return None
    if fault.after_events is None:
        return events
    return min(fault.after_events, events)
