"""Server-sent events, decoded exactly as the HTML specification says.

``SSEDecoder`` is a pure, incremental decoder: bytes in, as they come off
the wire and cut anywhere, ``ServerSentEvent`` values out. It follows the
specification's "Parsing an event stream" and "Interpreting an event
stream" (https://html.spec.whatwg.org/multipage/server-sent-events.html):

* UTF-8, whatever the ``Content-Type`` says, with one leading byte order
  mark stripped and malformed bytes read as U+FFFD;
* a line ends at CRLF, at LF, or at a lone CR, even when a chunk boundary
  falls between the CR and the LF;
* a line starting with a colon is a comment; a line without a colon is a
  field name with an empty value; one space after the colon is removed;
* ``data`` lines join with LF; ``event`` sets the type (``message`` if
  none); ``id`` sets the last event id, which carries over to later events,
  unless its value holds NULL; ``retry`` sets the reconnection time when its
  value is ASCII digits only; other fields are ignored;
* a blank line dispatches the event, unless no ``data`` line came, which
  dispatches nothing but still resets the type;
* an event not closed by a blank line when the stream ends is discarded.

One thing the specification leaves to the client: how much an event may
hold before it ends. A server that never ends a line, or an event, would
make the decoder hold all it sends; past ``max_event_bytes`` (the unended
line and the event's data so far) ``feed`` raises ``EventTooLarge``.

Neither httpx-sse nor httpx2's own reader does all of this: both keep the
byte order mark (so the first field is misread), dispatch events without
data, and decode with the response's charset; httpx2's also accepts
``retry`` values such as ``1_0`` and dispatches an unfinished last event
when the body ends in CR.

Every chunk of every stream passes here, so the work per line is kept
small: lines are split as bytes (a line break is never part of a multi-byte
UTF-8 sequence, so decoding line by line equals decoding the whole stream),
and only dispatched text is decoded.
"""

from __future__ import annotations

from typing import Final, NamedTuple, final

_BOM: Final = b"\xef\xbb\xbf"

MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""The default bound on one event (16 MiB): far above any model's answer."""


class EventTooLarge(ValueError):
    """An event, or a line of one, grew past the decoder's bound unended."""


class ServerSentEvent(NamedTuple):
    """One dispatched event: its type, its data and the last event id.

    A named tuple rather than an attrs class: one is made for every chunk
    of every stream, and this is the cheapest immutable value to make.
    """

    data: str
    event: str = "message"
    id: str = ""


@final
class SSEDecoder:
    """An event stream's decoder: ``feed`` it bytes, get the events they end.

    Pure and synchronous; one per stream. The last event id and the
    reconnection time the stream asked for are kept as the specification
    keeps them, for a client that reconnects.
    """

    __slots__ = (
        "_data",
        "_event",
        "_held",
        "_last_id",
        "_limit",
        "_parts",
        "_skip_lf",
        "_started",
        "_unended",
        "retry",
    )

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._limit = max_event_bytes
        # Bytes of the current event's data lines, and of the unended line.
        self._held = 0
        self._unended = 0
        self._parts: list[bytes] = []  # the line not yet ended
        self._started = False  # whether the byte order mark was looked for
        self._skip_lf = False  # the last chunk ended in CR: LF may follow
        self._data: list[bytes] = []
        self._event = b""
        self._last_id = ""
        self.retry: int | None = None
        """The reconnection time in milliseconds, if the stream set one."""

    @property
    def last_event_id(self) -> str:
        """The last event id the stream set (empty if none)."""
        return self._last_id

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events that ``chunk`` completes, in order (often none).

        Raises:
            EventTooLarge: The current event (its data and its unended
                line) holds more than ``max_event_bytes``.
        """
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not self._started:
            head = b"".join((*self._parts, chunk))
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._parts = [head] if head else []
                return []
            self._started = True
            self._parts = []
            chunk = head[len(_BOM) :] if head.startswith(_BOM) else head
        if b"\r" in chunk:
            if chunk[-1:] == b"\r":
                self._skip_lf = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            if chunk:
                self._parts.append(chunk)
                self._unended += len(chunk)
                self._check()
            return []
        lines = chunk.split(b"\n")
        parts = self._parts
        if parts:
            parts.append(lines[0])
            lines[0] = b"".join(parts)
            parts.clear()
        last = lines.pop()
        events = self._interpret(lines)
        self._unended = len(last)
        if last:
            parts.append(last)
        if self._held or last:
            self._check()
        return events

    def _check(self) -> None:
        if self._held + self._unended > self._limit:
            raise EventTooLarge(
                f"a server-sent event grew past {self._limit} bytes without ending"
            )

    def _interpret(self, lines: list[bytes]) -> list[ServerSentEvent]:
        events: list[ServerSentEvent] = []
        data = self._data
        for line in lines:
            if not line:  # a blank line: dispatch
                if data:
                    text = (data[0] if len(data) == 1 else b"\n".join(data)).decode(
                        "utf-8", "replace"
                    )
                    event = self._event
                    events.append(
                        ServerSentEvent(
                            text,
                            event.decode("utf-8", "replace") if event else "message",
                            self._last_id,
                        )
                    )
                    data.clear()
                    self._held = 0
                self._event = b""
                continue
            if line[0] == 0x3A:  # ":" a comment
                continue
            colon = line.find(b":")
            if colon < 0:
                name, value = line, b""
            else:
                name = line[:colon]
                value = line[colon + 1 :]
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                data.append(value)
                self._held += len(value) + 1
            elif name == b"event":
                self._event = value
            elif name == b"id":
                if b"\0" not in value:
                    self._last_id = value.decode("utf-8", "replace")
            elif name == b"retry" and value.isdigit():  # bytes: ASCII digits only
                self.retry = int(value)
        return events
