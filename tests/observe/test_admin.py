"""The admin API over a real socket: every route, the token, every bad input.

Each test serves ``admin_app`` with hypercorn on trio in the test's own run,
as an application would, and talks to it with httpx over loopback. A refused
request is checked to change nothing: the limits and pauses before and
after are compared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import types
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import trio.testing
from hypercorn.trio import serve

from trio_dispatch import AdaptiveLimit, Budget, ServerLoad, Tenant, open_dispatcher
from trio_dispatch.admin import (
    MAX_BODY_BYTES,
    MAX_LIMIT,
    MAX_PROVIDER_LENGTH,
    MIN_TOKEN_LENGTH,
    admin_app,
)

from .._admin import AUTH, TOKEN, loopback_config, problem, serve_admin, state
from .._helpers import settle

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from trio_dispatch import Dispatcher


@pytest.fixture
async def dispatcher() -> AsyncIterator[Dispatcher]:
    async with open_dispatcher(
        {"openai": 2, "anthropic": 3}, max_pause=3600.0
    ) as dispatcher:
        # A paused provider, so that a refused resume can be seen to change
        # nothing.
        dispatcher.report_rate_limit("anthropic", 3000.0)
        yield dispatcher


@pytest.fixture
async def client(dispatcher: Dispatcher) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        yield client


# -- admin_app's arguments -------------------------------------------------------


async def test_admin_app_checks_the_token_without_ever_showing_it(
    dispatcher: Dispatcher,
) -> None:
    with pytest.raises(TypeError, match=r"^token must be a string, got bytes$"):
        admin_app(dispatcher, token=TOKEN.encode())  # type: ignore[arg-type]  # the wrong type is the point
    with pytest.raises(TypeError, match=r"^token must be a string, got NoneType$"):
        admin_app(dispatcher, token=None)  # type: ignore[arg-type]  # the wrong type is the point
    with pytest.raises(
        ValueError,
        match=rf"^token must be at least {MIN_TOKEN_LENGTH} characters, got 0$",
    ):
        admin_app(dispatcher, token="")
    short = "s3cret-but-short"[:-1]
    with pytest.raises(
        ValueError, match=r"^token must be at least 16 characters, got 15$"
    ):
        admin_app(dispatcher, token=short)
    for bad in (
        "a token with spaces in it",
        "t\u00f6ken-0123456789abcdef",
        "tab\t0123456789abcdef",
    ):
        with pytest.raises(ValueError, match=r"^token must be visible ASCII") as info:
            admin_app(dispatcher, token=bad)
        assert bad not in str(info.value)
    app = admin_app(dispatcher, token=TOKEN)
    assert TOKEN not in repr(app)
    assert repr(app) == f"<AdminApp of {dispatcher!r}>"


async def test_admin_app_needs_a_dispatcher() -> None:
    with pytest.raises(TypeError, match=r"^dispatcher must be a Dispatcher, got dict$"):
        admin_app({}, token=TOKEN)  # type: ignore[arg-type]  # the wrong type is the point


async def test_the_app_refuses_to_run_outside_its_dispatchers_trio_run(
    dispatcher: Dispatcher,
) -> None:
    app = admin_app(dispatcher, token=TOKEN)
    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": []}

    async def never() -> dict[str, Any]:
        raise AssertionError("nothing may be read")  # pragma: no cover

    async def refuse(_message: dict[str, Any]) -> None:
        raise AssertionError("nothing may be sent")  # pragma: no cover

    def elsewhere() -> None:
        trio.run(app, scope, never, refuse)

    def under_asyncio() -> None:
        asyncio.run(app(scope, never, refuse))

    for run in (elsewhere, under_asyncio):
        with pytest.raises(
            RuntimeError, match=r"^the admin app must be served in the trio run"
        ):
            await trio.to_thread.run_sync(run)


# -- served as an application serves it ------------------------------------------


async def test_served_by_hypercorn_inside_the_applications_nursery() -> None:
    # What docs/manual.md shows: the server is one more task of the nursery that
    # holds the application's work, stopped by its shutdown trigger.
    async with (
        open_dispatcher({"openai": 8}) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        app = admin_app(dispatcher, token=TOKEN)
        stop = trio.Event()
        config = loopback_config()
        binds = await nursery.start(
            partial(serve, app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]  # an ASGI app; hypercorn's TypedDicts are stricter than its Mapping
        )
        async with httpx.AsyncClient(base_url=binds[0], headers=AUTH) as client:
            response = await client.put("/limits/openai", json={"limit": 4})
            assert response.json() == {"provider": "openai", "limit": 4}
        assert dispatcher.limits() == {"openai": 4}
        stop.set()
    # The nursery ended: the server stopped when told to, not by cancellation.
    assert not nursery.cancel_scope.cancel_called


def test_importing_the_admin_api_loads_no_server_or_http_library() -> None:
    code = (
        "import sys, trio_dispatch.admin\n"
        "heavy = {'httpx', 'httpx2', 'cattrs', 'hypercorn', 'hypothesis',"
        " 'prometheus_client', 'schemathesis'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout == "[]\n"


# -- the routes ------------------------------------------------------------------


async def test_healthz_needs_no_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"


async def test_get_limits(client: httpx.AsyncClient, dispatcher: Dispatcher) -> None:
    response = await client.get("/limits", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {"limits": {"openai": 2, "anthropic": 3}}
    dispatcher.remove_limit("anthropic")
    response = await client.get("/limits", headers=AUTH)
    assert response.json() == {"limits": {"openai": 2}}


async def test_put_limit_sets_it_and_grants_the_waiters_it_makes_room_for(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    holding = trio.Event()

    async def hold(done: trio.Event) -> None:
        async with dispatcher.slot("openai"):
            await done.wait()

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(hold, holding)
        await settle()
        before = dispatcher.statistics().providers["openai"]
        assert (before.in_flight, before.waiting) == (2, 2)

        response = await client.put("/limits/openai", headers=AUTH, json={"limit": 3})
        assert response.status_code == 200
        assert response.json() == {"provider": "openai", "limit": 3}
        assert dispatcher.limits()["openai"] == 3
        await settle()
        after = dispatcher.statistics().providers["openai"]
        assert (after.limit, after.in_flight, after.waiting) == (3, 3, 1)
        holding.set()


async def test_put_limit_of_a_new_provider_and_the_largest_limit(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    response = await client.put(
        "/limits/vllm", headers=AUTH, content=json.dumps({"limit": MAX_LIMIT})
    )
    assert response.status_code == 200
    assert response.json() == {"provider": "vllm", "limit": MAX_LIMIT}
    assert dispatcher.limits()["vllm"] == MAX_LIMIT


@pytest.mark.parametrize(
    ("path", "provider"),
    [
        ("/limits/openai%2Fgpt-4o", "openai/gpt-4o"),
        ("/limits/caf%C3%A9", "caf\u00e9"),
        ("/limits/a%20b", "a b"),
        ("/limits/%25", "%"),
        (f"/limits/{'p' * MAX_PROVIDER_LENGTH}", "p" * MAX_PROVIDER_LENGTH),
    ],
)
async def test_provider_names_are_percent_encoded_utf8(
    client: httpx.AsyncClient, dispatcher: Dispatcher, path: str, provider: str
) -> None:
    response = await client.put(path, headers=AUTH, json={"limit": 5})
    assert response.status_code == 200, response.text
    assert response.json() == {"provider": provider, "limit": 5}
    assert dispatcher.limits()[provider] == 5
    response = await client.delete(path, headers=AUTH)
    assert response.json() == {"provider": provider, "limit": None}
    assert provider not in dispatcher.limits()


async def test_delete_limit_lets_every_waiter_through(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    release = trio.Event()

    async def hold() -> None:
        async with dispatcher.slot("openai"):
            await release.wait()

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(hold)
        await settle()
        assert dispatcher.statistics().providers["openai"].waiting == 3
        response = await client.delete("/limits/openai", headers=AUTH)
        assert response.status_code == 200
        assert response.json() == {"provider": "openai", "limit": None}
        await settle()
        stats = dispatcher.statistics().providers["openai"]
        assert (stats.limit, stats.in_flight, stats.waiting) == (None, 5, 0)
        assert dispatcher.limits() == {"anthropic": 3}
        release.set()


async def test_delete_limit_of_an_unlimited_provider_is_idempotent(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    for _ in range(2):
        response = await client.delete("/limits/never-limited", headers=AUTH)
        assert response.status_code == 200
        assert response.json() == {"provider": "never-limited", "limit": None}
    assert dispatcher.limits() == {"openai": 2, "anthropic": 3}


async def test_status_is_the_statistics_as_plain_json(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    async with dispatcher.slot("openai"):
        response = await client.get("/status", headers=AUTH)
    assert response.status_code == 200
    body = response.json()
    assert body["closed"] is False
    assert set(body["providers"]) == {"openai", "anthropic"}
    openai = body["providers"]["openai"]
    stats = dispatcher.statistics().providers["openai"]
    assert openai == {
        "provider": "openai",
        "limit": 2,
        "in_flight": 1,
        "waiting": 0,
        "paused": False,
        "pause_remaining": None,
        "granted_total": 1,
        "released_total": 0,
        "withdrawn_total": 0,
        "rejected_total": 0,
        "peak_in_flight": 1,
        "peak_waiting": 0,
        "backend": "local",
        "backend_up": True,
        "local_in_flight": 1,
        "local_waiting": 0,
        "adaptive": False,
        "budget": None,
        "models": {},
        "tenants": {},
        "server_load": None,
        "server_slots": None,
        "affinity_hits": 0,
        "affinity_moves": 0,
        "failures": 0,
        "out_of_service_remaining": None,
        "half_open": False,
        "outages_total": 0,
    }
    assert body["pools"] == {}
    assert stats.released_total == 1  # given back since
    anthropic = body["providers"]["anthropic"]
    assert anthropic["paused"] is True
    assert type(anthropic["pause_remaining"]) is float
    assert 0.0 < anthropic["pause_remaining"] <= 3000.0


def test_status_shows_every_statistic() -> None:
    # A field added to ProviderStatistics must reach /status and its schema.
    import attrs  # noqa: PLC0415 (only this test needs it)

    from trio_dispatch import ProviderStatistics  # noqa: PLC0415
    from trio_dispatch.admin._openapi import openapi_document  # noqa: PLC0415

    fields = {field.name for field in attrs.fields(ProviderStatistics)}
    documented = openapi_document()["components"]["schemas"]["ProviderStatus"]
    shown = set(documented["properties"])
    assert shown == (fields - {"paused_until", "out_of_service_until"}) | {
        "pause_remaining",
        "out_of_service_remaining",
    }
    assert set(documented["required"]) == shown


async def test_status_shows_the_servers_load_and_its_slots(
    mock_clock: trio.testing.MockClock,
) -> None:
    async def load() -> ServerLoad:
        return ServerLoad(running=3, waiting=1, format="vllm")

    async with (
        open_dispatcher({"openai": 8}, server_load={"openai": load}) as dispatcher,
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        await trio.testing.wait_all_tasks_blocked()
        openai = (await client.get("/status")).json()["providers"]["openai"]
        assert openai["server_load"] == {"running": 3, "waiting": 1, "format": "vllm"}
        assert openai["server_slots"] == 3


async def test_status_shows_a_pause_as_the_seconds_left(
    mock_clock: trio.testing.MockClock,
) -> None:
    # A trio-clock instant means nothing to an operator: the seconds left do.
    async with open_dispatcher({"openai": 1}, max_pause=3600.0) as dispatcher:
        dispatcher.report_rate_limit("openai", 30.0)
        async with (
            serve_admin(dispatcher) as base_url,
            httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
        ):
            response = await client.get("/status")
            assert response.json()["providers"]["openai"]["pause_remaining"] == 30.0
            mock_clock.jump(12.5)
            response = await client.get("/status")
            openai = response.json()["providers"]["openai"]
            assert (openai["paused"], openai["pause_remaining"]) == (True, 17.5)


async def test_resume_lifts_the_pause_and_grants_the_waiters(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    granted = trio.Event()

    async def wait_for_a_slot() -> None:
        async with dispatcher.slot("anthropic"):
            granted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_a_slot)
        await settle()
        assert dispatcher.statistics().providers["anthropic"].waiting == 1
        response = await client.post("/providers/anthropic/resume", headers=AUTH)
        assert response.status_code == 200
        body = response.json()
        assert (body["provider"], body["paused"], body["pause_remaining"]) == (
            "anthropic",
            False,
            None,
        )
        await granted.wait()
    assert dispatcher.statistics().providers["anthropic"].granted_total == 1


async def test_resume_of_a_provider_not_paused_changes_nothing(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    before = state(dispatcher)
    response = await client.post("/providers/openai/resume", headers=AUTH)
    assert response.status_code == 200
    assert response.json()["paused"] is False
    assert state(dispatcher) == before


async def test_resume_of_an_unknown_provider_is_404(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    before = state(dispatcher)
    response = await client.post("/providers/opneai/resume", headers=AUTH)
    assert problem(response, 404) == "no provider named 'opneai' is limited or used"
    assert state(dispatcher) == before


async def test_openapi_document(client: httpx.AsyncClient) -> None:
    response = await client.get("/openapi.json", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["openapi"] == "3.1.0"
    operations = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert operations == set(ROUTES)
    assert document["components"]["securitySchemes"] == {
        "bearerAuth": {
            "type": "http",
            "scheme": "bearer",
            "description": "The token given to admin_app(..., token=...).",
        }
    }
    assert document["security"] == [{"bearerAuth": []}]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            if path == "/healthz":
                assert operation["security"] == []
                assert "401" not in operation["responses"]
            else:
                assert "security" not in operation  # the document's applies
                assert "401" in operation["responses"]
    update = document["components"]["schemas"]["LimitUpdate"]
    assert update["properties"]["limit"]["maximum"] == MAX_LIMIT
    assert update["additionalProperties"] is False
    parameter = document["paths"]["/limits/{provider}"]["parameters"][0]
    assert parameter["schema"]["maxLength"] == MAX_PROVIDER_LENGTH
    assert (
        str(MAX_BODY_BYTES)
        in document["paths"]["/limits/{provider}"]["put"]["responses"]["413"][
            "description"
        ]
    )


# -- /metrics --------------------------------------------------------------------


@pytest.fixture
def no_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trio_dispatch.metrics`` cannot be imported, whether it exists or not."""
    monkeypatch.setitem(sys.modules, "trio_dispatch.metrics", None)


