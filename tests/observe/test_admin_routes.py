"""The admin API's route table: the app serves it, the document describes it.

One table (``trio_dispatch.admin._routes.ROUTES``) says of each route its
method, path pattern, handler, need for the token and answers; the app
routes by it and the OpenAPI document is built from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from trio_dispatch import open_dispatcher
from trio_dispatch.admin._openapi import openapi_document
from trio_dispatch.admin._routes import ROUTES, Route

from .._admin import AUTH, serve_admin, state

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher

DOCUMENTED = [
    ("GET", "/limits"),
    ("PUT", "/limits/{provider}"),
    ("DELETE", "/limits/{provider}"),
    ("GET", "/status"),
    ("POST", "/providers/{provider}/resume"),
    ("GET", "/tenants"),
    ("PUT", "/tenants/{tenant}"),
    ("DELETE", "/tenants/{tenant}"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/openapi.json"),
]
"""The routes of the admin API, in the document's order."""


@pytest.fixture
async def dispatcher() -> AsyncIterator[Dispatcher]:
    async with open_dispatcher(
        {"openai": 2, "anthropic": 3}, max_pause=3600.0
    ) as dispatcher:
        dispatcher.report_rate_limit("anthropic", 3000.0)
        yield dispatcher


@pytest.fixture
async def client(dispatcher: Dispatcher) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        yield client


def test_the_document_has_one_operation_per_route_of_the_table() -> None:
    paths = openapi_document()["paths"]
    documented = [
        (method.upper(), path, operation["operationId"])
        for path, item in paths.items()
        for method, operation in item.items()
        if method != "parameters"
    ]
    assert documented == [
        (route.method, route.path, route.operation_id) for route in ROUTES
    ]
    assert [(method, path) for method, path, _ in documented] == DOCUMENTED


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.operation_id)
async def test_each_route_of_the_table_is_served_as_it_says(
    client: httpx.AsyncClient, dispatcher: Dispatcher, route: Route
) -> None:
    # The table names the handler, the need for the token and the answers;
    # the app serves each route by it, and the document says the same.
    operation = openapi_document()["paths"][route.path][route.method.lower()]
    assert ("security" in operation) is not route.auth
    assert list(operation["responses"]) == [str(status) for status in route.responses]
    path = route.path.replace("{provider}", "anthropic").replace("{tenant}", "acme")
    body = {"limit": 1} if route.request is not None else None
    before = state(dispatcher)
    refused = await client.request(route.method, path, json=body)
    assert refused.status_code == (401 if route.auth else 200)
    assert state(dispatcher) == before
    answered = await client.request(route.method, path, headers=AUTH, json=body)
    assert answered.status_code == 200, answered.text
    assert str(answered.status_code) in operation["responses"]
    media_type = answered.headers["content-type"].partition(";")[0]
    assert media_type in operation["responses"]["200"]["content"]
