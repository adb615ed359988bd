"""``Endpoint``: where one member of a pool is reached, and with which key."""

from __future__ import annotations

from typing import final
from urllib.parse import urlsplit

import attrs


def _check_base_url(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"base_url must be a string, got {type(value).__name__}")
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ValueError(
            f"base_url must be an http or https URL with a host, got {value!r}"
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(
            "base_url must have no query, fragment or credentials (the key goes in"
            " api_key)"
        )


def _check_api_key(_: object, __: attrs.Attribute[str | None], value: object) -> None:
    # Never the key itself in a message: its type, or what is wrong with it.
    if value is None:
        return
    if not isinstance(value, str):
        raise TypeError(f"api_key must be a string or None, got {type(value).__name__}")
    if not value:
        raise ValueError("api_key must not be empty (None sends the client's own)")
    if not value.isascii() or not value.isprintable():
        raise ValueError("api_key must be printable ASCII, fit for an HTTP header")


@final
@attrs.frozen
class Endpoint:
    """Where a pool's member is reached: its base URL, and its API key.

    For ``Dispatcher.transport(pool, endpoints={member: Endpoint(...)})``:
    each model call is sent to the base URL of the member its slot was
    granted on, with that member's key. The key never shows in a repr.

    Attributes:
        base_url: The member's base URL as its SDK takes it: OpenAI's
            with ``/v1`` (``"https://api.openai.com/v1"``,
            ``"http://10.0.0.7:8000/v1"``), Anthropic's without
            (``"https://api.anthropic.com"``). A model call's endpoint as
            the SDK adds it (``/chat/completions``, ``/v1/messages``...) is
            added to it.
        api_key: The member's key, sent in the header its wire format uses
            (``Authorization: Bearer`` for OpenAI's, ``x-api-key`` for
            Anthropic's) in place of the client's own; ``None`` sends the
            client's own headers (a server that wants no key).

    Raises:
        TypeError: ``base_url`` is not a string, or ``api_key`` not a
            string or ``None``.
        ValueError: ``base_url`` is not an http or https URL with a host, or
            has a query, fragment or credentials; ``api_key`` is empty or
            not printable ASCII.
    """

    base_url: str = attrs.field(validator=_check_base_url)
    api_key: str | None = attrs.field(
        default=None, repr=False, validator=_check_api_key
    )
