"""Tenants and model budgets: bad input refused at every entry point, at the call.

Each entry point (``open_dispatcher``'s ``tenants`` and ``budgets``,
``turn``, ``slot``, ``start_conversation``, ``set_tenant``,
``remove_tenant``, ``observe_rate_limits``) raises ``TypeError`` for a
value of the wrong type and ``ValueError`` for a bad value, with the
message of the one rule, and changes nothing.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import pytest
import trio

from trio_dispatch import (
    Budget,
    Quota,
    RateLimitInfo,
    Tenant,
    open_dispatcher,
)
from trio_dispatch.lowlevel import plumbing
from trio_dispatch.testing import ScriptedProvider

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher

LONG = "t" * 257

#: (tenant name, error type, message): every bad name, whatever the entry.
BAD_NAMES = [
    (5, TypeError, r"^tenant must be a non-empty string, got 5$"),
    (b"acme", TypeError, r"^tenant must be a non-empty string, got b'acme'$"),
    ("", ValueError, r"^tenant must be a non-empty string, got ''$"),
    (LONG, ValueError, r"^tenant must be at most 256 characters, got one of 257$"),
]

#: The bad values of a ``Tenant``'s fields: refused when it is made.
BAD_TENANTS = [
    ({"weight": 0}, ValueError, r"^weight must be a positive number, got 0$"),
    ({"weight": -1.0}, ValueError, r"^weight must be a positive number, got -1.0$"),
    ({"weight": math.nan}, ValueError, r"^weight must be a positive number, got nan$"),
    ({"weight": math.inf}, ValueError, r"^weight must be a positive number, got inf$"),
    ({"weight": True}, TypeError, r"^weight must be a positive number, got True$"),
    ({"weight": "2"}, TypeError, r"^weight must be a positive number, got '2'$"),
    ({"limit": 0}, ValueError, r"^limit must be a positive integer, got 0$"),
    ({"limit": 1.0}, TypeError, r"^limit must be a positive integer, got 1.0$"),
    ({"limit": True}, TypeError, r"^limit must be a positive integer, got True$"),
]


@pytest.mark.parametrize(("fields", "error", "message"), BAD_TENANTS)
def test_a_tenant_with_a_bad_field_is_refused_when_made(
    fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Tenant(**fields)


# ------------------------------------------------------- open_dispatcher


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
def test_open_dispatcher_refuses_a_bad_tenant_name(
    name: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        open_dispatcher(tenants={name: Tenant()})  # type: ignore[dict-item]  # the point


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        (
            [("acme", Tenant())],
            r"^tenants must be a mapping of tenant name to Tenant, got \[",
        ),
        ("acme", r"^tenants must be a mapping of tenant name to Tenant, got 'acme'$"),
        ({"acme": 2.0}, r"^tenants\['acme'\] must be a Tenant, got 2.0$"),
        ({"acme": None}, r"^tenants\['acme'\] must be a Tenant, got None$"),
        (
            {"acme": {"weight": 2.0}},
            r"^tenants\['acme'\] must be a Tenant, got \{'weight': 2.0\}$",
        ),
    ],
)
def test_open_dispatcher_refuses_tenants_of_the_wrong_type(
    tenants: object, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        open_dispatcher(tenants=tenants)  # type: ignore[arg-type]  # the point


@pytest.mark.parametrize(
    ("key", "error", "message"),
    [
        (
            "openai/",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got 'openai/'$",
        ),
        (
            "/x",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got '/x'$",
        ),
        (
            "/",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got '/'$",
        ),
        ("", ValueError, r"^provider must be a non-empty string, got ''$"),
        (7, TypeError, r"^provider must be a non-empty string, got 7$"),
    ],
)
def test_open_dispatcher_refuses_a_bad_budget_key(
    key: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        open_dispatcher(budgets={key: Budget(requests_per_minute=60)})  # type: ignore[dict-item]  # the point


def test_a_model_budget_must_be_a_budget() -> None:
    with pytest.raises(
        TypeError, match=r"^budget for 'openai/gpt-4o' must be a Budget, got 60$"
    ):
        open_dispatcher(budgets={"openai/gpt-4o": 60})  # type: ignore[dict-item]  # the point


async def test_a_model_key_splits_at_its_first_slash() -> None:
    budgets = {
        "openai": Budget(requests_per_minute=100),
        "openai/gpt-4o": Budget(requests_per_minute=10, default_max_tokens=64),
        "vllm/org/llama": Budget(tokens_per_minute=1000, default_max_tokens=32),
    }
    async with open_dispatcher(budgets=budgets) as dispatcher:
        # Each model's own budget answers for it; the provider's for the rest.
        assert plumbing(dispatcher).default_max_tokens("openai", "gpt-4o") == 64
        assert plumbing(dispatcher).default_max_tokens("openai", "gpt-4o-mini") == (
            budgets["openai"].default_max_tokens
        )
        assert plumbing(dispatcher).default_max_tokens("vllm", "org/llama") == 32
        assert plumbing(dispatcher).default_max_tokens("vllm", "org") == (
            Budget(requests_per_minute=1).default_max_tokens
        )


# ---------------------------------------------------------- at run time


@pytest.fixture
async def dispatcher() -> Any:  # noqa: ANN401  # an async generator fixture
    async with open_dispatcher(
        {"p": 1}, tenants={"acme": Tenant(weight=2.0)}
    ) as dispatcher:
        yield dispatcher


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
async def test_turn_refuses_a_bad_tenant(
    dispatcher: Dispatcher, name: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatcher.turn(tenant=name)  # type: ignore[arg-type]  # the point


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
async def test_slot_refuses_a_bad_tenant(
    dispatcher: Dispatcher, name: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatcher.slot("p", tenant=name)  # type: ignore[arg-type]  # the point
    assert dispatcher.statistics().providers["p"].waiting == 0


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        (4, TypeError, r"^model must be a non-empty string, got 4$"),
        ("", ValueError, r"^model must be a non-empty string, got ''$"),
    ],
)
async def test_slot_and_observe_rate_limits_refuse_a_bad_model(
    dispatcher: Dispatcher, model: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatcher.slot("p", model=model)  # type: ignore[arg-type]  # the point
    info = RateLimitInfo(requests=Quota(limit=10, remaining=5, reset=60.0))
    with pytest.raises(error, match=message):
        dispatcher.observe_rate_limits("p", info, model=model)  # type: ignore[arg-type]  # the point


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
async def test_start_conversation_refuses_a_bad_tenant(
    dispatcher: Dispatcher, name: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatcher.start_conversation(ScriptedProvider(id="p"), tenant=name)  # type: ignore[arg-type]  # the point


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
async def test_set_and_remove_tenant_refuse_a_bad_name(
    dispatcher: Dispatcher, name: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        dispatcher.set_tenant(name, Tenant())  # type: ignore[arg-type]  # the point
    with pytest.raises(error, match=message):
        dispatcher.remove_tenant(name)  # type: ignore[arg-type]  # the point
    assert dispatcher.tenants() == {"acme": Tenant(weight=2.0)}


@pytest.mark.parametrize("settings", [None, 2.0, {"weight": 2.0}, "Tenant()"], ids=repr)
async def test_set_tenant_refuses_settings_that_are_no_tenant(
    dispatcher: Dispatcher, settings: object
) -> None:
    message = f"settings must be a Tenant, got {settings!r}"
    with pytest.raises(TypeError, match=rf"^{re.escape(message)}$"):
        dispatcher.set_tenant("acme", settings)  # type: ignore[arg-type]  # the point
    assert dispatcher.tenants() == {"acme": Tenant(weight=2.0)}


async def test_tenants_are_kept_and_changed_by_name(dispatcher: Dispatcher) -> None:
    tenants = dispatcher.tenants()
    assert tenants == {"acme": Tenant(weight=2.0)}
    tenants["other"] = Tenant()  # a copy: the dispatcher's are not touched
    dispatcher.set_tenant("beta", Tenant(limit=3))
    dispatcher.set_tenant("acme", Tenant(weight=0.5))
    assert dispatcher.tenants() == {
        "acme": Tenant(weight=0.5),
        "beta": Tenant(limit=3),
    }
    dispatcher.remove_tenant("acme")
    dispatcher.remove_tenant("never-configured")  # nothing to do
    assert dispatcher.tenants() == {"beta": Tenant(limit=3)}


async def test_set_and_remove_tenant_after_closing_raise() -> None:
    from trio_dispatch import DispatcherClosed  # noqa: PLC0415  # beside its use

    async with open_dispatcher() as dispatcher:
        pass
    with pytest.raises(DispatcherClosed):
        dispatcher.set_tenant("acme", Tenant())
    with pytest.raises(DispatcherClosed):
        dispatcher.remove_tenant("acme")
    assert dispatcher.tenants() == {}


async def test_a_turn_s_tenant_is_taken_by_its_slots_where_not_given(
    dispatcher: Dispatcher,
) -> None:
    outside = dispatcher.slot("p")
    assert outside.tenant is None
    assert outside.model is None
    with dispatcher.turn(tenant="acme") as turn:
        assert turn.tenant == "acme"
        assert dispatcher.slot("p").tenant == "acme"
        assert dispatcher.slot("p", tenant="beta").tenant == "beta"
        with dispatcher.turn(conversation_id="c"):
            # A turn replaces the outer one whole.
            assert dispatcher.slot("p").tenant is None
        inside: list[str | None] = []

        async def take() -> None:
            inside.append(dispatcher.slot("p").tenant)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
        assert inside == ["acme"]
    # Every field given: the turn is not read, the tenant is the slot's.
    with dispatcher.turn(tenant="acme"):
        slot = dispatcher.slot(
            "p", conversation_id="c", started_at=0.0, priority=0, tenant="beta"
        )
        assert slot.tenant == "beta"
    slot = dispatcher.slot("p", tenant="acme", model="gpt-4o")
    assert (slot.tenant, slot.model) == ("acme", "gpt-4o")
    assert "tenant='acme' model='gpt-4o'" in repr(slot)


async def test_a_conversation_takes_the_tenant_current_where_it_starts(
    dispatcher: Dispatcher,
) -> None:
    provider = ScriptedProvider(id="p")
    assert dispatcher.start_conversation(provider).tenant is None
    assert dispatcher.start_conversation(provider, tenant="beta").tenant == "beta"
    with dispatcher.turn(tenant="acme"):
        assert dispatcher.start_conversation(provider).tenant == "acme"
        assert dispatcher.start_conversation(provider, tenant="beta").tenant == "beta"
