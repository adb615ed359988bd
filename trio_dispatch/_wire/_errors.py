"""What an LLM API's answer means, without any I/O: errors and tool calls.

The vocabulary of both APIs' errors, in one place: the HTTP providers turn
a status and its error body (``error_details``) or an error event into a
typed ``ProviderError`` here, and the decoders a tool call's argument text
into a ``ToolCall``. ``trio_dispatch.testing.ScriptedProvider`` uses the same
functions, so it raises and yields exactly what the HTTP providers would for
the same script; that is why this module loads no HTTP library.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from .._exceptions import (
    AuthenticationError,
    BadRequest,
    Overloaded,
    ProviderError,
    RateLimited,
    ServerError,
)
from .._json import json_kind
from ..messages import ToolCall

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# Tool arguments nested deeper are refused as they are decoded: far past any
# tool's schema, far short of the recursion limits on their way (encoding
# the next request, copying them for the tool, checking them).
_MAX_ARGUMENT_DEPTH: Final = 100
#: How much of a server's own message an exception repeats.
MESSAGE_LIMIT: Final = 500


def error_for_status(
    provider: str,
    status: int,
    *,
    error_type: str | None,
    message: str,
    retry_after: float | None,
) -> ProviderError:
    """The typed error for an HTTP status; the status decides the class."""
    what = f"HTTP {status}" + (f" {error_type}" if error_type else "")
    text = f"{provider}: {what}" + (f": {message}" if message else "")
    if status == 429:
        return RateLimited(
            text + _retry_after_text(retry_after),
            provider=provider,
            status_code=status,
            retry_after=retry_after,
        )
    if status in (503, 529):
        return Overloaded(
            text + _retry_after_text(retry_after),
            provider=provider,
            status_code=status,
            retry_after=retry_after,
        )
    if status >= 500:
        return ServerError(text, provider=provider, status_code=status)
    if status in (401, 403):
        return AuthenticationError(text, provider=provider, status_code=status)
    # Other 4xx, and statuses an API should never answer a POST with (a
    # redirect means a wrong base_url): sending again will not help.
    return BadRequest(text, provider=provider, status_code=status)


def error_for_type(provider: str, error_type: str, message: str) -> ProviderError:
    """The typed error for an error reported inside a stream, by its type.

    Knows both APIs' vocabularies (``rate_limit_error``,
    ``rate_limit_exceeded``, ``overloaded_error``, ``invalid_request_error``,
    ...); an unknown type is taken for a server-side failure.
    """
    text = f"{provider}: {error_type} in the stream" + (
        f": {message}" if message else ""
    )
    kind = error_type.lower()
    if "rate_limit" in kind:
        return RateLimited(text, provider=provider)
    if "overloaded" in kind or "unavailable" in kind:
        return Overloaded(text, provider=provider)
    if any(word in kind for word in ("authentication", "permission", "api_key")):
        return AuthenticationError(text, provider=provider)
    if any(word in kind for word in ("invalid_request", "not_found", "too_large")):
        return BadRequest(text, provider=provider)
    return ServerError(text, provider=provider)


def error_details(
    body: bytes, redact: Callable[[str], str] = str
) -> tuple[str | None, str]:
    """``(error type, message)`` from an error body, in either API's shape.

    Both OpenAI (``{"error": {"message", "type", "code"}}``) and Anthropic
    (``{"type": "error", "error": {"type", "message"}}``) nest the details
    under ``error``; anything else is shown as text. What JSON decoding
    gives is passed through ``redact`` before it is shortened.
    """
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, shorten(redact(text))
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        kind = error_kind(error)
        message = error.get("message")
        text = message if isinstance(message, str) else text
        return (None if kind is None else redact(kind)), shorten(redact(text))
    if isinstance(error, str):
        return None, shorten(redact(error))
    return None, shorten(redact(text))


def error_kind(error: Mapping[str, object]) -> str | None:
    """An error object's ``type``, and its ``code`` when that says more.

    ``"type (code)"``, or either alone; ``None`` if neither is a string.
    """
    error_type = error.get("type")
    code = error.get("code")
    kind = error_type if isinstance(error_type, str) and error_type else None
    if isinstance(code, str) and code and code != kind:
        kind = f"{kind} ({code})" if kind else code
    return kind


def _retry_after_text(retry_after: float | None) -> str:
    return "" if retry_after is None else f" (retry after {retry_after:g} s)"


def make_tool_call(call_id: str, name: str, raw_arguments: str) -> ToolCall:
    """A ``ToolCall`` with its arguments parsed, or the reason they did not."""
    if not raw_arguments.strip():
        # A tool without parameters may get no argument text at all.
        return ToolCall(call_id, name, {}, raw_arguments)
    try:
        arguments = json.loads(raw_arguments)
    except (ValueError, RecursionError) as exc:
        return ToolCall(
            call_id, name, {}, raw_arguments, f"arguments are not valid JSON: {exc}"
        )
    if _nests_deeper(arguments, _MAX_ARGUMENT_DEPTH):
        # Refused now, so the conversation never keeps what the next
        # request could not encode.
        return ToolCall(
            call_id,
            name,
            {},
            raw_arguments,
            f"arguments nest deeper than {_MAX_ARGUMENT_DEPTH} levels",
        )
    if not isinstance(arguments, dict):
        return ToolCall(
            call_id,
            name,
            {},
            raw_arguments,
            f"arguments must be a JSON object, got {json_kind(arguments)}",
        )
    return ToolCall(call_id, name, arguments, raw_arguments)


def _nests_deeper(value: object, limit: int) -> bool:
    """Whether JSON ``value`` has arrays and objects nested over ``limit`` deep.

    A loop, not recursion: the point is to stay clear of the limit.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if not isinstance(item, list):
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


def shorten(text: str) -> str:
    """``text`` on one line, cut to ``MESSAGE_LIMIT`` characters."""
    text = " ".join(text.split())
    if len(text) > MESSAGE_LIMIT:
        return text[: MESSAGE_LIMIT - 3] + "..."
    return text
