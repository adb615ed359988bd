"""The admin API against its own OpenAPI document, driven by schemathesis.

schemathesis generates requests from the document, valid and invalid, and
hypothesis pairs each with a credential: the token, none, or a wrong one.
They go over a real socket to the app served by hypercorn on trio, from a
worker thread (schemathesis's client is synchronous), while the test's trio
run serves them and holds the dispatcher. No answer may be a 5xx; an answer
to the token must conform to the document; and a request without the token
must get 401 (but ``/healthz``) and change no limit, no pause and no
tenant.
"""

from __future__ import annotations

import json
import math
import string
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_dispatch import Tenant, open_dispatcher
from trio_dispatch.admin import MAX_LIMIT
from trio_dispatch.admin._openapi import openapi_document
from trio_dispatch.messages._limits import MAX_WEIGHT, MIN_WEIGHT

from .._admin import AUTH, TOKEN, serve_admin, state

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher

schemathesis = pytest.importorskip("schemathesis")

VALID = f"Bearer {TOKEN}"
_VISIBLE = string.ascii_letters + string.digits + string.punctuation

CREDENTIALS = st.one_of(
    st.just(VALID),
    st.just(VALID),
    st.just(VALID),
    st.none(),
    st.sampled_from(
        [
            f"Bearer {TOKEN[:-1]}",
            f"Bearer {TOKEN}0",
            f"Bearer  {TOKEN[1:]}",
            f"Basic {TOKEN}",
            f"Token {TOKEN}",
            TOKEN,
            "Bearer",
        ]
    ),
    st.text(_VISIBLE, min_size=1, max_size=48).map(lambda text: f"Bearer {text}"),
)
"""What a request presents as ``Authorization``: ``None`` for no header."""


def _explore(base_url: str, dispatcher: Dispatcher) -> dict[str, int]:
    """Run the schema-driven examples (in a worker thread); count the answers."""
    import requests  # noqa: PLC0415 (schemathesis's own client)
    from schemathesis import GenerationMode  # noqa: PLC0415
    from schemathesis.checks import not_a_server_error  # noqa: PLC0415
    from schemathesis.specs.openapi.checks import (  # noqa: PLC0415
        content_type_conformance,
        negative_data_rejection,
        positive_data_acceptance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    # The credential is this test's to choose (below), not the generator's.
    # Invalid data must be rejected with one of schemathesis's own statuses
    # for it, or with 413: a body over the app's bound is refused so (the
    # document says it), however invalid the rest of it.
    config = schemathesis.config.SchemathesisConfig.from_dict(
        {
            "generation": {"with-security-parameters": False},
            "checks": {
                "negative_data_rejection": {
                    "expected-statuses": [
                        *("400", "401", "403", "404", "405", "406", "409"),
                        *("413", "415", "422", "428", "429", "5xx"),
                    ]
                }
            },
        }
    )
    schema = schemathesis.openapi.from_dict(openapi_document(), config=config)
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        negative_data_rejection,
        positive_data_acceptance,
    ]
    # Random provider names rarely name one the dispatcher has: some
    # requests aim at the limited and the paused provider on purpose.
    aimed = [
        schema["/limits/{provider}"][method].as_strategy(
            path_parameters={"provider": "openai"}
        )
        for method in ("PUT", "DELETE")
    ]
    aimed.append(
        schema["/providers/{provider}/resume"]["POST"].as_strategy(
            path_parameters={"provider": "anthropic"}
        )
    )
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE),
        schema.as_strategy(GenerationMode.NEGATIVE),
        *aimed,
    )
    seen: dict[str, int] = {}
    session = requests.Session()

    @settings(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=cases, presented=CREDENTIALS)
    def one_request(case: Any, presented: str | None) -> None:  # noqa: ANN401 (a schemathesis Case)
        # Paused again each time, so that a refused resume would show.
        trio.from_thread.run_sync(dispatcher.report_rate_limit, "anthropic", 3000.0)
        case.headers.pop("authorization", None)
        extra = {} if presented is None else {"Authorization": presented}
        before = trio.from_thread.run_sync(state, dispatcher)
        response = case.call(base_url=base_url, session=session, headers=extra)
        after = trio.from_thread.run_sync(state, dispatcher)
        status = response.status_code
        assert status < 500, (case.method, case.formatted_path, status, response.text)
        if presented == VALID:
            case.validate_response(response, checks=checks, headers=extra)
            kind = "authorized"
        else:
            if case.path != "/healthz":
                assert status == 401, (case.method, case.formatted_path, status)
            assert after == before
            kind = "refused"
        key = f"{kind} {status}"
        seen[key] = seen.get(key, 0) + 1

    try:
        one_request()
    finally:
        session.close()
    return seen


