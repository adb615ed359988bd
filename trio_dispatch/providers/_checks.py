"""What a provider is made with, checked when it is made.

Each check raises ``TypeError`` or ``ValueError`` at once, before anything
is built, with a short message that never repeats a secret: an API key or
a header value (which may carry a credential) is described by the kind of
character that is wrong and where, not shown. What passes here is what h11
and httpx2 will send, so nothing fails later, when a request is built, with
an error outside the ``ProviderError`` tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import httpx2

from .._validation import redact_url

if TYPE_CHECKING:
    from collections.abc import Mapping


def check_secret_text(value: object, name: str) -> str:
    """A non-empty ``str``; a wrong one is named by its type, never shown.

    For values that may hold a credential (an API key, a URL with one), so
    no error message carries it (``check_text`` shows the value).
    """
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a non-empty string, got {type(value).__name__}"
        )
    if not value:
        raise ValueError(f"{name} must be a non-empty string, got ''")
    return value


def _character_class(char: str) -> str:
    """What ``char`` is, in words that do not repeat it."""
    if char in "\r\n":
        return "a line break"
    if char == "\t":
        return "a tab"
    if char == "\0":
        return "a NUL character"
    if char == " ":
        return "a space"
    if char.isascii():
        return "a control character"
    return "a non-ASCII character"


def check_api_key(value: object) -> str:
    """An API key: printable ASCII, no whitespace; never echoed in an error.

    A trailing line break (what ``open(path).read()`` leaves) is refused,
    not stripped: a secret is sent exactly as given or not at all, and a
    file that holds more than the key may be damaged in other ways too.
    The error says which kind of character is wrong and where, never the
    key or any part of it.
    """
    if not isinstance(value, str):
        raise TypeError("api_key must be a non-empty string")
    if not value:
        raise ValueError("api_key must be a non-empty string")
    rule = "api_key must be printable ASCII without spaces"
    bad = [index for index, char in enumerate(value) if not "!" <= char <= "~"]
    if not bad:
        return value
    if value[bad[0] :] in ("\n", "\r", "\r\n"):
        raise ValueError(
            f"{rule}, got a line break at the end (strip a key read from a file)"
        )
    raise ValueError(f"{rule}, got {_character_class(value[bad[0]])} at index {bad[0]}")


def check_header_value(value: str, name: str) -> str:
    """A header value h11 will send: printable ASCII, inner spaces allowed.

    Never echoed: a header may carry a credential. Without this check, h11
    refuses the value when the request is sent, and its error shows it.
    """
    for index, char in enumerate(value):
        inner = 0 < index < len(value) - 1
        if "!" <= char <= "~" or (char in " \t" and inner):
            continue
        what = _character_class(char)
        if char in " \t":
            what = "leading or trailing whitespace"
        raise ValueError(f"{name} must be printable ASCII, got {what} at index {index}")
    return value


# RFC 9110's tchar: what a header name may be made of.
_TOKEN_CHARACTERS: Final = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Extra headers, names lowercased; values checked but never echoed."""
    checked: dict[str, str] = {}
    for name, value in dict(headers or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError("extra_headers must map header names to strings")
        if not name or not _TOKEN_CHARACTERS.issuperset(name):
            raise ValueError(f"extra_headers names must be HTTP tokens, got {name!r}")
        checked[name.lower()] = check_header_value(value, f"extra_headers[{name!r}]")
    return checked


def check_base_url(value: object) -> str:
    """A URL httpx2 can send to, with a host; paths are appended to it.

    Checked whole here, since httpx2 would only refuse it when a request is
    built, with an error outside the ``ProviderError`` tree.
    """
    url = check_secret_text(value, "base_url")
    # A gateway's URL may carry credentials (user:password@, ?api-key=):
    # every message shows it redacted, as the Redis URL is.
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {shown!r}")
    for index, char in enumerate(url):
        # Checked here rather than by httpx2, whose wording varies by version.
        if char <= " " or char == "\x7f":
            raise ValueError(
                f"base_url must be a valid URL, got {shown!r}"
                f" (a control character or space at index {index})"
            )
    try:
        host = httpx2.URL(url).host
    except httpx2.InvalidURL as exc:
        reason = str(exc).rstrip(".")
        reason = reason[:1].lower() + reason[1:]
        # httpx2's reason quotes a part of the URL (a port, a host), which
        # may be a piece of a password: kept only for a URL without any.
        detail = f" ({reason})" if shown == url else ""
        raise ValueError(
            f"base_url must be a valid URL, got {shown!r}{detail}"
        ) from None
    if not host:
        raise ValueError(f"base_url must name a host, got {shown!r}")
    if "?" in url or "#" in url:
        # The request's path is appended to base_url, after a query would be.
        raise ValueError(f"base_url must not have a query or fragment, got {shown!r}")
    return url.rstrip("/")
