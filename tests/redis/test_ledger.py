"""The shared ledger's Lua scripts, run against a real redis-server."""

from __future__ import annotations

import time

import attrs
import coredis
import trio

from trio_dispatch import Quota, RateLimitInfo
from trio_dispatch._redis._ledger import Ledger, keys_of, lease_of, member_of, wakes
from trio_dispatch._redis._scripts import Plan, Seed

from .._redis import RedisServer, needs_redis, next_member

pytestmark = needs_redis


def ledger(client: coredis.Redis[str], lease: float = 10.0) -> Ledger:
    return Ledger(client, "ns", lease)


m = next_member


async def test_a_step_grants_the_head_of_the_queue_within_the_limit(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 2)
    a1, a2, b1 = m("a:1"), m("a:2"), m("b:1")
    first = await book.step("p", "a", Plan(enqueue=[(a1, 10.0), (a2, 20.0)]))
    assert first.granted == [a1, a2]
    assert [lease_of(g) for g in first.granted] == ["a:1", "a:2"]
    assert (first.limit, first.in_flight, first.queued) == (2, 2, 0)
    full = await book.step("p", "b", Plan(enqueue=[(b1, 5.0)]), waiting=1)
    assert full.granted == []
    assert (full.in_flight, full.queued, full.waiting) == (2, 1, 1)
    # A release frees a slot for the waiter of another process, which must
    # ask for it: the releasing process gets nothing it did not ask for.
    after = await book.step("p", "a", Plan(release=["a:1"]))
    assert (after.granted, after.in_flight, after.queued) == ([], 1, 1)
    served = await book.step("p", "b", Plan(ask=[b1]))
    assert served.granted == [b1]
    assert served.in_flight == 2


