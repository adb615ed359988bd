"""The admin API's routes: one table, read by the router and the OpenAPI document.

Each ``Route`` says, once, what the app does and what it documents: the
method, the path pattern (``{provider}`` or ``{tenant}``: one
percent-encoded path segment), the operation id (which names the
``AdminApp`` method that answers it), whether the token is needed, the
request body's schema and every answer the route gives. The
app routes requests with ``match``; ``openapi_document`` builds the paths of
the document from the same rows, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Any, Final, final

import attrs

from .._validation import MAX_TENANT_NAME
from ._caps import (
    MAX_BODY_BYTES,
    MAX_LIMIT,
    MAX_PROVIDER_LENGTH,
    MAX_WEIGHT,
    MIN_WEIGHT,
)

Response = dict[str, Any]
"""An OpenAPI response object."""

PROVIDER: Final = "{provider}"
"""A path parameter: a provider's name, one percent-encoded segment."""

TENANT: Final = "{tenant}"
"""A path parameter: a tenant's name, one percent-encoded segment."""

PARAMETERS: Final = (PROVIDER, TENANT)
"""The path parameters; a route's path has at most one."""


@final
@attrs.frozen
class Route:
    """One method on one path pattern, and all that is said of it.

    Attributes:
        method: The HTTP method, upper case.
        path: The path pattern, such as ``/limits/{provider}``.
        operation_id: The OpenAPI ``operationId``.
        summary: One line on what it does.
        answers: The answers only it gives, by status code; ``responses``
            adds those of the checks it shares with others.
        description: More on what it does, if anything.
        request: The name of the request body's schema, if it takes one.
        auth: Whether a request must present the token.
    """

    method: str
    path: str
    operation_id: str
    summary: str
    answers: dict[int, Response]
    description: str | None = None
    request: str | None = None
    auth: bool = True

    @property
    def handler(self) -> str:
        """The ``AdminApp`` method that answers it: ``operation_id`` in snake case."""
        return re.sub(
            r"[A-Z]+", lambda upper: f"_{upper[0].lower()}", self.operation_id
        )

    @property
    def responses(self) -> dict[int, Response]:
        """Every answer it gives, by status code: its own, then its checks'.

        The token's (401), the path parameter's (400, 404, 422, and 503 for
        the dispatcher it names a part of) and the body's (413), as the app
        checks them; a route's own answer for a status comes first.
        """
        shared: dict[int, Response] = {401: _UNAUTHORIZED} if self.auth else {}
        if self.parameter is not None:
            bad_path, bad_name = _BAD_NAMES[self.parameter]
            shared |= {400: bad_path, 404: _NOT_FOUND, 422: bad_name, 503: _CLOSED}
        if self.request is not None:
            shared[413] = _TOO_LARGE
        return dict(sorted((shared | self.answers).items()))

    @property
    def segments(self) -> tuple[str, ...]:
        """The path pattern split at ``/``, the leading empty segment kept."""
        return tuple(self.path.split("/"))

    @property
    def parameter(self) -> str | None:
        """The path parameter (``PROVIDER`` or ``TENANT``), if the path has one."""
        found = [segment for segment in self.segments if segment in PARAMETERS]
        return found[0] if found else None

    def fits(self, segments: list[bytes]) -> bool:
        """Whether the raw path, split at ``/``, fits the pattern."""
        pattern = self.segments
        return len(segments) == len(pattern) and all(
            bool(segment) if expected in PARAMETERS else segment == expected.encode()
            for segment, expected in zip(segments, pattern, strict=True)
        )

    def argument(self, segments: list[bytes]) -> bytes | None:
        """The raw parameter segment of a fitting path; ``None`` if it has none."""
        parameter = self.parameter
        if parameter is None:
            return None
        return segments[self.segments.index(parameter)]


def problem(description: str, **headers: dict[str, Any]) -> Response:
    """A problem-details answer (``application/problem+json``)."""
    response: Response = {
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


def json_answer(description: str, schema: str) -> Response:
    """A JSON answer of the named schema."""
    return {
        "description": description,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
        },
    }


_UNAUTHORIZED = problem(
    "No token, or not the right one. Nothing was changed.",
    **{
        "WWW-Authenticate": {
            "description": "``Bearer realm=...``, with ``error=invalid_token`` for a wrong token.",
            "schema": {"type": "string"},
        }
    },
)
_NOT_FOUND = problem(
    "No such route (a ``/`` in a provider name must be sent as ``%2F``)."
)
_BAD_PATH = problem("The provider name is not valid percent-encoded UTF-8.")
_BAD_NAME = problem(
    f"The provider name is longer than {MAX_PROVIDER_LENGTH} characters."
)
_CLOSED = problem("The dispatcher is closed. Nothing was changed.")
_TOO_LARGE = problem(
    f"The body is larger than {MAX_BODY_BYTES} bytes. Nothing was changed."
)
_BAD_TENANT_PATH = problem("The tenant name is not valid percent-encoded UTF-8.")
_BAD_TENANT = problem(
    f"The tenant name is longer than {MAX_TENANT_NAME} characters. Nothing was changed."
)
_BAD_NAMES = {PROVIDER: (_BAD_PATH, _BAD_NAME), TENANT: (_BAD_TENANT_PATH, _BAD_TENANT)}

