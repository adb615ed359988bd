"""The fake server's prompt cache: which prefixes each API key has cached.

A prompt is cut into segments in the order the API caches them (tools,
the system prompt, then each content block for Anthropic, each message for
OpenAI); a prefix is known by a hash of its segments and the model.
Anthropic caches the prefix up to each ``cache_control`` breakpoint, and a
later request reads the longest cached prefix ending at or before its last
breakpoint (looking back over all blocks, not 20). OpenAI caches every
prefix of a request with a ``prompt_cache_key``. A token is four
characters of JSON, and there is no minimum cacheable length.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, final

import attrs

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


@attrs.frozen
class _Segment:
    text: str
    marked: bool


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
        # Never the key itself in memory longer than the request: its hash.
        owner = hashlib.sha256(api_key.encode()).hexdigest()
        if wire == "anthropic":
            segments = _anthropic_segments(body)
            store: tuple[str, ...] = (owner,)
            if not any(segment.marked for segment in segments):
                return None
        else:
            cache_key = body.get("prompt_cache_key")
            if not isinstance(cache_key, str):
                return None
            segments = _openai_segments(body)
            store = (owner, cache_key)
        held = self._held.setdefault(store, set())
        digest = hashlib.sha256(json.dumps(body.get("model")).encode())
        hashes: list[str] = []
        tokens: list[int] = []
        chars = 0
        for segment in segments:
            digest.update(segment.text.encode())
            digest.update(b"\0")
            hashes.append(digest.hexdigest())
            chars += len(segment.text)
            tokens.append(chars // 4)
        total = max(1, chars // 4)
        if wire == "anthropic":
            last = max(i for i, segment in enumerate(segments) if segment.marked)
            written = [i for i, segment in enumerate(segments) if segment.marked]
        else:
            last = len(segments) - 1
            written = list(range(len(segments)))
        read = max((tokens[i] for i in range(last + 1) if hashes[i] in held), default=0)
        cached = tokens[last] if wire == "anthropic" else read
        held.update(hashes[i] for i in written)
        return CacheUsage(
            input_tokens=max(total - cached, 0),
            read_tokens=read,
            write_tokens=cached - read,
        )


def _text(value: Any) -> str:  # noqa: ANN401 (any JSON value)
    if isinstance(value, dict):
        value = {key: item for key, item in value.items() if key != "cache_control"}
    return json.dumps(value, sort_keys=True)


def _marked(value: object) -> bool:
    return isinstance(value, dict) and "cache_control" in value


def _anthropic_segments(body: dict[str, Any]) -> list[_Segment]:
    segments: list[_Segment] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        segments.extend(_Segment(_text(tool), _marked(tool)) for tool in tools)
    system = body.get("system")
    if isinstance(system, list):
        segments.extend(_Segment(_text(block), _marked(block)) for block in system)
    elif system is not None:
        segments.append(_Segment(_text(system), marked=False))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        blocks = content if isinstance(content, list) else [content]
        segments.extend(
            _Segment(_text(role) + _text(block), _marked(block)) for block in blocks
        )
    return segments


def _openai_segments(body: dict[str, Any]) -> list[_Segment]:
    tools = body.get("tools")
    messages = body.get("messages")
    return [
        _Segment(_text(item), marked=False)
        for part in (tools, messages)
        if isinstance(part, list)
        for item in part
    ]