async def test_a_process_takes_only_its_own_entries_inside_the_free_window(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    holder = await book.step("p", "h", Plan(enqueue=[(m("h:1"), 0.0)]))
    assert len(holder.granted) == 1
    old, young = m("x:1"), m("y:1")
    await book.step("p", "x", Plan(enqueue=[(old, 1.0)]))
    await book.step("p", "y", Plan(enqueue=[(young, 2.0)]))
    await book.step("p", "h", Plan(release=["h:1"]))
    # y's entry is second in the queue and one slot is free: x's turn.
    assert (await book.step("p", "y", Plan(ask=[young]))).granted == []
    assert (await book.step("p", "x", Plan(ask=[old]))).granted == [old]
    # Equal starts go by arrival, although z's lease id sorts first.
    await book.set_limit("p", 2)
    tie = member_of(2_500_000, "a:9")
    await book.step("p", "z", Plan(enqueue=[(tie, 2.0)]))
    assert (await book.step("p", "z", Plan(ask=[tie]))).granted == []
    assert (await book.step("p", "y", Plan(ask=[young]))).granted == [young]
    await book.set_limit("p", 3)
    assert (await book.step("p", "z", Plan(ask=[tie]))).granted == [tie]


async def test_withdrawn_entries_leave_the_queue_and_wake_the_fleet(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    await book.step("p", "h", Plan(enqueue=[(m("h:1"), 0.0)]))
    quiet, entry, other = m("q:1"), m("x:1"), m("y:1")
    await book.step("p", "q", Plan(enqueue=[(quiet, 1.0)]), waiting=1)
    # A subscription on a client of its own: the ledger's calls share the
    # connections of its client's pool.
    async with (
        coredis.Redis.from_url(server.url, decode_responses=True) as listener,
        listener.pubsub(channels=["{ns:p}:wake"]) as pubsub,
    ):
        # Nobody else waits: nobody is woken.
        withdrawn = await book.step("p", "q", Plan(withdraw=[quiet]))
        assert (withdrawn.queued, withdrawn.waiting) == (0, 0)
        await book.step("p", "y", Plan(enqueue=[(other, 2.0)]), waiting=1)
        await book.step("p", "x", Plan(enqueue=[(entry, 1.0)]), waiting=1)
        withdrawn = await book.step("p", "x", Plan(withdraw=[entry]))
        assert (withdrawn.queued, withdrawn.waiting) == (1, 1)
        with trio.fail_after(5):
            async for message in pubsub:
                if message["type"] == "message":
                    # Signed by the process whose round caused it, and
                    # the first one: the first withdrawal woke nobody.
                    assert message["data"] == "x"
                    break
        await book.step("p", "y", Plan(withdraw=[other]))
        # Sent after y's withdrawal (which woke nobody): nothing came between.
        await client.publish("{ns:p}:wake", "end")
        with trio.fail_after(5):
            async for message in pubsub:
                if message["type"] == "message":
                    assert message["data"] == "end"
                    break


async def test_a_slot_given_back_wakes_only_the_processes_that_can_take_it(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    book = ledger(client)
    await book.set_limit("p", 2)
    h1, h2, x1, y1, z1 = m("h:1"), m("h:2"), m("x:1"), m("y:1"), m("z:1")
    await book.step("p", "h", Plan(enqueue=[(h1, 0.0), (h2, 0.5)]))
    await book.step("p", "x", Plan(enqueue=[(x1, 1.0)]), waiting=1)
    await book.step("p", "y", Plan(enqueue=[(y1, 2.0)]), waiting=1)
    await book.step("p", "z", Plan(enqueue=[(z1, 3.0)]), waiting=1)
    async with (
        coredis.Redis.from_url(server.url, decode_responses=True) as listener,
        listener.pubsub(channels=["{ns:p}:wake"]) as pubsub,
    ):

        async def next_message() -> str:
            with trio.fail_after(5):
                async for message in pubsub:
                    if message["type"] == "message":
                        return str(message["data"])
            raise AssertionError("the subscription ended")

        # One slot back: x's entry is the one left in the window.
        await book.step("p", "h", Plan(release=["h:1"]))
        assert await next_message() == ">x"
        # The last: x's and y's, not z's (outside the window).
        await book.step("p", "h", Plan(release=["h:2"]))
        assert await next_message() == ">x y"
        # A slot that the releasing process's own entry takes wakes nobody.
        h3, h4 = m("h:3"), m("h:4")
        ask = await book.step("p", "x", Plan(ask=[x1]), waiting=1)
        assert ask.granted == [x1]
        await book.step("p", "h", Plan(enqueue=[(h3, 0.1)]), waiting=1)
        taken = await book.step("p", "x", Plan(release=["x:1"], enqueue=[(h4, 0.2)]))
        assert taken.granted == [h4]
        await client.publish("{ns:p}:wake", "end")
        assert await next_message() == "end"
        # Any other change still wakes every other process: an expiry, a
        # withdrawal (see above), a limit raised by successes.
        await book.step("p", "y", Plan(withdraw=[y1]))
        assert await next_message() == "y"


async def calls_of(client: coredis.Redis[str]) -> dict[str, int]:
    """Each command's calls so far on the server, ``INFO`` left out."""
    stats = await client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if name.startswith("cmdstat_")
        and name != "cmdstat_info"
        and isinstance(value, dict)
    }


async def test_a_step_on_the_grant_path_runs_few_server_calls(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    h1, x1, x2 = m("h:1"), m("x:1"), m("x:2")
    await book.step("p", "h", Plan(enqueue=[(h1, 0.0)], recheck=False))
    await book.step("p", "x", Plan(enqueue=[(x1, 1.0)], recheck=False), waiting=1)

    async def counted(node: str, plan: Plan, waiting: int) -> dict[str, int]:
        before = await calls_of(client)
        await book.step("p", node, attrs.evolve(plan, recheck=False), waiting=waiting)
        after = await calls_of(client)
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k)}

    # Asking while the slot is taken: nothing added, nothing expired, the
    # same waiters: the clock, the settings, the two counts, the waiters.
    assert await counted("x", Plan(ask=[x1]), waiting=1) == {
        "evalsha": 1,
        "time": 1,
        "hmget": 1,
        "zcard": 2,
        "hgetall": 1,
    }
    # The slot given back: the lease removed, x's entry in the window woken.
    assert await counted("h", Plan(release=["h:1"]), waiting=0) == {
        "evalsha": 1,
        "time": 1,
        "hmget": 1,
        "zrem": 1,
        "zcard": 2,
        "zrange": 1,
        "hgetall": 1,
        "publish": 1,
    }
    # Taken by x's entry in x's round, with its next entry (x's waiters
    # stay 1, unwritten): the grant, the entry, and the expiries they move.
    assert await counted("x", Plan(ask=[x1], enqueue=[(x2, 2.0)]), waiting=2) == {
        "evalsha": 1,
        "time": 1,
        "hmget": 1,
        "zadd": 4,
        "zrem": 2,
        "zcard": 2,
        "zrange": 1,
        "hgetall": 1,
        "zrevrange": 1,
        "pexpireat": 5,
    }


async def test_an_entry_granted_in_the_step_that_queues_it_is_never_written(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 2)
    a1, a2, b1, b2 = m("a:1"), m("a:2"), m("b:1"), m("b:2")
    await book.step("p", "a", Plan(enqueue=[(a1, 0.0)], recheck=False))
    await book.step("p", "b", Plan(enqueue=[(b1, 1.0)], recheck=False))
    before = await calls_of(client)
    # a's slot given back and its next entry granted in the same round: the
    # lease written, the entry neither queued nor removed.
    taken = await book.step(
        "p", "a", Plan(release=["a:1"], enqueue=[(a2, 2.0)], recheck=False)
    )
    assert taken.granted == [a2]
    after = await calls_of(client)
    assert after["zadd"] - before.get("zadd", 0) == 2  # the lease, the process
    assert after["zrem"] - before.get("zrem", 0) == 1  # the lease given back
    # With no slot free, a newcomer is queued as before.
    late = await book.step(
        "p", "b", Plan(enqueue=[(b2, 3.0)], recheck=False), waiting=1
    )
    assert late.granted == []
    queue = keys_of("ns", "p")[1]
    assert list(await client.zrange(queue, 0, -1)) == [b2]
    # Sent again once a slot is free (a renewal), a queued entry is granted
    # and leaves the queue.
    await book.step("p", "a", Plan(release=["a:2"], recheck=False))
    again = await book.step("p", "b", Plan(enqueue=[(b2, 3.0)], recheck=False))
    assert again.granted == [b2]
    assert await client.zcard(queue) == 0
    assert await client.zcard(keys_of("ns", "p")[2]) == 0


def test_a_wake_up_says_which_processes_it_is_for() -> None:
    assert wakes(None, "a")
    assert wakes("wake", "a")
    # Signed by a process: for every other one.
    assert not wakes("a", "a")
    assert wakes("b", "a")
    # Named processes only.
    assert wakes(">a b", "a")
    assert wakes(">b a", "a")
    assert not wakes(">b c", "a")
    assert not wakes(">ab", "a")


async def test_a_script_that_redis_lost_is_loaded_again(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    # As after a restart, or a SCRIPT FLUSH: Redis answers NOSCRIPT.
    await client.script_flush()
    first = m("a:1")
    assert (await book.step("p", "a", Plan(enqueue=[(first, 1.0)]))).granted == [first]
    await client.script_flush()
    assert await book.set_limit("p", 2) == 2
    await client.script_flush()
    assert await book.pause("p", 2.0, default_pause=1.0, max_pause=5.0) > 1.5
    await client.script_flush()
    await book.resume("p")
    assert (await book.step("p", "a")).paused_for == 0


async def test_a_ledger_whose_connection_was_lost_takes_another(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    connection = book._connection
    assert connection is not None
    async with coredis.Redis.from_url(server.url) as killer:
        await killer.client_kill(identifier=connection.client_id)
    with trio.fail_after(5):
        while connection.usable:  # noqa: ASYNC110 (the socket's end, seen by coredis)
            await trio.sleep(0.01)
    first = m("a:1")
    assert (await book.step("p", "a", Plan(enqueue=[(first, 1.0)]))).granted == [first]
    assert book._connection is not connection


async def test_a_host_clock_far_off_is_read_as_the_servers_from_the_first_exchange(
    client: coredis.Redis[str],
) -> None:
    # This host's clock runs 30 s ahead of the server's (both real here).
    book = Ledger(client, "ns", 10.0, wall_clock=lambda: time.time() + 30.0)
    await book.measure_clock()
    measured = book.clock.offset
    server = (await book.step("p", "x")).server_time
    # Loopback: round trips well under a second, on a loaded machine too.
    assert book.clock.round_trip is not None
    assert book.clock.round_trip < 1.0
    assert -31.0 < measured < -29.0
    assert abs(book.clock.now() - server) < 1.0


async def test_leases_and_entries_expire_in_server_time(
    client: coredis.Redis[str],
) -> None:
    # Two seconds: a loaded machine may take a good part of one between
    # two steps, and the lease must outlive that until the wait below.
    book = ledger(client, lease=2.0)
    await book.set_limit("p", 1)
    held = await book.step("p", "dead", Plan(enqueue=[(m("dead:1"), 0.0)]))
    await book.step("p", "dead", Plan(enqueue=[(m("dead:2"), 1.0)]), waiting=1)
    leases, queue = keys_of("ns", "p")[:2]
    scores = await client.zrange(leases, 0, -1, withscores=True)
    # Scored by the server's clock (TIME in the script) plus the lease.
    assert scores[0][1] == round(held.server_time * 1000) + 2000
    await trio.sleep(2.1)
    live = m("live:1")
    alive = await book.step("p", "live", Plan(enqueue=[(live, 5.0)]))
    assert alive.granted == [live]
    assert (alive.in_flight, alive.queued, alive.waiting) == (1, 0, 0)
    assert held.granted[0] not in await client.zrange(queue, 0, -1)


async def test_renewal_keeps_leases_and_adds_back_what_a_restart_lost(
    server: RedisServer, client: coredis.Redis[str]
) -> None:
    # Renewed every 0.8 s for longer than it lasts, a lease of two
    # seconds outlives a loaded machine's pauses between renewals.
    book = ledger(client, lease=2.0)
    await book.set_limit("p", 1)
    held = await book.step(
        "p", "a", Plan(enqueue=[(m("a:1"), 0.0)]), seed=Seed(limit=1)
    )
    for _ in range(4):
        await trio.sleep(0.8)
        await book.step("p", "a", Plan(renew_leases=["a:1"]), seed=Seed(limit=1))
    assert (await book.step("p", "b", Plan(enqueue=[(m("b:1"), 1.0)]))).granted == []
    await client.flushall()
    # Redis lost everything: the holder's renewal registers its lease and
    # the stored limit again (it was only seeded, so a stored one would win).
    again = await book.step(
        "p", "a", Plan(renew_leases=[lease_of(held.granted[0])]), seed=Seed(limit=1)
    )
    assert (again.limit, again.in_flight) == (1, 1)
    assert (await book.step("p", "c", Plan(enqueue=[(m("c:1"), 2.0)]))).granted == []


async def test_a_stored_limit_wins_over_a_seed_and_set_limit_overwrites(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    assert await book.set_limit("p", 4, overwrite=False) == 4
    assert await book.set_limit("p", 9, overwrite=False) == 4
    assert (await book.step("p", "a", seed=Seed(limit=9))).limit == 4
    assert await book.set_limit("p", 2) == 2
    assert await book.set_limit("p", None) is None
    assert await book.set_limit("p", 7, overwrite=False) is None


async def test_unlimited_grants_every_asker_even_when_paused(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", None)
    await book.pause("p", 30.0, default_pause=1.0, max_pause=60.0)
    a1, a2 = m("a:1"), m("a:2")
    result = await book.step("p", "a", Plan(enqueue=[(a1, 1.0), (a2, 0.0)]))
    assert sorted(result.granted) == [a1, a2]
    assert result.in_flight == 2


async def test_a_pause_holds_grants_fleet_wide_in_server_time(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 2)
    left = await book.pause("p", 0.3, default_pause=1.0, max_pause=60.0)
    assert 0.2 < left <= 0.3
    # A shorter report never shortens it; max_pause caps a long one.
    assert await book.pause("p", 0.01, default_pause=1.0, max_pause=60.0) > 0.2
    b1 = m("b:1")
    paused = await book.step("p", "b", Plan(enqueue=[(b1, 0.0)]))
    assert paused.granted == []
    assert 0 < paused.paused_for <= 0.3
    await trio.sleep(0.35)
    after = await book.step("p", "b", Plan(ask=[b1]))
    assert (after.granted, after.paused_for) == ([b1], 0)
    assert await book.pause("p", 500.0, default_pause=1.0, max_pause=2.0) <= 2.0


# A delay of zero is no delay: the backoff, as without one.
async def test_the_ledger_backs_off_for_a_zero_delay(
    client: coredis.Redis[str],
) -> None:
    ledger = Ledger(client, "ns", 10.0)
    left = await ledger.pause("p", 0.0, default_pause=1.0, max_pause=60.0)
    assert 0.9 < left <= 1.0
    assert (await ledger.step("p", "a")).paused_for > 0.8


async def test_the_backoff_doubles_per_round_and_a_success_ends_the_streak(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 5)

    async def report() -> float:
        return await book.pause("p", None, default_pause=0.1, max_pause=0.35)

    assert 0.05 < await report() <= 0.1
    await trio.sleep(0.12)
    first = await book.step("p", "a", Plan(enqueue=[(m("a:1"), 0.0)]))
    assert 0.15 < await report() <= 0.2  # a grant since: a new round
    await trio.sleep(0.22)
    second = await book.step("p", "a", Plan(enqueue=[(m("a:2"), 0.0)]))
    assert 0.3 < await report() <= 0.35  # capped at max_pause
    # a:1 was held across reports: its release is no success.
    await book.step("p", "a", Plan(release=[lease_of(first.granted[0])]))
    await trio.sleep(0.37)
    a3 = m("a:3")
    third = await book.step("p", "a", Plan(enqueue=[(a3, 0.0)]))
    assert third.granted == [a3]
    await book.step("p", "a", Plan(release=[lease_of(third.granted[0])]))
    assert 0.05 < await report() <= 0.1  # the streak ended
    await book.resume("p")
    assert (await book.step("p", "a", Plan(ask=[]))).paused_for == 0
    assert second.granted


async def test_a_step_sent_again_leaves_one_entry_and_grants_the_same_lease(
    client: coredis.Redis[str],
) -> None:
    # As when a step's answer is lost after the server ran it: the process
    # sends the same changes again.
    book = ledger(client)
    await book.set_limit("p", 1)
    held, waiter = m("h:1"), m("w:1")
    for _ in range(2):
        granted = await book.step("p", "h", Plan(enqueue=[(held, 0.0)]))
        assert granted.granted == [held]
        assert (granted.in_flight, granted.queued) == (1, 0)
    for _ in range(2):
        queued = await book.step("p", "w", Plan(enqueue=[(waiter, 1.0)]), waiting=1)
        assert (queued.granted, queued.in_flight, queued.queued) == ([], 1, 1)
    # Asked again after a grant whose answer was lost: granted again.
    await book.step("p", "h", Plan(release=["h:1"]))
    assert (await book.step("p", "w", Plan(ask=[waiter]))).granted == [waiter]
    again = await book.step("p", "w", Plan(ask=[waiter]))
    assert (again.granted, again.in_flight, again.queued) == ([waiter], 1, 0)
    assert await client.zrange(keys_of("ns", "p")[0], 0, -1) == ("w:1",)


async def test_withdrawing_a_member_gives_back_the_lease_a_lost_answer_granted(
    client: coredis.Redis[str],
) -> None:
    book = ledger(client)
    await book.set_limit("p", 1)
    lost = m("a:1")
    assert (await book.step("p", "a", Plan(enqueue=[(lost, 0.0)]))).granted == [lost]
    # The process never learned of that grant, and its waiter left.
    gone = await book.step("p", "a", Plan(withdraw=[lost]))
    assert (gone.in_flight, gone.queued) == (0, 0)
    other = m("b:1")
    assert (await book.step("p", "b", Plan(enqueue=[(other, 1.0)]))).granted == [other]


async def test_figures_with_missing_fields_are_learned_in_their_own_places(
    client: coredis.Redis[str],
) -> None:
    # Regression: the step read the figures' empty fields as absent, so the
    # fields after them moved up: a token quota alone became a request
    # budget, and a request quota without its limit took its remaining
    # figure for one.
    book = ledger(client)
    tokens_only = RateLimitInfo(tokens=Quota(limit=60_000, remaining=59_000, reset=1.0))
    learned = (await book.step("p", "a", observed=tokens_only)).budget
    assert learned is not None
    assert (learned.requests_per_minute, learned.requests_available) == (None, None)
    assert (learned.tokens_per_minute, learned.tokens_available) == (60_000, 59_000)
    no_limit = RateLimitInfo(requests=Quota(remaining=5))
    assert (await book.step("q", "a", observed=no_limit)).budget is None


async def test_a_step_costs_the_same_however_many_learned_models_are_idle(
    client: coredis.Redis[str],
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=100, remaining=99))

    async def calls_of_a_grant(namespace: str, idle: int) -> dict[str, int]:
        book = Ledger(client, namespace, 10.0)
        await book.set_limit("p", 1)
        # Models seen once (fine-tunes per customer): learned, now idle.
        await book.step(
            "p", "x", observed_models={f"ft-{k}": figures for k in range(idle)}
        )
        await book.step("p", "x", observed_models={"other": figures})
        costs: dict[str, int] = {}
        for n in range(3):
            x = m(f"x:{n}")
            meta: dict[str, tuple[str | None, str | None]] = {x: (None, "other")}
            before = await calls_of(client)
            granted = await book.step("p", "x", Plan(enqueue=[(x, 0.0)], meta=meta))
            released = await book.step("p", "x", Plan(release=[lease_of(x)]))
            after = await calls_of(client)
            assert (granted.granted, set(released.models)) == ([x], {"other"})
            costs = {k: v - before.get(k, 0) for k, v in after.items()}
        return costs

    assert await calls_of_a_grant("many", 3000) == await calls_of_a_grant("none", 0)
