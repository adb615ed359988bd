"""What the ledger leaves in Redis: nothing that grows, nothing idle for ever.

Bookkeeping (leases, queue entries, processes, the estimates and charges of
requests) goes with what it tracks, and expires once nobody uses the
provider; a stored limit and a configured budget persist, as documented;
an unlimited provider leaves nothing behind. Counted on a real
redis-server with ``HLEN``, ``TTL`` and the keys that are left (``KEYS``
skips expired keys that Redis has not reclaimed yet).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from trio_dispatch import Budget, Quota, RateLimitInfo, open_dispatcher
from trio_dispatch._redis._ledger import Ledger, keys_of
from trio_dispatch._redis._scripts import Plan

from .._helpers import unknown_provider
from .._redis import needs_redis, next_member

if TYPE_CHECKING:
    import coredis

    from .._redis import RedisServer

pytestmark = needs_redis

m = next_member
LEASE = 0.5


async def left(client: coredis.Redis[str], namespace: str) -> set[str]:
    """The keys of ``namespace`` that are still there."""
    return set(await client.keys(f"{{{namespace}:*"))


async def test_estimates_leave_nothing_behind_without_a_budget(
    client: coredis.Redis[str],
) -> None:
    ledger = Ledger(client, "ns", 10.0)
    await ledger.set_limit("p", 4)
    for n in range(500):
        member = m(f"a:{n}")
        granted = await ledger.step(
            "p", "a", Plan(enqueue=[(member, 0.0)], costs={member: 100})
        )
        assert granted.granted == [member]
        await ledger.step("p", "a", Plan(release=[f"a:{n}"]))
    qcost, charge = keys_of("ns", "p")[7], keys_of("ns", "p")[8]
    assert await client.hlen(qcost) == 0
    assert await client.hlen(charge) == 0


async def test_estimates_and_charges_leave_nothing_behind_with_a_budget(
    client: coredis.Redis[str],
) -> None:
    ledger = Ledger(client, "ns", 10.0)
    await ledger.set_budget("p", Budget(tokens_per_minute=10**9))
    for n in range(300):
        member = m(f"a:{n}")
        await ledger.step("p", "a", Plan(enqueue=[(member, 0.0)], costs={member: 100}))
        await ledger.step("p", "a", Plan(usage=[(f"a:{n}", 50)], release=[f"a:{n}"]))
    keys = keys_of("ns", "p")
    lengths = {
        "qcost": await client.hlen(keys[7]),
        "charge": await client.hlen(keys[8]),
        "unans": await client.scard(keys[9]),
    }
    assert lengths == {"qcost": 0, "charge": 0, "unans": 0}


async def test_bookkeeping_expires_with_the_last_process_and_the_limit_stays(
    client: coredis.Redis[str],
) -> None:
    ledger = Ledger(client, "ns", 10.0)
    await ledger.set_limit("p", 1)
    a1, b1 = m("a:1"), m("b:1")
    await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 5}))
    await ledger.step("p", "b", Plan(enqueue=[(b1, 1.0)], costs={b1: 5}), waiting=1)
    keys = keys_of("ns", "p")
    ttls = {key.rpartition(":")[2]: await client.pttl(key) for key in keys}
    assert ttls.pop("conf") == -1
    # Those that exist live as long as the latest process, no longer.
    present = {name: ttl for name, ttl in ttls.items() if ttl != -2}
    assert set(present) == {"leases", "queue", "qexp", "nodes", "nwait", "qcost"}
    assert all(9_000 < ttl <= 10_000 for ttl in present.values()), present


async def test_a_stored_limit_and_a_configured_budget_persist_when_idle(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    async with open_dispatcher(
        {"p": 2},
        redis_url=server.url,
        namespace="idle",
        lease=LEASE,
        budgets={"p": Budget(tokens_per_minute=6000)},
    ) as dispatcher:
        for _ in range(20):
            async with dispatcher.slot("p", tokens=10):
                pass
    await trio.sleep(LEASE + 0.3)
    assert await left(client, "idle") == {"{idle:p}:conf"}
    assert await client.pttl("{idle:p}:conf") == -1
    conf = await client.hgetall("{idle:p}:conf")
    assert (conf["limit"], conf["t_cap"], conf["t_cfg"]) == ("2", "6000", "1")


async def test_unlimited_providers_leave_nothing_behind(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    async with open_dispatcher(
        redis_url=server.url, namespace="names", lease=LEASE
    ) as dispatcher:
        for n in range(50):
            with unknown_provider(f"model-{n}"):
                async with dispatcher.slot(f"model-{n}", tokens=10):
                    pass
        # Learned figures of one of them, and a rate limit of another.
        dispatcher.observe_rate_limits(
            "model-0", RateLimitInfo(requests=Quota(limit=100, remaining=50))
        )
        dispatcher.report_rate_limit("model-1", retry_after=0.2)
        async with dispatcher.slot("model-0"):
            pass
        assert len(await left(client, "names")) > 50
    await trio.sleep(LEASE + 0.3)
    assert await left(client, "names") == set()
