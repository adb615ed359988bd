"""Absurd token counts and damaged stored values, against a real redis-server.

The ledger's scripts apply the pure core's rule to the fleet's buckets: one
request's charge, estimated or reported, is at most its budget's capacity,
a charge takes the level down to 0 at most, and no estimate or usage report
makes a budget wait longer than one full refill. Numbers cross between Lua
and Python as digits (never in Lua's 14-digit exponent form), and a value
stored out of range is repaired by the next script, never passed on.

Redis keeps its own clock, so levels and waits are asserted within the few
tokens the milliseconds of a test refill.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import httpx2
import pytest
import trio

from trio_dispatch import Budget, open_dispatcher
from trio_dispatch._redis._ledger import Ledger, keys_of
from trio_dispatch._redis._scripts import Plan, Seed

from .._redis import needs_redis, next_member

if TYPE_CHECKING:
    import coredis

    from .._redis import RedisServer

pytestmark = needs_redis

m = next_member
URL = "https://llm.test/v1/chat/completions"
CONF = keys_of("ns", "p")[3]
CHARGE = keys_of("ns", "p")[8]


@pytest.fixture
def ledger(client: coredis.Redis[str]) -> Ledger:
    return Ledger(client, "ns", 10.0)


async def test_an_absurd_estimate_is_charged_the_capacity_and_waits_one_refill(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    # 600 tokens a minute: 10 a second, a full refill in 60 s.
    await ledger.set_budget("p", Budget(tokens_per_minute=600))
    a1, a2 = m("a:1"), m("a:2")
    first = await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 10**16}))
    assert first.granted == [a1]
    assert first.budget is not None
    assert first.budget.tokens_available is not None
    assert 0 <= first.budget.tokens_available < 5
    assert await client.hget(CHARGE, "a:1") == "600"
    # Python's ints have no bound; the scripts take them all the same.
    second = await ledger.step("p", "a", Plan(enqueue=[(a2, 1.0)], costs={a2: 10**400}))
    assert second.granted == []
    assert second.budget is not None
    assert second.budget.ready_in is not None
    assert 59 < second.budget.ready_in <= 60
    level = float(await client.hget(CONF, "t_lvl") or "nan")
    assert 0 <= level < 5


async def test_an_absurd_usage_report_empties_the_bucket_and_no_more(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await ledger.set_budget("p", Budget(tokens_per_minute=600))
    a1, a2 = m("a:1"), m("a:2")
    await ledger.step(
        "p", "a", Plan(enqueue=[(a1, 0.0), (a2, 1.0)], costs={a1: 100, a2: 100})
    )
    reported = await ledger.step(
        "p", "a", Plan(usage=[("a:1", 10**16), ("a:2", 10**16)])
    )
    assert reported.budget is not None
    assert reported.budget.tokens_available is not None
    assert 0 <= reported.budget.tokens_available < 5
    assert await client.hget(CHARGE, "a:1") == "600"
    # Used 10 after all: 590 back.
    back = await ledger.step("p", "a", Plan(usage=[("a:1", 10)]))
    assert back.budget is not None
    assert back.budget.tokens_available is not None
    assert 590 <= back.budget.tokens_available < 600


async def test_stored_values_out_of_range_are_repaired_not_passed_on(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await ledger.set_budget("p", Budget(tokens_per_minute=600, requests_per_minute=60))
    a1 = m("a:1")
    await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 100}))
    # What an older version, or a hand, may have left there.
    await client.hset(
        CONF,
        {
            "t_lvl": "-9.2233720368547758e+18",
            "t_at": "1e300",
            "r_lvl": "nan",
            "r_rate": "-1",
            "pause_until": "not a number",
        },
    )
    await client.hset(CHARGE, {"a:1": "inf"})
    await client.hset(keys_of("ns", "p")[7], {"x": "1e400"})
    result = await ledger.step("p", "a", Plan(usage=[("a:1", 50)]))
    budget = result.budget
    assert budget is not None
    assert budget.tokens_available is not None
    assert budget.requests_available is not None
    assert budget.requests_per_minute is not None
    assert -600 <= budget.tokens_available <= 600
    assert 0 <= budget.requests_available <= 60
    assert budget.requests_per_minute == pytest.approx(60)
    assert result.paused_for == 0
    stored = await client.hgetall(CONF)
    assert -600 <= float(stored["t_lvl"]) <= 600
    assert 0 <= float(stored["r_lvl"]) <= 60
    assert float(stored["t_at"]) <= result.server_time * 1000
    # And the next step, of any process, goes on from the repaired values.
    b1 = m("b:1")
    assert (await ledger.step("p", "b", Plan(enqueue=[(b1, 2.0)]))).budget is not None


async def test_a_dispatcher_survives_an_absurd_estimate_and_so_does_the_fleet(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": 2},
                    redis_url=server.url,
                    namespace="bounds",
                    budgets={"p": Budget(tokens_per_minute=6000)},
                )
            )
            for _ in range(2)
        ]
        with trio.fail_after(5):
            async with one.slot("p", tokens=10**16):
                pass
            budget = one.statistics().providers["p"].budget
            assert budget is not None
            assert budget.tokens_available is not None
            assert 0 <= budget.tokens_available <= 6000
            # 100 tokens a second refill: another process's small request
            # is granted within a second, not in 175,000 years.
            async with two.slot("p", tokens=50):
                pass
            async with one.slot("p", tokens=50):
                pass
        stats = two.statistics().providers["p"]
        assert stats.granted_total == 1
        assert stats.budget is not None
        assert stats.budget.tokens_available is not None
        assert -6000 <= stats.budget.tokens_available <= 6000


async def test_an_sdk_call_with_an_absurd_max_tokens_through_the_transport(
    server: RedisServer,
) -> None:
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10**15,
        }
    ).encode()

    def handle(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={"choices": []})

    async with open_dispatcher(
        {"openai": 2},
        redis_url=server.url,
        namespace="sdk",
        budgets={"openai": Budget(tokens_per_minute=6000)},
    ) as dispatcher:
        transport = dispatcher.transport("openai", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            with trio.fail_after(5):
                first = await client.post(URL, content=body)
                budget = dispatcher.statistics().providers["openai"].budget
                assert budget is not None
                assert budget.tokens_available is not None
                assert 0 <= budget.tokens_available <= 6000
                # Charged a whole minute's budget at most, so the bucket is
                # empty, not in debt: a small call waits for its own tokens
                # (a few, 100 a second), no more.
                small = {"model": "m", "messages": [], "max_tokens": 1}
                second = await client.post(URL, json=small)
        assert (first.status_code, second.status_code) == (200, 200)
        assert dispatcher.statistics().providers["openai"].granted_total == 2


async def test_a_damaged_stored_limit_is_replaced_not_passed_on(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await client.hset(CONF, {"limit": "9.9999999999999e+18"})
    # Opening stores its limit where none is usable.
    assert await ledger.set_limit("p", 3, overwrite=False) == 3
    await client.hset(CONF, {"limit": "garbage"})
    a1 = m("a:1")
    result = await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)]), seed=Seed(limit=2))
    assert (result.limit, result.granted) == (2, [a1])
    await client.hset(CONF, {"limit": "0"})
    # With no limit to put in its place: unlimited, as with none stored.
    b1 = m("b:1")
    unlimited = await ledger.step("p", "b", Plan(enqueue=[(b1, 0.0)]))
    assert (unlimited.limit, unlimited.granted) == (None, [b1])
    assert await client.hget(CONF, "limit") is None
