"""The OpenAPI 3.1 document of the admin API, served at ``GET /openapi.json``.

Written out by hand beside the routes it describes; the tests hold the two
together (every route answers as documented, and a schema-driven run
against this document finds no request that the app answers otherwise).
"""

from __future__ import annotations

import copy
from typing import Any

from .._version import __version__
from ._caps import MAX_BODY_BYTES as _MAX_BODY_BYTES
from ._caps import MAX_LIMIT as _MAX_LIMIT
from ._caps import MAX_PROVIDER_LENGTH as _MAX_PROVIDER_LENGTH

_COUNT = {"type": "integer", "minimum": 0}


def _problem(description: str, **headers: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {
            "application/problem+json": {
                "schema": {"$ref": "#/components/schemas/Problem"}
            }
        },
    }
    if headers:
        response["headers"] = headers
    return response


def _json(description: str, schema: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
        },
    }


_UNAUTHORIZED = _problem(
    "No token, or not the right one. Nothing was changed.",
    **{
        "WWW-Authenticate": {
            "description": "``Bearer realm=...``, with ``error=invalid_token`` for a wrong token.",
            "schema": {"type": "string"},
        }
    },
)
_NOT_FOUND = _problem(
    "No such route (a ``/`` in a provider name must be sent as ``%2F``)."
)
_BAD_PATH = _problem("The provider name is not valid percent-encoded UTF-8.")
_BAD_NAME = _problem(
    f"The provider name is longer than {_MAX_PROVIDER_LENGTH} characters."
)
_CLOSED = _problem("The dispatcher is closed. Nothing was changed.")

_PROVIDER = {
    "name": "provider",
    "in": "path",
    "required": True,
    "description": (
        "The provider's name, percent-encoded UTF-8 (``%2F`` for ``/``),"
        f" at most {_MAX_PROVIDER_LENGTH} characters."
    ),
    "schema": {"type": "string", "minLength": 1, "maxLength": _MAX_PROVIDER_LENGTH},
}

_SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "description": "An error, as RFC 9457 problem details.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
    },
    "Limits": {
        "type": "object",
        "required": ["limits"],
        "additionalProperties": False,
        "properties": {
            "limits": {
                "type": "object",
                "description": "Each limited provider's limit.",
                "additionalProperties": {"type": "integer", "minimum": 1},
            }
        },
    },
    "LimitUpdate": {
        "type": "object",
        "required": ["limit"],
        "additionalProperties": False,
        "properties": {
            "limit": {"type": "integer", "minimum": 1, "maximum": _MAX_LIMIT}
        },
    },
    "ProviderLimit": {
        "type": "object",
        "required": ["provider", "limit"],
        "additionalProperties": False,
        "properties": {
            "provider": {"type": "string"},
            "limit": {
                "type": ["integer", "null"],
                "minimum": 1,
                "description": "The limit now; null for none (unlimited).",
            },
        },
    },
    "ProviderStatus": {
        "type": "object",
        "description": (
            "One provider's statistics, as ``Dispatcher.statistics()`` has"
            " them, but for the end of a pause, shown as the seconds left."
        ),
        "required": [
            "provider",
            "limit",
            "in_flight",
            "waiting",
            "paused",
            "pause_remaining",
            "granted_total",
            "released_total",
            "withdrawn_total",
            "rejected_total",
            "peak_in_flight",
            "peak_waiting",
            "backend",
            "backend_up",
            "local_in_flight",
            "local_waiting",
            "adaptive",
            "budget",
        ],
        "additionalProperties": False,
        "properties": {
            "provider": {"type": "string"},
            "limit": {
                "type": ["integer", "null"],
                "minimum": 1,
                "description": "null for an unlimited provider.",
            },
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
        },
    },
    "Budget": {
        "type": "object",
        "description": "A provider's requests and tokens per minute budgets now.",
        "required": [
            "requests_per_minute",
            "tokens_per_minute",
            "requests_available",
            "tokens_available",
            "learned",
            "waiting_for_budget",
        ],
        "additionalProperties": False,
        "properties": {
            "requests_per_minute": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "tokens_per_minute": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "requests_available": {"type": ["number", "null"]},
            "tokens_available": {"type": ["number", "null"]},
            "learned": {"type": "boolean"},
            "waiting_for_budget": {"type": "boolean"},
        },
    },
    "Status": {
        "type": "object",
        "required": ["closed", "providers"],
        "additionalProperties": False,
        "properties": {
            "closed": {"type": "boolean"},
            "providers": {
                "type": "object",
                "description": "Every provider limited or used, by name.",
                "additionalProperties": {"$ref": "#/components/schemas/ProviderStatus"},
            },
        },
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "additionalProperties": False,
        "properties": {"status": {"type": "string", "enum": ["ok", "closed"]}},
    },
}

