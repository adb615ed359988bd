"""The admin API served on loopback by hypercorn on trio, for the admin tests."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from trio_dispatch.admin import admin_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import httpx

    from trio_dispatch import Dispatcher

TOKEN = "admin-test-token-0123456789abcdef"
"""The token every served admin app of the tests takes."""

AUTH = {"authorization": f"Bearer {TOKEN}"}
"""The headers of a request that presents ``TOKEN``."""

PROBLEM = "application/problem+json"
"""The media type of every refusal."""


def state(dispatcher: Dispatcher) -> tuple[dict[str, int], dict[str, Any], object]:
    """What a refused request must leave as it was: limits, pauses, tenants."""
    providers = dispatcher.statistics().providers
    return (
        dispatcher.limits(),
        {name: (stats.limit, stats.paused_until) for name, stats in providers.items()},
        dispatcher.tenants(),
    )


def problem(response: httpx.Response, status: int) -> str:
    """Check ``response`` is an RFC 9457 problem of ``status``; its detail."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert set(body) == {"type", "title", "status", "detail"}
    assert body["status"] == status
    assert body["type"] == "about:blank"
    detail = body["detail"]
    assert isinstance(detail, str)
    return detail


def loopback_config() -> Config:
    """A hypercorn config that binds a free loopback port and logs nothing."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("tests.admin.hypercorn")
    return config


@asynccontextmanager
async def serve_admin(dispatcher: Dispatcher, token: str = TOKEN) -> AsyncIterator[str]:
    """Serve ``admin_app(dispatcher)`` for the block; yield its base URL.

    Served as an application would: hypercorn on trio in a nursery of the
    same run, stopped by its shutdown trigger.
    """
    app = admin_app(dispatcher, token=token)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(serve, app, loopback_config(), shutdown_trigger=stop.wait)  # type: ignore[arg-type]  # an ASGI app; hypercorn's TypedDicts are stricter than its Mapping
        )
        try:
            yield binds[0]
        finally:
            stop.set()
