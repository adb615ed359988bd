"""Tenants' shares and caps hold across a fleet sharing one real Redis.

Two shared schedulers of one provider ("nodes", as two processes run
them) on one namespace, each with requests of its own tenant, or with
both; the ledger's clock is the test's (``open_fleet``), so that the
service counters, and with them the grant orders, are exact. The fleet is
paused while the requests queue on both nodes, then resumed; each holder
holds for a set time on that clock, then gives its slot back, and the
next grant, whichever node it goes to, is the one the tenant rule names.
"""

from __future__ import annotations

import math
import signal
import uuid
from typing import TYPE_CHECKING

import coredis
import pytest
import trio

from trio_dispatch import Tenant, open_dispatcher
from trio_dispatch._redis._ledger import Ledger, member_of
from trio_dispatch._redis._scripts import Plan, load_scripts
from trio_dispatch.lowlevel import SetTenant

from .._redis import SET_CLOCK, lose_everything, needs_redis, open_fleet
from .._workers import worker

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._redis import Fleet, RedisServer

pytestmark = needs_redis

LEASE = 3.0


async def serve_one_by_one(fleet: Fleet, hold_ms: int, count: int) -> str:
    """Release each holder after ``hold_ms`` until ``count`` grants; their tenants."""
    await fleet.resume(1)
    for n in range(1, count):
        await fleet.clock(n * hold_ms)
        fleet.release(fleet.grants[n - 1])
        await fleet.settle(n + 1)
    return "".join(str(reply.ticket.tenant) for reply in fleet.grants)


async def test_equal_weights_share_one_slot_turn_about_across_two_nodes(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=1) as fleet:
        await fleet.pause()
        # Tenant a's turns are all older: oldest-first alone would serve
        # every one of them before b's.
        for _ in range(6):
            fleet.acquire(0, older=10.0, tenant="a")
        for _ in range(6):
            fleet.acquire(1, tenant="b")
        order = await serve_one_by_one(fleet, 1000, 12)
        view = await fleet.view()
    assert order == "abababababab"
    assert {reply.node for reply in fleet.grants if reply.ticket.tenant == "b"} == {1}
    # At 11 s: b held 5 slots of 1 s, and its sixth since now; a, which
    # nobody configured, holds and waits for nothing: forgotten.
    assert {name: (t.in_flight, t.service) for name, t in view.tenants.items()} == {
        "b": (1, 5.0)
    }


async def test_weights_three_to_one_share_one_slot_three_to_one_across_two_nodes(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=1) as fleet:
        await fleet.pause()
        # Set by one node, for the whole fleet.
        fleet.nodes[1].send(SetTenant("b", Tenant(weight=3.0)))
        for _ in range(6):
            fleet.acquire(0, older=10.0, tenant="a")
        for _ in range(9):
            fleet.acquire(1, tenant="b")
        # Holds of 3 s: every counter is a whole number of seconds.
        order = await serve_one_by_one(fleet, 3000, 12)
        view = await fleet.view()
        shown = fleet.nodes[0].statistics().tenants
    assert order == "abbbabbbabbb"
    # At 33 s: a held three slots of 3 s; b eight of 3 s, at weight 3, and
    # its ninth since now.
    assert {
        name: (t.weight, t.in_flight, t.service) for name, t in view.tenants.items()
    } == {"a": (1.0, 0, 9.0), "b": (3.0, 1, 8.0)}
    # Each node shows the fleet's tenants as its latest round saw them.
    assert set(shown) == {"a", "b"}
    assert shown["b"].weight == 3.0


async def test_a_tenants_cap_holds_fleet_wide(shared_server: RedisServer) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=3) as fleet:
        await fleet.pause()
        fleet.nodes[0].send(SetTenant("a", Tenant(limit=2)))
        # A hundredth of a second apart: the nodes' clocks agree closer.
        a = [fleet.acquire(n % 2, older=10.0 - n / 100, tenant="a") for n in range(4)]
        b = [fleet.acquire(1, tenant="b") for _ in range(2)]
        await fleet.resume(3)
        # Nobody has service yet: a's oldest, then b's (fewer held for its
        # weight), then a's next; whichever node's round came first.
        assert set(fleet.grants) == {a[0], b[0], a[1]}
        await fleet.clock(1000)
        fleet.release(a[0])
        await fleet.settle(4)
        # a held two slots for a second, b one: b's.
        assert fleet.grants[3:] == [b[1]]
        await fleet.clock(2000)
        fleet.release(b[0])
        await fleet.settle(5)
        await fleet.settle()
        assert fleet.grants[4:] == [a[2]]
        await fleet.clock(3000)
        fleet.release(b[1])
        await fleet.settle()
        # A slot is free and a's oldest request waits, on both nodes'
        # queues: a holds its cap, on two nodes.
        assert len(fleet.grants) == 5
        view = await fleet.view()
        assert (view.in_flight, view.limit) == (2, 3)
        capped = view.tenants["a"]
        assert (capped.limit, capped.in_flight, capped.queued) == (2, 2, 1)
        await fleet.clock(4000)
        fleet.release(a[1])
        await fleet.settle(6)
        assert fleet.grants[5:] == [a[3]]


