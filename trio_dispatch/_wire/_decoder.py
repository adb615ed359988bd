"""What a wire format's decoder is, and what every decoder shares.

A decoder is a small synchronous state machine (no I/O, no trio) that turns
each server-sent event into stream events and knows whether the stream
reached its terminator: a ``WireDecoder``. ``EventStream`` feeds it; each
format's module (``_openai.py``, ``_anthropic.py``) holds one.

Each decoder is written by hand: dict lookups that check every field they
read as they read it. DESIGN.md turns wire JSON into domain objects through
the private cattrs converter, and the decoders did, beside a hand-written
fast path for the common deltas. Measured (``timeit`` of ``feed`` on one
event, CPython 3.11, the machine ``bench/decode.py --quick`` ran on),
structuring through cattrs cost 9.7 µs for an OpenAI text chunk with its
envelope against 2.7 µs read by hand, and 6.1 against 1.4 µs for an
Anthropic text delta, where the whole minimal loop of ``bench/decode.py``
(httpx2, its SSE reader and ``json.loads``) costs 5 to 7 µs a chunk: a
cattrs decoder alone would cost about twice the minimal loop, against a
target of 1.3x. So one hand-written decoder per format, and the converter
stays for what is not a hot loop (trace files, configuration).

What cattrs gave, a message naming every wrong field, comes from the
format's ``Shape`` values: when a check fails, ``misfit`` walks the event
against its shape and names every field that does not fit, in the words
the converter uses (``expected a string, got number @ $.delta.text``).
The shapes are the formats' documentation too; the decoders never read
through them on the way that works.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, Final, TypeAlias

import attrs

from .._exceptions import MalformedStream, StreamInterrupted
from .._json import json_kind

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..messages import StreamEvent
    from ._sse import ServerSentEvent


# An event's data is parsed with this first: on a small chunk, json.loads
# spends a quarter to a half of its time around it (two whitespace regexes,
# three calls). Data it does not take whole, (value, end) with end ==
# len(data), goes to parse_json_data, which accepts or refuses it as
# json.loads does.
raw_json: Final = json.JSONDecoder().raw_decode

# -- shapes: what an event's JSON must be ---------------------------------------

#: A JSON string.
TEXT: Final = "a string"
#: A JSON integer (not a boolean).
INT: Final = "an integer"


@attrs.frozen
class Field:
    """One field of an ``Obj``: its name, its shape, whether it may be left out.

    ``required``: the field must be there. ``nullable``: ``null`` is as
    good as leaving it out (otherwise ``null`` is a value of the wrong kind).
    """

    name: str
    shape: Shape
    required: bool = False
    nullable: bool = True


@attrs.frozen
class Obj:
    """A JSON object with these fields; others are ignored."""

    fields: tuple[Field, ...]


@attrs.frozen
class Arr:
    """A JSON array of ``item``."""

    item: Shape


Shape: TypeAlias = "str | Obj | Arr"


def problems(value: object, shape: Shape, path: str = "$") -> list[str]:
    """Every way ``value`` does not fit ``shape``, depth first, field by field."""
    if isinstance(shape, Obj):
        if not isinstance(value, Mapping):
            return [f"expected an object, got {json_kind(value)} @ {path}"]
        found: list[str] = []
        for field in shape.fields:
            where = f"{path}.{field.name}"
            if field.name not in value:
                if field.required:
                    found.append(f"required field missing @ {where}")
                continue
            item = value[field.name]
            if item is None and field.nullable:
                continue
            found += problems(item, field.shape, where)
        return found
    if isinstance(shape, Arr):
        if not isinstance(value, list | tuple):
            return [f"expected an array, got {json_kind(value)} @ {path}"]
        found = []
        for index, item in enumerate(value):
            found += problems(item, shape.item, f"{path}[{index}]")
        return found
    fits = isinstance(value, str) if shape == TEXT else type(value) is int
    return [] if fits else [f"expected {shape}, got {json_kind(value)} @ {path}"]


# -- the decoder ------------------------------------------------------------------


class WireDecoder:
    """A wire format's parser: server-sent events in, stream events out.

    Pure and synchronous. ``feed`` returns the stream events one
    server-sent event completes, in order, and raises ``MalformedStream``
    for an event that makes no sense and the typed error for an error
    event. A subclass reads each event's JSON in ``_on_payload``, and an
    event whose data is not JSON in ``_on_text`` (its terminator, if the
    format has one of those).
    """

    _terminator: ClassVar[str]

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        self._provider = provider
        self._redact = redact
        self._done = False

    @property
    def done(self) -> bool:
        """Whether the stream's terminator has arrived."""
        return self._done

    def feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        """The stream events ``event`` completes, in order."""
        data = event.data
        try:
            payload, end = raw_json(data)
        except (ValueError, RecursionError):
            end = -1  # a terminator, a keep-alive, or not JSON: said below
        if end != len(data):
            text = data.strip()
            if not text:
                return []  # a keep-alive
            events = self._on_text(text)
            if events is not None:
                return events
            payload = parse_json_data(self._provider, event, self._redact)
        return self._on_payload(payload, event)

    def end_of_stream(self) -> list[StreamEvent]:
        """The body ended: the last events, or ``StreamInterrupted``."""
        if not self._done:
            raise StreamInterrupted(
                f"{self._provider}: the stream ended without {self._terminator}",
                provider=self._provider,
            )
        return []

    def _on_text(self, text: str) -> list[StreamEvent] | None:
        """The events of data that is not one JSON value, or ``None``: refuse it."""
        return None

    def _on_payload(self, payload: object, event: ServerSentEvent) -> list[StreamEvent]:
        raise NotImplementedError

    def _malformed(self, problem: str) -> MalformedStream:
        return MalformedStream(f"{self._provider}: {problem}", provider=self._provider)

    def _misfit(self, payload: object, shape: Shape, what: str) -> MalformedStream:
        """The error of ``payload``, which a check found not to fit ``shape``."""
        found = problems(payload, shape)
        # A check stricter than its shape is a bug of this package's.
        assert found, f"{what} was refused, but fits its shape"
        return self._malformed(f"{what} does not fit the format: {'; '.join(found)}")


def parse_json_data(
    provider: str, event: ServerSentEvent, redact: Callable[[str], str] = str
) -> object:
    """An event's ``data`` as JSON, or ``MalformedStream`` naming the problem."""
    try:
        return json.loads(event.data)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
    # Raised out here, not in the except clause: the JSONDecodeError holds
    # the whole data, key and all, and would ride along as __context__.
    data = redact(event.data)  # before the cut, which could halve a key
    excerpt = data if len(data) <= 80 else data[:77] + "..."
    raise MalformedStream(
        f"{provider}: an event's data is not valid JSON ({reason}): {excerpt!r}",
        provider=provider,
    )
