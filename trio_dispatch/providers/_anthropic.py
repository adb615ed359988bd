"""``AnthropicProvider``: the HTTP client of Anthropic's Messages API.

What the format is (its endpoint, headers, body, decoder and rate-limit
headers) is in ``trio_dispatch._wire._anthropic``; this is the client that
sends it, as ``ProviderBase`` sends every format.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, final

from .._validation import check_limit, check_text
from .._wire._anthropic import ANTHROPIC, request_body
from ._checks import check_header_value
from ._http import ProviderBase

if TYPE_CHECKING:
    from collections.abc import Mapping

    import httpx2

    from .._provider import RateLimitObserver, RateLimitReporter


@final
class AnthropicProvider(ProviderBase):
    """Anthropic's Messages API, streamed over HTTP.

    Use it as an async context manager, or call ``aclose()``, to close the
    HTTP client it made; a client you lend it stays yours to close.

    Args:
        id: The provider's id, as the dispatcher knows it.
        base_url: The API root without the version, as the official SDK
            takes it; requests go to ``{base_url}/v1/messages``.
            Credentials in it are masked, as ``OpenAIProvider`` does.
        api_key: Sent as ``x-api-key``; checked, and never shown, as
            ``OpenAIProvider`` does.
        model: The model to ask for.
        anthropic_version: The ``anthropic-version`` header.
        max_tokens: Sent when the request has no ``max_tokens`` (the API
            requires one).
        extra_headers: More headers for every request (an ``anthropic-beta``
            flag, a proxy's routing header), checked as ``OpenAIProvider``
            checks them. The key, version and content type headers are
            always the provider's own.

    ``client``, ``connect_timeout``, ``read_timeout``, ``on_rate_limit`` and
    ``on_rate_limits`` are as for ``OpenAIProvider``.
    """

    def __init__(
        self,
        id: str = "anthropic",
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str,
        model: str,
        client: httpx2.AsyncClient | None = None,
        anthropic_version: str = "2023-06-01",
        max_tokens: int = 4096,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        extra_headers: Mapping[str, str] | None = None,
        on_rate_limit: RateLimitReporter | None = None,
        on_rate_limits: RateLimitObserver | None = None,
    ) -> None:
        check_text(anthropic_version, "anthropic_version")
        check_header_value(anthropic_version, "anthropic_version")
        check_limit(max_tokens, "max_tokens")
        # Last, once every argument is known good: it may make a client.
        super().__init__(
            id,
            base_url=base_url,
            api_key=api_key,
            model=model,
            client=client,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            extra_headers=extra_headers,
            on_rate_limit=on_rate_limit,
            on_rate_limits=on_rate_limits,
            wire=ANTHROPIC,
            headers={"anthropic-version": anthropic_version},
            body=functools.partial(request_body, model, max_tokens),
        )