async def test_no_tenant_anywhere_keeps_the_oldest_first_order_and_todays_keys(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=1) as fleet:
        await fleet.pause()
        replies = [fleet.acquire(n % 2, older=float(10 - n)) for n in range(6)]
        await serve_one_by_one(fleet, 1000, 6)
        stats = fleet.nodes[0].statistics()
        view = await fleet.view()
        tag = fleet.ledger.names("p")[0][0][: -len("leases")]
        keys = await fleet.client.keys(tag + "*")
    assert fleet.grants == replies
    assert stats.tenants == {}
    assert view.tenants == {}
    assert not view.counting
    # Nothing of tenants or models is kept.
    kept = {key[len(tag) :] for key in keys}
    assert not kept & {"tconf", "tstate", "tback", "qmeta", "lmeta", "models"}


async def test_a_tenant_set_at_run_time_on_one_node_steers_the_other(
    shared_server: RedisServer,
) -> None:
    async with open_fleet(shared_server.url, nodes=2, limit=1) as fleet:
        await fleet.pause()
        for _ in range(4):
            fleet.acquire(1, older=10.0, tenant="a")
        for _ in range(4):
            fleet.acquire(1, tenant="b")
        # Node 0 holds nothing and waits for nothing: the setting reaches
        # the ledger all the same, and node 1 grants by it.
        fleet.nodes[0].send(SetTenant("a", Tenant(weight=2.0)))
        order = await serve_one_by_one(fleet, 1000, 6)
    # a (weight 2) gets two slots of a second for each of b's; ties go to
    # the older head, a's.
    assert order == "abaaba"


async def test_a_lost_processs_leases_give_its_tenants_slots_back(
    shared_server: RedisServer,
) -> None:
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        base_ms = math.ceil((await client.time()).timestamp() * 1000)
        # Leases of a minute on the clock set here: Redis expires the keys
        # that hold them on its own clock too, which a loaded machine may
        # move by more than a second between two steps.
        ledger = Ledger(client, uuid.uuid4().hex, 60.0, scripts=load_scripts(SET_CLOCK))
        clock = ledger.names("p")[0][0] + ":clock"
        await client.set(clock, str(base_ms))
        await ledger.set_limit("p", 2)
        await ledger.set_tenant("p", "a", Tenant(limit=2))
        lost = [member_of(n, f"gone:{n}") for n in range(1, 4)]
        first = await ledger.step(
            "p",
            "gone",
            Plan(
                enqueue=[(m, 0.0) for m in lost], meta=dict.fromkeys(lost, ("a", None))
            ),
            waiting=3,
        )
        assert first.granted == lost[:2]
        assert first.tenants["a"].in_flight == 2
        # The process is gone: nothing renews its leases or its entry.
        # Another one's request of tenant b waits meanwhile.
        waiter = member_of(9, "here:1")
        await client.set(clock, str(base_ms + 30_000))
        kept = await ledger.step(
            "p",
            "here",
            Plan(enqueue=[(waiter, 1.0)], meta={waiter: ("b", None)}),
            waiting=1,
        )
        assert kept.granted == []
        await client.set(clock, str(base_ms + 72_000))
        after = await ledger.step("p", "here", Plan(ask=[waiter]), waiting=1)
    # Its leases expired: tenant a holds nothing (its service, two slots
    # until they were pruned, stays), its entry is gone, b is served.
    assert after.granted == [waiter]
    assert (after.in_flight, after.queued) == (1, 0)
    assert after.tenants["a"].in_flight == after.tenants["a"].queued == 0
    assert after.tenants["a"].service == 2 * 72.0
    assert after.tenants["b"].in_flight == 1


