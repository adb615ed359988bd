"""Reading rate-limit headers into ``RateLimitInfo``: what every format shares.

Each format's module names its headers and reads its resets (OpenAI's
``x-ratelimit-*`` with Go durations, Anthropic's ``anthropic-ratelimit-*``
with RFC 3339 times) through ``figures`` and a ``HeaderReader``; both
formats send ``retry-after`` on a 429, read by ``parse_retry_after``.

Reading never fails, whatever a server sends:

* a missing header is a missing figure (``None``);
* ``-1`` means "unknown" (``None``), and so does a limit of ``0``: some
  compatible servers send those when they keep no limit, and no account
  has a limit of nothing. A quota whose limit says so is dropped whole;
* a value that does not parse is ignored, and reported to ``on_malformed``
  (``MalformedHeaderLog`` logs it, once per provider and header name);
* enormous values are capped: counts at ``MAX_COUNT`` (10**12), times at
  ``MAX_SECONDS`` (a day, the longest window either API has);
* a reset in the past is ``0.0``: the quota is full again;
* a ``retry-after`` that is not positive names no delay (``None``), as
  ``parse_retry_after`` reads it.

This module loads no HTTP library: it takes any ``Mapping[str, str]`` of
headers and matches names without regard to case.
"""

from __future__ import annotations

import decimal
import email.utils
import logging
import math
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final, final

from .._policy._ratelimits import Quota, RateLimitInfo, server_delay
from ._retry_after import header_delay

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

_logger = logging.getLogger("trio_dispatch")

#: The largest count (requests or tokens) a header is taken to say.
MAX_COUNT: Final = 10**12
#: The longest time, in seconds, a header is taken to say: a day.
MAX_SECONDS: Final = 86_400.0

# A count: digits, perhaps a fraction (dropped), perhaps a sign.
_COUNT = re.compile(r"([+-]?)(\d+)(?:\.\d*)?")
# A Go duration: one or more number-unit pairs (``1h2m3.5s``), or "0".
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_PLAIN_SECONDS = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
# Seconds per unit, as decimals: ``1m24.734s`` adds up to exactly 84.734
# before it becomes a float (in floats, ``60 + 24.734`` is not 84.734).
_UNITS: Final = {
    "ns": decimal.Decimal("1e-9"),
    "us": decimal.Decimal("1e-6"),
    "µs": decimal.Decimal("1e-6"),
    "μs": decimal.Decimal("1e-6"),
    "ms": decimal.Decimal("1e-3"),
    "s": decimal.Decimal(1),
    "m": decimal.Decimal(60),
    "h": decimal.Decimal(3600),
}
_EXACT: Final = decimal.Context(prec=60)
# Longer than this, a header value is not a figure (and not worth parsing).
_MAX_VALUE_LENGTH: Final = 64
# A reset more than this before the answer's date is still "full now", but
# the clocks disagree: the ``date`` header wins over the caller's ``now``.
_DATE_RESOLUTION: Final = timedelta(seconds=2)


def _ignore(name: str, value: str) -> None:
    pass


