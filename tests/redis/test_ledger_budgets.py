"""The ledger's budgets and adaptive limit, fleet-wide, against a real redis-server.

Each test drives the Lua scripts directly, as several processes (nodes)
would, and reads what the step answers and what Redis holds. Redis keeps
its own clock: the budgets here refill slowly enough (a few tokens or
requests per minute) that the milliseconds a test takes change nothing
asserted, and every wait asserted is bounded on both sides.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import AdaptiveLimit, Budget
from trio_dispatch._policy._ratelimits import Quota, RateLimitInfo
from trio_dispatch._redis._ledger import Ledger, keys_of, lease_of
from trio_dispatch._redis._scripts import Plan, Seed, load_scripts

from .._redis import SET_CLOCK, needs_redis, next_member

if TYPE_CHECKING:
    from collections.abc import Mapping

    import coredis

    from trio_dispatch._redis._ledger import StepResult

pytestmark = needs_redis


@pytest.fixture
def ledger(client: coredis.Redis[str]) -> Ledger:
    return Ledger(client, "ns", 10.0)


m = next_member


async def conf(client: coredis.Redis[str]) -> dict[str, str]:
    return dict(await client.hgetall(keys_of("ns", "p")[3]))


async def test_a_request_budget_grants_its_capacity_then_says_when_the_next_fits(
    ledger: Ledger,
) -> None:
    # 3 a minute: a request every 20 s once the bucket is empty.
    await ledger.set_budget("p", Budget(requests_per_minute=3))
    members = [m(f"a:{n}") for n in range(5)]
    result = await ledger.step(
        "p", "a", Plan(enqueue=[(x, float(n)) for n, x in enumerate(members)])
    )
    assert result.granted == members[:3]
    budget = result.budget
    assert budget is not None
    assert budget.requests_per_minute == pytest.approx(3)
    assert budget.tokens_per_minute is None
    assert budget.requests_available is not None
    assert 0 <= budget.requests_available < 0.01
    assert budget.ready_in is not None
    assert 19.5 < budget.ready_in <= 20.0
    assert budget.learned is False
    # Asking again a moment later changes nothing but the wait.
    again = await ledger.step("p", "a", Plan(ask=members[3:]))
    assert again.granted == []
    assert again.budget is not None
    assert again.budget.ready_in is not None
    assert again.budget.ready_in <= budget.ready_in


async def test_nobody_passes_a_head_the_token_budget_cannot_hold_yet(
    ledger: Ledger,
) -> None:
    # 1,000 tokens a minute: about 16.7 a second.
    await ledger.set_budget("p", Budget(tokens_per_minute=1000))
    b1 = m("b:1")
    first = await ledger.step("p", "b", Plan(enqueue=[(b1, 0.0)], costs={b1: 600}))
    assert first.granted == [b1]
    # a's request is older than b's next one, and does not fit yet.
    a1, b2 = m("a:1"), m("b:2")
    blocked = await ledger.step("p", "a", Plan(enqueue=[(a1, 1.0)], costs={a1: 500}))
    assert blocked.granted == []
    assert blocked.budget is not None
    assert blocked.budget.ready_in is not None
    # 100 tokens at 1000/60 a second, less what refilled since the grant.
    assert 3.0 < blocked.budget.ready_in <= 6.0
    small = await ledger.step("p", "b", Plan(enqueue=[(b2, 2.0)], costs={b2: 100}))
    assert small.granted == []  # it would fit, but a's head comes first
    # b's first request used far less than charged: the tokens come back,
    # and a's head fits.
    await ledger.step("p", "b", Plan(usage=[("b:1", 100)]), waiting=1)
    granted = await ledger.step("p", "a", Plan(ask=[a1]))
    assert granted.granted == [a1]
    then = await ledger.step("p", "b", Plan(ask=[b2]))
    assert then.granted == [b2]
    assert then.budget is not None
    assert then.budget.tokens_available is not None
    # 1000 - 100 (b:1, corrected) - 500 - 100, plus what refilled meanwhile
    # (16.7 a second).
    assert 300 <= then.budget.tokens_available < 350


async def test_another_process_entry_ahead_keeps_its_cost_until_it_asks(
    ledger: Ledger,
) -> None:
    await ledger.set_limit("p", 5)
    await ledger.set_budget("p", Budget(tokens_per_minute=1000))
    # b's entry is older and fits; b has not asked since it was queued
    # (its first step was paused out of grants).
    await ledger.pause("p", 0.3, default_pause=1.0, max_pause=60.0)
    b1 = m("b:1")
    paused = await ledger.step("p", "b", Plan(enqueue=[(b1, 0.0)], costs={b1: 700}))
    assert paused.granted == []
    await ledger.resume("p")
    a1 = m("a:1")
    # 1000 - 700 reserved for b: a's 400 must wait, though the bucket holds it.
    result = await ledger.step("p", "a", Plan(enqueue=[(a1, 1.0)], costs={a1: 400}))
    assert result.granted == []
    assert result.budget is not None
    assert result.budget.tokens_available == pytest.approx(1000, abs=1)
    assert (await ledger.step("p", "b", Plan(ask=[b1]))).granted == [b1]


async def test_usage_reports_are_idempotent_and_need_a_held_lease(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await ledger.set_budget("p", Budget(tokens_per_minute=600))
    a1 = m("a:1")
    assert (
        await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 500}))
    ).granted == [a1]
    once = await ledger.step("p", "a", Plan(usage=[("a:1", 580)]))
    twice = await ledger.step("p", "a", Plan(usage=[("a:1", 580)]))
    assert once.budget is not None
    assert twice.budget is not None
    assert once.budget.tokens_available is not None
    assert twice.budget.tokens_available is not None
    # 600 - 580, refilling 10 a second: sent twice, charged once (twice
    # would have taken 80 more, down to 0).
    assert 20 <= once.budget.tokens_available < 40
    assert twice.budget.tokens_available >= once.budget.tokens_available
    # Given back in the same step as its report: the report still counts,
    # and the lease leaves nothing behind.
    a2 = m("a:2")
    await ledger.step("p", "a", Plan(enqueue=[(a2, 1.0)], costs={a2: 5}))
    assert await client.hget(keys_of("ns", "p")[8], "a:1") == "580"
    await ledger.step("p", "a", Plan(usage=[("a:1", 0)], release=["a:1"]))
    assert await client.hget(keys_of("ns", "p")[8], "a:1") is None
    late = await ledger.step("p", "a", Plan(usage=[("a:1", 0)]))
    assert late.budget is not None
    assert late.budget.tokens_available is not None
    # 800 came back once (the report at release), not twice.
    assert 595 <= late.budget.tokens_available <= 600


async def test_learned_figures_lower_the_level_less_what_the_server_has_not_seen(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    info = RateLimitInfo(requests=Quota(limit=100, remaining=3, reset=60.0))
    first = await ledger.step("p", "a", observed=info)
    assert first.budget is not None
    assert first.budget.learned is True
    assert first.budget.requests_available == pytest.approx(3, abs=0.01)
    # (100 - 3) / 60 s refill: slower than 100 a minute, so learned so.
    assert first.budget.requests_per_minute == pytest.approx(97)
    a1, a2, a3 = m("a:1"), m("a:2"), m("a:3")
    two = await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0), (a2, 1.0)]))
    assert two.granted == [a1, a2]
    # The same figures again: the two requests granted have no answer yet,
    # so the server may not have counted them: 3 - 2 left.
    again = await ledger.step("p", "a", Plan(enqueue=[(a3, 2.0)]), observed=info)
    assert again.granted == [a3]
    b1 = m("b:1")
    out = await ledger.step("p", "b", Plan(enqueue=[(b1, 3.0)]))
    assert out.granted == []
    assert out.budget is not None
    assert out.budget.ready_in is not None
    # Once answered, they count as seen by the server: no longer held.
    unanswered = keys_of("ns", "p")[9]
    assert await client.zcard(unanswered) == 3
    await ledger.step("p", "a", Plan(answered=["a:1", "a:2"]))
    assert await client.zrange(unanswered, 0, -1) == ("a:3",)


async def test_malformed_figures_teach_nothing(ledger: Ledger) -> None:
    for quota in (
        Quota(limit=0, remaining=0),
        Quota(limit=10**18, remaining=10**18),
        Quota(),
    ):
        result = await ledger.step(
            "p", "a", observed=RateLimitInfo(requests=quota, tokens=quota)
        )
        assert result.budget is None


async def test_a_configured_budget_keeps_its_rate_and_figures_only_lower_it(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await ledger.set_budget("p", Budget(requests_per_minute=50))
    info = RateLimitInfo(requests=Quota(limit=1000, remaining=10, reset=1.0))
    result = await ledger.step("p", "a", observed=info)
    assert result.budget is not None
    assert result.budget.requests_per_minute == pytest.approx(50)
    assert result.budget.requests_available == pytest.approx(10, abs=0.01)
    # A process opening with no configured request budget turns it into a
    # learned one, which the next figures rebuild.
    await ledger.set_budget("p", Budget())
    assert "r_cap" not in await conf(client)
    relearned = await ledger.step("p", "a", observed=info)
    assert relearned.budget is not None
    assert relearned.budget.requests_per_minute == pytest.approx(1000)


async def test_a_new_configured_budget_keeps_the_level_below_its_capacity(
    ledger: Ledger,
) -> None:
    await ledger.set_budget("p", Budget(tokens_per_minute=10_000))
    a1 = m("a:1")
    await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 9_000}))
    await ledger.set_budget("p", Budget(tokens_per_minute=5_000))
    result = await ledger.step("p", "a")
    assert result.budget is not None
    assert result.budget.tokens_per_minute == pytest.approx(5_000)
    assert result.budget.tokens_available is not None
    # Kept (plus what refilled meanwhile, 167 a second), not filled to 5,000.
    assert 1_000 <= result.budget.tokens_available < 1_500
    await ledger.set_budget("p", Budget(tokens_per_minute=500))
    lower = await ledger.step("p", "a")
    assert lower.budget is not None
    assert lower.budget.tokens_available == pytest.approx(500)


async def test_unlimited_providers_grant_in_order_within_their_budget(
    ledger: Ledger,
) -> None:
    await ledger.set_limit("p", None)
    await ledger.set_budget("p", Budget(requests_per_minute=2))
    a = [m(f"a:{n}") for n in range(3)]
    result = await ledger.step(
        "p", "a", Plan(enqueue=[(a[2], 0.0), (a[0], 1.0), (a[1], 2.0)])
    )
    assert result.granted == [a[2], a[0]]
    assert result.limit is None


async def test_an_adaptive_limit_grows_on_successes_in_use_and_shrinks_per_round(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    spec = AdaptiveLimit(initial=4, minimum=2, maximum=6, backoff=0.5)
    assert await ledger.set_limit("p", spec) == 4
    members = [m(f"a:{n}") for n in range(4)]
    result = await ledger.step(
        "p", "a", Plan(enqueue=[(x, float(n)) for n, x in enumerate(members)])
    )
    assert result.granted == members
    assert result.adaptive == (2, 6, 0.5, "rate_limits")
    # Granted with at least half of the limit in use: the 2nd, 3rd, 4th.
    in_use = set(await client.smembers(keys_of("ns", "p")[10]))
    assert in_use == {"a:1", "a:2", "a:3"}
    # A success of the first (not in use) moves nothing; of the second,
    # one up (slow start); a cancelled holder's end is no success.
    assert (await ledger.step("p", "a", Plan(release=["a:0"]))).limit == 4
    assert (await ledger.step("p", "a", Plan(release=["a:1"]))).limit == 5
    assert (
        await ledger.step("p", "a", Plan(spoil=["a:2"], release=["a:2"]))
    ).limit == 5
    # A rate limit: the limit halves, and the slot held across it is no
    # success when it ends. (Pauses of a millisecond: a delay of 0 names
    # none, and would back off for a second.)
    await ledger.pause("p", 0.001, default_pause=1.0, max_pause=60.0)
    assert (await ledger.step("p", "a")).limit == 2
    # A second report with no grant since shares the round.
    await ledger.pause("p", 0.001, default_pause=1.0, max_pause=60.0)
    assert (await ledger.step("p", "a", Plan(release=["a:3"]))).limit == 2
    await trio.sleep(0.01)
    stored = await conf(client)
    assert stored["a_slow"] == "0"
    assert float(stored["a_val"]) == pytest.approx(2.5)  # 5 x 0.5, shown as 2
    # Past the slow start: 1 / limit per success, about one per round trip
    # of the whole limit.
    b = [m(f"b:{n}") for n in range(2)]
    assert (
        await ledger.step("p", "b", Plan(enqueue=[(b[0], 10.0), (b[1], 11.0)]))
    ).granted == b
    assert (await ledger.step("p", "b", Plan(release=["b:0"]))).limit == 3  # 2.5 + 1/2
    assert (await ledger.step("p", "b", Plan(release=["b:1"]))).limit == 3  # + 1/3
    assert float((await conf(client))["a_val"]) == pytest.approx(3 + 1 / 3)


async def test_an_adaptive_limit_stays_within_its_bounds(ledger: Ledger) -> None:
    await ledger.set_limit("p", AdaptiveLimit(initial=2, minimum=2, maximum=3))
    for _ in range(4):
        await ledger.pause("p", 0.001, default_pause=1.0, max_pause=60.0)
        await trio.sleep(0.01)
        x = m("a:x")
        await ledger.step("p", "a", Plan(enqueue=[(x, 0.0)]))
        await ledger.step("p", "a", Plan(release=[lease_of(x)]))
    assert (await ledger.step("p", "a")).limit == 2
    for n in range(6):
        x, y = m(f"b:{2 * n}"), m(f"b:{2 * n + 1}")
        await ledger.step("p", "b", Plan(enqueue=[(x, 0.0), (y, 0.0)]))
        await ledger.step("p", "b", Plan(release=[lease_of(x), lease_of(y)]))
    assert (await ledger.step("p", "b")).limit == 3


async def test_a_fixed_limit_replaces_an_adaptive_one_and_a_seed_restores_it(
    client: coredis.Redis[str], ledger: Ledger
) -> None:
    await ledger.set_limit("p", AdaptiveLimit(initial=3, maximum=5))
    assert (await ledger.step("p", "a")).adaptive == (1, 5, 0.9, "rate_limits")
    await ledger.set_limit("p", 7)
    fixed = await ledger.step("p", "a")
    assert (fixed.limit, fixed.adaptive) == (7, None)
    assert not {"a_min", "a_max", "a_val"} & set(await conf(client))
    # Redis restarted empty: a process's seed brings the adaptive limit back.
    await client.flushall()
    seeded = await ledger.step(
        "p", "a", seed=Seed(limit=AdaptiveLimit(initial=4, minimum=2, maximum=5))
    )
    assert (seeded.limit, seeded.adaptive) == (4, (2, 5, 0.9, "rate_limits"))
    # A limit stored wins over a seed.
    assert (await ledger.step("p", "a", seed=Seed(limit=9))).limit == 4
    assert await ledger.set_limit("p", AdaptiveLimit(initial=2, maximum=3)) == 2
    kept = await ledger.set_limit("p", 6, overwrite=False)
    assert kept == 2


async def test_expired_leases_and_entries_leave_no_budget_bookkeeping(
    client: coredis.Redis[str],
) -> None:
    # Leases of a minute on a clock the test sets: the keys that hold them,
    # which Redis expires on its own clock, outlive the test however
    # loaded the machine is.
    base = math.ceil((await client.time()).timestamp() * 1000)
    short = Ledger(client, "ns", 60.0, scripts=load_scripts(SET_CLOCK))
    clock = short.names("p")[0][0] + ":clock"
    await client.set(clock, str(base))
    await short.set_budget("p", Budget(tokens_per_minute=1000))
    await short.set_limit("p", AdaptiveLimit(initial=2, maximum=4))
    a1, a2, a3 = m("a:1"), m("a:2"), m("a:3")
    result = await short.step(
        "p",
        "a",
        Plan(enqueue=[(a1, 0.0), (a2, 1.0), (a3, 2.0)], costs={a1: 10, a2: 10, a3: 10}),
    )
    assert result.granted == [a1, a2]
    keys = keys_of("ns", "p")
    assert await client.hlen(keys[7]) == 1  # a3's cost, queued
    assert await client.hlen(keys[8]) == 2  # the charges
    assert await client.zcard(keys[9]) == 2  # unanswered
    assert await client.scard(keys[10]) == 2  # in use
    # The process vanishes; a later step of another, once its leases and
    # its entry have run out, prunes it all.
    await client.set(clock, str(base + 60_001))
    after = await short.step("p", "b")
    assert (after.in_flight, after.queued) == (0, 0)
    for key in keys[7:9]:
        assert await client.hlen(key) == 0
    for key in keys[9:11]:
        assert await client.scard(key) == 0


# -- learning as Bucket.learn does it (the same figures as test_learned_pace) --


def per_day(limit: int, remaining: int) -> RateLimitInfo:
    """Figures whose reset claims a day."""
    return RateLimitInfo(
        requests=Quota(limit=limit, remaining=remaining, reset=86_400.0)
    )


async def test_a_reset_of_a_day_cannot_stall_a_learned_pace(ledger: Ledger) -> None:
    result = await ledger.step("p", "a", observed=per_day(100, 99))
    assert result.budget is not None
    # Not 1 request a day: the whole limit within an hour at the slowest.
    assert result.budget.requests_per_minute == pytest.approx(100 / 60)
    info = RateLimitInfo(requests=Quota(limit=100, remaining=50, reset=1200.0))
    believed = await ledger.step("p", "a", observed=info)
    assert believed.budget is not None
    assert believed.budget.requests_per_minute == pytest.approx(2.5)


async def test_the_newest_answer_sets_the_level_and_an_older_one_only_lowers_it(
    ledger: Ledger,
) -> None:
    full = RateLimitInfo(requests=Quota(limit=100, remaining=100, reset=0.0))
    await ledger.step("p", "a", observed=full)
    for n in range(4):
        # One after the other: granted in the same millisecond, they would
        # all count as unseen (which reached the server first is unknown).
        await trio.sleep(0.005)
        x = m(f"a:{n}")
        assert (await ledger.step("p", "a", Plan(enqueue=[(x, float(n))]))).granted == [
            x
        ]
    # The third answer starts: the server counted it and the two granted
    # before it; only the fourth may not have reached it yet.
    third = await ledger.step(
        "p", "a", Plan(answered=["a:2"]), observed=per_day(100, 97)
    )
    assert third.budget is not None
    assert third.budget.requests_available == pytest.approx(96, abs=0.01)
    # The first answer comes late: older figures, which cannot raise it.
    first = await ledger.step(
        "p", "a", Plan(answered=["a:0"]), observed=per_day(100, 99)
    )
    assert first.budget is not None
    assert first.budget.requests_available == pytest.approx(96, abs=0.01)
    # The newest answer raises it again, up to the limit.
    last = await ledger.step(
        "p", "a", Plan(answered=["a:3"]), observed=per_day(100, 10**6)
    )
    assert last.budget is not None
    assert last.budget.requests_available == pytest.approx(100, abs=0.01)
    # Figures with no answer only lower it.
    unpaired = await ledger.step("p", "a", observed=per_day(100, 99))
    assert unpaired.budget is not None
    assert unpaired.budget.requests_available == pytest.approx(99, abs=0.01)


async def test_a_configured_budget_is_raised_by_the_newest_answer_up_to_its_own_count(
    ledger: Ledger,
) -> None:
    await ledger.set_budget("p", Budget(requests_per_minute=60))
    for n in range(2):
        await trio.sleep(0.005)
        x = m(f"a:{n}")
        assert (await ledger.step("p", "a", Plan(enqueue=[(x, float(n))]))).granted == [
            x
        ]
    # A server that counted more than the budget did lowers the level...
    low = await ledger.step("p", "a", Plan(answered=["a:0"]), observed=per_day(600, 5))
    assert low.budget is not None
    assert low.budget.requests_available == pytest.approx(4, abs=0.5)
    # ...and a newer answer lifts it back, never past the budget's own
    # count: 60, less the 2 granted.
    high = await ledger.step(
        "p", "a", Plan(answered=["a:1"]), observed=per_day(600, 500)
    )
    assert high.budget is not None
    assert high.budget.requests_per_minute == pytest.approx(60)
    # (Refilled by a second's sixtieth a millisecond meanwhile.)
    assert high.budget.requests_available == pytest.approx(58, abs=0.5)


async def test_leases_granted_in_the_same_millisecond_count_as_unseen(
    ledger: Ledger,
) -> None:
    full = RateLimitInfo(requests=Quota(limit=100, remaining=100, reset=0.0))
    await ledger.step("p", "a", observed=full)
    members = [m(f"a:{n}") for n in range(4)]
    result = await ledger.step(
        "p", "a", Plan(enqueue=[(x, float(n)) for n, x in enumerate(members)])
    )
    assert result.granted == members
    third = await ledger.step(
        "p", "a", Plan(answered=["a:2"]), observed=per_day(100, 97)
    )
    assert third.budget is not None
    assert third.budget.requests_available == pytest.approx(94, abs=0.01)
    fourth = await ledger.step(
        "p", "a", Plan(answered=["a:3"]), observed=per_day(100, 99)
    )
    assert fourth.budget is not None
    assert fourth.budget.requests_available == pytest.approx(94, abs=0.01)


def tokens_left(remaining: int) -> RateLimitInfo:
    return RateLimitInfo(tokens=Quota(limit=6000, remaining=remaining, reset=0.0))


async def test_a_charge_the_newest_figures_counted_gives_nothing_back(
    ledger: Ledger,
) -> None:
    await ledger.step("p", "a", observed=tokens_left(6000))
    await trio.sleep(0.005)
    a1 = m("a:1")
    granted = await ledger.step("p", "a", Plan(enqueue=[(a1, 0.0)], costs={a1: 1000}))
    assert granted.granted == [a1]
    # The bucket refills at 6000 tokens a minute on the server's clock while
    # the steps run: a loaded machine may take a while between them, so each
    # figure is bounded by what can have refilled since the figures came.
    seen_at = trio.current_time()
    # The server charged its own estimate, 1100: its figures say so.
    seen = await ledger.step(
        "p", "a", Plan(answered=["a:1"]), observed=tokens_left(4900)
    )
    assert seen.budget is not None
    tokens = seen.budget.tokens_available
    assert tokens is not None
    assert 4899 <= tokens <= refilled(4900, seen_at)
    # 300 used: what the server gives back, its next figures will say.
    used = await ledger.step("p", "a", Plan(usage=[("a:1", 300)]))
    assert used.budget is not None
    tokens = used.budget.tokens_available
    assert tokens is not None
    assert 4899 <= tokens <= refilled(4900, seen_at)
    # More than charged: the excess is taken.
    more = await ledger.step("p", "a", Plan(usage=[("a:1", 1500)]))
    assert more.budget is not None
    tokens = more.budget.tokens_available
    assert tokens is not None
    assert 3699 <= tokens <= refilled(3700, seen_at)


def refilled(tokens: float, since: float) -> float:
    """The most a bucket of 6000 tokens a minute holds, ``tokens`` at ``since``."""
    return tokens + 1 + 100 * (trio.current_time() - since)


async def test_answers_reported_in_one_step_count_as_unseen_but_the_last(
    ledger: Ledger,
) -> None:
    full = RateLimitInfo(requests=Quota(limit=100, remaining=100, reset=0.0))
    await ledger.step("p", "a", observed=full)
    for n in range(3):
        await trio.sleep(0.005)
        x = m(f"a:{n}")
        assert (await ledger.step("p", "a", Plan(enqueue=[(x, float(n))]))).granted == [
            x
        ]
    # The figures are the last answer's; the two others may have reached
    # the server after it.
    result = await ledger.step(
        "p", "a", Plan(answered=["a:0", "a:1", "a:2"]), observed=per_day(100, 97)
    )
    assert result.budget is not None
    assert result.budget.requests_available == pytest.approx(95, abs=0.01)


# Learned model budgets are forgotten once idle and full, on a clock the
# test sets (Redis forgets their keys at the same instant of its own).


class Clocked:
    """A ledger whose scripts read a clock the test sets, in ms from ``base``."""

    def __init__(self, client: coredis.Redis[str], base: int) -> None:
        self.client = client
        self.base = base
        self.ledger = Ledger(client, "ns", 3600.0, scripts=load_scripts(SET_CLOCK))

    async def at(self, ms: int) -> None:
        await self.client.set(
            self.ledger.names("p")[0][0] + ":clock", str(self.base + ms)
        )

    async def step(
        self,
        plan: Plan | None = None,
        *,
        observed_models: Mapping[str, RateLimitInfo] | None = None,
    ) -> StepResult:
        return await self.ledger.step(
            "p", "a", Plan() if plan is None else plan, observed_models=observed_models
        )


@pytest.fixture
async def clocked(client: coredis.Redis[str]) -> Clocked:
    base = math.ceil((await client.time()).timestamp() * 1000)
    clocked = Clocked(client, base)
    await clocked.at(0)
    await clocked.ledger.set_limit("p", 1)
    return clocked


def per_minute(limit: int, remaining: int) -> RateLimitInfo:
    return RateLimitInfo(requests=Quota(limit=limit, remaining=remaining))


def of(model: str, member: str) -> dict[str, tuple[str | None, str | None]]:
    return {member: (None, model)}


async def test_a_learned_model_budget_is_forgotten_once_idle_for_a_while_and_full(
    clocked: Clocked, client: coredis.Redis[str]
) -> None:
    # Half of 10 a minute left: full again 30 s later.
    shown = await clocked.step(observed_models={"m": per_minute(10, 5)})
    assert shown.models["m"].idle == 0.0
    x = m("a:1")
    shown = await clocked.step(Plan(enqueue=[(x, 0.0)], meta=of("m", x)))
    assert shown.granted == [x]
    assert shown.models["m"].idle is None  # in use
    await clocked.at(1000)
    shown = await clocked.step(Plan(release=[lease_of(x)]))
    budget = shown.models["m"]
    assert budget.idle == 0.0
    assert not budget.forgotten(59.75)
    assert budget.forgotten(60.0)  # by the pure core's rule
    # Redis forgets its keys at that instant too.
    keys = [f"{{ns:p}}:{k}:m" for k in ("m", "mc", "mu")]
    expiry = await client.pexpiretime(keys[0])
    assert round(expiry.timestamp() * 1000) == clocked.base + 61_000
    await clocked.at(61_000)
    y = m("a:2")
    shown = await clocked.step(Plan(enqueue=[(y, 0.0)], meta=of("m", y)))
    assert shown.granted == [y]
    assert shown.forgotten == ["m"]
    assert shown.models == {}  # granted with no budget of its model
    assert await client.exists(keys) == 0
    # Its next figures learn it afresh.
    shown = await clocked.step(observed_models={"m": per_minute(20, 15)})
    budget = shown.models["m"]
    assert (budget.requests_capacity, budget.requests_available) == (20.0, 15.0)
    assert budget.learned


async def test_a_configured_model_budget_is_never_forgotten_fleet_wide(
    clocked: Clocked, client: coredis.Redis[str]
) -> None:
    await clocked.ledger.set_budget("p", Budget(requests_per_minute=10), model="c")
    await clocked.step(observed_models={"c": per_minute(10, 10)})
    assert await client.pttl("{ns:p}:m:c") == -1  # persists
    await clocked.at(36_000_000)  # ten hours on
    x = m("a:1")
    shown = await clocked.step(Plan(enqueue=[(x, 0.0)], meta=of("c", x)))
    assert shown.granted == [x]
    assert shown.forgotten == []
    assert shown.models["c"].requests_available == pytest.approx(9.0)


async def test_a_model_with_waiters_is_never_forgotten_fleet_wide(
    clocked: Clocked,
) -> None:
    await clocked.step(observed_models={"w": per_minute(10, 10)})
    other, waiter = m("a:1"), m("a:2")
    shown = await clocked.step(Plan(enqueue=[(other, 0.0)]))
    assert shown.granted == [other]
    shown = await clocked.step(Plan(enqueue=[(waiter, 1.0)], meta=of("w", waiter)))
    assert shown.granted == []
    assert shown.models["w"].idle is None
    await clocked.at(1_800_000)  # half an hour on (within a lease), waiting
    shown = await clocked.step(Plan(release=[lease_of(other)], ask=[waiter]))
    assert shown.granted == [waiter]
    assert shown.forgotten == []
    assert shown.models["w"].requests_available == pytest.approx(9.0)
