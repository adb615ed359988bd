"""``OpenAIProvider``: the HTTP client of OpenAI-compatible chat completions.

What the format is (its endpoint, key header, body, decoder and rate-limit
headers) is in ``trio_dispatch._wire._openai``; this is the client that
sends it, as ``ProviderBase`` sends every format.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, final

from .._validation import check_flag
from .._wire._openai import OPENAI, request_body
from ._http import ProviderBase

if TYPE_CHECKING:
    from collections.abc import Mapping

    import httpx2

    from .._provider import RateLimitObserver, RateLimitReporter


@final
class OpenAIProvider(ProviderBase):
    """An OpenAI-compatible chat completions API, streamed over HTTP.

    Works with OpenAI itself and with servers that speak its format (vLLM,
    DeepSeek, llama.cpp, a proxy). Use it as an async context manager, or
    call ``aclose()``, to close the HTTP client it made; a client you lend
    it stays yours to close.

    Args:
        id: The provider's id, as the dispatcher knows it.
        base_url: The API root including its version, as the official SDK
            takes it: ``https://api.openai.com/v1``. A trailing slash is
            dropped; requests go to ``{base_url}/chat/completions``. A
            gateway's credentials in it (``https://user:password@proxy/v1``)
            are masked wherever the provider shows it (its repr, errors).
        api_key: Sent as ``Authorization: Bearer ...``. Never shown in a
            repr, a log line or an error message. It must be printable
            ASCII without spaces: a key with a trailing line break (as read
            from a file) is refused, not stripped: a key is sent exactly as
            given or not at all.
        model: The model to ask for.
        client: An ``httpx2.AsyncClient`` to share; the provider makes (and
            owns) one if not given. A legacy ``httpx.AsyncClient`` is
            refused with ``TypeError``.
        connect_timeout: Seconds to connect, or to wait for a pooled
            connection.
        read_timeout: Seconds to wait for the response to start, and then
            for each event of the stream: comments (``: keepalive``) do not
            count. A stalled stream ends as ``ProviderConnectionError``
            after this long without an event.
        extra_headers: More headers for every request (an organisation id,
            a proxy's routing header). Names must be HTTP tokens and values
            printable ASCII; a bad value is refused without being shown,
            since it may be a credential.
        on_rate_limit: A ``RateLimitReporter``, called on a 429, 503 or 529
            (and on a rate-limit or overloaded error in the stream) before
            the error is raised. Not needed through a dispatcher (the error
            carries what it needs, and an answer the dispatcher meters calls
            neither callback); else pass ``dispatcher.report_rate_limit``.
        on_rate_limits: A ``RateLimitObserver``, told the figures of every
            answer whose headers carry them, except those a dispatcher
            meters (``events()`` shows theirs). Not needed through a
            dispatcher; else pass ``dispatcher.observe_rate_limits``. Malformed headers are
            ignored, and logged once per header name. An observer that takes
            a ``model`` keyword, as ``observe_rate_limits`` does, is told
            ``model=`` too: providers count their limits per model.
        server_priority: For a self-hosted server that orders its own
            queue by a request's ``priority`` (vLLM started with
            ``--scheduling-policy priority``): through a dispatcher
            (``wrap_provider``, conversations), each request is sent with
            ``"priority"``, its slot's place in line, lower for an older
            turn (as ``Dispatcher.transport(..., server_priority=True)``
            sends it), unless its ``extra`` gives one. Used without a
            dispatcher's slot, a request has no place in line and gets
            none. Off by default: turn it on only for a server in priority
            mode.
    """

    def __init__(
        self,
        id: str = "openai",
        *,
        base_url: str,
        api_key: str,
        model: str,
        client: httpx2.AsyncClient | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        extra_headers: Mapping[str, str] | None = None,
        on_rate_limit: RateLimitReporter | None = None,
        on_rate_limits: RateLimitObserver | None = None,
        server_priority: bool = False,
    ) -> None:
        self._server_priority = check_flag(server_priority, "server_priority")
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
            wire=OPENAI,
            headers={},
            body=functools.partial(request_body, model),
        )

    @property
    def server_priority(self) -> bool:
        """Whether a request through a dispatcher carries its place in line."""
        return self._server_priority
