"""A request as the fake LLM server received it, and the wire formats.

Its own module so that the script (whose ``choose`` is called with a
``FakeRequest``), the encoders and the server can all name it without
importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

WireFormat = Literal["openai", "anthropic"]

#: The fake server's routes, and the wire format each one speaks.
ROUTES: dict[str, WireFormat] = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
}


@final
@attrs.frozen
class FakeRequest:
    """One request the fake server received, as it arrived (minus the key).

    Attributes:
        format: ``"openai"`` or ``"anthropic"``, from the path.
        path: The request path.
        body: The parsed JSON body, or ``None`` if it was not JSON.
        headers: The request headers, names lowercased, without
            ``authorization`` and ``x-api-key``.
        authenticated: Whether it passed the server's key check.
        arrived_at: When it arrived, on the trio clock.
        client: The client's ``(host, port)``; requests over one kept-alive
            connection share it.
    """

    format: WireFormat
    path: str
    body: Any
    headers: Mapping[str, str]
    authenticated: bool
    arrived_at: float
    client: tuple[str, int] | None = None