@pytest.mark.usefixtures("no_collector")
async def test_metrics_without_the_collector_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics", headers=AUTH)
    assert problem(response, 404) == "this trio-dispatch has no Prometheus collector"


async def test_metrics_without_prometheus_client_is_404(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("prometheus_client.exposition", "prometheus_client.registry"):
        monkeypatch.setitem(sys.modules, name, None)
    response = await client.get("/metrics", headers=AUTH)
    assert problem(response, 404) == "metrics need the prometheus_client package"


@pytest.fixture
def stand_in_collector(monkeypatch: pytest.MonkeyPatch) -> list[Dispatcher]:
    """A ``trio_dispatch.metrics`` whose collector reports the limits.

    Stands in for the real collector (whose own tests check its figures),
    to check what the route does with one. Returns the dispatchers the
    collectors were made for.
    """
    metrics_core = pytest.importorskip("prometheus_client.metrics_core")
    made: list[Dispatcher] = []

    class PrometheusCollector:
        def __init__(self, dispatcher: Dispatcher) -> None:
            made.append(dispatcher)
            self._dispatcher = dispatcher

        def collect(self) -> Iterator[Any]:
            family = metrics_core.GaugeMetricFamily(
                "trio_dispatch_slots_limit", "The limit.", labels=["provider"]
            )
            for provider, limit in sorted(self._dispatcher.limits().items()):
                family.add_metric([provider], limit)
            yield family

    module = types.ModuleType("trio_dispatch.metrics")
    module.PrometheusCollector = PrometheusCollector  # type: ignore[attr-defined]  # a stand-in module
    monkeypatch.setitem(sys.modules, "trio_dispatch.metrics", module)
    return made


async def test_metrics_serves_the_collector_in_prometheus_text(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    stand_in_collector: list[Dispatcher],
) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    response = await client.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    samples = {
        s.labels["provider"]: s.value
        for s in families["trio_dispatch_slots_limit"].samples
    }
    assert samples == {"anthropic": 3.0, "openai": 2.0}
    # One collector for the app, made at the first scrape, of its dispatcher.
    await client.put("/limits/openai", headers=AUTH, json={"limit": 7})
    response = await client.get(
        "/metrics",
        headers={**AUTH, "accept": "application/openmetrics-text; version=1.0.0"},
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert 'trio_dispatch_slots_limit{provider="openai"} 7.0' in response.text
    assert response.text.endswith("# EOF\n")
    assert stand_in_collector == [dispatcher]


@pytest.mark.usefixtures("stand_in_collector")
async def test_metrics_needs_the_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    problem(response, 401)


# -- the token -------------------------------------------------------------------

ROUTES: list[tuple[str, str]] = [
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
GUARDED = [(method, path) for method, path in ROUTES if path != "/healthz"]

WRONG_AUTHORIZATIONS: list[list[tuple[str, str]]] = [
    [],
    [("authorization", "")],
    [("authorization", "Bearer")],
    [("authorization", f"Bearer {TOKEN[:-1]}")],
    [("authorization", f"Bearer {TOKEN}x")],
    [("authorization", f"Bearer {TOKEN.upper()}")],
    [("authorization", f"Basic {TOKEN}")],
    [("authorization", TOKEN)],
    [("authorization", f"Bearer{TOKEN}")],
    [("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")],
    [("x-api-key", TOKEN)],
]


@pytest.mark.parametrize(("method", "path"), GUARDED)
async def test_every_route_but_healthz_needs_the_token(
    client: httpx.AsyncClient, dispatcher: Dispatcher, method: str, path: str
) -> None:
    before = state(dispatcher)
    url = path.format(provider="anthropic", tenant="acme")
    body = json.dumps({"limit": 1}) if method == "PUT" else None
    for headers in WRONG_AUTHORIZATIONS:
        response = await client.request(method, url, headers=headers, content=body)
        detail = problem(response, 401)
        missing = not any(name == "authorization" for name, _ in headers)
        if missing:
            assert detail == "this route needs Authorization: Bearer <token>"
            assert (
                response.headers["www-authenticate"] == 'Bearer realm="trio-dispatch"'
            )
        else:
            assert detail == "the token is not valid"
            assert (
                response.headers["www-authenticate"]
                == 'Bearer realm="trio-dispatch", error="invalid_token"'
            )
        assert TOKEN not in response.text
    assert state(dispatcher) == before


async def test_the_scheme_is_case_insensitive_and_spaces_are_allowed(
    client: httpx.AsyncClient,
) -> None:
    for value in (f"bearer {TOKEN}", f"BEARER  {TOKEN}", f"Bearer {TOKEN}"):
        response = await client.get("/limits", headers={"authorization": value})
        assert response.status_code == 200, value


async def test_without_the_token_unknown_routes_and_methods_are_401_too(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    # Nothing about the API is told to a client without the token.
    for method, path in [("GET", "/nope"), ("POST", "/limits"), ("GET", "/limits/%ZZ")]:
        response = await client.request(method, path)
        problem(response, 401)


async def test_the_token_is_never_logged_or_sent_back(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts = []
    for headers in [*WRONG_AUTHORIZATIONS, list(AUTH.items())]:
        for method, path in ROUTES:
            url = path.format(provider="openai", tenant="acme")
            body = json.dumps({"limit": 2}) if method == "PUT" else None
            response = await client.request(method, url, headers=headers, content=body)
            texts.append(response.text)
            texts.extend(f"{name}: {value}" for name, value in response.headers.items())
    assert any("admin API: refused GET b'/limits'" in r.message for r in caplog.records)
    assert any(
        "admin API: set the limit of 'openai' to 2" in r.message for r in caplog.records
    )
    assert TOKEN not in caplog.text
    assert not any(TOKEN[:-1] in text for text in texts)


# -- routes and methods ----------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/nope",
        "/limits/",
        "/limits/openai/",
        "/limits/a/b",
        "/providers/openai",
        "/providers/openai/pause",
        "/providers//resume",
        "/status/",
        "/%6Cimits",
    ],
)
async def test_unknown_routes_are_404(
    client: httpx.AsyncClient, dispatcher: Dispatcher, path: str
) -> None:
    before = state(dispatcher)
    for method in ("GET", "PUT", "POST", "DELETE"):
        response = await client.request(method, path, headers=AUTH, json={"limit": 1})
        assert problem(response, 404) == "no such route; GET /openapi.json lists them"
    assert state(dispatcher) == before


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/limits", "GET"),
        ("DELETE", "/limits", "GET"),
        ("GET", "/limits/openai", "PUT, DELETE"),
        ("POST", "/limits/openai", "PUT, DELETE"),
        ("PATCH", "/limits/openai", "PUT, DELETE"),
        ("PUT", "/status", "GET"),
        ("GET", "/providers/anthropic/resume", "POST"),
        ("DELETE", "/providers/anthropic/resume", "POST"),
        ("POST", "/metrics", "GET"),
        ("HEAD", "/openapi.json", "GET"),
        ("OPTIONS", "/status", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
async def test_a_wrong_method_is_405_with_allow(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    method: str,
    path: str,
    allow: str,
) -> None:
    before = state(dispatcher)
    response = await client.request(method, path, headers=AUTH, json={"limit": 1})
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    if method != "HEAD":
        assert problem(response, 405) == (
            f"{method} is not allowed here; allowed: {allow}"
        )
    assert state(dispatcher) == before


# -- bad input -------------------------------------------------------------------

BAD_BODIES: list[tuple[bytes, int, str]] = [
    (b"not json", 400, r"the body is not JSON: Expecting value: .*"),
    (b"", 400, r"the body is not JSON: Expecting value: .*"),
    (b'{"limit": 8', 400, r"the body is not JSON: .*"),
    (b"\xff\xfe", 400, r"the body is not UTF-8"),
    (b'{"limit": NaN}', 400, r"the body is not JSON: NaN is not a JSON number"),
    (
        b'{"limit": Infinity}',
        400,
        r"the body is not JSON: Infinity is not a JSON number",
    ),
    (b'{"limit": 1, "limit": 2}', 400, r"the body repeats a key"),
    (b"[" * MAX_BODY_BYTES, 400, r"the body is (not JSON: .*|nested too deeply)"),
    (b'{"limit": 0}', 422, r"limit must be a positive integer, got 0"),
    (b'{"limit": -1}', 422, r"limit must be a positive integer, got -1"),
    (b'{"limit": 1.5}', 422, r"limit must be a positive integer, got 1\.5"),
    (b'{"limit": 1e400}', 422, r"limit must be a positive integer, got Infinity"),
    (b'{"limit": "8"}', 422, r'limit must be a positive integer, got "8"'),
    (b'{"limit": true}', 422, r"limit must be a positive integer, got true"),
    (b'{"limit": null}', 422, r"limit must be a positive integer, got null"),
    (b'{"limit": [8]}', 422, r"limit must be a positive integer, got \[8\]"),
    (
        b'{"limit": %d}' % (MAX_LIMIT + 1),
        422,
        rf"limit must be at most {MAX_LIMIT}, got {MAX_LIMIT + 1}; DELETE the limit to lift it",
    ),
    (
        b'{"limit": %d}' % 10**300,
        422,
        rf"limit must be at most {MAX_LIMIT}, got 1000000000000000000000000000000000000\.\.\.; DELETE the limit to lift it",
    ),
    (
        b'{"limit": 8, "burst": 2}',
        422,
        r"unknown field \"burst\"; the body is a JSON object \{'limit': n\}, n an integer from 1 to 100000",
    ),
    (b"{}", 422, r"limit is required; the body is .*"),
    (b"[8]", 422, r"the body must be a JSON object \{'limit': n\}, .*, got array"),
    (b"8", 422, r"the body must be .*, got number"),
    (b'"8"', 422, r"the body must be .*, got string"),
    (b"null", 422, r"the body must be .*, got null"),
    (
        b'{"limit": 8}' + b" " * MAX_BODY_BYTES,
        413,
        rf"the body must be at most {MAX_BODY_BYTES} bytes",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "detail"), BAD_BODIES, ids=[repr(b[0][:24]) for b in BAD_BODIES]
)
async def test_a_bad_body_is_refused_and_changes_nothing(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    body: bytes,
    status: int,
    detail: str,
) -> None:
    before = state(dispatcher)
    response = await client.put("/limits/openai", headers=AUTH, content=body)
    assert re_full(detail, problem(response, status))
    assert state(dispatcher) == before


@pytest.mark.parametrize("written", [b"8.0", b"8e0", b"0.8e1"])
async def test_a_limit_written_as_an_integral_float_is_that_integer(
    client: httpx.AsyncClient, dispatcher: Dispatcher, written: bytes
) -> None:
    # One JSON number, however written: the document's "integer" takes 8.0.
    response = await client.put(
        "/limits/openai", headers=AUTH, content=b'{"limit": %s}' % written
    )
    assert response.status_code == 200, response.text
    assert response.text == '{"provider": "openai", "limit": 8}'
    assert dispatcher.limits()["openai"] == 8
    response = await client.put(
        "/tenants/acme", headers=AUTH, content=b'{"limit": %s}' % written
    )
    assert response.status_code == 200, response.text
    assert dispatcher.tenants()["acme"] == Tenant(limit=8)


async def test_a_large_body_sent_in_chunks_is_refused_without_a_length(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    before = state(dispatcher)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"limit": 8'
        for _ in range(MAX_BODY_BYTES):
            yield b" "
        yield b"}"

    response = await client.put("/limits/openai", headers=AUTH, content=chunks())
    assert "content-length" not in response.request.headers
    assert problem(response, 413) == f"the body must be at most {MAX_BODY_BYTES} bytes"
    assert state(dispatcher) == before


async def test_a_body_at_the_cap_is_read(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    body = b'{"limit": 6}'
    body += b" " * (MAX_BODY_BYTES - len(body))
    response = await client.put("/limits/openai", headers=AUTH, content=body)
    assert response.status_code == 200
    assert dispatcher.limits()["openai"] == 6


PROVIDER_ROUTES = [
    ("PUT", "/limits/{}"),
    ("DELETE", "/limits/{}"),
    ("POST", "/providers/{}/resume"),
]


@pytest.mark.parametrize(("method", "template"), PROVIDER_ROUTES)
@pytest.mark.parametrize(
    "bad",
    [
        ("%ZZ", "the provider name has a bad percent-escape"),
        ("%", "the provider name has a bad percent-escape"),
        ("a%4", "the provider name has a bad percent-escape"),
        ("a%4g", "the provider name has a bad percent-escape"),
        ("%C3", "the provider name is not UTF-8"),
        ("%C3%28", "the provider name is not UTF-8"),
        ("%ED%A0%80", "the provider name is not UTF-8"),  # a lone surrogate
        ("%FF", "the provider name is not UTF-8"),
    ],
)
async def test_bad_percent_encoding_is_400(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    method: str,
    template: str,
    bad: tuple[str, str],
) -> None:
    segment, detail = bad
    before = state(dispatcher)
    url = httpx.URL(str(client.base_url)).copy_with(
        raw_path=template.format(segment).encode()
    )
    response = await client.request(method, url, headers=AUTH, json={"limit": 1})
    assert response.request.url.raw_path == template.format(segment).encode()
    assert problem(response, 400) == detail
    assert state(dispatcher) == before


@pytest.mark.parametrize(("method", "template"), PROVIDER_ROUTES)
@pytest.mark.parametrize("name", ["p" * (MAX_PROVIDER_LENGTH + 1), "\u00e9" * 300])
async def test_an_overlong_provider_name_is_422(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    method: str,
    template: str,
    name: str,
) -> None:
    before = state(dispatcher)
    response = await client.request(
        method, template.format(name), headers=AUTH, json={"limit": 1}
    )
    assert problem(response, 422) == (
        f"provider must be at most {MAX_PROVIDER_LENGTH} characters, got {len(name)}"
    )
    assert state(dispatcher) == before


# -- a closed dispatcher ---------------------------------------------------------


async def test_a_closed_dispatcher_is_shown_and_refuses_changes() -> None:
    async with open_dispatcher({"openai": 2}) as dispatcher, dispatcher.slot("openai"):
        pass
    async with (
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        response = await client.get("/healthz")
        assert response.status_code == 503
        assert response.json() == {"status": "closed"}
        for method, path in PROVIDER_ROUTES:
            response = await client.request(
                method, path.format("openai"), json={"limit": 5}
            )
            assert problem(response, 503) == "the dispatcher is closed"
        assert dispatcher.limits() == {"openai": 2}
        response = await client.get("/limits")
        assert response.json() == {"limits": {"openai": 2}}
        response = await client.get("/status")
        assert response.status_code == 200
        body = response.json()
        assert body["closed"] is True
        assert body["providers"]["openai"]["granted_total"] == 1


# -- other ASGI scopes -----------------------------------------------------------


async def test_a_websocket_is_closed_at_once(dispatcher: Dispatcher) -> None:
    app = admin_app(dispatcher, token=TOKEN)
    incoming: list[dict[str, Any]] = [{"type": "websocket.connect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "websocket", "path": "/status", "headers": []}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]


async def test_a_client_that_leaves_mid_body_gets_no_answer(
    dispatcher: Dispatcher,
) -> None:
    app = admin_app(dispatcher, token=TOKEN)
    incoming: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"lim', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)  # pragma: no cover (the point: nothing is sent)

    scope = {
        "type": "http",
        "method": "PUT",
        "path": "/limits/openai",
        "raw_path": b"/limits/openai",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
    }
    before = state(dispatcher)
    await app(scope, receive, send)
    assert sent == []
    assert incoming == []
    assert state(dispatcher) == before


async def test_the_root_path_is_left_out_of_the_route(dispatcher: Dispatcher) -> None:
    app = admin_app(dispatcher, token=TOKEN)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("a GET reads no body")  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/admin/limits",
        "raw_path": b"/admin/limits",
        "root_path": "/admin",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"]) == {"limits": {"openai": 2, "anthropic": 3}}


def re_full(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches the whole of ``text``."""
    import re  # noqa: PLC0415 (only this helper needs it)

    return re.fullmatch(pattern, text) is not None


async def test_status_shows_budgets_and_adaptive_limits() -> None:
    async with (
        open_dispatcher(
            {"openai": AdaptiveLimit(initial=4, minimum=1, maximum=8)},
            budgets={"openai": Budget(requests_per_minute=60, tokens_per_minute=6000)},
        ) as dispatcher,
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
        dispatcher.slot("openai", tokens=100),
    ):
        response = await client.get("/status", headers=AUTH)
    assert response.status_code == 200
    openai = response.json()["providers"]["openai"]
    assert (openai["limit"], openai["adaptive"]) == (4, True)
    budget = openai["budget"]
    assert (budget["requests_per_minute"], budget["tokens_per_minute"]) == (60, 6000)
    assert (budget["learned"], budget["waiting_for_budget"]) == (False, False)
    # One request and 100 tokens taken, and a little refilled since.
    assert 59.0 <= budget["requests_available"] < 60.0
    assert 5900.0 <= budget["tokens_available"] < 6000.0


async def test_metrics_serves_the_real_collector_agreeing_with_statistics(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    async with trio.open_nursery() as nursery:
        release = trio.Event()

        async def hold() -> None:
            async with dispatcher.slot("openai"):
                await release.wait()

        for _ in range(3):
            nursery.start_soon(hold)
        await trio.testing.wait_all_tasks_blocked()
        response = await client.get("/metrics", headers=AUTH)
        stats = dispatcher.statistics().providers
        release.set()
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}

    def by_provider(name: str) -> dict[str, float]:
        return {s.labels["provider"]: s.value for s in families[name].samples}

    assert by_provider("trio_dispatch_slots_limit") == {"openai": 2.0, "anthropic": 3.0}
    assert (
        by_provider("trio_dispatch_slots_in_use")["openai"]
        == stats["openai"].in_flight
        == 2
    )
    assert (
        by_provider("trio_dispatch_waiting")["openai"] == stats["openai"].waiting == 1
    )
    assert by_provider("trio_dispatch_paused") == {"openai": 0.0, "anthropic": 1.0}
    grants = {
        s.labels["provider"]: s.value
        for s in families["trio_dispatch_grants"].samples
        if s.name == "trio_dispatch_grants_total"
    }
    assert grants["openai"] == stats["openai"].granted_total == 2


async def test_status_lists_the_pools_and_their_members() -> None:
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 2}, pools={"gpt": ("key-a", "key-b")}
        ) as dispatcher,
        dispatcher.slot("gpt"),
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        response = await client.get("/status")
    body = response.json()
    assert body["pools"] == {
        "gpt": {
            "pool": "gpt",
            "members": ["key-a", "key-b"],
            "limit": 3,
            "in_flight": 1,
            "waiting": 0,
            "affinity_hits": 0,
            "affinity_moves": 0,
        }
    }
    # key-b has the most free slots: the grant went there.
    assert body["providers"]["key-b"]["in_flight"] == 1
    assert body["providers"]["key-a"]["in_flight"] == 0


async def test_status_shows_a_member_out_of_service_and_the_seconds_left() -> None:
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 2},
            pools={"gpt": ("key-a", "key-b")},
            failure_threshold=1,
            failure_cooldown=3000.0,
        ) as dispatcher,
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        async with dispatcher.slot("key-a") as slot:
            slot.failed()
        response = await client.get("/status")
    providers = response.json()["providers"]
    out = providers["key-a"]
    assert (out["failures"], out["outages_total"], out["half_open"]) == (1, 1, False)
    assert type(out["out_of_service_remaining"]) is float
    assert 0.0 < out["out_of_service_remaining"] <= 3000.0
    assert providers["key-b"]["out_of_service_remaining"] is None
