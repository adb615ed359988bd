"""Tenants through the real dispatcher: grant orders, bad input refused, removal.

A provider with one slot, requests that each hold it one second, staged
with ``wait_all_tasks_blocked`` so that every arrival order is exact, in
virtual time. The tenant rule (the least weighted service first, no idle
time banked, caps) is the pure core's; here it is held to through the
front: ``slot``, ``turn``, ``start_conversation``,
``open_dispatcher(tenants=)`` and ``set_tenant`` at run time.

Each entry point that takes a tenant or a model (``open_dispatcher``'s
``tenants``, ``turn``, ``slot``, ``start_conversation``, ``set_tenant``,
``remove_tenant``, ``observe_rate_limits``) raises ``TypeError`` for a
value of the wrong type and ``ValueError`` for a bad value, with the
message of the one rule, and changes nothing.

``remove_tenant`` gives a tenant the defaults again wherever it was
configured: in a fleet sharing a real redis-server (in real time), a
process that never configured it removes the cap another process set.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import Budget, Quota, RateLimitInfo, Tenant, open_dispatcher
from trio_dispatch.lowlevel import open_dispatcher_with
from trio_dispatch.messages import ChatMessage
from trio_dispatch.testing import FakeReply, FakeScript, ScriptedProvider

from .._backend_rigs import Made
from .._redis import needs_redis

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from trio_dispatch import Dispatcher, TenantStatistics

    from .._redis import RedisServer


async def grant_order(
    dispatcher: Dispatcher,
    tenants: Iterable[str | None],
    *,
    hold: float = 1.0,
    provider: str = "p",
    **slot: Any,  # noqa: ANN401 (slot's keyword arguments)
) -> list[tuple[str | None, float]]:
    """Queue one slot per name of ``tenants``, in order; each holds ``hold``.

    Returns who was granted, and when, in grant order.
    """
    order: list[tuple[str | None, float]] = []

    async def call(tenant: str | None) -> None:
        async with dispatcher.slot(provider, tenant=tenant, **slot):
            order.append((tenant, trio.current_time()))
            await trio.sleep(hold)

    async with trio.open_nursery() as nursery:
        for tenant in tenants:
            nursery.start_soon(call, tenant)
            await trio.testing.wait_all_tasks_blocked()
    return order


def names(order: list[tuple[str | None, float]]) -> str:
    """The grant order as one letter per grant (``-`` for no tenant)."""
    return "".join("-" if tenant is None else tenant[0] for tenant, _ in order)


async def test_no_tenant_anywhere_is_oldest_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        order: list[str] = []

        async def call(name: str, started_at: float) -> None:
            async with dispatcher.slot("p", started_at=started_at):
                order.append(name)
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            for name, started_at in [("a", 0.0), ("b", -3.0), ("c", -1.0), ("d", -2.0)]:
                nursery.start_soon(call, name, started_at)
                await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["p"]
    # The first is granted on arrival; then oldest turn first.
    assert order == ["a", "b", "d", "c"]
    assert stats.tenants == {}


async def test_equal_weights_alternate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        order = await grant_order(dispatcher, ["heavy"] * 6 + ["light"] * 3)
    # Unconfigured tenants have weight 1: one each, the tie to the older.
    assert names(order) == "hlhlhlhhh"
    assert [at for _, at in order] == [float(t) for t in range(9)]


async def test_three_to_one_weights_give_three_slots_for_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"p": 1}, tenants={"heavy": Tenant(weight=3.0), "light": Tenant()}
    ) as dispatcher:
        order = await grant_order(dispatcher, ["heavy"] * 10 + ["light"] * 4)
        stats = dispatcher.statistics().providers["p"]
    assert names(order) == "hlhhhlhhhlhhhl"
    assert stats.tenants["heavy"].weight == 3.0
    # Service is slot-seconds over the weight: 10 / 3 and 4 / 1.
    assert abs(stats.tenants["heavy"].service - 10 / 3) < 1e-9
    assert stats.tenants["light"].service == 4.0


async def test_without_tenants_a_heavy_user_takes_every_slot_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Today's order, the default tenant for all: what tenants change.
    async with open_dispatcher({"p": 1}) as dispatcher:
        order = await grant_order(dispatcher, [None] * 9)
    assert [at for _, at in order] == [float(t) for t in range(9)]


async def test_a_turn_s_tenant_goes_with_its_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        order: list[str] = []

        async def turn_of(tenant: str, calls: int) -> None:
            with dispatcher.turn(tenant=tenant):
                for _ in range(calls):
                    async with dispatcher.slot("p") as slot:
                        order.append(f"{slot.tenant}")
                        await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            for tenant in ["a", "a", "a", "b"]:
                nursery.start_soon(turn_of, tenant, 2)
                await trio.testing.wait_all_tasks_blocked()
            stats = dispatcher.statistics().providers["p"].tenants
            assert (stats["a"].in_flight, stats["a"].waiting) == (1, 2)
            assert (stats["b"].in_flight, stats["b"].waiting) == (0, 1)
    assert order.count("a") == 6
    assert order.count("b") == 2
    # b is not left behind a's three turns: it has the second slot.
    assert order[1] == "b"


async def test_a_conversation_s_turns_are_its_tenant_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(default=FakeReply(text="ok", latency=1.0))
    async with open_dispatcher(
        {"p": 1}, tenants={"light": Tenant(weight=1.0)}
    ) as dispatcher:
        provider = ScriptedProvider(script, id="p")
        with dispatcher.turn(tenant="light"):
            light = dispatcher.start_conversation(provider)
        heavy = [
            dispatcher.start_conversation(provider, tenant="heavy") for _ in range(3)
        ]
        assert light.tenant == "light"
        finished: list[str] = []

        async def ask(conversation: Any, name: str) -> None:  # noqa: ANN401 (a Conversation)
            await conversation.ask("hi")
            finished.append(name)

        async with trio.open_nursery() as nursery:
            for index, conversation in enumerate(heavy):
                nursery.start_soon(ask, conversation, f"heavy{index}")
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask, light, "light")
            await trio.testing.wait_all_tasks_blocked()
            tenants = dispatcher.statistics().providers["p"].tenants
            assert tenants["light"].waiting == 1
            assert tenants["heavy"].waiting == 2
        for conversation in [light, *heavy]:
            assert conversation.history[0] == ChatMessage("user", "hi")
    # The light tenant's one question goes second, not last.
    assert finished == ["heavy0", "light", "heavy1", "heavy2"]


async def test_a_tenant_at_its_cap_waits_while_others_go(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"p": 3}, tenants={"capped": Tenant(limit=1)}
    ) as dispatcher:
        order = await grant_order(dispatcher, ["capped"] * 3 + ["other"] * 2)
        stats = dispatcher.statistics().providers["p"]
    # One capped slot at a time, even with slots free.
    capped = [at for tenant, at in order if tenant == "capped"]
    assert capped == [0.0, 1.0, 2.0]
    assert [at for tenant, at in order if tenant == "other"] == [0.0, 0.0]
    assert stats.peak_in_flight == 3


async def test_set_tenant_at_run_time_applies_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"p": 4}, tenants={"acme": Tenant(limit=1)}
    ) as dispatcher:
        granted: list[float] = []

        async def call() -> None:
            async with dispatcher.slot("p", tenant="acme"):
                granted.append(trio.current_time())
                await trio.sleep(10)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked()
            assert granted == [0.0]
            await trio.sleep(2)
            # A higher cap grants the waiting at once.
            dispatcher.set_tenant("acme", Tenant(limit=3))
            await trio.testing.wait_all_tasks_blocked()
            assert granted == [0.0, 2.0, 2.0]
            stats = dispatcher.statistics().providers["p"].tenants["acme"]
            assert (stats.limit, stats.in_flight, stats.waiting) == (3, 3, 1)
            # Removed: back to the defaults, no cap.
            dispatcher.remove_tenant("acme")
            await trio.testing.wait_all_tasks_blocked()
            assert granted == [0.0, 2.0, 2.0, 2.0]
        assert dispatcher.tenants() == {}


async def test_a_backend_made_later_gets_the_tenants_set_earlier(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher() as dispatcher:
        dispatcher.set_tenant("acme", Tenant(weight=2.0, limit=2))
        dispatcher.set_limit("late", 4)
        stats = dispatcher.statistics().providers["late"].tenants
        assert stats["acme"].weight == 2.0
        assert stats["acme"].limit == 2


async def _grant_times(
    requests: list[tuple[float, int]], tenant: str | None, tenants: dict[str, Tenant]
) -> dict[int, float]:
    """When each of ``requests`` (turn start, class), all of ``tenant``, was granted.

    Times, not the order of the records: slots granted at the same instant
    run in whatever order trio picks.
    """
    granted: dict[int, float] = {}
    async with open_dispatcher({"p": 2}, tenants=tenants) as dispatcher:

        async def call(index: int, started_at: float, priority: int) -> None:
            async with dispatcher.slot(
                "p", started_at=started_at, priority=priority, tenant=tenant
            ):
                granted[index] = trio.current_time()
                await trio.sleep(1 + index % 3)

        async with trio.open_nursery() as nursery:
            for index, (started_at, priority) in enumerate(requests):
                nursery.start_soon(call, index, started_at, priority)
                await trio.testing.wait_all_tasks_blocked()
    return granted


@given(
    requests=st.lists(
        st.tuples(
            st.integers(min_value=-20, max_value=0).map(float),
            st.integers(min_value=0, max_value=2),
        ),
        min_size=1,
        max_size=12,
    ),
    weight=st.sampled_from([0.5, 1.0, 3.0]),
)
@settings(deadline=None)
def test_one_tenant_is_today_s_order_whatever_its_weight(
    requests: list[tuple[float, int]], weight: float
) -> None:
    def run(tenant: str | None, tenants: dict[str, Tenant]) -> dict[int, float]:
        return trio.run(
            _grant_times,
            requests,
            tenant,
            tenants,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )

    today = run(None, {})
    assert run("solo", {}) == today
    assert run("solo", {"solo": Tenant(weight=weight)}) == today


async def test_tenants_and_model_budgets_reach_every_backend_in_its_setup_then_the_protocol(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    async with open_dispatcher_with(
        made,
        {"p": 2, "q": 2},
        tenants={"acme": Tenant(weight=2.0), "beta": Tenant(limit=1)},
        budgets={"p/m": Budget(requests_per_minute=60)},
    ) as dispatcher:
        dispatcher.set_tenant("gamma", Tenant(weight=0.5))
        dispatcher.remove_tenant("beta")
        dispatcher.remove_tenant("never-configured")
        dispatcher.set_limit("late", 1)
        stats = dispatcher.statistics().providers
    # Given at birth in the setup (the tenants then, and each model's budget
    # to its own provider only), then told each change (gamma's, beta's and
    # a removal of a tenant configured here never, which another process of
    # a fleet may have configured).
    calls = {name: backend.calls for name, backend in made.backends.items()}
    assert [calls[name]["set_tenant"] for name in ("p", "q", "late")] == [3, 3, 0]
    assert [calls[name]["set_model_budget"] for name in ("p", "q", "late")] == [0, 0, 0]
    assert set(made.setups["p"].tenants) == {"acme", "beta"}
    assert set(made.setups["late"].tenants) == {"acme", "gamma"}
    assert set(made.setups["p"].model_budgets) == {"m"}
    assert made.setups["q"].model_budgets == {}
    assert set(stats["p"].models) == {"m"}
    assert stats["q"].models == {}
    assert set(stats["late"].tenants) == {"acme", "gamma"}
    assert stats["late"].tenants["gamma"].weight == 0.5


# -- bad input, refused at every entry point, at the call --------------------------

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


# By open_dispatcher, when it is called.


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


# At run time, by a dispatcher with one tenant configured.


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


# -- removing a tenant -------------------------------------------------------------


async def test_remove_tenant_of_a_tenant_configured_nowhere_changes_nothing() -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        dispatcher.remove_tenant("acme")
        assert dispatcher.tenants() == {}
        async with dispatcher.slot("p"):
            stats = dispatcher.statistics().providers["p"]
            assert (stats.in_flight, stats.tenants) == (1, {})


@needs_redis
async def test_a_process_that_never_configured_a_tenant_removes_its_cap(
    server: RedisServer,
) -> None:
    release = trio.Event()

    async def until(
        dispatcher: Dispatcher, check: Callable[[TenantStatistics], bool]
    ) -> None:
        """Wait (real time: the fleet's state comes through Redis) for ``check``."""
        with trio.fail_after(10):
            while True:
                seen = dispatcher.statistics().providers["p"].tenants.get("acme")
                if seen is not None and check(seen):
                    return
                await trio.sleep(0.01)

    async with (
        open_dispatcher(
            {"p": 3},
            redis_url=server.url,
            namespace="removal",
            tenants={"acme": Tenant(limit=1)},
        ) as configuring,
        open_dispatcher({"p": 3}, redis_url=server.url, namespace="removal") as other,
        trio.open_nursery() as nursery,
    ):

        async def hold() -> None:
            async with configuring.slot("p", tenant="acme"):
                await release.wait()

        for _ in range(2):
            nursery.start_soon(hold)
        await until(configuring, lambda seen: (seen.in_flight, seen.waiting) == (1, 1))
        # The fleet's tenants, as the other process's rounds see them.
        with trio.fail_after(10):
            while other.tenants() != {"acme": Tenant(limit=1)}:  # noqa: ASYNC110 (state across dispatchers)
                await trio.sleep(0.01)
        other.remove_tenant("acme")
        assert other.tenants() == {}
        # The fleet's cap is gone: the waiter is granted.
        await until(configuring, lambda seen: (seen.in_flight, seen.waiting) == (2, 0))
        assert configuring.tenants() == {}
        release.set()
