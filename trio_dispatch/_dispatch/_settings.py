"""A dispatcher's settings: ``open_dispatcher``'s keywords, checked on their fields.

``Settings`` is one frozen value that the dispatcher and its backends
read. Making one checks it: each field by its validator, in the order of
the fields, then the rules between fields (``default_pause`` at most
``max_pause``; ``namespace``, ``lease`` and ``redis_connect_timeout``
only with ``redis_url``), so ``open_dispatcher`` refuses a bad keyword at
the call, before anything starts. The mappings are copied as they are taken: a caller's later
change to its own dict reaches nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Literal, final

import attrs

from .._policy._budgets import check_budgets, check_limit_mapping, split_budget_key
from .._policy._slots import (
    DEFAULT_AFFINITY_WAIT,
    DEFAULT_FAILURE_COOLDOWN,
    DEFAULT_FAILURE_THRESHOLD,
)
from .._server_load._probe import check_server_load_source
from .._util import raise_if_extra_missing
from .._validation import (
    as_float,
    check_namespace,
    check_pauses,
    check_provider,
    check_redis_url,
    check_tenant_name,
    flag,
    non_negative_int,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    redact_url,
    validator,
)
from ..messages._limits import Tenant
from ._pools import check_pools

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._policy._budgets import AdaptiveLimit, Budget
    from .._server_load._probe import ServerLoadSource
    from ._backend import Backend
    from ._setup import BackendSetup

UnknownProviders = Literal["allow", "warn", "error"]
_UNKNOWN_PROVIDERS: Final[tuple[UnknownProviders, ...]] = ("allow", "warn", "error")


class _DefaultNamespace(str):
    """The default ``namespace``: it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


class _DefaultSeconds(float):
    """A default of seconds (``lease``...): it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


# Given explicitly, even with these very values, namespace, lease and
# redis_connect_timeout need a redis_url: alone, each would be silently
# ignored.
DEFAULT_NAMESPACE: Final = _DefaultNamespace("trio-dispatch")
DEFAULT_LEASE: Final = _DefaultSeconds(15.0)
DEFAULT_CONNECT_TIMEOUT: Final = _DefaultSeconds(10.0)


def check_unknown_providers(
    value: object, name: str = "unknown_providers"
) -> UnknownProviders:
    """``unknown_providers``, checked: one of its three modes."""
    for mode in _UNKNOWN_PROVIDERS:
        if value == mode:
            return mode
    rule = f"{name} must be 'allow', 'warn' or 'error'"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {value!r}")
    raise ValueError(f"{rule}, got {value!r}")


def check_tenants(tenants: object, name: str = "tenants") -> None:
    """``open_dispatcher``'s ``tenants``: a mapping of tenant names to ``Tenant``."""
    if not isinstance(tenants, Mapping):
        raise TypeError(
            f"{name} must be a mapping of tenant name to Tenant, got {tenants!r}"
        )
    for tenant, settings in tenants.items():
        check_tenant_name(tenant)
        check_tenant_settings(settings, f"{name}[{tenant!r}]")


def check_tenant_settings(settings: object, name: str = "settings") -> Tenant:
    """A ``Tenant`` value (its fields were checked when it was made)."""
    if not isinstance(settings, Tenant):
        raise TypeError(f"{name} must be a Tenant, got {settings!r}")
    return settings


def check_new_backend(new_backend: object, name: str = "new_backend") -> None:
    """A backend factory: anything callable."""
    if not callable(new_backend):
        raise TypeError(f"{name} must be callable, got {new_backend!r}")


def _copied(value: object) -> object:
    """A mapping as a dict of its own, ``{}`` for ``None``.

    Anything else is returned as it is, for the field's check (run after
    this converter) to refuse.
    """
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else value


def check_server_loads(
    sources: object, name: str = "server_load"
) -> dict[str, ServerLoadSource]:
    """Provider names to where each one's server load is read from.

    Each a ``ServerMetrics`` or an async callable returning a ``ServerLoad``.
    """
    if not isinstance(sources, Mapping):
        raise TypeError(
            f"{name} must be a mapping of provider names to ServerMetrics or"
            f" async callables, got {sources!r}"
        )
    checked = {}
    for provider, source in sources.items():
        check_provider(provider)
        checked[provider] = check_server_load_source(source, f"{name}[{provider!r}]")
    return checked


