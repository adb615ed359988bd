from __future__ import annotations

import os
from typing import TYPE_CHECKING

import coredis
import pytest
from hypothesis import settings

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
