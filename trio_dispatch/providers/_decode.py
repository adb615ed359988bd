"""What a wire format's decoder is, and the helpers every decoder uses.

A decoder is a small synchronous state machine (no I/O, no trio) that turns
each server-sent event into stream events and knows whether the stream
reached its terminator: a ``WireDecoder``. ``EventStream`` feeds it;
``_openai.py`` and ``_anthropic.py`` hold one each. They parse an event's
data with ``raw_json`` on their fast path and ``parse_json_data``
on their full one, and turn it into their attrs classes with
``structure_event``: data that makes no sense becomes ``MalformedStream``
naming the problem.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, ClassVar, Final, TypeVar

from .._converter import describe_error, structure
from .._exceptions import MalformedStream, StreamInterrupted

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..messages import StreamEvent
    from ._sse import ServerSentEvent

_T = TypeVar("_T")


# A decoder's fast path parses with this: on a small chunk, json.loads
# spends a quarter to a half of its time around it (two whitespace regexes,
# three calls). Data it does not take whole, (value, end) with end ==
# len(data), goes to the full path and parse_json_data, which accept or
# refuse it as always.
raw_json: Final = json.JSONDecoder().raw_decode


class WireDecoder:
    """A wire format's parser: server-sent events in, stream events out.

    Pure and synchronous. ``feed`` returns the stream events one
    server-sent event completes, in order, and raises ``MalformedStream``
    for an event that makes no sense and the typed error for an error
    event. A subclass's ``_fast`` takes an event whose data is one JSON
    value and returns its events, or ``None`` (having changed nothing) to
    leave it to ``_feed``, the full path.
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
            pass  # a terminator, a keep-alive, or not JSON: the full path says which
        else:
            if end == len(data):
                fast = self._fast(payload, event)
                if fast is not None:
                    return fast
        return self._feed(event)

    def end_of_stream(self) -> list[StreamEvent]:
        """The body ended: the last events, or ``StreamInterrupted``."""
        if not self._done:
            raise StreamInterrupted(
                f"{self._provider}: the stream ended without {self._terminator}",
                provider=self._provider,
            )
        return []

    def _fast(
        self, payload: object, event: ServerSentEvent
    ) -> list[StreamEvent] | None:
        raise NotImplementedError

    def _feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        raise NotImplementedError

    def _malformed(self, problem: str) -> MalformedStream:
        return MalformedStream(f"{self._provider}: {problem}", provider=self._provider)


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


def structure_event(provider: str, data: object, cls: type[_T], what: str) -> _T:
    """``data`` as ``cls``, or ``MalformedStream`` naming every wrong field."""
    try:
        return structure(data, cls)
    except Exception as exc:  # cattrs raises several kinds; nothing awaits here
        problem = describe_error(exc)
    # Out here, as in parse_json_data: cattrs' errors may hold the values.
    raise MalformedStream(
        f"{provider}: {what} does not fit the format: {problem}", provider=provider
    )
