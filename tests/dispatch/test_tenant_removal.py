"""Removing a tenant: from any process of a fleet, and free where none is counted.

``remove_tenant`` gives a tenant the defaults again wherever it was
configured: in a fleet, a process that never configured it removes the cap
another process set. A policy that counts no tenant stays on its default
path when told to forget one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from trio_dispatch import Tenant, open_dispatcher
from trio_dispatch.lowlevel import SlotPolicy, Ticket

from .._redis import needs_redis

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Dispatcher, TenantStatistics

    from .._redis import RedisServer


def test_forgetting_a_tenant_counts_no_tenant() -> None:
    policy = SlotPolicy(1)
    assert policy.set_tenant("acme", None) == []
    assert (policy.needs_clock, policy.counts_tenants) == (False, False)
    # The default path still: one grant, the next waits in ticket order.
    assert policy.acquire(Ticket(0.0, 0)) == [Ticket(0.0, 0)]
    assert policy.acquire(Ticket(1.0, 1)) == []
    assert policy.release(Ticket(0.0, 0)) == [Ticket(1.0, 1)]
    assert policy.tenant_statistics(0.0) == {}


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
