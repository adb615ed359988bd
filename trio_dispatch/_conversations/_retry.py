"""Retrying a conversation's LLM calls: whether to send again, and when.

Pure functions of the attempt, the error and the ``ConversationOptions``
(and a ``random.Random`` for the jitter), so they are tested without trio.
The loop that sends, counts and sleeps is the conversation's
(``Conversation._call``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._exceptions import Overloaded, RateLimited

if TYPE_CHECKING:
    import random

    from .._exceptions import ProviderError
    from ._options import ConversationOptions

_MAX_EXPONENT: Final = 62  # 2.0**62 seconds: far past any max_backoff


def waits_out(error: ProviderError, limited: bool) -> bool:
    """Whether a call waits ``error`` out in its provider's queue.

    A rate limit (``RateLimited``, ``Overloaded``) of a ``limited``
    provider, which the dispatcher pauses: the call is sent again when the
    pause ends, within ``rate_limit_patience``, and uses up no attempt. An
    unlimited provider's rate limits are broken calls like any other.
    """
    return limited and isinstance(error, RateLimited | Overloaded)


def should_retry(
    error: ProviderError, attempt: int, options: ConversationOptions
) -> bool:
    """Whether a call whose attempt ``attempt`` (from 1) failed goes again.

    ``attempt`` counts the attempts ``max_attempts`` bounds: not the rate
    limits a call waits out (see ``waits_out``).
    """
    return error.retryable and attempt < options.max_attempts


def backoff(
    attempt: int,
    error: ProviderError,
    options: ConversationOptions,
    rng: random.Random,
    max_pause: float | None,
) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential, jittered.

    The ceiling doubles from ``retry_backoff`` up to ``max_backoff``, and
    the wait is drawn from ``rng`` between half the ceiling and the ceiling
    (one draw per call, whatever the error, so a seeded run repeats).

    A ``Retry-After`` is honoured by the dispatcher's pause, which the next
    attempt's slot waits for, not here: pass ``max_pause=None`` for a
    limited provider. An unlimited provider, which nothing pauses, waits
    for it here instead, for at most ``max_pause`` (the dispatcher's), as a
    pause would.
    """
    exponent = min(attempt - 1, _MAX_EXPONENT)
    ceiling = min(options.max_backoff, options.retry_backoff * 2.0**exponent)
    delay = rng.uniform(ceiling / 2, ceiling)
    if (
        max_pause is not None
        and isinstance(error, RateLimited | Overloaded)
        and error.retry_after is not None
    ):
        delay = max(delay, min(error.retry_after, max_pause))
    return delay
