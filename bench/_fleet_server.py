"""The paced LLM server of ``bench/fleet.py``, run in its own process.

Usage (``fleet.py`` starts it)::

    python bench/_fleet_server.py --rate 50 --tokens 425 --lifetime 280

Listens on 127.0.0.1 (a free port, printed on the first line of stdout)
and answers every request, whatever it asks, with an OpenAI chat
completion stream: a first chunk whose text is the stream's schedule start
(``time.monotonic()``, the clock every process of the machine shares), then
``--tokens`` token chunks, token ``i`` due ``i / rate`` seconds after the
start, then the finish, usage and ``[DONE]``; then it closes the
connection. The chunks are precomputed bytes. One thread, one selector,
one heap of due times: cheap enough to serve thousands of streams.

Each line read from stdin asks for the figures since the last one, printed
as one JSON line: streams started, tokens sent, the p99 and largest delay
between a token's due time and its sending, and the server's CPU share.
It exits when stdin closes, or after ``--lifetime`` seconds at most.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import selectors
import socket
import sys
import time
from typing import IO, Final

_ENVELOPE: Final = (
    '"id":"chatcmpl-fleet","object":"chat.completion.chunk","created":1,'
    '"model":"fleet","system_fingerprint":"fp_fleet"'
)


def _chunk(delta: str, finish: str = "null") -> bytes:
    choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish}}}'
    return f'data: {{{_ENVELOPE},"choices":[{choice}],"usage":null}}\n\n'.encode()


_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\nconnection: close\r\n\r\n"
)
_TOKEN: Final = _chunk('{"content":" tok"}')
_END: Final = (
    _chunk("{}", '"stop"')
    + f'data: {{{_ENVELOPE},"choices":[],"usage":{{"prompt_tokens":9,"completion_tokens":1}}}}\n\n'.encode()
    + b"data: [DONE]\n\n"
)


class _Connection:
    __slots__ = ("closing", "dead", "events", "inbox", "outbox", "sent", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = b""
        self.outbox = b""
        self.sent = -1  # tokens sent; -1 until the request has arrived
        self.closing = False
        self.dead = False
        self.events = selectors.EVENT_READ


class _Server:
    """Serves paced streams from one thread with a selector; see the module notes."""

    def __init__(self, rate: float, tokens: int, control: IO[str]) -> None:
        self.interval = 1.0 / rate
        self.tokens = tokens
        self.control = control
        self.selector = selectors.DefaultSelector()
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(control, selectors.EVENT_READ, "control")
        self.due: list[tuple[float, int, _Connection]] = []
        self.sequence = 0
        self.lateness: list[float] = []
        self.streams = 0
        self.cpu_mark = (time.process_time(), time.monotonic())

    @property
    def port(self) -> int:
        port: int = self.listener.getsockname()[1]
        return port

    def run(self, lifetime: float) -> None:
        deadline = time.monotonic() + lifetime
        while time.monotonic() < deadline:
            now = time.monotonic()
            timeout = min(1.0, max(0.0, self.due[0][0] - now)) if self.due else 1.0
            for key, _ in self.selector.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "control":
                    if not self._control():
                        return
                else:
                    self._ready(key.data)
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                due, _, connection = heapq.heappop(self.due)
                if not connection.dead:
                    self.lateness.append(now - due)
                    self._next_token(connection, due)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while True:
                sock, _ = self.listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                connection = _Connection(sock)
                self.selector.register(sock, selectors.EVENT_READ, connection)

    def _control(self) -> bool:
        line = self.control.readline()
        if not line:
            return False  # the parent is gone
        ordered = sorted(self.lateness)
        cpu, wall = self.cpu_mark
        self.cpu_mark = (time.process_time(), time.monotonic())
        report = {
            "streams": self.streams,
            "tokens": len(ordered),
            "late_p99_ms": 1e3 * _quantile(ordered, 0.99) if ordered else 0.0,
            "late_max_ms": 1e3 * ordered[-1] if ordered else 0.0,
            "cpu_share": (self.cpu_mark[0] - cpu) / (self.cpu_mark[1] - wall),
        }
        self.lateness.clear()
        self.streams = 0
        print(json.dumps(report), flush=True)
        return True

    def _ready(self, connection: _Connection) -> None:
        if connection.outbox:
            self._flush(connection)
        if connection.dead:
            return
        try:
            data = connection.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)  # the peer left
        elif connection.sent < 0:
            connection.inbox += data
            self._maybe_start(connection)

    def _maybe_start(self, connection: _Connection) -> None:
        head, found, body = connection.inbox.partition(b"\r\n\r\n")
        if not found:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(body) < length:
            return
        # The schedule starts now; the first chunk says when, and token i
        # is due interval * i after it.
        start = time.monotonic()
        self.streams += 1
        connection.sent = 0
        self._send(connection, _HEAD + _chunk(json.dumps({"content": repr(start)})))
        self._push(start + self.interval, connection)

    def _push(self, due: float, connection: _Connection) -> None:
        self.sequence += 1
        heapq.heappush(self.due, (due, self.sequence, connection))

    def _next_token(self, connection: _Connection, due: float) -> None:
        connection.sent += 1
        if connection.sent < self.tokens:
            self._send(connection, _TOKEN)
            self._push(due + self.interval, connection)
        else:
            connection.closing = True
            self._send(connection, _TOKEN + _END)

    def _send(self, connection: _Connection, data: bytes) -> None:
        connection.outbox += data
        self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbox)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(connection)
            return
        connection.outbox = connection.outbox[sent:]
        events = selectors.EVENT_READ
        if connection.outbox:
            events |= selectors.EVENT_WRITE
        elif connection.closing:
            self._drop(connection)
            return
        if events != connection.events:
            connection.events = events
            self.selector.modify(connection.sock, events, connection)

    def _drop(self, connection: _Connection) -> None:
        if connection.dead:
            return
        connection.dead = True
        self.selector.unregister(connection.sock)
        connection.sock.close()


def _quantile(ordered: list[float], q: float) -> float:
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main(argv: list[str] | None = None) -> int:
    """Serve until the parent closes stdin or the lifetime runs out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, required=True, help="tokens/s")
    parser.add_argument("--tokens", type=int, required=True, help="per stream")
    parser.add_argument("--lifetime", type=float, required=True, help="seconds")
    args = parser.parse_args(argv)
    server = _Server(args.rate, args.tokens, sys.stdin)
    print(server.port, flush=True)
    server.run(args.lifetime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
