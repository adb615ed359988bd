"""Pools shared through a real redis-server: one fleet-wide queue over several members.

Several dispatchers in one trio run stand for several processes, each with
its own schedulers and connection, meeting only in Redis; every one
declares the same pools, as a fleet's processes must. Time is real (Redis
keeps its own): each test stages its requests until Redis holds them (the
group's queue, read directly), then frees slots one at a time, and asserts
the order, the members and the statistics, never a duration.
"""

from __future__ import annotations

import math
from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

import coredis
import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trio_dispatch import (
    AdaptiveLimit,
    Budget,
    Dispatcher,
    PoolProvider,
    Quota,
    RateLimitInfo,
    Tenant,
    open_dispatcher,
)
from trio_dispatch._dispatch._pools import MemberView
from trio_dispatch._dispatch._setup import fleet_name
from trio_dispatch._redis._ledger import Ledger, StepResult, keys_of
from trio_dispatch._redis._scheduler import SharedSchedulerActor
from trio_dispatch.events import Granted, LimitChanged, Paused, Queued, ServiceChanged
from trio_dispatch.lowlevel import Acquire, Failed, plumbing
from trio_dispatch.metrics import PrometheusCollector
from trio_dispatch.testing import FakeReply, FakeScript, Fault, ScriptedProvider

from .._admin import AUTH, serve_admin
from .._helpers import RecordingReply
from .._redis import RedisServer, needs_redis

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = needs_redis

LEASE = 1.5
NAMESPACE = "fleet"
POOLS: dict[str, tuple[str, ...]] = {"gpt": ("key-a", "key-b")}


async def open_fleet(
    stack: AsyncExitStack,
    server: RedisServer,
    count: int,
    limits: dict[str, int | AdaptiveLimit],
    pools: dict[str, tuple[str, ...]] = POOLS,
    **kwargs: object,
) -> list[Dispatcher]:
    """``count`` dispatchers declaring the same pools, as if in ``count`` processes."""
    return [
        await stack.enter_async_context(
            open_dispatcher(
                limits,
                pools=pools,
                redis_url=server.url,
                namespace=NAMESPACE,
                lease=LEASE,
                **kwargs,  # type: ignore[arg-type]  # the tests pass valid settings
            )
        )
        for _ in range(count)
    ]


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds, for at most 10 seconds (state across sockets)."""
    with trio.fail_after(10):
        while not condition():  # noqa: ASYNC110 (polling state across sockets)
            await trio.sleep(0.005)


async def until_queued(
    server: RedisServer, count: int, pools: dict[str, tuple[str, ...]] = POOLS
) -> None:
    """Wait until the group's fleet-wide queue in Redis holds ``count`` entries."""
    queue = keys_of(NAMESPACE, fleet_name(pools))[1]
    async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
        with trio.fail_after(10):
            while await client.zcard(queue) != count:  # noqa: ASYNC110 (state across sockets)
                await trio.sleep(0.005)


class Holder:
    """A request that holds its slot until told to let go."""

    def __init__(self, name: str, log: list[tuple[str, str | None]]) -> None:
        self.name = name
        self.log = log
        self.granted = trio.Event()
        self.done = trio.Event()
        self.member: str | None = None

    async def run(
        self, dispatcher: Dispatcher, provider: str, **options: object
    ) -> None:
        async with dispatcher.slot(provider, **options) as slot:  # type: ignore[arg-type]
            self.member = slot.member
            self.log.append((self.name, slot.member))
            self.granted.set()
            await self.done.wait()