class HeaderReader:
    """Headers with lowercased names, and where to report what does not parse."""

    __slots__ = ("headers", "malformed")

    def __init__(
        self,
        headers: Mapping[str, str],
        on_malformed: Callable[[str, str], None] | None,
    ) -> None:
        self.headers = {str(name).lower(): value for name, value in headers.items()}
        self.malformed = _ignore if on_malformed is None else on_malformed

    def get(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if isinstance(value, str) else None

    def count(self, name: str) -> tuple[int | None, bool]:
        """A count, and whether the header said "unknown" (``-1``)."""
        value = self.get(name)
        if value is None:
            return None, False
        match = _COUNT.fullmatch(value.strip())
        if match is None or len(value) > _MAX_VALUE_LENGTH:
            self.malformed(name, value)
            return None, False
        sign, digits = match.group(1), match.group(2)
        if sign == "-":
            if digits.lstrip("0") == "1":
                return None, True
            self.malformed(name, value)
            return None, False
        # Compared as text first: int() refuses thousands of digits.
        if len(digits.lstrip("0")) > len(str(MAX_COUNT)):
            return MAX_COUNT, False
        return min(int(digits), MAX_COUNT), False

    def duration(self, name: str) -> float | None:
        """OpenAI's reset: a Go duration, or a plain number of seconds."""
        value = self.get(name)
        if value is None:
            return None
        text = value.strip()
        if len(text) > _MAX_VALUE_LENGTH:
            self.malformed(name, value)
            return None
        if _PLAIN_SECONDS.fullmatch(text):
            seconds = float(text)
            if seconds < 0:
                if seconds != -1:
                    self.malformed(name, value)
                return None
            return _seconds(seconds)
        if not _DURATION.fullmatch(text):
            self.malformed(name, value)
            return None
        total = decimal.Decimal(0)
        for number, unit in _DURATION_PART.findall(text):
            total = _EXACT.add(
                total, _EXACT.multiply(decimal.Decimal(number), _UNITS[unit])
            )
        return _seconds(float(total))

    def instant(self, name: str, reference: datetime) -> float | None:
        """Anthropic's reset: an RFC 3339 time, as seconds after ``reference``."""
        value = self.get(name)
        if value is None:
            return None
        when = _rfc3339(value)
        if when is None:
            self.malformed(name, value)
            return None
        return _seconds((when - reference).total_seconds())


def ceil_ms(seconds: float) -> int:
    """``seconds`` in whole milliseconds, rounded up: how a reset is written."""
    return math.ceil(round(seconds * 1000, 6))


def _seconds(seconds: float) -> float:
    """Clamped to ``[0, MAX_SECONDS]``; NaN (from ``inf - inf``) is 0."""
    if not seconds > 0:
        return 0.0
    return min(seconds, MAX_SECONDS)


def _rfc3339(text: str) -> datetime | None:
    text = text.strip().upper()
    if len(text) > _MAX_VALUE_LENGTH or "T" not in text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        # RFC 3339 always has an offset; a server that leaves it out means UTC.
        when = when.replace(tzinfo=UTC)
    return when


def http_date(text: str | None) -> datetime | None:
    if text is None or len(text) > _MAX_VALUE_LENGTH:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when


def reference_time(date: datetime | None, now: datetime | None) -> datetime:
    """The moment Anthropic's resets are counted from.

    The answer's ``date`` is the server's clock, the one its resets are
    on, but it has whole seconds only: the answer came up to a second
    after it. ``now`` (the caller's clock, when the answer arrived) is
    precise, so it is used while it agrees with ``date``; when the two
    clocks disagree by more than the ``date`` resolution, ``date`` wins.
    """
    if now is not None and now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    if date is None:
        return datetime.now(UTC) if now is None else now
    if now is not None and date <= now < date + _DATE_RESOLUTION:
        return now
    return date


def _quota(
    reader: HeaderReader, limit: str, remaining: str, reset: float | None
) -> Quota | None:
    """One quota, or ``None`` if the headers say nothing of it."""
    limit_value, unknown = reader.count(limit)
    if unknown or limit_value == 0:
        # The server keeps no such limit; what it says of the rest is noise.
        return None
    remaining_value, _ = reader.count(remaining)
    if limit_value is None and remaining_value is None and reset is None:
        return None
    return Quota(limit=limit_value, remaining=remaining_value, reset=reset)


def _retry_after(reader: HeaderReader, reference: datetime) -> float | None:
    headers = reader.headers
    present = [name for name in ("retry-after-ms", "retry-after") if name in headers]
    if not present:
        return None
    try:
        delay = header_delay(headers, reference.timestamp())
    except (OverflowError, ValueError):  # a date past what datetime can hold
        delay = None
    if delay is None:
        for name in present:
            reader.malformed(name, headers[name])
        return None
    return server_delay(min(delay, MAX_SECONDS))


def figures(
    reader: HeaderReader,
    reference: datetime,
    kinds: tuple[tuple[str, str], ...],
    name: str,
    reset: Callable[[str], float | None],
) -> RateLimitInfo:
    """Each quota of ``kinds``, its headers named by ``name.format(part, kind)``."""
    quotas = {
        field: _quota(
            reader,
            name.format("limit", kind),
            name.format("remaining", kind),
            reset(name.format("reset", kind)),
        )
        for field, kind in kinds
    }
    return RateLimitInfo(**quotas, retry_after=_retry_after(reader, reference))


def header_figures(
    info: RateLimitInfo, name: str, reset: Callable[[float], str]
) -> list[tuple[str, str]]:
    """The request and token quotas of ``info`` as headers: ``figures``' inverse.

    Named by ``name.format(part, kind)``; ``reset`` writes a reset's seconds.
    """
    headers: list[tuple[str, str]] = []
    for kind, quota in (("requests", info.requests), ("tokens", info.tokens)):
        if quota is None:
            continue
        assert quota.reset is not None
        headers += [
            (name.format("limit", kind), str(quota.limit)),
            (name.format("remaining", kind), str(quota.remaining)),
            (name.format("reset", kind), reset(quota.reset)),
        ]
    return headers


# How much of a malformed value a log line shows.
_SHOWN: Final = 40


@final
class MalformedHeaderLog:
    """Logs each malformed header once per provider and header name.

    Passed as ``on_malformed``: the first bad value of a header is logged
    on the ``trio_dispatch`` logger at WARNING, shortened and passed
    through ``redact`` (a server could echo anything); later ones are not,
    so a server that always sends it does not flood the log.
    """

    __slots__ = ("_provider", "_redact", "_seen")

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        self._provider = provider
        self._redact = redact
        self._seen: set[str] = set()

    def __call__(self, name: str, value: str) -> None:
        """Log ``name``'s bad ``value``, unless ``name`` was logged before."""
        if name in self._seen:
            return
        self._seen.add(name)
        shown = self._redact(value)
        if len(shown) > _SHOWN:
            shown = shown[: _SHOWN - 3] + "..."
        _logger.warning(
            "%s: ignoring the %s header, which does not parse: %r",
            self._provider,
            name,
            shown,
        )
