"""What a provider's answer says about its rate limits: ``RateLimitInfo``.

Providers limit requests and tokens per minute per organisation and key,
and tell how much is left on every answer (OpenAI's ``x-ratelimit-*``
headers, Anthropic's ``anthropic-ratelimit-*``). Both formats become one
value: a ``Quota`` per kind of limit, with every figure optional, since
servers send some, all or none of them. Times are relative, in seconds
after the answer arrived, so the value needs no clock to be read.
"""

from __future__ import annotations

from typing import final

import attrs

from .._validation import non_negative_int, non_negative_seconds

_count = attrs.validators.optional(non_negative_int)
_seconds = attrs.validators.optional(non_negative_seconds)


@final
@attrs.frozen
class Quota:
    """One limit as an answer reported it; any figure may be missing.

    Attributes:
        limit: The most the quota allows per window (requests or tokens).
        remaining: What is left of it now.
        reset: Seconds after the answer until the quota is full again.
    """

    limit: int | None = attrs.field(default=None, validator=_count)
    remaining: int | None = attrs.field(default=None, validator=_count)
    reset: float | None = attrs.field(default=None, validator=_seconds)


_quota = attrs.validators.optional(attrs.validators.instance_of(Quota))


@final
@attrs.frozen
class RateLimitInfo:
    """The rate-limit figures of one answer, in either wire format.

    Attributes:
        requests: Requests per window (OpenAI ``x-ratelimit-*-requests``,
            Anthropic ``anthropic-ratelimit-requests-*``).
        tokens: Tokens per window, input and output together.
        input_tokens: Input tokens per window (Anthropic only).
        output_tokens: Output tokens per window (Anthropic only).
        retry_after: Seconds the server asked to wait (``Retry-After`` or
            ``retry-after-ms``), on a 429, 503 or 529 (``None`` if it named
            no positive delay, see ``parse_retry_after``).
    """

    requests: Quota | None = attrs.field(default=None, validator=_quota)
    tokens: Quota | None = attrs.field(default=None, validator=_quota)
    input_tokens: Quota | None = attrs.field(default=None, validator=_quota)
    output_tokens: Quota | None = attrs.field(default=None, validator=_quota)
    retry_after: float | None = attrs.field(default=None, validator=_seconds)

    @property
    def empty(self) -> bool:
        """Whether the answer said nothing about its limits."""
        return self == _EMPTY


_EMPTY = RateLimitInfo()


def server_delay(seconds: float | None) -> float | None:
    """A server's ``Retry-After`` as the pauses take it: ``None`` unless positive.

    The one rule for every reader of the delay (the header parser, the
    dispatcher's pauses, local and in Redis): ``Retry-After: 0``, a
    negative delay, ``retry-after-ms: 0`` or an HTTP-date in the past name
    no delay, so they count as no header at all, and the pause backs off
    (``default_pause``, doubling) instead of letting every waiter go at
    once and meet the same answer again.
    """
    return seconds if seconds is not None and seconds > 0 else None