async def test_each_member_keeps_its_own_limit_across_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        fleet = await open_fleet(stack, server, 3, {"key-a": 2, "key-b": 1})
        holding = {"key-a": 0, "key-b": 0}
        peak = dict(holding)
        on: list[str | None] = []

        async def work(dispatcher: Dispatcher) -> None:
            async with dispatcher.slot("gpt") as slot:
                member = slot.member
                assert member is not None
                on.append(member)
                holding[member] += 1
                peak[member] = max(peak[member], holding[member])
                await trio.sleep(0.01)
                holding[member] -= 1

        async with trio.open_nursery() as nursery:
            for n in range(30):
                nursery.start_soon(work, fleet[n % 3])
        assert peak == {"key-a": 2, "key-b": 1}
        assert len(on) == 30
        assert set(on) == {"key-a", "key-b"}
        # Every process sees the fleet's limits, and its own grants per member.
        for dispatcher in fleet:
            stats = dispatcher.statistics()
            assert stats.pools["gpt"].members == ("key-a", "key-b")
            assert stats.pools["gpt"].limit == 3
            assert "gpt" not in stats.providers
            assert dispatcher.limits() == {"key-a": 2, "key-b": 1}
            assert dispatcher.pools() == POOLS
            providers = stats.providers
            assert providers["key-a"].backend == "redis"
            assert providers["key-a"].limit == 2
            assert providers["key-b"].limit == 1
            assert providers["key-a"].local_in_flight == 0
        granted = [
            d.statistics().providers[m].granted_total
            for d in fleet
            for m in ("key-a", "key-b")
        ]
        assert sum(granted) == 30
        assert [on.count(m) for m in ("key-a", "key-b")] == [
            sum(d.statistics().providers[m].granted_total for d in fleet)
            for m in ("key-a", "key-b")
        ]


async def test_the_oldest_turn_goes_first_across_members_and_processes(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 1})
        log: list[tuple[str, str | None]] = []
        first, second = Holder("first", log), Holder("second", log)
        young, old = Holder("young", log), Holder("old", log)
        now = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.run, one, "gpt")
            await first.granted.wait()
            nursery.start_soon(second.run, one, "gpt")
            await second.granted.wait()
            # The younger turn is asked first, in another process.
            nursery.start_soon(partial(young.run, two, "gpt", started_at=now - 1.0))
            await until_queued(server, 1)
            nursery.start_soon(partial(old.run, one, "gpt", started_at=now - 5.0))
            await until_queued(server, 2)
            second.done.set()
            await old.granted.wait()
            assert not young.granted.is_set()
            old.done.set()
            await young.granted.wait()
            first.done.set()
            young.done.set()
        assert [name for name, _ in log] == ["first", "second", "old", "young"]
        assert {first.member, second.member} == {"key-a", "key-b"}
        # Each took the member the one before it freed.
        assert old.member == second.member
        assert young.member == second.member


async def test_a_request_for_a_member_waits_for_it_alone_in_the_pools_queue(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 1})
        log: list[tuple[str, str | None]] = []
        on_a, on_b = Holder("a-holder", log), Holder("b-holder", log)
        for_a, for_any = Holder("for-a", log), Holder("for-any", log)
        now = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_a.run, one, "key-a")
            nursery.start_soon(on_b.run, one, "key-b")
            await on_a.granted.wait()
            await on_b.granted.wait()
            nursery.start_soon(partial(for_a.run, two, "key-a", started_at=now - 9.0))
            nursery.start_soon(partial(for_any.run, one, "gpt", started_at=now - 1.0))
            await until_queued(server, 2)
            assert two.statistics().providers["key-a"].waiting == 1
            assert one.statistics().pools["gpt"].waiting == 1
            # key-b frees: the pool's request takes it, though an older one
            # waits, for key-a alone.
            on_b.done.set()
            await for_any.granted.wait()
            assert not for_a.granted.is_set()
            on_a.done.set()
            await for_a.granted.wait()
            for_a.done.set()
            for_any.done.set()
        assert log[2:] == [("for-any", "key-b"), ("for-a", "key-a")]


