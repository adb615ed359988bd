from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

import coredis
import pytest
from coredis.exceptions import ConnectionError as RedisConnectionError
from hypothesis import settings

from trio_dispatch._redis._ledger import Ledger

from ._redis import RedisServer, running_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

# CI gets more examples than a developer's quick run; both are bounded so the
# suite stays within CI's time.
settings.register_profile("ci", max_examples=500, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, on a free port, to kill and restart."""
    with running_redis(tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def shared_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisServer]:
    """A redis-server for a module's examples (each uses a namespace of its own)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[coredis.Redis[str]]:
    """A coredis client of the test's redis-server, as the ledger wants one."""
    async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
        yield client


@pytest.fixture(scope="module")
def dead_ledgers() -> Iterator[set[Ledger]]:
    """The ledgers of crashed processes (``crash``): every script they run fails."""
    dead: set[Ledger] = set()
    run = Ledger._run

    async def run_unless_dead(
        ledger: Ledger,
        *args: Any,  # noqa: ANN401  # passed through
    ) -> Any:  # noqa: ANN401  # passed through
        if ledger in dead:
            raise RedisConnectionError("the process is gone")
        return await run(ledger, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Ledger, "_run", run_unless_dead)
        yield dead


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl+C raises KeyboardInterrupt for the test, as in a terminal.

    A background job (``cmd &``, ``nohup``) and many CI runners start with
    SIGINT ignored, and a raised SIGINT then does nothing at all: a test
    waiting for its KeyboardInterrupt would wait for ever. trio turns
    SIGINT into KeyboardInterrupt only when Python's own handler is
    installed as ``trio.run`` starts, so the test gets that handler, and the
    previous one is put back after it.
    """
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT's handler can only be set from the main thread")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: a handler not set from Python, which Python cannot put back.
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
