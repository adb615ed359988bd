"""``Format``: everything a user of a wire format needs, in one value.

Each format's module (``_openai.py``, ``_anthropic.py``) ends with one; the
providers, the transport's metering and the testing kit take what they
need from it and know nothing of the format themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._policy._ratelimits import RateLimitInfo
    from ._decoder import WireDecoder
    from ._encode import CachePlan, WireEvent


@final
@attrs.frozen(kw_only=True)
class Format:
    """One wire format: its endpoint, headers, codecs and vocabulary.

    Attributes:
        name: How the package names it (``"openai"``): a fake server's
            format, ``ScriptedProvider(wire=...)``.
        path: The endpoint under the API root as the official SDK takes it
            (``/chat/completions`` under ``.../v1``).
        route: The same endpoint from the server's root (``/v1/...``), where
            the fake server serves it.
        key_headers: The headers that may carry the API key, each with its
            scheme (``("Authorization", "Bearer")``, or ``""`` for the bare
            key); a request sends the first. Names as the API's
            documentation spells them, for messages; sent and matched
            lowercased.
        version_header: A header every request must carry (Anthropic's
            ``anthropic-version``), or ``None``.
        required_fields: The fields every request body must have.
        usage_on_request: Whether the stream says its usage only when the
            request asks (OpenAI's ``stream_options.include_usage``).
        terminator: What ends a stream, for messages.
        rate_limit_prefix: The prefix of its rate-limit headers.
        retry_after_ms: Whether a 429 says ``retry-after-ms`` beside
            ``retry-after``.
        decoder: Makes a fresh decoder: ``decoder(provider id, redact)``.
        read_rate_limits: Reads an answer's rate-limit headers
            (``headers, *, now, on_malformed``).
        rate_limit_headers: Writes rate-limit figures as headers, the
            reader's inverse (``info, wall_now``).
        encode_stream: A reply's server-sent events (``plan, *,
            include_usage``), with the stream events the decoder makes of
            each.
        cache_plan: How the API caches a request body's prompt (the fake
            server's prompt cache plays it), or ``None`` if it asks for
            no caching.
        error_body: An error answer's JSON body (``error type, message``).
        error_event: An error event in the stream (``error type, message``).
        status_errors: The error type and message of each status fault
            (``"rate_limit"``, ``"server_error"``, ``"unavailable"``,
            ``"overloaded"``), as the API words them.
        refusal_error: The error type and message (a template with
            ``{reason}``) of a request a quota refuses.
        malformed_event: An event whose data is not JSON.
        call_id_prefix: How the API's tool call ids begin (``call``).
    """

    name: str
    path: str
    route: str
    key_headers: tuple[tuple[str, str], ...]
    version_header: str | None
    required_fields: tuple[str, ...]
    usage_on_request: bool
    terminator: str
    rate_limit_prefix: str
    retry_after_ms: bool
    decoder: Callable[[str, Callable[[str], str]], WireDecoder]
    read_rate_limits: Callable[..., RateLimitInfo]
    rate_limit_headers: Callable[[RateLimitInfo, float], list[tuple[str, str]]]
    encode_stream: Callable[..., list[WireEvent]]
    cache_plan: Callable[[dict[str, Any]], CachePlan | None]
    error_body: Callable[[str, str], dict[str, Any]]
    error_event: Callable[[str, str], bytes]
    status_errors: Mapping[str, tuple[str, str]]
    refusal_error: tuple[str, str]
    malformed_event: bytes
    call_id_prefix: str

    def __repr__(self) -> str:
        return f"<Format {self.name!r}>"

    def key_header(self, api_key: str) -> tuple[str, str]:
        """The header carrying ``api_key`` as a request sends it: (name, value)."""
        name, scheme = self.key_headers[0]
        return name.lower(), f"{scheme} {api_key}" if scheme else api_key

    def key_in(self, headers: Mapping[str, str]) -> str:
        """The key a request's (lowercased) headers present, or ``""``."""
        for name, scheme in self.key_headers:
            value = headers.get(name.lower(), "")
            if scheme:
                given, _, value = value.partition(" ")
                if given.lower() != scheme.lower():
                    continue
            if value.strip():
                return value.strip()
        return ""