async def test_a_member_paused_by_one_process_is_passed_over_by_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 1})
        one.report_rate_limit("key-a", 30.0)
        await until(lambda: one.statistics().providers["key-a"].paused)
        members = []
        for _ in range(4):
            async with two.slot("gpt") as slot:
                members.append(slot.member)
        assert members == ["key-b"] * 4
        stats = two.statistics().providers
        assert stats["key-a"].paused
        assert not stats["key-b"].paused
        # Asked directly, the paused member makes its request wait.
        with trio.move_on_after(0.3):
            async with two.slot("key-a"):
                pytest.fail("granted on a paused member")
        two.resume("key-a")
        async with two.slot("key-a") as slot:
            assert slot.member == "key-a"


async def test_a_conversation_keeps_to_the_member_of_its_last_call(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 3, "key-b": 3})
        async with one.slot("gpt", conversation_id="chat") as slot:
            home = slot.member
        assert home is not None
        # Another process fills part of the home member: the other has more
        # room, yet the conversation's calls keep to its member.
        log: list[tuple[str, str | None]] = []
        blocker = Holder("blocker", log)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocker.run, two, home)
            await blocker.granted.wait()
            members = []
            for _ in range(4):
                async with one.slot("gpt", conversation_id="chat") as slot:
                    members.append(slot.member)
            blocker.done.set()
        assert members == [home] * 4
        await until(lambda: one.statistics().providers[home].affinity_hits >= 4)
        stats = one.statistics()
        assert stats.pools["gpt"].affinity_hits == stats.providers[home].affinity_hits
        assert stats.pools["gpt"].affinity_moves == 0


async def test_a_member_failing_in_a_row_goes_out_of_service_for_the_fleet_then_back(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(
            stack,
            server,
            2,
            {"key-a": 2, "key-b": 2},
            failure_threshold=2,
            failure_cooldown=1.0,
        )
        async with two.events() as events:
            for dispatcher in (one, two):
                async with dispatcher.slot("key-a") as slot:
                    slot.failed()
            # Out for the whole fleet: the other process's pool requests go to key-b.
            members = []
            for _ in range(3):
                async with two.slot("gpt") as slot:
                    members.append(slot.member)
            assert members == ["key-b"] * 3
            stats = two.statistics().providers["key-a"]
            assert stats.outages_total == 1
            assert stats.out_of_service_until is not None
            # Asked directly, it waits for the cooldown's end, and probes it.
            async with two.slot("key-a") as slot:
                assert slot.member == "key-a"
            await until(lambda: two.statistics().providers["key-a"].failures == 0)
            async with two.slot("key-a"):
                pass
            seen = [await events.__anext__() for _ in range(events.pending)]
        changes = [event.state for event in seen if isinstance(event, ServiceChanged)]
        assert changes[0] == "out"
        assert changes[-1] == "in"
        assert all(
            event.provider == "key-a"
            for event in seen
            if isinstance(event, ServiceChanged)
        )


async def test_a_fallback_avoids_the_member_it_failed_on(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 1})
        async with one.slot("gpt") as slot:
            failed_on = slot.member
            slot.failed()
        assert failed_on is not None
        for _ in range(3):
            async with one.slot("gpt", avoid=(failed_on,)) as again:
                assert again.member != failed_on


async def test_a_members_limit_set_by_one_process_is_the_fleets(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 1})
        async with two.events() as events:
            one.set_limit("key-a", 3)
            # The other process learns it with its next round.
            async with two.slot("gpt"):
                pass
            await until(lambda: two.limits()["key-a"] == 3)
            seen = [await events.__anext__() for _ in range(events.pending)]
        assert two.statistics().pools["gpt"].limit == 4
        assert any(
            isinstance(event, LimitChanged)
            and event.provider == "key-a"
            and event.limit == 3
            for event in seen
        )
        # A third process that opens with other limits takes the fleet's.
        (three,) = await open_fleet(stack, server, 1, {"key-a": 9, "key-b": 9})
        assert three.limits() == {"key-a": 3, "key-b": 1}


