"""A dispatcher's settings, and the checks of ``open_dispatcher``'s keywords.

``checked_settings`` checks every keyword of ``open_dispatcher`` at the
call, before anything starts, and returns the limits and one frozen
``Settings`` value that the dispatcher and its backends read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Literal

import attrs

from .._budgets import check_budgets, check_limit_mapping, split_budget_key
from .._util import raise_if_extra_missing
from .._validation import (
    check_max_waiting,
    check_namespace,
    check_optional_seconds,
    check_pauses,
    check_positive_seconds,
    check_redis_url,
    check_tenant_name,
    redact_url,
)
from ..messages._limits import Tenant

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._backend import Backend
    from .._budgets import AdaptiveLimit, Budget

UnknownProviders = Literal["allow", "warn", "error"]
_UNKNOWN_PROVIDERS: Final[tuple[UnknownProviders, ...]] = ("allow", "warn", "error")


@attrs.frozen
class Settings:
    """A dispatcher's settings, checked by ``open_dispatcher``."""

    default_pause: float
    max_pause: float
    max_hold: float | None
    max_waiting: int | None
    unknown_providers: UnknownProviders
    # Its credentials never show in a repr.
    redis_url: str | None = attrs.field(default=None, repr=lambda url: repr(shown(url)))
    namespace: str = "trio-dispatch"
    lease: float = 15.0
    priority_aging: float = 60.0
    # The providers' own budgets, by provider; each model's, by provider
    # then model (the keys "provider/model" of open_dispatcher's budgets).
    budgets: Mapping[str, Budget] = attrs.field(factory=dict)
    model_budgets: Mapping[str, Mapping[str, Budget]] = attrs.field(factory=dict)
    learn_budgets: bool = True
    # The tenants configured when the dispatcher opened, by name.
    tenants: Mapping[str, Tenant] = attrs.field(factory=dict)
    # A backend for each provider, instead of the local scheduler: given by
    # trio_dispatch.lowlevel.open_dispatcher_with.
    new_backend: Callable[[str], Backend] | None = attrs.field(default=None, repr=False)


class _DefaultNamespace(str):
    """The default ``namespace``: it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


class _DefaultLease(float):
    """The default ``lease``: it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


# Given explicitly, even with these very values, namespace and lease need a
# redis_url: either alone would be silently ignored.
DEFAULT_NAMESPACE: Final = _DefaultNamespace("trio-dispatch")
DEFAULT_LEASE: Final = _DefaultLease(15.0)


def checked_settings(  # open_dispatcher's keywords, once
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    *,
    budgets: Mapping[str, Budget] | None = None,
    learn_budgets: bool = True,
    default_pause: float = 1.0,
    max_pause: float = 60.0,
    max_hold: float | None = None,
    max_waiting: int | None = None,
    unknown_providers: UnknownProviders = "warn",
    redis_url: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    lease: float = DEFAULT_LEASE,
    priority_aging: float = 60.0,
    tenants: Mapping[str, Tenant] | None = None,
) -> tuple[dict[str, int | AdaptiveLimit], Settings]:
    """``open_dispatcher``'s arguments, checked: the limits and the settings."""
    checked = check_limit_mapping(limits)
    provider_budgets, model_budgets = split_budgets(check_budgets(budgets))
    checked_tenants = check_tenants(tenants)
    if not isinstance(learn_budgets, bool):
        raise TypeError(f"learn_budgets must be True or False, got {learn_budgets!r}")
    pause, longest = check_pauses(default_pause, max_pause)
    hold = check_optional_seconds(max_hold, "max_hold", positive=True)
    waiting = check_max_waiting(max_waiting)
    url = check_redis_url(redis_url)
    checked_namespace = check_namespace(namespace)
    checked_lease = check_positive_seconds(lease, "lease")
    if url is None:
        if namespace is not DEFAULT_NAMESPACE:
            raise ValueError("namespace needs redis_url")
        if lease is not DEFAULT_LEASE:
            raise ValueError("lease needs redis_url")
    else:
        require_redis()
    settings = Settings(
        default_pause=pause,
        max_pause=longest,
        max_hold=hold,
        max_waiting=waiting,
        unknown_providers=check_unknown_providers(unknown_providers),
        redis_url=url,
        namespace=str(checked_namespace),
        lease=float(checked_lease),
        priority_aging=check_positive_seconds(priority_aging, "priority_aging"),
        budgets=provider_budgets,
        model_budgets=model_budgets,
        learn_budgets=learn_budgets,
        tenants=checked_tenants,
    )
    return checked, settings


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


def check_tenants(tenants: object) -> dict[str, Tenant]:
    """``open_dispatcher``'s ``tenants``: a mapping of tenant names to ``Tenant``."""
    if tenants is None:
        return {}
    if not isinstance(tenants, Mapping):
        raise TypeError(
            f"tenants must be a mapping of tenant name to Tenant, got {tenants!r}"
        )
    checked: dict[str, Tenant] = {}
    for name, settings in tenants.items():
        check_tenant_name(name)
        checked[name] = check_tenant_settings(settings, f"tenants[{name!r}]")
    return checked


def check_tenant_settings(settings: object, name: str = "settings") -> Tenant:
    """A ``Tenant`` value (its fields were checked when it was made)."""
    if not isinstance(settings, Tenant):
        raise TypeError(f"{name} must be a Tenant, got {settings!r}")
    return settings


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


def check_unknown_providers(value: object) -> UnknownProviders:
    """``unknown_providers``, checked: one of its three modes."""
    for mode in _UNKNOWN_PROVIDERS:
        if value == mode:
            return mode
    rule = "unknown_providers must be 'allow', 'warn' or 'error'"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {value!r}")
    raise ValueError(f"{rule}, got {value!r}")


def shown(url: str | None) -> str | None:
    """A URL as a repr shows it: without its credentials."""
    return None if url is None else redact_url(url)
