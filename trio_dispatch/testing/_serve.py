"""The fake LLM server on loopback, served by hypercorn (the ``testing`` extra)."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from ._fake_server import FakeLLMServer
from ._script import FakeScript

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from ._quotas import FakeQuotas

_logger = logging.getLogger("trio_dispatch.testing.fake_server")


def open_fake_llm_server(
    script: FakeScript | None = None,
    *,
    api_key: str | None = None,
    quotas: FakeQuotas | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AbstractAsyncContextManager[FakeLLMServer]:
    """Serve a ``FakeLLMServer`` on loopback for the ``async with`` block.

    The arguments are checked at the call, before anything is bound. On exit
    the server stops at once, cancelling the requests being answered.

    Args:
        script: What to answer; a default ``FakeScript`` if not given.
        api_key: If given, the only key accepted (non-empty, without
            surrounding whitespace); ``None`` accepts any non-empty key.
        quotas: Rate limits to keep for each API key; none if not given.
        host: The address to bind.
        port: The port to bind; ``0`` picks a free one.

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: ``api_key`` is empty or has surrounding whitespace.
    """
    server = FakeLLMServer(
        FakeScript() if script is None else script, api_key=api_key, quotas=quotas
    )
    return _serve(server, host=host, port=port)


@asynccontextmanager
async def _serve(
    server: FakeLLMServer, *, host: str, port: int
) -> AsyncIterator[FakeLLMServer]:
    try:
        from hypercorn.config import Config  # noqa: PLC0415 (an optional dependency)
        from hypercorn.trio import serve  # noqa: PLC0415 (an optional dependency)
    except ModuleNotFoundError as exc:  # pragma: no cover (installed for tests)
        raise ModuleNotFoundError(
            "the fake LLM server needs hypercorn: pip install 'trio-dispatch[testing]'"
        ) from exc
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = _logger
    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            await serve(server, config, mode="asgi", task_status=task_status)  # type: ignore[arg-type]  # FakeLLMServer is an ASGI app; hypercorn's TypedDicts are stricter than its Mapping
            # hypercorn returns only when told to shut down, which nothing
            # here does but a KeyboardInterrupt landing in one of its tasks,
            # which it swallows. Raise it again: Ctrl+C meant to stop, and
            # the block must not go on against a server that is gone.
            if not nursery.cancel_scope.cancel_called:
                raise KeyboardInterrupt

        binds = await nursery.start(run)
        server.serving_at(binds[0])
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
