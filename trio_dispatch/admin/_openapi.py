"""The OpenAPI 3.1 document of the admin API, served at ``GET /openapi.json``.

The paths are built from the route table (``_routes.ROUTES``) that the app
routes by; the schemas they name are here. The tests hold the document to
the app (every route answers as documented, and a schema-driven run
against this document finds no request that the app answers otherwise).
"""

from __future__ import annotations

import copy
from typing import Any

from .._validation import MAX_TENANT_NAME as _MAX_TENANT_NAME
from .._version import __version__
from ._caps import MAX_LIMIT as _MAX_LIMIT
from ._caps import MAX_PROVIDER_LENGTH as _MAX_PROVIDER_LENGTH
from ._caps import MAX_WEIGHT as _MAX_WEIGHT
from ._caps import MIN_WEIGHT as _MIN_WEIGHT
from ._routes import PROVIDER, ROUTES, TENANT, Route

# Every bound below is one the app enforces, read from ``_caps`` as the
# app's checks read it: a schema-valid body is never refused for its values.
_COUNT = {"type": "integer", "minimum": 0}
_LIMIT_VALUE = {"type": "integer", "minimum": 1, "maximum": _MAX_LIMIT}
_LIMIT = {**_LIMIT_VALUE, "type": ["integer", "null"]}


def _path_parameter(name: str, longest: int) -> dict[str, Any]:
    """The path parameter of a provider's or a tenant's name."""
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": (
            f"The {name}'s name, percent-encoded UTF-8 (``%2F`` for ``/``),"
            f" at most {longest} characters."
        ),
        "schema": {"type": "string", "minLength": 1, "maxLength": longest},
    }


_PARAMETERS = {
    PROVIDER: _path_parameter("provider", _MAX_PROVIDER_LENGTH),
    TENANT: _path_parameter("tenant", _MAX_TENANT_NAME),
}

_WEIGHT = {
    "type": "number",
    "minimum": _MIN_WEIGHT,
    "maximum": _MAX_WEIGHT,
    "description": "The tenant's share, relative to the others'.",
}
_TENANT_LIMIT = {
    **_LIMIT,
    "description": "At most this many slots of each provider; null for no cap.",
}


def _record(
    properties: dict[str, Any], description: str | None = None, *, closed: bool = True
) -> dict[str, Any]:
    """An object schema whose every property is required; ``closed``: no others."""
    schema: dict[str, Any] = {"type": "object"}
    if description is not None:
        schema["description"] = description
    schema["required"] = list(properties)
    if closed:
        schema["additionalProperties"] = False
    schema["properties"] = properties
    return schema