async def test_events_name_the_member_granted_and_the_pool(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 1})
        async with one.events() as events:
            async with one.slot("gpt"):
                pass
            async with one.slot("key-b"):
                pass
            one.report_rate_limit("key-a", 5.0)
            async with one.slot("gpt") as slot:
                assert slot.member == "key-b"
            await until(lambda: events.pending > 0)
            seen = [await events.__anext__() for _ in range(events.pending)]
        named = [
            (type(event).__name__, event.provider, getattr(event, "pool", None))
            for event in seen
            if isinstance(event, Granted | Queued)
        ]
        assert named[0] == ("Queued", "gpt", "gpt")
        assert named[1][0] == "Granted"
        assert named[1][1] in {"key-a", "key-b"}
        assert named[1][2] == "gpt"
        assert ("Queued", "key-b", None) in named
        assert ("Granted", "key-b", None) in named
        assert named[-1] == ("Granted", "key-b", "gpt")
        assert any(
            isinstance(event, Paused) and event.provider == "key-a" for event in seen
        )


async def test_pools_cannot_change_at_run_time_in_a_fleet(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(
            stack, server, 1, {"key-a": 1, "key-b": 1, "key-c": 1}
        )
        with pytest.raises(ValueError, match=r"^a fleet's pools are fixed"):
            one.set_pool("other", ("key-c",))
        with pytest.raises(ValueError, match=r"^a fleet's pools are fixed"):
            one.remove_pool("gpt")
        assert one.pools() == POOLS
        async with one.slot("gpt") as slot:
            assert slot.member in {"key-a", "key-b"}


async def test_a_group_comes_back_with_its_members_limits_after_redis_lost_them(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 2})
        async with one.slot("gpt"):
            pass
        async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
            await client.flushall()
        # The next rounds store the members' limits again: still one on key-a.
        holding = {"key-a": 0, "key-b": 0}
        peak = dict(holding)

        async def work() -> None:
            async with one.slot("gpt") as slot:
                member = slot.member
                assert member is not None
                holding[member] += 1
                peak[member] = max(peak[member], holding[member])
                await trio.sleep(0.02)
                holding[member] -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(work)
        assert peak == {"key-a": 1, "key-b": 2}
        assert one.limits() == {"key-a": 1, "key-b": 2}


async def test_a_members_budget_is_the_fleets_and_shuts_it_for_the_pool(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(
            stack,
            server,
            2,
            {"key-a": 2, "key-b": 2},
            budgets={"key-a": Budget(requests_per_minute=2)},
        )
        members = []
        for dispatcher in (one, two, one, two, one, two):
            async with dispatcher.slot("gpt") as slot:
                members.append(slot.member)
        # key-a's two requests of the minute, fleet-wide, then key-b alone.
        assert members.count("key-a") == 2
        assert members.count("key-b") == 4
        for dispatcher in (one, two):
            budget = dispatcher.statistics().providers["key-a"].budget
            assert budget is not None
            assert budget.requests_per_minute == 2
            assert dispatcher.statistics().providers["key-b"].budget is None


async def test_a_members_budget_learned_by_one_process_holds_for_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 2})
        # key-b's answer says none is left of its minute's ten requests.
        one.observe_rate_limits(
            "key-b",
            RateLimitInfo(requests=Quota(limit=10, remaining=0, reset=60.0)),
        )
        await until(lambda: one.statistics().providers["key-b"].budget is not None)
        log: list[tuple[str, str | None]] = []
        holder = Holder("holder", log)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder.run, two, "key-a")
            await holder.granted.wait()
            # key-a is full, and key-b's budget, learned by the other
            # process, holds the pool's request back though key-b is free.
            with trio.move_on_after(0.3) as waited:
                async with two.slot("gpt"):
                    pytest.fail("granted on a member its budget shuts")
            assert waited.cancelled_caught
            holder.done.set()
        async with two.slot("gpt") as slot:
            assert slot.member == "key-a"
        budget = two.statistics().providers["key-b"].budget
        assert budget is not None
        assert budget.learned
        assert two.statistics().providers["key-a"].budget is None


