"""The limits and budgets a user configures, as frozen attrs values.

``Budget`` (requests and tokens per minute), ``AdaptiveLimit`` (a
concurrency limit that finds its own value) and ``Tenant`` (a share of
every provider's slots) are plain data, checked on
their fields; the rules that act on them (refill, learning, the adaptive
moves) are in the policy core (``_budgets``), which imports these values,
never the reverse.
"""

from __future__ import annotations

from typing import Literal, cast, final

import attrs

from .._validation import (
    check_fraction,
    check_positive_number,
    check_tenant_name,
    check_text,
    positive_int,
    positive_number,
    slot_limit,
    validator,
)

DEFAULT_MAX_TOKENS = 4096
"""Tokens charged for the answer of a request that sets no ``max_tokens``."""


MIN_WEIGHT = 1e-6
"""The smallest ``Tenant.weight``: a million times less than the default."""

MAX_WEIGHT = 1e6
"""The largest ``Tenant.weight``: a million times more than the default."""


SIGNALS = ("rate_limits", "latency")
"""What may move an ``AdaptiveLimit``."""

_optional_rate = attrs.validators.optional(positive_number)


def check_backoff(value: object, name: str) -> float:
    """A factor of decrease: a number between 0 and 1, both excluded."""
    factor = check_fraction(value, name)
    if factor in (0, 1):
        raise ValueError(
            f"{name} must be a number between 0 and 1, both excluded, got {value!r}"
        )
    return factor


def check_signal(value: object, name: str) -> Literal["rate_limits", "latency"]:
    """What moves an adaptive limit: ``"rate_limits"`` or ``"latency"``."""
    if value not in SIGNALS:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, SIGNALS))}, got {value!r}"
        )
    return cast("Literal['rate_limits', 'latency']", value)


def check_weight(value: object, name: str) -> float:
    """A tenant's weight: a number from ``MIN_WEIGHT`` to ``MAX_WEIGHT``."""
    weight = check_positive_number(value, name)
    if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(
            f"{name} must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g},"
            f" got {value!r}"
        )
    return weight


@final
@attrs.frozen(kw_only=True)
class Budget:
    """A provider's requests and tokens per minute, as configured.

    Either may be ``None`` (no budget of that kind, unless one is learned
    from the provider's answers). A request is charged 1 request and its
    estimated tokens at grant time (see ``open_dispatcher``'s ``budgets``).

    Attributes:
        requests_per_minute: Requests per minute (a positive number).
        tokens_per_minute: Tokens per minute, prompt and answer together.
        default_max_tokens: Tokens charged for the answer of a request that
            sets no ``max_tokens`` (a positive integer).
    """

    requests_per_minute: float | None = attrs.field(
        default=None, validator=_optional_rate
    )
    tokens_per_minute: float | None = attrs.field(
        default=None, validator=_optional_rate
    )
    default_max_tokens: int = attrs.field(
        default=DEFAULT_MAX_TOKENS, validator=positive_int
    )


@final
@attrs.frozen(kw_only=True)
class AdaptiveLimit:
    """A concurrency limit that finds its own value, usable wherever an int limit is.

    It starts at ``initial``, is multiplied by ``backoff`` after each round
    of rate-limit answers (which also pause the provider, as always), and
    grows while requests succeed with the limit in use (at least half of it
    held): by 1 per success until the first rate limit, then by about 1 per
    round trip of the whole limit. It never leaves ``[minimum, maximum]``.
    ``statistics()`` shows its current value (``ProviderStatistics.limit``)
    and ``adaptive=True``; ``set_limit`` with an int replaces it by a fixed
    limit. With ``redis_url``, the value lives in Redis and moves for the
    whole fleet (see ``open_dispatcher``).

    ``signal="latency"`` is for servers that queue instead of answering
    429 (vLLM, llama.cpp's ``llama-server``, SGLang, TGI): the limit
    follows the answers' time to first token (less what the prompt's size
    explains) and time between tokens instead of successes. It grows while
    they stay near their floor and the batch still pays, and comes down
    when the server starts to queue or its batch stops paying, so that it
    settles where the server's throughput stops growing, before its own
    queue starts (the rule: ``trio_dispatch._policy._latency``). Rate-limit
    answers still bring it down by ``backoff``. Each call is measured where
    it is made: ``Dispatcher.transport``, ``wrap_provider`` and
    conversations do it; an integration of one's own reports
    ``Slot.report_timing``. With ``redis_url`` each process judges its own
    calls and the fleet's limit moves by every process's verdicts.

    Attributes:
        initial: The first value, from ``minimum`` to ``maximum``. With
            the latency signal, start low: the floors are learned from
            the first answers, best before the server queues.
        minimum: The lowest value (a positive integer).
        maximum: The highest value, at least ``minimum``.
        backoff: The factor of a decrease, above 0 and below 1.
        signal: What moves it: ``"rate_limits"`` (the default: successes
            and rate-limit answers) or ``"latency"``.
    """

    initial: int = attrs.field(validator=slot_limit)
    minimum: int = attrs.field(default=1, validator=slot_limit)
    maximum: int = attrs.field(validator=slot_limit)
    backoff: float = attrs.field(default=0.9, validator=validator(check_backoff))
    signal: Literal["rate_limits", "latency"] = attrs.field(
        default="rate_limits", validator=validator(check_signal)
    )

    def __attrs_post_init__(self) -> None:
        if self.minimum > self.maximum:
            raise ValueError(
                f"minimum must be at most maximum={self.maximum!r},"
                f" got {self.minimum!r}"
            )
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                f"initial must be from minimum={self.minimum!r} to"
                f" maximum={self.maximum!r}, got {self.initial!r}"
            )


@final
@attrs.frozen
class Tenant:
    """One tenant's share of every provider's slots: a weight and an optional cap.

    Between tenants whose requests wait, a provider's next free slot goes
    to the one that has received the least service for its weight (see
    ``open_dispatcher``'s ``tenants``); within a tenant, the oldest turn
    goes first, as always. Tenants not configured have the defaults.

    Attributes:
        weight: The tenant's share, relative to the others' (a number
            from ``MIN_WEIGHT`` to ``MAX_WEIGHT``, so that a service
            counter, slot-seconds over the weight, stays finite): a tenant of weight 2 receives twice the
            service of a tenant of weight 1 while both have requests
            waiting.
        limit: At most this many slots of each provider held by the
            tenant at once (from 1 to ``MAX_LIMIT``), or ``None`` for no
            cap of its own.
    """

    weight: float = attrs.field(default=1.0, validator=validator(check_weight))
    limit: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(slot_limit)
    )


def check_model_budget(model: object, budget: object) -> None:
    """A model's name and its configured budget: a ``Budget``."""
    check_text(model, "model")
    if not isinstance(budget, Budget):
        raise TypeError(f"budget must be a Budget, got {budget!r}")


def check_tenant(tenant: object, settings: object) -> None:
    """A tenant's name and its settings: a ``Tenant``, or ``None`` for the defaults."""
    check_tenant_name(tenant)
    if settings is not None and not isinstance(settings, Tenant):
        raise TypeError(f"settings must be a Tenant or None, got {settings!r}")
