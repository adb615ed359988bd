"""The settings of a conversation, as one checked frozen value."""

from __future__ import annotations

from typing import final

import attrs

from .._validation import (
    check_optional_seconds,
    check_seed,
    non_negative_int,
    non_negative_seconds,
    positive_int,
    validator,
)
from ..messages._chat import RequestOptions


def check_request_options(value: object, name: str) -> None:
    """``value`` is a ``RequestOptions``; its fields were checked when it was made."""
    if not isinstance(value, RequestOptions):
        raise TypeError(f"{name} must be a RequestOptions, got {value!r}")


@final
@attrs.frozen
class ConversationOptions:
    """How a conversation retries, compacts and asks.

    Pass one to ``Dispatcher.start_conversation``. Every field is checked
    when the value is made, so a bad setting fails there, before any
    conversation starts; make variants with ``attrs.evolve``.

    Attributes:
        max_attempts: Attempts per LLM call, the first included, when it
            fails with a retryable ``ProviderError``: a broken call (5xx,
            a dropped connection, a malformed stream). A rate limit the
            dispatcher pauses the provider for does not use one up (see
            ``rate_limit_patience``).
        rate_limit_patience: Seconds an LLM call waits out rate limits,
            counted from its first rate-limit answer (``RateLimited``, or
            ``Overloaded``: 429, 529, 503). A limited provider (one the
            dispatcher has a limit for) is paused by each such answer, and
            the call is sent again when the pause ends, from the
            provider's queue with its turn's place (oldest turn first),
            without backoff of its own (unless the answer asked for no
            pause at all, ``Retry-After: 0``: then it backs off first) and
            without using up ``max_attempts``. Once the patience has run out (at a rate
            limit, or while the call waits in the queue) the call fails
            with its last ``RateLimited`` or ``Overloaded``. 300 seconds
            by default: long enough for a per-minute quota to refill;
            ``None`` waits as long as it takes. An unlimited provider,
            which nothing pauses, keeps the bounded behaviour: each rate
            limit uses up an attempt and waits a backoff (at least its
            ``Retry-After``, at most the dispatcher's ``max_pause``).
        retry_backoff: Seconds of the first backoff; it doubles per retry.
        max_backoff: The longest backoff, in seconds.
        context_budget: Estimated tokens (characters / 4 of the system
            prompt, the tool definitions, the history and the turn so far)
            above which a turn replaces older messages with a summary the
            model writes (one ``system`` message starting with
            ``SUMMARY_PREFIX``). Checked before every LLM call of a turn,
            so tool results that grow a turn past it compact before the
            next call; only messages from before the turn are replaced,
            and one turn sends at most one summary call. ``None`` never
            compacts. If the summary call fails, the turn goes on without
            compaction.
        keep_recent: Messages at least that compaction keeps as they are;
            it cuts only where a user message starts, so no tool call is
            parted from its results.
        max_tokens: ``ChatRequest.max_tokens`` of every call, or ``None``
            for the provider's default. Also settable in
            ``request_options``, but not in both.
        request_options: How the turns' answers are sampled (temperature,
            top_p, max_tokens, stop sequences, extra body fields), as a
            ``RequestOptions``; a turn's own ``options`` win over it field
            by field. The summary calls of compaction and ``warm`` do not
            use it.
        max_tool_rounds: Rounds of tools one turn may run (a round: one
            answer of the model that calls tools, and running them). A
            model that asks for tools once more fails the turn with
            ``TooManyToolRounds``, leaving the history as it was before
            the turn. 16 by default: room for a real agent's loop, but a
            model stuck calling tools stops in bounded time and cost.
        seed: Seeds the backoff jitter, for reproducible runs; ``None``
            seeds it from the system.
    """

    max_attempts: int = attrs.field(default=4, validator=positive_int)
    retry_backoff: float = attrs.field(default=0.5, validator=non_negative_seconds)
    max_backoff: float = attrs.field(default=8.0, validator=non_negative_seconds)
    context_budget: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_int)
    )
    keep_recent: int = attrs.field(default=6, validator=non_negative_int)
    max_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_int)
    )
    seed: int | None = attrs.field(default=None, validator=validator(check_seed))
    max_tool_rounds: int = attrs.field(default=16, validator=positive_int)
    request_options: RequestOptions = attrs.field(
        default=RequestOptions(), validator=validator(check_request_options)
    )
    rate_limit_patience: float | None = attrs.field(
        default=300.0, validator=validator(check_optional_seconds)
    )

    def __attrs_post_init__(self) -> None:
        if self.max_tokens is not None and self.request_options.max_tokens is not None:
            raise ValueError(
                "max_tokens must be set in ConversationOptions"
                " or in its request_options, not both"
            )
