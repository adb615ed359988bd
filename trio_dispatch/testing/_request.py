"""A request as the fake LLM received it, and the wire formats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..messages import ChatRequest

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

    A ``ScriptedProvider`` makes one for its script's ``choose`` too, with
    no body and no headers, and the ``ChatRequest`` itself as ``chat``.

    Attributes:
        format: ``"openai"`` or ``"anthropic"``, from the path.
        body: The parsed JSON body, or ``None`` if it was not JSON.
        headers: The request headers, names lowercased, without
            ``authorization`` and ``x-api-key``.
        authenticated: Whether it passed the server's key check.
        arrived_at: When it arrived, on the trio clock.
        client: The client's ``(host, port)``, shared by the requests of
            one kept-alive connection.
    """

    format: WireFormat
    path: str
    body: Any
    headers: Mapping[str, str]
    authenticated: bool
    arrived_at: float
    client: tuple[str, int] | None = None
    chat: ChatRequest | None = None

    @property
    def model(self) -> str | None:
        """The body's ``model``, if it is a string (what per-model quotas go by)."""
        body = self.body
        if isinstance(body, dict):
            model = body.get("model")
            if isinstance(model, str):
                return model
        return None