@final
@attrs.frozen(kw_only=True)
class Settings:
    """``open_dispatcher``'s keywords, and ``lowlevel.open_dispatcher_with``'s factory.

    The defaults are ``open_dispatcher``'s (a test holds the two to each
    other).

    Attributes:
        provider_budgets: The providers' own budgets, by provider (the
            keys of ``budgets`` without a ``/``).
        model_budgets: Each model's budget, by provider then model (the
            keys ``"provider/model"`` of ``budgets``).
    """

    new_backend: Callable[[BackendSetup], Backend] | None = attrs.field(
        default=None,
        repr=False,
        validator=attrs.validators.optional(validator(check_new_backend)),
    )
    limits: Mapping[str, int | AdaptiveLimit] = attrs.field(
        factory=dict, converter=_copied, validator=validator(check_limit_mapping)
    )
    budgets: Mapping[str, Budget] = attrs.field(
        factory=dict, converter=_copied, validator=validator(check_budgets)
    )
    tenants: Mapping[str, Tenant] = attrs.field(
        factory=dict, converter=_copied, validator=validator(check_tenants)
    )
    learn_budgets: bool = attrs.field(default=True, validator=flag)
    default_pause: float = attrs.field(default=1.0, validator=non_negative_seconds)
    max_pause: float = attrs.field(default=60.0, validator=positive_seconds)
    max_hold: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(positive_seconds)
    )
    retry_grace: float = attrs.field(default=2.0, validator=non_negative_seconds)
    max_waiting: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(non_negative_int)
    )
    # Its credentials never show in a repr.
    redis_url: str | None = attrs.field(
        default=None,
        validator=validator(check_redis_url),
        repr=lambda url: repr(None if url is None else redact_url(url)),
    )
    namespace: str = attrs.field(
        default=DEFAULT_NAMESPACE, validator=validator(check_namespace)
    )
    lease: float = attrs.field(default=DEFAULT_LEASE, validator=positive_seconds)
    redis_connect_timeout: float = attrs.field(
        default=DEFAULT_CONNECT_TIMEOUT, validator=positive_seconds
    )
    unknown_providers: UnknownProviders = attrs.field(
        default="warn", validator=validator(check_unknown_providers)
    )
    priority_aging: float = attrs.field(default=60.0, validator=positive_seconds)
    server_load: Mapping[str, ServerLoadSource] = attrs.field(
        factory=dict, converter=_copied, validator=validator(check_server_loads)
    )
    server_load_interval: float = attrs.field(default=1.0, validator=positive_seconds)
    pools: Mapping[str, tuple[str, ...]] = attrs.field(
        factory=dict, converter=_copied, validator=validator(check_pools)
    )
    affinity_wait: float = attrs.field(
        default=DEFAULT_AFFINITY_WAIT, validator=non_negative_seconds
    )
    failure_threshold: int = attrs.field(
        default=DEFAULT_FAILURE_THRESHOLD, validator=positive_int
    )
    failure_cooldown: float = attrs.field(
        default=DEFAULT_FAILURE_COOLDOWN, validator=positive_seconds
    )
    provider_budgets: Mapping[str, Budget] = attrs.field(init=False, repr=False)
    model_budgets: Mapping[str, Mapping[str, Budget]] = attrs.field(
        init=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        # The rules between fields, once every field has passed its own.
        check_pauses(self.default_pause, self.max_pause)
        if self.redis_url is None:
            if self.namespace is not DEFAULT_NAMESPACE:
                raise ValueError("namespace needs redis_url")
            if self.lease is not DEFAULT_LEASE:
                raise ValueError("lease needs redis_url")
            if self.redis_connect_timeout is not DEFAULT_CONNECT_TIMEOUT:
                raise ValueError("redis_connect_timeout needs redis_url")
        else:
            require_redis()
            if self.server_load:
                raise ValueError(
                    "server_load cannot be used with redis_url: the fleet's"
                    " grants do not read a server's load yet"
                )
        if self.pools and self.new_backend is not None:
            raise ValueError(
                "pools need the local scheduler or the Redis one (redis_url), not a"
                " backend factory of one's own"
            )
        self._check_pool_names()
        # Kept as checked: seconds as floats (a message shows max_hold=5
        # as "5.0 seconds"), the defaults as plain values, and the budgets
        # apart. A frozen class sets its own fields this way (attrs).
        for name in _SECONDS:
            seconds = getattr(self, name)
            if seconds is not None:
                object.__setattr__(self, name, as_float(seconds))
        object.__setattr__(self, "namespace", str(self.namespace))
        providers, models = split_budgets(self.budgets)
        object.__setattr__(self, "provider_budgets", providers)
        object.__setattr__(self, "model_budgets", models)

    def _check_pool_names(self) -> None:
        """A pool's name is no provider's: not one of a limit, budget or pool's member."""
        providers = {
            *self.limits,
            *(split_budget_key(key)[0] for key in self.budgets),
            *self.server_load,
            *(member for members in self.pools.values() for member in members),
        }
        for pool in self.pools:
            if pool in providers:
                raise ValueError(f"pool {pool!r} has the name of a provider")


_SECONDS: Final = (
    "default_pause",
    "max_pause",
    "max_hold",
    "retry_grace",
    "lease",
    "redis_connect_timeout",
    "priority_aging",
    "affinity_wait",
    "failure_cooldown",
)


def split_budgets(
    budgets: Mapping[str, Budget],
) -> tuple[dict[str, Budget], dict[str, dict[str, Budget]]]:
    """Checked ``budgets``, apart: the providers' own, and each model's by provider."""
    providers: dict[str, Budget] = {}
    models: dict[str, dict[str, Budget]] = {}
    for key, budget in budgets.items():
        provider, model = split_budget_key(key)
        if model is None:
            providers[provider] = budget
        else:
            models.setdefault(provider, {})[model] = budget
    return providers, models


def require_redis() -> None:
    """Refuse ``redis_url`` at once, with a hint, if the ``redis`` extra is missing.

    Raises:
        ModuleNotFoundError: coredis is not installed.
    """
    try:
        import coredis  # noqa: F401, PLC0415  # the redis extra, only when asked for
    except ModuleNotFoundError as exc:
        raise_if_extra_missing(exc, "redis_url", "redis", "coredis")
        raise
