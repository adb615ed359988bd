"""One metering path for every integration: what a model call costs and says.

The transport, ``wrap_provider`` and conversations (through
``wrap_provider``) all meter their calls here, and nowhere else:

* one token estimate, about 4 characters a token plus a few tokens of
  framing per message, of a ``ChatRequest`` (``estimate_tokens``) or of a
  model call's JSON body (``estimate_json_tokens``), plus the answer's
  ``max_tokens`` (or the provider's ``default_max_tokens``). A request's
  characters (``prompt_chars``) are what a conversation's context budget
  counts too;
* one reader of the model a call asks for: a provider's ``model``
  (``model_of_provider``), or a JSON body's ``model`` (``model_of_body``),
  read from the same parse as the estimate (``json_body``). The slot
  carries it, and the figures of its answer go to that model's budget;
* one reader of rate-limit figures: off an answer that carries them
  (``figures_of``: an opened stream's or a status error's
  ``rate_limits``), or off raw headers (``RateLimitReader``: the wire
  format whose headers they are reads them);
* one "answered, then maybe pause" (``Meter.answered``): the slot's answer
  started (the provider has counted the request, before the figures that
  count it), the figures go to ``Dispatcher.observe_rate_limits``, and a
  rate-limit answer pauses the provider (``report_rate_limit``). This is
  the one route a metered answer's figures take to the dispatcher: such an
  answer calls none of its provider's own callbacks (``Meter.metered``),
  which are for calls made without a slot, so a provider given
  ``on_rate_limits=dispatcher.observe_rate_limits`` is counted once;
* the usage an answer reports corrects its slot's estimate
  (``MeteredEvents``);
* one clock of an answer's tokens (``TokenTimes``): when the first came,
  when the latest, how many, told to the slot at the answer's end
  (``Slot.report_timing``) for a latency-signal adaptive limit. Our
  providers' streams count their text, reasoning and tool-call events;
  the transport, which leaves the body to the SDK, counts the server-sent
  events of the body (a self-hosted server sends one per token).

It uses the dispatcher's public names only.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Protocol, TypeVar, cast, final

import trio

from .._policy._ratelimits import RateLimitInfo
from .._wire import FORMATS
from .._wire._headers import MalformedHeaderLog
from ..messages._stream import ReasoningDelta, TextDelta, ToolCall, Usage
from ._hooks import RateLimitHooks

#: The events of our providers' streams that carry tokens.
_TOKENS: Final = frozenset({TextDelta, ReasoningDelta, ToolCall})

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Mapping

    from .._dispatch._plumbing import Plumbing
    from .._dispatch._slot import Slot
    from .._observe._hub import CallWatch
    from .._wire import Format
    from .._wire._decoder import WireDecoder
    from .._wire._sse import ServerSentEvent
    from ..messages import ChatMessage, ChatRequest, StreamEvent, ToolSpec


def prompt_chars(
    system: str | None, messages: Iterable[ChatMessage], tools: Iterable[ToolSpec]
) -> int:
    """The characters a prompt sends: system prompt, messages, tool calls, tools.

    What a request's estimate and a conversation's context budget count.
    """
    chars = len(system or "")
    for message in messages:
        chars += len(message.content)
        for call in message.tool_calls:
            chars += len(call.name) + len(call.raw_arguments or str(call.arguments))
    for spec in tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(json.dumps(spec.parameters))
    return chars


def estimate_prompt_tokens(request: ChatRequest) -> int:
    """A rough count of the tokens ``request`` sends: 4 characters a token.

    ``prompt_chars``, plus a few tokens of framing per message. Meant to be
    corrected by the usage the answer reports, not to be exact.
    """
    chars = prompt_chars(request.system, request.messages, request.tools)
    return 3 + 4 * len(request.messages) + (chars + 3) // 4


def estimate_tokens(
    request: ChatRequest, default_max_tokens: int, prompt_tokens: int | None = None
) -> int:
    """The tokens a request is charged at grant time: prompt plus answer.

    ``prompt_tokens``: the prompt's ``estimate_prompt_tokens``, if made already.
    """
    answer = request.max_tokens
    if prompt_tokens is None:
        prompt_tokens = estimate_prompt_tokens(request)
    return prompt_tokens + (default_max_tokens if answer is None else answer)


#: Content parts that are not text: not counted in a prompt's estimate.
NOT_TEXT: Final = frozenset({
    "audio", "document", "file", "image", "image_url", "input_audio", "input_file",
    "input_image",
})  # fmt: skip


def _text_length(value: object) -> int:
    """The characters of the strings in a JSON value, parts not text left out."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_length(item) for item in value)
    if isinstance(value, dict):
        if value.get("type") in NOT_TEXT:
            return 0
        return sum(_text_length(item) for item in value.values())
    return 0