_PATHS: dict[str, Any] = {
    "/limits": {
        "get": {
            "operationId": "getLimits",
            "summary": "The limit of every limited provider.",
            "responses": {
                "200": _json("The limits.", "Limits"),
                "401": _UNAUTHORIZED,
            },
        }
    },
    "/limits/{provider}": {
        "parameters": [_PROVIDER],
        "put": {
            "operationId": "setLimit",
            "summary": "Limit a provider to this many concurrent slots, now.",
            "description": (
                "A higher limit grants waiting requests at once; a lower one"
                " lets the holders finish and grants nothing until fewer than"
                " the limit hold a slot. The body is read as JSON whatever"
                f" its Content-Type, at most {_MAX_BODY_BYTES} bytes."
            ),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/LimitUpdate"}
                    }
                },
            },
            "responses": {
                "200": _json("The limit is set.", "ProviderLimit"),
                "400": _problem(
                    "The body is not JSON, or the provider name not valid"
                    " percent-encoded UTF-8. Nothing was changed."
                ),
                "401": _UNAUTHORIZED,
                "404": _NOT_FOUND,
                "413": _problem(
                    f"The body is larger than {_MAX_BODY_BYTES} bytes."
                    " Nothing was changed."
                ),
                "422": _problem(
                    'The body is not exactly ``{"limit": n}`` with n an'
                    f" integer from 1 to {_MAX_LIMIT}, or the provider name is"
                    f" longer than {_MAX_PROVIDER_LENGTH} characters. Nothing"
                    " was changed."
                ),
                "503": _CLOSED,
            },
        },
        "delete": {
            "operationId": "removeLimit",
            "summary": "Lift a provider's limit: waiters go through, nobody waits.",
            "responses": {
                "200": _json("The provider is unlimited.", "ProviderLimit"),
                "400": _BAD_PATH,
                "401": _UNAUTHORIZED,
                "404": _NOT_FOUND,
                "422": _BAD_NAME,
                "503": _CLOSED,
            },
        },
    },
    "/status": {
        "get": {
            "operationId": "getStatus",
            "summary": "The dispatcher's statistics, provider by provider.",
            "responses": {
                "200": _json("The statistics.", "Status"),
                "401": _UNAUTHORIZED,
            },
        }
    },
    "/providers/{provider}/resume": {
        "parameters": [_PROVIDER],
        "post": {
            "operationId": "resume",
            "summary": "End a provider's rate-limit pause now, and its backoff.",
            "description": "Takes no body; one sent is not read.",
            "responses": {
                "200": _json(
                    "Resumed (or it was not paused): the provider's status now.",
                    "ProviderStatus",
                ),
                "400": _BAD_PATH,
                "401": _UNAUTHORIZED,
                "404": _problem(
                    "No such route, or the dispatcher has never limited or"
                    " used a provider of that name."
                ),
                "422": _BAD_NAME,
                "503": _CLOSED,
            },
        },
    },
    "/metrics": {
        "get": {
            "operationId": "getMetrics",
            "summary": "The Prometheus metrics of the dispatcher.",
            "description": (
                "The text format, or OpenMetrics when the Accept header asks for it."
            ),
            "responses": {
                "200": {
                    "description": "The metrics.",
                    "content": {
                        "text/plain": {"schema": {"type": "string"}},
                        "application/openmetrics-text": {"schema": {"type": "string"}},
                    },
                },
                "401": _UNAUTHORIZED,
                "404": _problem(
                    "No metrics: the prometheus_client package or the"
                    " collector is not installed."
                ),
            },
        }
    },
    "/healthz": {
        "get": {
            "operationId": "getHealth",
            "summary": "Whether the dispatcher runs. Needs no token.",
            "security": [],
            "responses": {
                "200": _json("The dispatcher runs.", "Health"),
                "503": _json("The dispatcher is closed.", "Health"),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "getOpenAPI",
            "summary": "This document.",
            "responses": {
                "200": {
                    "description": "The OpenAPI document.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "401": _UNAUTHORIZED,
            },
        }
    },
}


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
                    " its statistics, its pauses and its metrics. Errors are RFC"
                    " 9457 problem details; a refused request changes nothing."
                ),
            },
            "paths": _PATHS,
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