@pytest.mark.parametrize("shared", [False, True], ids=["local", "redis"])
async def test_a_tenants_cap_holds_over_the_whole_pool(
    server: RedisServer, shared: bool
) -> None:
    async with AsyncExitStack() as stack:
        tenants = {"capped": Tenant(limit=1)}
        if shared:
            (dispatcher,) = await open_fleet(
                stack, server, 1, {"key-a": 2, "key-b": 2}, tenants=tenants
            )
        else:
            dispatcher = await stack.enter_async_context(
                open_dispatcher({"key-a": 2, "key-b": 2}, pools=POOLS, tenants=tenants)
            )
        holding = peak = 0
        others = 0

        async def capped() -> None:
            nonlocal holding, peak
            async with dispatcher.slot("gpt", tenant="capped"):
                holding += 1
                peak = max(peak, holding)
                await trio.sleep(0.02)
                holding -= 1

        async def other() -> None:
            nonlocal others
            async with dispatcher.slot("gpt", tenant="other"):
                others += 1
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(capped)
                nursery.start_soon(other)
    assert others == 6
    # Its cap is over the group, as the pure core keeps it, not per member.
    assert peak == 1


async def test_a_members_adaptive_limit_backs_off_for_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        adaptive = AdaptiveLimit(initial=4, minimum=1, maximum=8, backoff=0.5)
        one, two = await open_fleet(stack, server, 2, {"key-a": adaptive, "key-b": 2})
        assert two.limits() == {"key-a": 4, "key-b": 2}
        async with two.events() as events:
            one.report_rate_limit("key-a", 0.01)
            await until(lambda: one.limits()["key-a"] == 2)
            # The other process learns key-a's new limit with its next round;
            # key-b's stays.
            async with two.slot("gpt"):
                pass
            await until(lambda: two.limits()["key-a"] == 2)
            seen = [await events.__anext__() for _ in range(events.pending)]
        assert two.limits()["key-b"] == 2
        # Each process sees the fleet's: key-a's limit is adaptive, key-b's is not.
        for dispatcher in (one, two):
            providers = dispatcher.statistics().providers
            assert providers["key-a"].adaptive is True
            assert providers["key-b"].adaptive is False
        assert [
            (event.provider, event.previous, event.limit)
            for event in seen
            if isinstance(event, LimitChanged)
        ] == [("key-a", 4, 2)]


def scripted(
    script: FakeScript,
) -> tuple[ScriptedProvider, ScriptedProvider, PoolProvider]:
    """Members ``key-a`` and ``key-b`` playing ``script``, and the pool's provider over them."""
    a = ScriptedProvider(script, id="key-a")
    b = ScriptedProvider(script, id="key-b")
    return a, b, PoolProvider("gpt", {"key-a": a, "key-b": b})


async def test_a_conversation_over_a_fleets_pool_keeps_its_member(
    server: RedisServer,
) -> None:
    a, b, pool = scripted(
        FakeScript(default=FakeReply(text="fine", time_to_first_token=0.05))
    )
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 1})
        first = one.start_conversation(pool, conversation_id="first")
        second = two.start_conversation(pool, conversation_id="second")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.ask, "first")
            nursery.start_soon(second.ask, "second")
        # One call on each member: each conversation's next goes back to it.
        assert (len(a.requests), len(b.requests)) == (1, 1)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(first.ask, "again")
                nursery.start_soon(second.ask, "again")
        await until(lambda: one.statistics().pools["gpt"].affinity_hits >= 6)
        stats = one.statistics().pools["gpt"]
    assert (len(a.requests), len(b.requests)) == (4, 4)
    # Each member served one conversation: its every request opens with
    # that conversation's first question.
    opened = [
        {str(request.messages[0].content) for request in provider.requests}
        for provider in (a, b)
    ]
    assert sorted(map(sorted, opened)) == [["first"], ["second"]]
    assert stats.affinity_moves == 0


