"""The fake server's prompt cache: which prefixes each API key has cached.

A prompt is cut into segments in the order the API caches them, and each
format says which prefixes a request reads and writes (its
``cache_plan``, in ``trio_dispatch._wire``: Anthropic's breakpoints,
OpenAI's ``prompt_cache_key``); a prefix is known by a hash of its
segments and the model. A token is four characters of JSON, and there is
no minimum cacheable length.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, final

import attrs

from .._wire import FORMATS

if TYPE_CHECKING:
    from ._script import WireFormat


@final
@attrs.frozen
class CacheUsage:
    """How one request's prompt splits between the cache and the rest.

    Tokens neither read from the cache nor written to it, read from it, and
    written to it (Anthropic only).
    """

    input_tokens: int
    read_tokens: int
    write_tokens: int


@final
class PromptCache:
    """Prefixes cached so far, per API key (and per OpenAI cache key)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, ...], set[str]] = {}

    def use(self, wire: WireFormat, api_key: str, body: object) -> CacheUsage | None:
        """Read and write the cache for ``body``, sent with ``api_key``.

        Returns:
            The split of its prompt, or ``None`` when it asks for no
            caching (no breakpoint for Anthropic, no ``prompt_cache_key``
            for OpenAI) and the server's usage stays as it was.
        """
        if not isinstance(body, dict):
            return None
        plan = FORMATS[wire].cache_plan(body)
        if plan is None:
            return None
        # Never the key itself in memory longer than the request: its hash.
        owner = hashlib.sha256(api_key.encode()).hexdigest()
        held = self._held.setdefault((owner, *plan.store), set())
        digest = hashlib.sha256(json.dumps(body.get("model")).encode())
        hashes: list[str] = []
        tokens: list[int] = []
        chars = 0
        for segment in plan.segments:
            digest.update(segment.text.encode())
            digest.update(b"\0")
            hashes.append(digest.hexdigest())
            chars += len(segment.text)
            tokens.append(chars // 4)
        total = max(1, chars // 4)
        last = plan.last
        read = max((tokens[i] for i in range(last + 1) if hashes[i] in held), default=0)
        cached = tokens[last] if plan.explicit else read
        held.update(hashes[i] for i in plan.written)
        return CacheUsage(
            input_tokens=max(total - cached, 0),
            read_tokens=read,
            write_tokens=cached - read,
        )