def _count(value: object) -> int | None:
    """A JSON count (an int, not a bool, not negative), or ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def json_body(content: bytes) -> dict[str, object] | None:
    """A model call's body as a JSON object, or ``None`` (not JSON, not an object).

    Parsed once per call: the estimate and the model are read from it.
    """
    if not content.startswith(b"{"):
        return None
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def model_of_body(body: Mapping[str, object] | None) -> str | None:
    """The model a JSON body asks for (its ``model``), or ``None``."""
    return _model(None if body is None else body.get("model"))


def model_of_provider(provider: object) -> str | None:
    """The model a provider asks for (ours name theirs), or ``None``."""
    return _model(getattr(provider, "model", None))


def _model(model: object) -> str | None:
    """``model`` if it names one (a non-empty string), else ``None``."""
    return model if isinstance(model, str) and model else None


def estimate_json_prompt_tokens(body: Mapping[str, object] | None) -> int:
    """The prompt's part of ``estimate_json_tokens``: 0 for a body without ``messages``."""
    messages = None if body is None else body.get("messages")
    if body is None or not isinstance(messages, list):
        return 0
    chars = sum(
        _text_length(body.get(field)) for field in ("messages", "system", "tools")
    )
    return 3 + 4 * len(messages) + (chars + 3) // 4


def estimate_json_tokens(
    body: Mapping[str, object] | None,
    default_max_tokens: int,
    prompt_tokens: int | None = None,
) -> int:
    """The tokens a model call's JSON body is charged at grant time; 0 for none.

    A JSON object with a ``messages`` list: its prompt (the text of its
    messages, ``system`` and ``tools``, 4 characters a token, plus a few
    tokens of framing per message, as ``estimate_prompt_tokens`` counts a
    ``ChatRequest``) and ``n`` answers of ``max_tokens`` (or
    ``max_completion_tokens``; ``default_max_tokens`` if neither). Any
    other body, JSON or not (``None``), is 0. ``prompt_tokens``: the
    body's ``estimate_json_prompt_tokens``, if made already.
    """
    prompt = (
        estimate_json_prompt_tokens(body) if prompt_tokens is None else prompt_tokens
    )
    if body is None or not prompt:
        return 0
    answer = _count(body.get("max_tokens"))
    if answer is None:
        answer = _count(body.get("max_completion_tokens"))
    if answer is None:
        answer = default_max_tokens
    answers = _count(body.get("n")) or 1
    return prompt + answers * answer


def figures_of(answer: object) -> RateLimitInfo | None:
    """The rate-limit figures an answer carries (``rate_limits``), or ``None``.

    An opened stream of a provider, or a ``ProviderError``: both carry what
    their answer's headers said, when there were figures.
    """
    info = getattr(answer, "rate_limits", None)
    return info if isinstance(info, RateLimitInfo) and not info.empty else None