async def test_a_server_error_sends_a_fleets_call_to_the_other_member(
    server: RedisServer,
) -> None:
    failing = FakeScript(
        default=FakeReply(text="fine"),
        replies=(FakeReply(fault=Fault("server_error")),),
    )
    a = ScriptedProvider(failing, id="key-a")
    b = ScriptedProvider(FakeScript(default=FakeReply(text="fine")), id="key-b")
    pool = PoolProvider("gpt", {"key-a": a, "key-b": b})
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 1})
        result = await one.start_conversation(pool).ask("hello")
        await until(lambda: one.statistics().providers["key-a"].failures == 1)
        providers = one.statistics().providers
    assert (result.text, result.retries) == ("fine", 0)
    assert (len(a.requests), len(b.requests)) == (1, 1)
    assert providers["key-b"].failures == 0


async def test_the_admin_api_and_prometheus_show_a_fleets_pool_and_its_members(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"key-a": 1, "key-b": 2})
        async with one.slot("gpt") as held:
            # key-b has the most free slots; the other process sees the
            # fleet's slot in use with its next exchange.
            assert held.member == "key-b"
            async with two.slot("key-a"):
                pass
            await until(lambda: two.statistics().pools["gpt"].in_flight == 1)
            registry = CollectorRegistry()
            registry.register(PrometheusCollector(two))
            families = {
                family.name: family
                for family in text_string_to_metric_families(
                    generate_latest(registry).decode()
                )
            }
            async with (
                serve_admin(two) as base_url,
                httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
            ):
                body = (await client.get("/status")).json()
    assert body["pools"]["gpt"] == {
        "pool": "gpt",
        "members": ["key-a", "key-b"],
        "limit": 3,
        "in_flight": 1,
        "waiting": 0,
        "affinity_hits": 0,
        "affinity_moves": 0,
    }
    assert body["providers"]["key-b"]["in_flight"] == 1
    assert body["providers"]["key-b"]["backend"] == "redis"
    assert body["providers"]["key-a"]["in_flight"] == 0

    def value(family: str, **labels: str) -> float:
        return next(
            sample.value
            for sample in families[family].samples
            if sample.labels == labels
        )

    assert value("trio_dispatch_pool_slots_in_use", pool="gpt") == 1
    assert value("trio_dispatch_pool_slots_limit", pool="gpt") == 3
    assert value("trio_dispatch_slots_in_use", provider="key-b") == 1
    assert value("trio_dispatch_slots_in_use", provider="key-a") == 0


async def test_an_idle_group_keeps_its_epoch_and_the_fleets_newest_budgets(
    server: RedisServer,
) -> None:
    # An older process configured key-a's m1 at 1,000 a minute, a newer
    # one at 50: the fleet holds 50. Once the fleet idles, the group's own
    # settings stay while its members' do: no process finds the namespace
    # lost and stores its own older view again.
    async with AsyncExitStack() as stack:

        async def process(rpm: int) -> Dispatcher:
            (dispatcher,) = await open_fleet(
                stack,
                server,
                1,
                {"key-a": 2, "key-b": 2},
                budgets={"key-a/m1": Budget(requests_per_minute=rpm)},
            )
            async with dispatcher.slot("key-a", model="m1"):
                pass
            return dispatcher

        old = await process(1000)
        new = await process(50)

        def rate(dispatcher: Dispatcher) -> float | None:
            models = dispatcher.statistics().providers["key-a"].models
            return models["m1"].requests_per_minute if "m1" in models else None

        await until(lambda: rate(new) == 50)
        await trio.sleep(2.5 * LEASE)  # every lease and entry has expired
        for dispatcher in (old, new, old):
            async with dispatcher.slot("key-a", model="m1"):
                pass
        await until(lambda: rate(old) == 50)
        assert rate(new) == 50