_SCHEMAS: dict[str, Any] = {
    "Problem": _record(
        {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
        "An error, as RFC 9457 problem details.",
        closed=False,
    ),
    "Limits": _record(
        {
            "limits": {
                "type": "object",
                "description": "Each limited provider's limit.",
                "additionalProperties": _LIMIT_VALUE,
            }
        }
    ),
    "LimitUpdate": _record({"limit": _LIMIT_VALUE}),
    "ProviderLimit": _record(
        {
            "provider": {"type": "string"},
            "limit": {
                **_LIMIT,
                "description": "The limit now; null for none (unlimited).",
            },
        }
    ),
    "ProviderStatus": _record(
        {
            "provider": {"type": "string"},
            "limit": {**_LIMIT, "description": "null for an unlimited provider."},
            "in_flight": _COUNT,
            "waiting": _COUNT,
            "paused": {"type": "boolean"},
            "pause_remaining": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "Seconds until the pause ends; null when not paused.",
            },
            "granted_total": _COUNT,
            "released_total": _COUNT,
            "withdrawn_total": _COUNT,
            "rejected_total": _COUNT,
            "peak_in_flight": _COUNT,
            "peak_waiting": _COUNT,
            "backend": {"type": "string", "enum": ["local", "redis"]},
            "backend_up": {"type": "boolean"},
            "local_in_flight": _COUNT,
            "local_waiting": _COUNT,
            "adaptive": {
                "type": "boolean",
                "description": "Whether the limit is an AdaptiveLimit's value now.",
            },
            "budget": {
                "oneOf": [{"$ref": "#/components/schemas/Budget"}, {"type": "null"}],
                "description": "The budgets in use (configured or learned), or null.",
            },
            "models": {
                "type": "object",
                "description": "Each model's own budgets, by model name.",
                "additionalProperties": {"$ref": "#/components/schemas/Budget"},
            },
            "tenants": {
                "type": "object",
                "description": "Each tenant's share of the provider, by name.",
                "additionalProperties": {"$ref": "#/components/schemas/TenantStatus"},
            },
            "server_load": {
                "oneOf": [
                    {"$ref": "#/components/schemas/ServerLoad"},
                    {"type": "null"},
                ],
                "description": "What the provider's server said of its load at"
                " the latest reading (open_dispatcher's server_load), or null.",
            },
            "server_slots": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "The server's slots, learned from a reading with a"
                " queue, or null.",
            },
            "affinity_hits": {
                **_COUNT,
                "description": "For a member of a pool: requests granted on it"
                " that preferred it (their conversation's previous call was).",
            },
            "affinity_moves": {
                **_COUNT,
                "description": "For a member of a pool: requests that preferred"
                " it and were granted on another member.",
            },
            "failures": {
                **_COUNT,
                "description": "For a member of a pool: its calls failed in a"
                " row before their answer.",
            },
            "out_of_service_remaining": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "For a member of a pool out of service: seconds"
                " until its cooldown ends; null otherwise.",
            },
            "half_open": {
                "type": "boolean",
                "description": "For a member of a pool back from its cooldown:"
                " whether one request probes it before it takes its full share.",
            },
            "outages_total": {
                **_COUNT,
                "description": "For a member of a pool: the times it was taken"
                " out of service.",
            },
        },
        "One provider's statistics, as ``Dispatcher.statistics()`` has"
        " them, but for the end of a pause, shown as the seconds left.",
    ),
    "ServerLoad": _record(
        {
            "running": _COUNT,
            "waiting": _COUNT,
            "format": {
                "type": ["string", "null"],
                "enum": ["vllm", "llama.cpp", "sglang", "tgi", None],
                "description": "The server whose metrics it was read from, or null.",
            },
        },
        "A model server's own count of the requests it runs and queues.",
    ),
    "TenantUpdate": {
        "type": "object",
        "description": "A tenant's settings; a field left out takes its default.",
        "additionalProperties": False,
        "properties": {
            "weight": {**_WEIGHT, "default": 1.0},
            "limit": {**_TENANT_LIMIT, "default": None},
        },
    },
    "TenantSettings": _record(
        {"tenant": {"type": "string"}, "weight": _WEIGHT, "limit": _TENANT_LIMIT},
        "A tenant's weight and cap, on every provider.",
    ),
    "Tenants": _record(
        {
            "tenants": {
                "type": "object",
                "description": "The configured tenants, by name.",
                "additionalProperties": {"$ref": "#/components/schemas/TenantSettings"},
            },
            "providers": {
                "type": "object",
                "description": "Each provider's tenants, by provider, then tenant.",
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": {
                        "$ref": "#/components/schemas/TenantStatus"
                    },
                },
            },
        }
    ),
    "TenantStatus": _record(
        {
            "tenant": {"type": "string"},
            "weight": _WEIGHT,
            "limit": _TENANT_LIMIT,
            "in_flight": _COUNT,
            "waiting": _COUNT,
            "service": {
                "type": "number",
                "description": "Slot-seconds received, divided by the weight.",
            },
        },
        "One tenant's part of one provider.",
    ),
    "Budget": _record(
        {
            "requests_per_minute": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "tokens_per_minute": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "requests_available": {"type": ["number", "null"]},
            "tokens_available": {"type": ["number", "null"]},
            "learned": {"type": "boolean"},
            "waiting_for_budget": {"type": "boolean"},
        },
        "A provider's requests and tokens per minute budgets now.",
    ),
    "Status": _record(
        {
            "closed": {"type": "boolean"},
            "providers": {
                "type": "object",
                "description": "Every provider limited or used, by name; a"
                " pool's members too.",
                "additionalProperties": {"$ref": "#/components/schemas/ProviderStatus"},
            },
            "pools": {
                "type": "object",
                "description": "Every pool, by name.",
                "additionalProperties": {"$ref": "#/components/schemas/PoolStatus"},
            },
        }
    ),
    "PoolStatus": _record(
        {
            "pool": {"type": "string"},
            "members": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Its members, in the pool's order.",
            },
            "limit": {
                **_LIMIT,
                "description": "Its members' limits added up; null if one is"
                " unlimited.",
            },
            "in_flight": _COUNT,
            "waiting": _COUNT,
            "affinity_hits": _COUNT,
            "affinity_moves": _COUNT,
        },
        "One pool's statistics: its members, and the requests waiting for it.",
    ),
    "Health": _record({"status": {"type": "string", "enum": ["ok", "closed"]}}),
}


def _operation(route: Route) -> dict[str, Any]:
    """The OpenAPI operation object of one route."""
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
    }
    if route.description is not None:
        operation["description"] = route.description
    if not route.auth:
        operation["security"] = []
    if route.request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": f"#/components/schemas/{route.request}"}
                }
            },
        }
    operation["responses"] = {
        str(status): response for status, response in route.responses.items()
    }
    return operation


def _paths() -> dict[str, Any]:
    """The document's paths, one operation per route of the table."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        item = paths.setdefault(route.path, {})
        parameter = route.parameter
        if parameter is not None:
            item.setdefault("parameters", [_PARAMETERS[parameter]])
        item[route.method.lower()] = _operation(route)
    return paths


def openapi_document() -> dict[str, Any]:
    """The admin API's OpenAPI 3.1 document, as a fresh JSON-ready dict."""
    return copy.deepcopy(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "trio-dispatch admin API",
                "version": __version__,
                "description": (
                    "See and steer a running trio-dispatch dispatcher: its limits,"
                    " its tenants' shares, its statistics, its pauses and its"
                    " metrics. Errors are RFC"
                    " 9457 problem details; a refused request changes nothing."
                ),
            },
            "paths": _paths(),
            "components": {
                "schemas": _SCHEMAS,
                "securitySchemes": {
                    "bearerAuth": {
                        "type": "http",
                        "scheme": "bearer",
                        "description": "The token given to admin_app(..., token=...).",
                    }
                },
            },
            "security": [{"bearerAuth": []}],
        }
    )
