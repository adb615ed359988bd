"""The admin API's routes: one table, read by the router and the OpenAPI document.

Each ``Route`` says, once, what the app does and what it documents: the
method, the path pattern (``{provider}`` is one percent-encoded path
segment), the handler (an ``AdminApp`` method, by name), whether the token
is needed, the request body's schema and every answer the route gives. The
app routes requests with ``match``; ``openapi_document`` builds the paths of
the document from the same rows, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Final, final

import attrs

from ._caps import MAX_BODY_BYTES, MAX_LIMIT, MAX_PROVIDER_LENGTH

Response = dict[str, Any]
"""An OpenAPI response object."""

PROVIDER: Final = "{provider}"
"""The one path parameter: a provider's name, one percent-encoded segment."""


@final
@attrs.frozen
class Route:
    """One method on one path pattern, and all that is said of it.

    Attributes:
        method: The HTTP method, upper case.
        path: The path pattern, such as ``/limits/{provider}``.
        handler: The name of the ``AdminApp`` method that answers it.
        operation_id: The OpenAPI ``operationId``.
        summary: One line on what it does.
        responses: The answers it gives, by status code.
        description: More on what it does, if anything.
        request: The name of the request body's schema, if it takes one.
        auth: Whether a request must present the token.
    """

    method: str
    path: str
    handler: str
    operation_id: str
    summary: str
    responses: dict[int, Response]
    description: str | None = None
    request: str | None = None
    auth: bool = True

    @property
    def segments(self) -> tuple[str, ...]:
        """The path pattern split at ``/``, the leading empty segment kept."""
        return tuple(self.path.split("/"))

    def fits(self, segments: list[bytes]) -> bool:
        """Whether the raw path, split at ``/``, fits the pattern."""
        pattern = self.segments
        return len(segments) == len(pattern) and all(
            bool(segment) if expected == PROVIDER else segment == expected.encode()
            for segment, expected in zip(segments, pattern, strict=True)
        )

    def provider(self, segments: list[bytes]) -> bytes | None:
        """The raw provider segment of a fitting path; ``None`` if it has none."""
        pattern = self.segments
        return segments[pattern.index(PROVIDER)] if PROVIDER in pattern else None


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

ROUTES: Final[tuple[Route, ...]] = (
    Route(
        "GET",
        "/limits",
        "get_limits",
        "getLimits",
        "The limit of every limited provider.",
        {200: json_answer("The limits.", "Limits"), 401: _UNAUTHORIZED},
    ),
    Route(
        "PUT",
        "/limits/{provider}",
        "set_limit",
        "setLimit",
        "Limit a provider to this many concurrent slots, now.",
        {
            200: json_answer("The limit is set.", "ProviderLimit"),
            400: problem(
                "The body is not JSON, or the provider name not valid"
                " percent-encoded UTF-8. Nothing was changed."
            ),
            401: _UNAUTHORIZED,
            404: _NOT_FOUND,
            413: problem(
                f"The body is larger than {MAX_BODY_BYTES} bytes. Nothing was changed."
            ),
            422: problem(
                'The body is not exactly ``{"limit": n}`` with n an'
                f" integer from 1 to {MAX_LIMIT}, or the provider name is"
                f" longer than {MAX_PROVIDER_LENGTH} characters. Nothing"
                " was changed."
            ),
            503: _CLOSED,
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
        "remove_limit",
        "removeLimit",
        "Lift a provider's limit: waiters go through, nobody waits.",
        {
            200: json_answer("The provider is unlimited.", "ProviderLimit"),
            400: _BAD_PATH,
            401: _UNAUTHORIZED,
            404: _NOT_FOUND,
            422: _BAD_NAME,
            503: _CLOSED,
        },
    ),
    Route(
        "GET",
        "/status",
        "get_status",
        "getStatus",
        "The dispatcher's statistics, provider by provider.",
        {200: json_answer("The statistics.", "Status"), 401: _UNAUTHORIZED},
    ),
    Route(
        "POST",
        "/providers/{provider}/resume",
        "resume",
        "resume",
        "End a provider's rate-limit pause now, and its backoff.",
        {
            200: json_answer(
                "Resumed (or it was not paused): the provider's status now.",
                "ProviderStatus",
            ),
            400: _BAD_PATH,
            401: _UNAUTHORIZED,
            404: problem(
                "No such route, or the dispatcher has never limited or"
                " used a provider of that name."
            ),
            422: _BAD_NAME,
            503: _CLOSED,
        },
        description="Takes no body; one sent is not read.",
    ),
    Route(
        "GET",
        "/metrics",
        "get_metrics",
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
            401: _UNAUTHORIZED,
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
        "get_health",
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
        "get_openapi",
        "getOpenAPI",
        "This document.",
        {
            200: {
                "description": "The OpenAPI document.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            401: _UNAUTHORIZED,
        },
    ),
)
"""Every route of the admin API, in the order the document lists them."""


def match(path: bytes) -> tuple[list[Route], bytes | None]:
    """The routes ``path`` fits (one per method), and its raw provider segment."""
    segments = path.split(b"/")
    found = [route for route in ROUTES if route.fits(segments)]
    return found, found[0].provider(segments) if found else None