ROUTES: Final[tuple[Route, ...]] = (
    Route(
        "GET",
        "/limits",
        "getLimits",
        "The limit of every limited provider.",
        {200: json_answer("The limits.", "Limits")},
    ),
    Route(
        "PUT",
        "/limits/{provider}",
        "setLimit",
        "Limit a provider to this many concurrent slots, now.",
        {
            200: json_answer("The limit is set.", "ProviderLimit"),
            400: problem(
                "The body is not JSON, or the provider name not valid"
                " percent-encoded UTF-8. Nothing was changed."
            ),
            422: problem(
                'The body is not exactly ``{"limit": n}`` with n an'
                f" integer from 1 to {MAX_LIMIT}, or the provider name is"
                f" longer than {MAX_PROVIDER_LENGTH} characters. Nothing"
                " was changed."
            ),
        },
        description=(
            "A higher limit grants waiting requests at once; a lower one"
            " lets the holders finish and grants nothing until fewer than"
            " the limit hold a slot. The body is read as JSON whatever"
            f" its Content-Type, at most {MAX_BODY_BYTES} bytes."
        ),
        request="LimitUpdate",
    ),
    Route(
        "DELETE",
        "/limits/{provider}",
        "removeLimit",
        "Lift a provider's limit: waiters go through, nobody waits.",
        {200: json_answer("The provider is unlimited.", "ProviderLimit")},
    ),
    Route(
        "GET",
        "/status",
        "getStatus",
        "The dispatcher's statistics, provider by provider.",
        {200: json_answer("The statistics.", "Status")},
    ),
    Route(
        "POST",
        "/providers/{provider}/resume",
        "resume",
        "End a provider's rate-limit pause now, and its backoff.",
        {
            200: json_answer(
                "Resumed (or it was not paused): the provider's status now.",
                "ProviderStatus",
            ),
            404: problem(
                "No such route, or the dispatcher has never limited or"
                " used a provider of that name."
            ),
        },
        description="Takes no body; one sent is not read.",
    ),
    Route(
        "GET",
        "/tenants",
        "getTenants",
        "The configured tenants, and each provider's statistics of its tenants.",
        {200: json_answer("The tenants.", "Tenants")},
        description=(
            "Tenants not configured have the defaults (weight 1, no cap);"
            " a provider shows every tenant it has seen or been configured"
            " with."
        ),
    ),
    Route(
        "PUT",
        "/tenants/{tenant}",
        "setTenant",
        "Set a tenant's weight and cap on every provider, now.",
        {
            200: json_answer("The tenant's settings now.", "TenantSettings"),
            400: problem(
                "The body is not JSON, or the tenant name not valid"
                " percent-encoded UTF-8. Nothing was changed."
            ),
            422: problem(
                'The body is not a JSON object ``{"weight": w, "limit": n}``'
                f" with w a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} and n"
                f" an integer from 1 to {MAX_LIMIT} or null, or the tenant"
                " name is longer than"
                f" {MAX_TENANT_NAME} characters. Nothing was changed."
            ),
        },
        description=(
            "Replaces the tenant's settings whole: a field left out takes"
            " its default (weight 1, no cap). The service the tenant has"
            " received so far is kept, at its old weight; a lower cap lets"
            " the holders finish. With a Redis-shared dispatcher, the whole"
            f" fleet. The body is read as JSON whatever its Content-Type, at"
            f" most {MAX_BODY_BYTES} bytes."
        ),
        request="TenantUpdate",
    ),
    Route(
        "DELETE",
        "/tenants/{tenant}",
        "removeTenant",
        "Put a tenant back to the defaults: weight 1, no cap.",
        {200: json_answer("The tenant's settings now.", "TenantSettings")},
        description="Takes no body; one sent is not read. Idempotent.",
    ),
    Route(
        "GET",
        "/metrics",
        "getMetrics",
        "The Prometheus metrics of the dispatcher.",
        {
            200: {
                "description": "The metrics.",
                "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}},
                },
            },
            404: problem(
                "No metrics: the prometheus_client package or the"
                " collector is not installed."
            ),
        },
        description=(
            "The text format, or OpenMetrics when the Accept header asks for it."
        ),
    ),
    Route(
        "GET",
        "/healthz",
        "getHealth",
        "Whether the dispatcher runs. Needs no token.",
        {
            200: json_answer("The dispatcher runs.", "Health"),
            503: json_answer("The dispatcher is closed.", "Health"),
        },
        auth=False,
    ),
    Route(
        "GET",
        "/openapi.json",
        "getOpenAPI",
        "This document.",
        {
            200: {
                "description": "The OpenAPI document.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    ),
)
"""Every route of the admin API, in the order the document lists them."""


def match(path: bytes) -> tuple[list[Route], bytes | None]:
    """The routes ``path`` fits (one per method), and its raw parameter segment.

    Every route on one path has the same pattern, so the same parameter.
    """
    segments = path.split(b"/")
    found = [route for route in ROUTES if route.fits(segments)]
    return found, found[0].argument(segments) if found else None
