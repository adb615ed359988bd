"""The admin API's tenants: ``GET /tenants``, ``PUT`` and ``DELETE /tenants/{tenant}``.

Served as in ``test_admin.py`` (hypercorn on trio in the test's run, httpx
over loopback); each refused request is checked to change nothing, tenants
included.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from trio_dispatch import Tenant, open_dispatcher

from .._admin import AUTH, problem, serve_admin, state
from .._helpers import settle
from .._redis import needs_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from trio_dispatch import Dispatcher, TenantStatistics

    from .._redis import RedisServer


@pytest.fixture
async def dispatcher() -> AsyncIterator[Dispatcher]:
    async with open_dispatcher(
        {"openai": 2, "anthropic": 3},
        tenants={"beta": Tenant(weight=0.5)},
    ) as dispatcher:
        yield dispatcher


@pytest.fixture
async def client(dispatcher: Dispatcher) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url) as client,
    ):
        yield client


async def test_put_get_and_delete_a_tenant(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    response = await client.get("/tenants", headers=AUTH)
    assert response.status_code == 200
    assert response.json()["tenants"] == {
        "beta": {"tenant": "beta", "weight": 0.5, "limit": None}
    }

    response = await client.put(
        "/tenants/acme", headers=AUTH, json={"weight": 2.0, "limit": 4}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"tenant": "acme", "weight": 2.0, "limit": 4}
    assert dispatcher.tenants() == {
        "acme": Tenant(weight=2.0, limit=4),
        "beta": Tenant(weight=0.5),
    }
    response = await client.get("/tenants", headers=AUTH)
    body = response.json()
    assert body["tenants"] == {
        "acme": {"tenant": "acme", "weight": 2.0, "limit": 4},
        "beta": {"tenant": "beta", "weight": 0.5, "limit": None},
    }
    # Every provider the dispatcher knows shows its tenants' statistics.
    assert set(body["providers"]) == set(dispatcher.statistics().providers)
    for provider, tenants in body["providers"].items():
        stats = dispatcher.statistics().providers[provider]
        assert set(tenants) == set(stats.tenants)
        for name, shown in tenants.items():
            assert shown["tenant"] == name
            assert shown["in_flight"] == stats.tenants[name].in_flight

    response = await client.delete("/tenants/acme", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {"tenant": "acme", "weight": 1.0, "limit": None}
    assert dispatcher.tenants() == {"beta": Tenant(weight=0.5)}
    # Back to the defaults already: the same answer again.
    response = await client.delete("/tenants/acme", headers=AUTH)
    assert response.json() == {"tenant": "acme", "weight": 1.0, "limit": None}
    assert dispatcher.tenants() == {"beta": Tenant(weight=0.5)}


@pytest.mark.parametrize(
    ("body", "settings"),
    [
        ({}, Tenant()),
        ({"weight": 3}, Tenant(weight=3)),
        ({"limit": 2}, Tenant(limit=2)),
        ({"weight": 0.25, "limit": None}, Tenant(weight=0.25)),
    ],
)
async def test_put_replaces_the_settings_whole_a_field_left_out_is_its_default(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    body: dict[str, object],
    settings: Tenant,
) -> None:
    response = await client.put("/tenants/beta", headers=AUTH, json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "tenant": "beta",
        "weight": settings.weight,
        "limit": settings.limit,
    }
    assert dispatcher.tenants() == {"beta": settings}


async def test_a_cap_set_through_the_api_holds_the_tenants_next_grants(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    release = trio.Event()

    async def hold() -> None:
        async with dispatcher.slot("anthropic", tenant="acme"):
            await release.wait()

    response = await client.put("/tenants/acme", headers=AUTH, json={"limit": 1})
    assert response.status_code == 200
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(hold)
        await settle()
        response = await client.get("/tenants", headers=AUTH)
        acme = response.json()["providers"]["anthropic"]["acme"]
        assert (acme["in_flight"], acme["waiting"], acme["limit"]) == (1, 1, 1)
        # Lifting the cap grants the waiter: the provider has room.
        response = await client.delete("/tenants/acme", headers=AUTH)
        assert response.status_code == 200
        await settle()
        acme_now = dispatcher.statistics().providers["anthropic"].tenants["acme"]
        assert (acme_now.in_flight, acme_now.waiting) == (2, 0)
        release.set()


BAD_TENANT_BODIES: list[tuple[bytes, int, str]] = [
    (b'{"weight": 0}', 422, "weight must be a positive number, got 0"),
    (b'{"weight": -1.5}', 422, "weight must be a positive number, got -1.5"),
    (b'{"weight": "2"}', 422, "weight must be a positive number, got '2'"),
    (b'{"weight": true}', 422, "weight must be a positive number, got True"),
    (b'{"weight": null}', 422, "weight must be a positive number, got None"),
    (b'{"weight": 1e400}', 422, "weight must be a positive number, got inf"),
    (b'{"limit": 0}', 422, "limit must be a positive integer, got 0"),
    (b'{"limit": 2.5}', 422, "limit must be a positive integer, got 2.5"),
    (b'{"limit": "2"}', 422, "limit must be a positive integer, got '2'"),
    (b'{"limit": 100001}', 422, "limit must be at most 100000, got 100001"),
    (
        b'{"weight": 1, "share": 2}',
        422,
        "unknown field \"share\"; the body is a JSON object {'weight': w, 'limit': n},"
        " both optional, w a number from 1e-06 to 1e+06, n an integer from 1 to"
        " 100000 or null",
    ),
    (b"[1]", 422, "the body must be a JSON object {'weight': w, .*, got array"),
    (b"null", 422, "the body must be a JSON object {'weight': w, .*, got null"),
    (b'{"weight": NaN}', 400, "the body is not JSON: NaN is not a JSON number"),
    (b'{"weight": 1, "weight": 2}', 400, "the body repeats a key"),
    (b"{weight: 1}", 400, "the body is not JSON: .*"),
    (b"", 400, "the body is not JSON: .*"),
    (b'{"weight": 1}' + b" " * 1024, 413, "the body must be at most 1024 bytes"),
]


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    BAD_TENANT_BODIES,
    ids=[repr(body[:24]) for body, _, _ in BAD_TENANT_BODIES],
)
async def test_a_bad_tenant_body_is_refused_with_the_rule_and_changes_nothing(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    body: bytes,
    status: int,
    detail: str,
) -> None:
    before = state(dispatcher)
    response = await client.put("/tenants/beta", headers=AUTH, content=body)
    shown = problem(response, status)
    assert shown == detail or re.fullmatch(detail, shown) is not None, shown
    assert state(dispatcher) == before


@pytest.mark.parametrize(
    ("path", "tenant"),
    [
        ("/tenants/team%2Fone", "team/one"),
        ("/tenants/caf%C3%A9", "caf\u00e9"),
        ("/tenants/a%20b", "a b"),
        (f"/tenants/{'t' * 256}", "t" * 256),
    ],
)
async def test_tenant_names_are_percent_encoded_utf8(
    client: httpx.AsyncClient, dispatcher: Dispatcher, path: str, tenant: str
) -> None:
    response = await client.put(path, headers=AUTH, json={"weight": 2})
    assert response.status_code == 200, response.text
    assert response.json() == {"tenant": tenant, "weight": 2, "limit": None}
    assert dispatcher.tenants()[tenant] == Tenant(weight=2)
    response = await client.delete(path, headers=AUTH)
    assert response.status_code == 200
    assert tenant not in dispatcher.tenants()


BAD_NAMES = [
    ("t" * 257, 422, "tenant must be at most 256 characters, got one of 257"),
    ("%C3%A9" * 257, 422, "tenant must be at most 256 characters, got one of 257"),
    ("%ZZ", 400, "the tenant name has a bad percent-escape"),
    ("%C3", 400, "the tenant name is not UTF-8"),
]


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
@pytest.mark.parametrize("bad", BAD_NAMES, ids=[name[:8] for name, _, _ in BAD_NAMES])
async def test_a_bad_tenant_name_is_refused_and_changes_nothing(
    client: httpx.AsyncClient,
    dispatcher: Dispatcher,
    method: str,
    bad: tuple[str, int, str],
) -> None:
    segment, status, detail = bad
    before = state(dispatcher)
    url = httpx.URL(str(client.base_url)).copy_with(
        raw_path=f"/tenants/{segment}".encode()
    )
    response = await client.request(method, url, headers=AUTH, json={"weight": 2})
    assert problem(response, status) == detail
    assert state(dispatcher) == before


async def test_tenant_routes_need_the_token(
    client: httpx.AsyncClient, dispatcher: Dispatcher
) -> None:
    before = state(dispatcher)
    for method, path in [
        ("GET", "/tenants"),
        ("PUT", "/tenants/acme"),
        ("DELETE", "/tenants/beta"),
    ]:
        response = await client.request(method, path, content=json.dumps({"weight": 9}))
        assert problem(response, 401) == (
            "this route needs Authorization: Bearer <token>"
        )
    assert state(dispatcher) == before


async def test_a_closed_dispatcher_refuses_tenant_changes() -> None:
    async with open_dispatcher({"openai": 2}, tenants={"beta": Tenant()}) as dispatcher:
        pass
    async with (
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        for method in ("PUT", "DELETE"):
            response = await client.request(method, "/tenants/beta", json={"weight": 3})
            assert problem(response, 503) == "the dispatcher is closed"
        response = await client.get("/tenants")
        assert response.status_code == 200
        assert response.json()["tenants"] == {
            "beta": {"tenant": "beta", "weight": 1.0, "limit": None}
        }


async def test_a_weight_out_of_bounds_is_refused_and_nothing_changes() -> None:
    # A weight near 0 would divide a hold's slot-seconds into an infinity,
    # which no counter, and no JSON, can carry: refused at the door.
    async with (
        open_dispatcher({"p": 1}, tenants={"beta": Tenant(weight=0.5)}) as dispatcher,
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        for weight, shown in ((5e-324, "5e-324"), (1e7, "10000000.0")):
            response = await client.put("/tenants/beta", json={"weight": weight})
            assert response.status_code == 422
            assert response.json()["detail"] == (
                f"weight must be a number from 1e-06 to 1e+06, got {shown}"
            )
        assert dispatcher.tenants() == {"beta": Tenant(weight=0.5)}


@needs_redis
async def test_a_cap_set_through_the_api_holds_for_a_redis_shared_dispatcher(
    server: RedisServer,
) -> None:
    release = trio.Event()

    async def hold() -> None:
        async with shared.slot("p", tenant="acme"):
            await release.wait()

    async def until(check: Callable[[TenantStatistics], bool]) -> None:
        """Wait (real time: the fleet's state comes through Redis) for ``check``."""
        with trio.fail_after(10):
            while True:
                seen = shared.statistics().providers["p"].tenants.get("acme")
                if seen is not None and check(seen):
                    return
                await trio.sleep(0.01)

    async with (
        open_dispatcher(
            {"p": 3}, redis_url=server.url, namespace="admin-tenants"
        ) as shared,
        serve_admin(shared) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
        trio.open_nursery() as nursery,
    ):
        response = await client.put("/tenants/acme", json={"weight": 2, "limit": 1})
        assert response.status_code == 200, response.text
        for _ in range(2):
            nursery.start_soon(hold)
        await until(lambda seen: (seen.in_flight, seen.waiting) == (1, 1))
        response = await client.get("/tenants")
        acme = response.json()["providers"]["p"]["acme"]
        assert (acme["weight"], acme["limit"], acme["in_flight"]) == (2, 1, 1)
        # Lifted: the fleet grants the waiter.
        response = await client.delete("/tenants/acme")
        assert response.status_code == 200
        await until(lambda seen: (seen.in_flight, seen.waiting) == (2, 0))
        assert shared.tenants() == {}
        release.set()