@final
class RateLimitReader:
    """Reads the rate-limit figures of raw answer headers, either format.

    One per transport: a malformed header is logged once per reader and
    header name (``MalformedHeaderLog``).
    """

    __slots__ = ("_malformed", "_provider")

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._malformed: Callable[[str, str], None] | None = None

    def read(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        """The figures of ``headers``, or ``None`` if they carry none."""
        wire = _format_of(headers)
        if wire is None:
            return None
        if self._malformed is None:
            self._malformed = MalformedHeaderLog(self._provider)
        info = wire.read_rate_limits(
            headers, now=datetime.now(UTC), on_malformed=self._malformed
        )
        return None if info.empty else info


def format_of_path(path: str) -> Format | None:
    """The wire format whose model call ``path`` ends with, or ``None``."""
    path = path.rstrip("/")
    for wire in FORMATS.values():
        if path.endswith(wire.path):
            return wire
    return None


def _format_of(headers: Mapping[str, str]) -> Format | None:
    """The wire format whose rate-limit headers ``headers`` carry, or ``None``.

    The one with the most headers under its prefix, if a proxy mixed two;
    the first in ``FORMATS`` on a tie.
    """
    names = [name.lower() for name in headers]
    counts = [
        (sum(name.startswith(wire.rate_limit_prefix) for name in names), wire)
        for wire in FORMATS.values()
    ]
    count, wire = max(counts, key=lambda pair: pair[0])
    return wire if count else None


_Answer = TypeVar("_Answer")

#: What a metered answer calls: nothing.
_QUIET: Final = RateLimitHooks("metered", None, None)


class _Hooked(Protocol):
    """An answer of our providers: the callbacks it tells, which a meter may trim."""

    rate_limit_hooks: RateLimitHooks


@final
class Meter:
    """One model call's metering: "answered, then maybe pause" (see above)."""

    __slots__ = ("_dispatcher", "_slot", "_started")

    def __init__(self, dispatcher: Plumbing, slot: Slot) -> None:
        self._dispatcher = dispatcher
        self._slot = slot
        self._started = False

    def metered(self, answer: _Answer) -> _Answer:
        """``answer`` (a provider's stream, not yet entered), metered here.

        A provider's callbacks (``on_rate_limits``, ``on_rate_limit``) are
        for its calls made without a slot; this answer calls none of them.
        What they would tell the dispatcher, the meter tells it, once, the
        answer's start first (and ``events()`` shows it).
        """
        if isinstance(getattr(answer, "rate_limit_hooks", None), RateLimitHooks):
            cast("_Hooked", answer).rate_limit_hooks = _QUIET
        return answer

    def answered(
        self,
        info: RateLimitInfo | None,
        *,
        started: bool = True,
        pause: bool = False,
        retry_after: float | None = None,
    ) -> None:
        """An answer arrived: its start, its figures ``info``, maybe a pause.

        ``started=False`` for an answer that may not have reached the
        provider (an error without figures); ``retry_after`` is the pause a
        rate-limit answer (``pause``) asked for, or ``None`` to back off.
        """
        dispatcher = self._dispatcher
        # A pool's member granted: its limits the answer speaks of.
        provider = self._slot.member or self._slot.provider
        if started and not self._started:
            self._started = True
            self._slot.answered()
        if info is not None:
            dispatcher.observe_rate_limits(provider, info, model=self._slot.model)
        if pause:
            dispatcher.report_rate_limit(provider, retry_after)


@final
class TokenTimes:
    """When an answer's tokens came: the first, the latest, and how many.

    Given its wire format's ``decoder``, it also reads raw server-sent
    events (``heard_events``), counting the token events they decode to: a
    stream's opening events (its role, ``message_start``) may come before
    the model's first token, and its closing ones (the finish, the usage)
    carry none. Without a decoder (a body of no known format, or one the
    decoder gave up on), each event counts as a token.
    """

    __slots__ = ("_decoder", "count", "first", "last", "prompt_tokens")

    def __init__(self, prompt_tokens: int, decoder: WireDecoder | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.first = self.last = 0.0
        self.count = 0
        self._decoder = decoder

    def heard_events(self, events: list[ServerSentEvent]) -> None:
        """These server-sent events came now (a transport's body)."""
        tokens = 0
        for event in events:
            decoder = self._decoder
            if decoder is not None:
                try:
                    decoded = decoder.feed(event)
                except Exception:  # the SDK meets it; timing goes on without
                    self._decoder = None
                else:
                    tokens += sum(type(each) in _TOKENS for each in decoded)
                    continue
            tokens += event.data != "[DONE]"
        if tokens:
            self.heard(tokens)

    def heard(self, tokens: int = 1) -> None:
        """``tokens`` more came now."""
        now = trio.current_time()
        if not self.count:
            self.first = now
        self.last = now
        self.count += tokens

    def report(self, slot: Slot) -> None:
        """The answer ended: tell its slot, if it is still held and any token came."""
        if self.count and slot.held:
            slot.report_timing(
                first_token_at=self.first,
                last_token_at=self.last,
                output_tokens=self.count,
                prompt_tokens=self.prompt_tokens,
            )


@final
class MeteredEvents:
    """A stream's events, passed on; its ``Usage`` corrects the slot's estimate.

    It is also the usage a ``CallWatch`` of the call reports, if one is given,
    and the clock of its tokens (``TokenTimes``), reported when it ends.
    """

    __slots__ = ("_events", "_slot", "_times", "_watch")

    def __init__(
        self,
        events: AsyncIterator[StreamEvent],
        slot: Slot,
        watch: CallWatch | None = None,
        times: TokenTimes | None = None,
    ) -> None:
        self._events = events
        self._slot = slot
        self._watch = watch
        self._times = times

    def __aiter__(self) -> MeteredEvents:
        return self

    async def __anext__(self) -> StreamEvent:
        times = self._times
        try:
            event = await self._events.__anext__()
        except StopAsyncIteration:
            if times is not None:
                self._times = None
                times.report(self._slot)
            raise
        if times is not None and type(event) in _TOKENS:
            times.heard()
        if type(event) is Usage:
            if self._slot.held:
                self._slot.report_usage(event.prompt_tokens + event.output_tokens)
            if self._watch is not None:
                self._watch.usage = event
        return event
