"""``open_dispatcher``'s keywords are ``Settings``' fields, checked on the fields."""

from __future__ import annotations

import inspect

import attrs
import pytest

from trio_dispatch import Budget, Tenant, open_dispatcher
from trio_dispatch._dispatch._settings import Settings
from trio_dispatch.lowlevel import open_dispatcher_with

from .._backend_rigs import Made


def test_open_dispatchers_keywords_and_defaults_are_the_settings_fields() -> None:
    # The keywords are written twice, in the public signature and in the
    # fields: this holds the two to each other (a default namespace or
    # lease that is not the sentinel would need a redis_url here).
    keywords = inspect.signature(open_dispatcher).parameters
    fields = {field.alias for field in attrs.fields(Settings) if field.init}
    assert set(keywords) == fields - {"new_backend"}
    defaults = {name: parameter.default for name, parameter in keywords.items()}
    assert Settings(**defaults) == Settings()


def test_settings_keep_the_seconds_as_floats_and_the_budgets_apart() -> None:
    provider, model = Budget(requests_per_minute=60), Budget(tokens_per_minute=1000)
    settings = Settings(max_hold=5, max_pause=30, budgets={"p": provider, "p/m": model})
    assert (settings.max_hold, settings.max_pause, settings.lease) == (5.0, 30.0, 15.0)
    assert all(
        type(seconds) is float
        for seconds in (settings.max_hold, settings.max_pause, settings.lease)
    )
    assert type(settings.namespace) is str
    assert settings.provider_budgets == {"p": provider}
    assert settings.model_budgets == {"p": {"m": model}}


async def test_a_later_change_to_the_callers_mappings_reaches_nothing() -> None:
    limits = {"p": 1}
    tenants = {"t": Tenant(weight=2.0)}
    budget = Budget(requests_per_minute=60)
    budgets = {"p": budget}
    opened = open_dispatcher(limits, tenants=tenants, budgets=budgets)
    limits["p"] = 0
    limits["q"] = 2
    tenants["u"] = "not a Tenant"  # type: ignore[assignment]  # the point
    del budgets["p"]
    async with opened as dispatcher:
        assert dispatcher.limits() == {"p": 1}
        assert dispatcher.tenants() == {"t": Tenant(weight=2.0)}
        budgets_now = dispatcher.statistics().providers["p"].budget
        assert budgets_now is not None
        assert budgets_now.requests_per_minute == budget.requests_per_minute


@pytest.mark.parametrize("name", ["max_wait", "provider_budgets", "model_budgets"])
def test_open_dispatcher_with_refuses_what_open_dispatcher_does_not_take(
    name: str,
) -> None:
    with pytest.raises(
        TypeError,
        match=rf"^open_dispatcher_with\(\) got an unexpected keyword argument '{name}'$",
    ):
        open_dispatcher_with(Made(), **{name: {}})
