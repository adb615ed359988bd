"""The fake LLM server's rate limits: per-key quotas, as real APIs keep them.

``FakeQuotas`` configures them; ``QuotaBook`` keeps them, one set of
buckets per API key (or per key and model), and ``quota_headers`` /
``refusal_headers`` write them in the wire format's own headers. Pure: times are
passed in, so ``MockClock`` drives the refill.

Each per-minute quota is a token bucket, as OpenAI and Anthropic describe
theirs, refilled continuously at a sixtieth of it per second. A request is
admitted only if a concurrency slot (when capped), a request and its
estimated tokens (the prompt's estimate plus ``max_tokens``, as OpenAI
counts) are all there, and charged them; when it ends the estimate is
replaced by what it used, which may leave the bucket in debt for a while.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, final

import attrs

from .._policy._ratelimits import Quota, RateLimitInfo
from .._validation import (
    check_fraction,
    check_text,
    flag,
    non_negative_int,
    non_negative_seconds,
    positive_int,
    validator,
)
from .._wire import FORMATS
from .._wire._headers import ceil_ms

if TYPE_CHECKING:
    from ._script import WireFormat

_positive = attrs.validators.optional(positive_int)
_fraction = validator(check_fraction)


def _copied(models: object) -> object:
    """A mapping's own copy (so the caller's later changes do not reach it)."""
    return dict(models) if isinstance(models, Mapping) else models


def _check_models(
    _instance: object, _attribute: attrs.Attribute[Any], models: object
) -> None:
    """Model names (non-empty strings) to ``FakeQuotas`` of no models of their own."""
    if not isinstance(models, Mapping):
        raise TypeError(
            f"models must be a mapping of model names to FakeQuotas, got {models!r}"
        )
    for model, quotas in models.items():
        check_text(model, "models' names")
        if not isinstance(quotas, FakeQuotas):
            raise TypeError(f"models[{model!r}] must be a FakeQuotas, got {quotas!r}")
        if quotas.models or quotas.per_model:
            raise ValueError(
                f"models[{model!r}] must be a FakeQuotas without models or"
                f" per_model of its own, got {quotas!r}"
            )


# How finely the headers tell times: milliseconds, rounded up, so a client
# that waits what it is told is never early.
_MS: Final = 1000


@final
@attrs.frozen
class FakeQuotas:
    """Rate limits the fake server keeps for each API key.

    A request beyond any of a key's buckets is answered 429 in its wire
    format, with ``Retry-After`` (whole seconds, rounded up; OpenAI's also
    ``retry-after-ms``) the time until they hold enough for it, and every
    answer to a key carries the rate-limit headers of its format.

    Attributes:
        requests_per_minute: Requests a key may make per minute.
        tokens_per_minute: Tokens (prompt and output together) per minute.
        max_concurrency: Requests a key may have in flight at once.
        default_max_tokens: The output a request without ``max_tokens`` is
            charged for at admission.
        busy_retry_after: The ``Retry-After`` of a request refused for
            concurrency; ``None`` sends none.
        initial_fill: The share of each bucket there when the server first
            sees a key, from 0 to 1: below 1 a short run meets the refill
            rate at once, not after a minute's worth of requests.
        models: Quotas of their own (all their figures) for the models
            named, kept apart in each key; an entry may not have ``models``
            or ``per_model`` of its own. A request's model is its body's
            ``model``, and an answer's headers report that model's buckets.
        per_model: Whether every other model gets buckets of its own too
            (under the figures above), as OpenAI keeps them; if not, they
            share the key's buckets.
    """

    requests_per_minute: int | None = attrs.field(default=None, validator=_positive)
    tokens_per_minute: int | None = attrs.field(default=None, validator=_positive)
    max_concurrency: int | None = attrs.field(default=None, validator=_positive)
    default_max_tokens: int = attrs.field(default=0, validator=non_negative_int)
    busy_retry_after: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_seconds)
    )
    initial_fill: float = attrs.field(default=1.0, validator=_fraction)
    models: Mapping[str, FakeQuotas] = attrs.field(
        factory=dict, converter=_copied, validator=_check_models, hash=False
    )
    per_model: bool = attrs.field(default=False, validator=flag)

    def for_model(self, model: str | None) -> FakeQuotas:
        """The figures a request for ``model`` is held to (``None``: no model)."""
        if model is None:
            return self
        return self.models.get(model, self)

    def keeps_apart(self, model: str | None) -> bool:
        """Whether ``model``'s requests have buckets of their own in each key."""
        return model is not None and (self.per_model or model in self.models)


@attrs.define
class _Bucket:
    """A token bucket: ``capacity`` per minute, refilled continuously."""

    capacity: int
    level: float
    updated: float

    @property
    def rate(self) -> float:
        return self.capacity / 60

    def refill(self, now: float) -> None:
        if now > self.updated and self.level < self.capacity:
            self.level = min(
                float(self.capacity), self.level + (now - self.updated) * self.rate
            )
        self.updated = max(self.updated, now)

    def wait(self, amount: float) -> float:
        """Seconds until the bucket holds ``amount`` (0: it does now)."""
        return max(0.0, (amount - self.level) / self.rate)

    def quota(self) -> Quota:
        """What the headers say of it: limit, whole remaining, time to full."""
        reset = ceil_ms((self.capacity - self.level) / self.rate) / _MS
        return Quota(
            limit=self.capacity,
            remaining=max(0, math.floor(self.level)),
            reset=reset,
        )


