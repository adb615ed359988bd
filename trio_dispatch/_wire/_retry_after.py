"""How long a provider asked us to wait, from its response headers.

Two headers say it. ``retry-after-ms`` (milliseconds, a number; OpenAI and
Anthropic send it) is the more precise and wins when it makes sense.
``Retry-After`` (RFC 9110 section 10.2.3) is either delta-seconds or an
HTTP-date; a date is turned into seconds from ``now``. A value that does not
parse is ignored, as if the header were absent, and so is a delay that is
not positive (``0``, a negative delay, a date in the past): it names no
delay, so the dispatcher backs off as without the header
(``server_delay``).
"""

from __future__ import annotations

import email.utils
import math
import re
from typing import TYPE_CHECKING

from .._policy._ratelimits import server_delay

if TYPE_CHECKING:
    from collections.abc import Mapping

# Delta-seconds is digits; a fraction (which some servers send) and a sign
# (which none should) are accepted and clamped, anything else is not a delay.
_DELAY = re.compile(r"[+-]?\d+(?:\.\d+)?")


def _lookup(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    # A plain dict is case-sensitive where HTTP is not.
    for key, candidate in headers.items():
        if key.lower() == name:
            return candidate
    return None


def _delay(text: str, scale: float) -> float | None:
    text = text.strip()
    if not _DELAY.fullmatch(text):
        return None
    seconds = float(text) * scale
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def _http_date(text: str, now: float) -> float | None:
    try:
        parsed = email.utils.parsedate_tz(text.strip())
        if parsed is None:
            return None
        when = float(email.utils.mktime_tz(parsed))
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(when - now, 0.0)


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds to wait before retrying, or ``None`` if the headers do not say.

    A delay that is not positive (``Retry-After: 0``, ``retry-after-ms: 0``,
    a negative delay, an HTTP-date in the past) says nothing: ``None``, as
    if the header were absent, so a rate-limit answer that carries it backs
    off like one without.

    Args:
        headers: The response headers (``httpx2.Headers`` or any mapping;
            names are matched without regard to case).
        now: The current time as a Unix timestamp (``time.time()``), to
            turn an HTTP-date into a delay.

    Returns:
        A finite, positive number of seconds, or ``None``.
    """
    return server_delay(header_delay(headers, now))


def header_delay(headers: Mapping[str, str], now: float) -> float | None:
    """The delay the headers write, ``0.0`` for one that is not positive.

    ``None`` only when neither header is there or parses: what tells a
    malformed header from one that names no delay. A positive
    ``retry-after-ms`` wins; one of ``0`` gives way to ``Retry-After``.
    """
    fallback: float | None = None
    milliseconds = _lookup(headers, "retry-after-ms")
    if milliseconds is not None:
        fallback = _delay(milliseconds, 0.001)
        if fallback:
            return fallback
    value = _lookup(headers, "retry-after")
    if value is None:
        return fallback
    delay = _delay(value, 1.0)
    if delay is None:
        delay = _http_date(value, now)
    return fallback if delay is None else delay