async def test_a_tenants_cap_holds_across_os_processes(server: RedisServer) -> None:
    lease = 1.5
    async with (
        worker(
            "tests._fleet_worker",
            mode="hold",
            redis_url=server.url,
            namespace="tenants",
            lease=lease,
            limit=4,
            count=4,
            held=2,
            tenant="a",
            tenants={"a": [1.0, 2]},
        ) as holder,
        open_dispatcher(
            {"p": 4}, redis_url=server.url, namespace="tenants", lease=lease
        ) as dispatcher,
    ):
        with trio.fail_after(30):
            # Four requests of a, two of them held for a whole lease: the
            # cap, set by that process, for the fleet.
            assert await holder.line() == {"ready": True, "held": 2}
        order: list[str] = []

        async def request(tenant: str, started_at: float) -> None:
            async with dispatcher.slot("p", tenant=tenant, started_at=started_at):
                order.append(tenant)
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            # a's turn started first, but a holds its cap in the fleet.
            nursery.start_soon(request, "a", trio.current_time() - 60)
            await trio.sleep(0.05)
            nursery.start_soon(request, "b", trio.current_time())
            with trio.fail_after(10):
                while not order:  # noqa: ASYNC110 (state across processes)
                    await trio.sleep(0.01)
            await trio.sleep(lease / 2)
            assert order == ["b"]
            stats = dispatcher.statistics().providers["p"]
            assert (stats.in_flight, stats.limit) == (3, 4)
            assert (stats.tenants["a"].limit, stats.tenants["a"].in_flight) == (2, 2)
            # The other process dies: its leases expire, a's slots with
            # them, and a's requests (this one the oldest) get them.
            holder.process.send_signal(signal.SIGKILL)
            with trio.fail_after(lease * 3 + 5):
                while order != ["b", "a"]:  # noqa: ASYNC110 (state across processes)
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_two_dispatchers_share_a_tenants_cap_and_a_change_of_it(
    server: RedisServer,
) -> None:
    async with (
        open_dispatcher(
            {"p": 3},
            tenants={"a": Tenant(limit=1)},
            redis_url=server.url,
            namespace="caps",
        ) as first,
        open_dispatcher({"p": 3}, redis_url=server.url, namespace="caps") as second,
    ):
        granted: list[str] = []

        async def request(tenant: str, name: str) -> None:
            async with second.slot("p", tenant=tenant):
                granted.append(name)
                await trio.sleep_forever()

        async def until(count: int) -> None:
            with trio.fail_after(10):
                while len(granted) < count:  # noqa: ASYNC110 (state across dispatchers)
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            # The first dispatcher's cap for a, in the second's grants.
            nursery.start_soon(request, "a", "a1")
            await until(1)
            nursery.start_soon(request, "a", "a2")
            await trio.sleep(0.05)
            nursery.start_soon(request, "b", "b1")
            await until(2)
            await trio.sleep(0.5)
            assert granted == ["a1", "b1"]
            a = second.statistics().providers["p"].tenants["a"]
            assert (a.limit, a.in_flight, a.waiting) == (1, 1, 1)
            # Raised at run time in the first: the second's a2 goes.
            first.set_tenant("a", Tenant(limit=2))
            await until(3)
            assert granted == ["a1", "b1", "a2"]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["restart", "flushall"])
async def test_configured_tenants_are_stored_again_after_redis_comes_back_empty(
    server: RedisServer, how: str
) -> None:
    async with (
        open_dispatcher(
            {"p": 3},
            tenants={"acme": Tenant(weight=2.0, limit=1)},
            redis_url=server.url,
            namespace="restored",
            lease=LEASE,
        ),
        open_dispatcher(
            {"p": 3}, redis_url=server.url, namespace="restored", lease=LEASE
        ) as other,
    ):

        async def check() -> None:
            """The cap holds in the other process: one acme slot, no second."""
            granted: list[str] = []

            async def request(name: str) -> None:
                async with other.slot("p", tenant="acme"):
                    granted.append(name)
                    await trio.sleep_forever()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(request, "first")
                # The first grant may wait for the reconnection.
                with trio.fail_after(LEASE * 3):
                    while not granted:  # noqa: ASYNC110 (state across sockets)
                        await trio.sleep(0.01)
                nursery.start_soon(request, "second")
                await trio.sleep(0.5)
                assert granted == ["first"]
                acme = other.statistics().providers["p"].tenants["acme"]
                assert (acme.weight, acme.limit, acme.in_flight) == (2.0, 1, 1)
                nursery.cancel_scope.cancel()

        await check()
        await lose_everything(server, how)
        # Redis lost the tenants' settings with everything else: the
        # processes store them again, and the cap holds at once.
        await check()


async def test_a_processs_tenants_are_the_fleets_after_another_process_sets_them(
    server: RedisServer,
) -> None:
    async with (
        open_dispatcher(
            {"p": 3},
            tenants={"acme": Tenant(limit=1)},
            redis_url=server.url,
            namespace="view",
            lease=LEASE,
        ) as first,
        open_dispatcher(
            {"p": 3}, redis_url=server.url, namespace="view", lease=LEASE
        ) as second,
    ):
        held = 0

        async def hold() -> None:
            nonlocal held
            async with second.slot("p", tenant="acme"):
                held += 1
                await trio.sleep_forever()

        async def until(check: Callable[[], bool]) -> None:
            with trio.fail_after(LEASE * 3):
                while not check():  # noqa: ASYNC110 (state across sockets)
                    await trio.sleep(0.01)

        await until(lambda: second.tenants() == {"acme": Tenant(limit=1)})
        second.set_tenant("acme", Tenant(weight=2.0, limit=3))
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(hold)
            # The fleet grants acme three at once: the first process must
            # say so, not the cap it was opened with.
            await until(lambda: held == 3)
            await until(lambda: first.tenants() == {"acme": Tenant(2.0, 3)})
            nursery.cancel_scope.cancel()
        second.remove_tenant("acme")
        await until(lambda: first.tenants() == {})