def _new_bucket(per_minute: int | None, fill: float, now: float) -> _Bucket | None:
    """A key's bucket of ``per_minute``, ``fill`` of it there, or ``None``."""
    if per_minute is None:
        return None
    return _Bucket(per_minute, per_minute * fill, now)


@attrs.define
class _Key:
    requests: _Bucket | None
    tokens: _Bucket | None
    in_flight: int = 0


@final
@attrs.frozen
class Refusal:
    """Why a request was refused, and seconds until enough is back.

    ``"too_large"``: more tokens than the bucket can ever hold;
    ``retry_after`` is ``None`` when unknown.
    """

    reason: Literal["requests", "tokens", "too_large", "concurrency"]
    retry_after: float | None


@final
class QuotaBook:
    """The buckets of every key (and model kept apart) under one ``FakeQuotas``."""

    def __init__(self, quotas: FakeQuotas) -> None:
        self._quotas = quotas
        self._keys: dict[tuple[str, str | None], _Key] = {}

    @property
    def quotas(self) -> FakeQuotas:
        """The limits it keeps."""
        return self._quotas

    def _apart(self, model: str | None) -> str | None:
        return model if self._quotas.keeps_apart(model) else None

    def _key(self, key: str, model: str | None, now: float) -> _Key:
        apart = self._apart(model)
        state = self._keys.get((key, apart))
        if state is None:
            q = self._quotas.for_model(apart)
            state = _Key(
                requests=_new_bucket(q.requests_per_minute, q.initial_fill, now),
                tokens=_new_bucket(q.tokens_per_minute, q.initial_fill, now),
            )
            self._keys[key, apart] = state
        for bucket in (state.requests, state.tokens):
            if bucket is not None:
                bucket.refill(now)
        return state

    def _figures(self, model: str | None) -> FakeQuotas:
        return self._quotas.for_model(self._apart(model))

    def estimate(
        self, prompt_tokens: int, max_tokens: int | None, model: str | None = None
    ) -> int:
        """What a request is charged at admission."""
        default = self._figures(model).default_max_tokens
        return prompt_tokens + (default if max_tokens is None else max_tokens)

    def admit(
        self, key: str, cost: int, now: float, model: str | None = None
    ) -> Refusal | None:
        """Admit a request of ``cost`` tokens and charge it, or say why not."""
        state = self._key(key, model, now)
        figures = self._figures(model)
        cap = figures.max_concurrency
        if cap is not None and state.in_flight >= cap:
            return Refusal("concurrency", figures.busy_retry_after)
        if state.tokens is not None and cost > state.tokens.capacity:
            return Refusal("too_large", None)
        waits = {
            reason: bucket.wait(amount)
            for reason, bucket, amount in (
                ("requests", state.requests, 1),
                ("tokens", state.tokens, cost),
            )
            if bucket is not None
        }
        longest = max(waits.values(), default=0.0)
        if longest > 0:
            if waits.get("requests", 0.0) == longest:
                return Refusal("requests", longest)
            return Refusal("tokens", longest)
        if state.requests is not None:
            state.requests.level -= 1
        if state.tokens is not None:
            state.tokens.level -= cost
        state.in_flight += 1
        return None

    def settle(
        self, key: str, charged: int, used: int, now: float, model: str | None = None
    ) -> None:
        """An admitted request ended: its estimate is replaced by ``used``."""
        state = self._key(key, model, now)
        if state.tokens is not None:
            state.tokens.level += charged - used
        state.in_flight -= 1

    def rate_limits(
        self, key: str, now: float, model: str | None = None
    ) -> RateLimitInfo:
        """What the headers of an answer to ``key`` for ``model`` at ``now`` say."""
        state = self._key(key, model, now)
        return RateLimitInfo(
            requests=None if state.requests is None else state.requests.quota(),
            tokens=None if state.tokens is None else state.tokens.quota(),
        )


# -- the headers -----------------------------------------------------------------


def quota_headers(
    wire: WireFormat, info: RateLimitInfo, wall_now: float
) -> list[tuple[bytes, bytes]]:
    """``info`` as the rate-limit headers of ``wire``; ``wall_now`` is Unix time."""
    headers = FORMATS[wire].rate_limit_headers(info, wall_now)
    return [(name.encode(), value.encode()) for name, value in headers]


def refusal_headers(
    wire: WireFormat, retry_after: float | None
) -> list[tuple[bytes, bytes]]:
    """A 429's ``Retry-After`` (and ``retry-after-ms``, where the format has it), rounded up."""
    if retry_after is None:
        return []
    ms = ceil_ms(retry_after)
    headers = [(b"retry-after", str(-(-ms // _MS)).encode())]
    if FORMATS[wire].retry_after_ms:
        headers.append((b"retry-after-ms", str(ms).encode()))
    return headers
