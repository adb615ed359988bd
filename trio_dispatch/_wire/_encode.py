"""What every format's stream encoder shares: the plan of a reply, its events.

The formats' encoders (``encode_stream`` in ``_openai.py`` and
``_anthropic.py``) are the decoders' counterparts, kept beside them as h11
keeps its writers beside its readers: a ``ReplyPlan`` in, the server-sent
events of the stream out, each a ``WireEvent`` that says what the format's
decoder makes of it. The fake server sends them; ``ScriptedProvider``
plays their stream events in memory.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import make_tool_call

if TYPE_CHECKING:
    from ..messages import StreamEvent, ToolCall


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


@attrs.frozen
class PlannedCall:
    """A tool call of a ``ReplyPlan``: its id, name and argument pieces."""

    id: str
    name: str
    pieces: list[str]


@attrs.frozen
class ReplyPlan:
    """What one streamed reply says, in the words of no format in particular.

    ``finish`` is the stream events' finish reason (``"stop"``,
    ``"tool_calls"``, ...); the token counts are as ``Usage`` counts them.
    """

    model: str
    message_id: str
    reasoning: list[str]
    text: list[str]
    calls: list[PlannedCall]
    finish: str
    input_tokens: int
    output_tokens: int
    cache_read: int
    cache_write: int

    def tool_calls(self) -> list[ToolCall]:
        """The plan's tool calls, as the decoders make them from their pieces."""
        return [
            make_tool_call(call.id, call.name, "".join(call.pieces))
            for call in self.calls
        ]


def sse(payload: object, event: str | None = None) -> bytes:
    """One server-sent event: ``payload`` as JSON data, with its name if given."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


# -- prompt caching, as the fake server plays it ----------------------------------


@attrs.frozen
class CacheSegment:
    """One piece of a prompt, in caching order, and whether a breakpoint ends it."""

    text: str
    marked: bool = False


@attrs.frozen
class CachePlan:
    """How a format caches one request's prompt.

    ``store``: what keeps its cache apart beside the API key (OpenAI's
    ``prompt_cache_key``); ``segments``: its prompt in caching order;
    ``last``: the segment whose prefix it reads at most, and caches if
    ``explicit`` (Anthropic's last breakpoint), else only reads (the
    prompt's end); ``written``: the segments whose prefixes it caches.
    """

    store: tuple[str, ...]
    segments: list[CacheSegment]
    last: int
    written: list[int]
    explicit: bool


def segment_text(value: Any) -> str:  # noqa: ANN401 (any JSON value)
    """A prompt piece as cache-comparable text: its JSON, breakpoints left out."""
    if isinstance(value, dict):
        value = {key: item for key, item in value.items() if key != "cache_control"}
    return json.dumps(value, sort_keys=True)


def marked(value: object) -> bool:
    """Whether a prompt piece carries a ``cache_control`` breakpoint."""
    return isinstance(value, dict) and "cache_control" in value