async def test_no_request_is_a_server_error_or_changes_anything_without_the_token() -> (
    None
):
    async with (
        open_dispatcher({"openai": 2, "anthropic": 3}, max_pause=3600.0) as dispatcher,
        serve_admin(dispatcher) as base_url,
    ):
        seen = await trio.to_thread.run_sync(partial(_explore, base_url, dispatcher))
    # The run reached both sides of the token, and past the checks.
    assert seen.get("refused 401", 0) > 0, seen
    assert seen.get("authorized 200", 0) > 0, seen
    assert any(key.startswith("authorized 4") for key in seen), seen


def test_the_openapi_document_is_valid_openapi_3_1() -> None:
    schemathesis.openapi.from_dict(openapi_document()).validate()


# Each bound the app enforces, on both sides and on it, with the JSON values
# beside it that a schema can get wrong: a float that is an integer, the
# smallest float, a boolean, null, a string.
_LIMITS: list[object] = [
    *(0, 1, 1.0, 2.5, -1, 8, 8.0, 1e2),
    *(MAX_LIMIT, float(MAX_LIMIT), MAX_LIMIT + 1, MAX_LIMIT + 0.5, 1e300),
    *(True, None, "8"),
]
_WEIGHTS: list[object] = [
    *(0, 5e-324, math.nextafter(MIN_WEIGHT, 0.0), MIN_WEIGHT, 1, 0.5, 2),
    *(MAX_WEIGHT, math.nextafter(MAX_WEIGHT, math.inf), 1e7, -1.5),
    *(True, None, "2"),
]
BODIES = [
    *(("/limits/openai", "LimitUpdate", {"limit": limit}) for limit in _LIMITS),
    ("/limits/openai", "LimitUpdate", {}),
    *(("/tenants/acme", "TenantUpdate", {"limit": limit}) for limit in _LIMITS),
    *(("/tenants/acme", "TenantUpdate", {"weight": weight}) for weight in _WEIGHTS),
    ("/tenants/acme", "TenantUpdate", {}),
    ("/tenants/acme", "TenantUpdate", {"weight": MAX_WEIGHT, "limit": MAX_LIMIT}),
]
"""Each ``PUT`` body at the app's bounds: the path, its schema, the body."""


async def test_the_document_accepts_exactly_the_bodies_the_app_accepts() -> None:
    import jsonschema_rs  # noqa: PLC0415 (schemathesis's validator)

    schemas = openapi_document()["components"]["schemas"]
    disagreements = []
    async with (
        open_dispatcher({"openai": 2}, tenants={"acme": Tenant()}) as dispatcher,
        serve_admin(dispatcher) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
    ):
        for path, name, body in BODIES:
            valid = jsonschema_rs.Draft202012Validator(schemas[name]).is_valid(body)
            response = await client.put(path, content=json.dumps(body))
            assert response.status_code in (200, 422), response.text
            if valid != (response.status_code == 200):
                disagreements.append((name, body, response.status_code))
    assert disagreements == [], "\n".join(map(repr, disagreements))