async def test_a_groups_members_limits_survive_a_loss_before_its_first_round(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = Ledger.step
    flushed: list[bool] = []

    async def flushed_first(
        ledger: Ledger,
        *args: Any,  # noqa: ANN401  # passed through
        **kwargs: Any,  # noqa: ANN401  # passed through
    ) -> StepResult:
        if not flushed:
            # Redis restarts empty between the open and the first round.
            flushed.append(True)
            async with coredis.Redis.from_url(server.url) as client:
                await client.flushall()
        return await step(ledger, *args, **kwargs)

    monkeypatch.setattr(Ledger, "step", flushed_first)
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 2})
        async with one.slot("gpt"):
            pass
        assert flushed
        assert one.limits() == {"key-a": 1, "key-b": 2}
        # And the fleet holds them: a second process opening with others
        # takes them.
        (two,) = await open_fleet(stack, server, 1, {"key-a": 7, "key-b": 7})
        assert two.limits() == {"key-a": 1, "key-b": 2}


async def test_a_groups_members_budgets_come_back_after_redis_lost_them(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(
            stack,
            server,
            1,
            {"key-a": 1, "key-b": 1},
            budgets={
                "key-a": Budget(requests_per_minute=600),
                "key-b/m1": Budget(requests_per_minute=100),
            },
        )
        async with one.slot("key-b", model="m1"):
            pass
        async with coredis.Redis.from_url(server.url) as client:
            await client.flushall()
        # The next exchange finds the namespace lost and stores them again.
        for member in ("key-a", "key-b"):
            async with one.slot(member, model="m1"):
                pass
        (two,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 1})
        for member in ("key-a", "key-b"):
            async with two.slot(member, model="m1"):
                pass
        providers = two.statistics().providers
        budget = providers["key-a"].budget
        assert budget is not None
        assert budget.requests_per_minute == 600
        assert providers["key-b"].models["m1"].requests_per_minute == 100


async def test_a_request_no_longer_waiting_for_its_member_is_due_a_round(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(
            stack, server, 1, {"key-a": 1, "key-b": 1}, affinity_wait=0.2
        )
        async with one.slot("gpt", conversation_id="chat") as slot:
            home = slot.member
        assert home is not None
        log: list[tuple[str, str | None]] = []
        blocker = Holder("blocker", log)
        waiter = Holder("waiter", log)
        backend = plumbing(one)._backends["gpt"]
        assert isinstance(backend, MemberView)
        actor = backend.actor
        assert isinstance(actor, SharedSchedulerActor)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocker.run, one, home)
            await blocker.granted.wait()
            nursery.start_soon(partial(waiter.run, one, "gpt", conversation_id="chat"))
            await until_queued(server, 1)
            await until(lambda: actor._deadline() < math.inf)
            published = trio.current_time()
            # Its wait for its member ends within affinity_wait (and a
            # little slack) of being published: a round is due then, not
            # at the next poll.
            assert actor._deadline() <= published + 0.2 + 0.05
            await waiter.granted.wait()
            waiter.done.set()
            blocker.done.set()
        assert waiter.member != home
        assert not actor._affinity


async def test_a_failure_reported_for_a_waiting_request_withdraws_it(
    server: RedisServer,
) -> None:
    # Only a holder's call can fail; a Failed for a request still waiting
    # (low-level misuse) withdraws it, as a Cancel would, and nothing is
    # granted to it later.
    async with AsyncExitStack() as stack:
        (one,) = await open_fleet(stack, server, 1, {"key-a": 1, "key-b": 1})
        log: list[tuple[str, str | None]] = []
        holders = [Holder("a", log), Holder("b", log)]
        async with trio.open_nursery() as nursery:
            for holder in holders:
                nursery.start_soon(holder.run, one, "gpt")
                await holder.granted.wait()
            backend = plumbing(one)._backends["gpt"]
            assert isinstance(backend, MemberView)
            reply = RecordingReply()
            ticket = backend.ticket(trio.current_time())
            backend.send(Acquire(ticket, reply))
            await until_queued(server, 1)
            backend.send(Failed(ticket))
            await until_queued(server, 0)
            for holder in holders:
                holder.done.set()
        async with one.slot("gpt") as slot:
            assert slot.member in {"key-a", "key-b"}
        assert (reply.grants, reply.errors) == ([], [])
        assert one.statistics().pools["gpt"].waiting == 0
