"""Real redis-server processes for the shared-backend tests.

Each server runs on a free loopback port in its own directory, with no
persistence, so a test can kill it and start it again empty. ``Faults``
cuts one process off from it, or loses the answer of one of its steps.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest
from coredis.exceptions import ConnectionError as RedisConnectionError

from trio_dispatch._ledger import Ledger, StepResult

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from trio_dispatch import Dispatcher

REDIS_SERVER = shutil.which("redis-server")

needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed"
)

# coredis (6.2 to 6.9 at least) leaves a connection's memory streams
# unclosed when connecting fails; their ResourceWarning says nothing about
# this code. Tests that meet a refused connection ignore it, and the
# server's teardown collects the garbage under the test's warning filters,
# so that the warning cannot surface in a later test.
coredis_leaks = pytest.mark.filterwarnings(
    "ignore:Unclosed <MemoryObject(Send|Receive)Stream:ResourceWarning"
)


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process that a test may kill and start again."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # A readiness probe at startup, before any trio code runs.
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextlib.contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        gc.collect()


class Faults:
    """Steps that fail, per process (its book's node), in place of ``Ledger.step``.

    A node in ``down`` cannot reach Redis (a partition: the others can); a
    node in ``lose_next`` loses the answer of its next step that enqueues,
    after Redis ran it (kept in ``lost``).
    """

    def __init__(self) -> None:
        self.lose_next: set[str] = set()
        self.down: set[str] = set()
        self.lost: list[StepResult] = []

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> Faults:
        """Patch ``Ledger.step`` for the test; returns the switches."""
        faults = cls()
        step = Ledger.step

        async def faulty(
            self: Ledger,
            provider: str,
            node: str,
            *args: Any,  # noqa: ANN401  # passed through
            **kwargs: Any,  # noqa: ANN401  # passed through
        ) -> StepResult:
            if node in faults.lose_next and kwargs.get("enqueue"):
                # Redis runs the script; its answer never reaches the process.
                faults.lose_next.discard(node)
                faults.lost.append(await step(self, provider, node, *args, **kwargs))
                raise RedisConnectionError("connection closed by server")
            if node in faults.down:
                raise RedisConnectionError("connection refused")
            return await step(self, provider, node, *args, **kwargs)

        monkeypatch.setattr(Ledger, "step", faulty)
        return faults


def node_of(dispatcher: Dispatcher, provider: str = "p") -> str:
    """The node name of a dispatcher's share of ``provider``."""
    return dispatcher._books[provider].node
