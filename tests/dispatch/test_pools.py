"""Pools through the dispatcher: one queue over several members, in virtual time.

Each test stages its requests with ``wait_all_tasks_blocked`` so that
arrivals have an exact order, and asserts on exact virtual times, on
``Slot.member`` and on ``statistics()``.
"""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing

from trio_dispatch import (
    AdaptiveLimit,
    Dispatcher,
    DispatcherClosed,
    PoolRemoved,
    QueueFull,
    Quota,
    RateLimitInfo,
    SlotHoldTimeout,
    open_dispatcher,
)
from trio_dispatch.lowlevel import SchedulerActor, open_dispatcher_with


async def hold(
    dispatcher: Dispatcher,
    provider: str,
    log: list[tuple[str, str | None, float]],
    name: str,
    seconds: float,
    *,
    started_at: float | None = None,
    conversation_id: str | None = None,
) -> None:
    async with dispatcher.slot(
        provider, started_at=started_at, conversation_id=conversation_id
    ) as slot:
        log.append((name, slot.member, trio.current_time()))
        await trio.sleep(seconds)


async def start(  # noqa: PLR0917  # one request in one line
    nursery: trio.Nursery,
    dispatcher: Dispatcher,
    provider: str,
    log: list[tuple[str, str | None, float]],
    name: str,
    seconds: float,
    **options: str | float,
) -> None:
    """Start one request, and let it reach its scheduler: arrivals in an exact order."""
    nursery.start_soon(
        partial(hold, dispatcher, provider, log, name, seconds, **options)  # type: ignore[arg-type]
    )
    await trio.testing.wait_all_tasks_blocked()


async def test_a_pool_grants_on_whichever_member_is_free_oldest_turn_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "first", 10.0)
        await start(nursery, d, "gpt", log, "second", 4.0)
        await trio.testing.wait_all_tasks_blocked()
        # Younger turn first in arrival, older turn later: the older goes first.
        await start(nursery, d, "gpt", log, "young", 1.0, started_at=-1.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "old", 1.0, started_at=-5.0)
        await trio.testing.wait_all_tasks_blocked()
        stats = d.statistics()
        assert stats.pools["gpt"].waiting == 2
        assert stats.pools["gpt"].members == ("key-a", "key-b")
        assert stats.pools["gpt"].limit == 2
        assert stats.providers["key-a"].in_flight == 1
        assert stats.providers["key-b"].in_flight == 1
        assert "gpt" not in stats.providers
    assert log == [
        ("first", "key-a", 0.0),
        ("second", "key-b", 0.0),
        ("old", "key-b", 4.0),
        ("young", "key-b", 5.0),
    ]


async def test_a_request_for_a_member_takes_its_place_in_the_pools_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "key-a", log, "a-holder", 5.0)
        await start(nursery, d, "key-b", log, "b-holder", 2.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "key-a", log, "for-a", 1.0, started_at=-9.0)
        await start(nursery, d, "gpt", log, "for-any", 1.0, started_at=-1.0)
        await trio.testing.wait_all_tasks_blocked()
        assert d.statistics().providers["key-a"].waiting == 1
    assert log == [
        ("a-holder", "key-a", 0.0),
        ("b-holder", "key-b", 0.0),
        # key-b frees first: the pool's request takes it, though the older
        # one waits, for key-a alone.
        ("for-any", "key-b", 2.0),
        ("for-a", "key-a", 5.0),
    ]


async def test_a_paused_member_is_passed_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 2, "key-b": 2}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        d.report_rate_limit("key-a", 10.0)
        for name in ("one", "two", "three"):
            await start(nursery, d, "gpt", log, name, 3.0)
            await trio.testing.wait_all_tasks_blocked()
        stats = d.statistics()
        assert stats.providers["key-a"].paused
        assert not stats.providers["key-b"].paused
    assert log == [
        ("one", "key-b", 0.0),
        ("two", "key-b", 0.0),
        ("three", "key-b", 3.0),
    ]


async def test_a_conversation_waits_for_its_member_at_most_affinity_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1},
            pools={"gpt": ("key-a", "key-b")},
            affinity_wait=2.0,
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await hold(d, "gpt", log, "c1-first", 1.0, conversation_id="c1")
        await hold(d, "gpt", log, "c2-first", 1.0, conversation_id="c2")
        # c1's member was key-a, c2's key-a too (both free: key-a first).
        await start(nursery, d, "key-a", log, "busy-a", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "c1-second", 1.0, conversation_id="c1")
        await trio.testing.wait_all_tasks_blocked()
        assert d.statistics().providers["key-a"].waiting == 1
        await trio.sleep(1.0)
        assert log[-1][0] == "busy-a"  # still waiting for key-a, b idle
    assert log == [
        ("c1-first", "key-a", 0.0),
        ("c2-first", "key-a", 1.0),
        ("busy-a", "key-a", 2.0),
        ("c1-second", "key-b", 4.0),
    ]


async def test_a_conversation_returns_to_its_member_when_it_frees_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "c1-first", 1.0, conversation_id="c1")
        await start(nursery, d, "gpt", log, "c2-first", 1.0, conversation_id="c2")
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1.5)
        await start(nursery, d, "key-a", log, "busy-a", 0.5)
        await start(nursery, d, "key-b", log, "busy-b", 3.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "c1-second", 1.0, conversation_id="c1")
        await start(nursery, d, "gpt", log, "c2-second", 1.0, conversation_id="c2")
    stats = d.statistics()
    assert log[:2] == [("c1-first", "key-a", 0.0), ("c2-first", "key-b", 0.0)]
    # key-a frees at 2.0, in c1's wait for it: c1 goes back to it. c2
    # waits for key-b, busy until 4.5, for affinity_wait (until 3.5),
    # then takes key-a, free since c1 left it at 3.0.
    assert log[-2:] == [("c1-second", "key-a", 2.0), ("c2-second", "key-a", 3.5)]
    assert stats.providers["key-a"].affinity_hits == 1
    assert stats.providers["key-b"].affinity_moves == 1
    assert (stats.pools["gpt"].affinity_hits, stats.pools["gpt"].affinity_moves) == (
        1,
        1,
    )


async def test_affinity_wait_zero_sends_a_conversation_wherever_there_is_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1},
            pools={"gpt": ("key-a", "key-b")},
            affinity_wait=0,
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await hold(d, "gpt", log, "c1-first", 1.0, conversation_id="c1")
        await start(nursery, d, "key-a", log, "busy-a", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "c1-second", 1.0, conversation_id="c1")
    assert log[-1] == ("c1-second", "key-b", 1.0)
    assert d.statistics().pools["gpt"].affinity_moves == 0


async def test_a_member_keeps_its_own_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        for name in ("one", "two", "three", "four"):
            await start(nursery, d, "gpt", log, name, 2.0)
            await trio.testing.wait_all_tasks_blocked()
        d.set_limit("key-b", 3)
        await trio.testing.wait_all_tasks_blocked()
        assert d.limits() == {"key-a": 1, "key-b": 3}
        stats = d.statistics()
        assert (stats.providers["key-b"].limit, stats.providers["key-b"].in_flight) == (
            3,
            3,
        )
        assert stats.pools["gpt"].limit == 4
    assert {name: member for name, member, _ in log} == {
        "one": "key-a",
        "two": "key-b",
        "three": "key-b",
        "four": "key-b",
    }


async def test_a_pool_has_no_limit_or_pause_of_its_own() -> None:
    async with open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d:
        with pytest.raises(
            ValueError,
            match=r"^'gpt' is a pool: it has no limit of its own; its members have \('key-a'\)$",
        ):
            d.set_limit("gpt", 2)
        with pytest.raises(
            ValueError, match=r"^'gpt' is a pool: it has no pause of its own"
        ):
            d.resume("gpt")
        with pytest.raises(ValueError, match=r"^'gpt' is a pool"):
            d.report_rate_limit("gpt", 1.0)
        assert d.pools() == {"gpt": ("key-a",)}


async def test_set_pool_changes_members_and_replaces_the_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1},
            pools={"gpt": ("key-a",), "spare": ("key-b",)},
        ) as d,
        trio.open_nursery() as nursery,
    ):
        # Two pools apart: each its own queue, never the other's member.
        await start(nursery, d, "gpt", log, "one", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "two", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        assert d.statistics().pools["gpt"].waiting == 1
        # gpt takes spare's member: the groups merge, and the request
        # waiting for gpt takes key-b at once.
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.testing.wait_all_tasks_blocked()
        assert d.statistics().pools["gpt"].waiting == 0
    assert log == [("one", "key-a", 0.0), ("two", "key-b", 0.0)]


async def test_set_pool_regroups_members_already_pooled_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1},
            pools={"gpt": ("key-a",), "all": ("key-a", "key-b")},
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "one", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "two", 5.0)
        await trio.testing.wait_all_tasks_blocked()
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.testing.wait_all_tasks_blocked()
        assert d.pools() == {"gpt": ("key-a", "key-b"), "all": ("key-a", "key-b")}
        d.set_pool("mini", ("key-b",))
        assert "mini" in d.pools()
    assert log == [("one", "key-a", 0.0), ("two", "key-b", 0.0)]


async def test_remove_pool_fails_its_waiters_and_keeps_its_members(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failed: list[BaseException] = []

    async def waits() -> None:
        try:
            async with d.slot("gpt"):
                pass
        except PoolRemoved as exc:
            failed.append(exc)

    async with (
        open_dispatcher(
            {"key-a": 1}, pools={"gpt": ("key-a",), "pro": ("key-a",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        held = d.slot("key-a")
        await held.__aenter__()
        nursery.start_soon(waits)
        await trio.testing.wait_all_tasks_blocked()
        d.remove_pool("gpt")
        await trio.testing.wait_all_tasks_blocked()
        assert d.pools() == {"pro": ("key-a",)}
        assert d.statistics().providers["key-a"].in_flight == 1
        await held.__aexit__(None, None, None)
        with pytest.raises(ValueError, match=r"^no pool 'gpt'"):
            d.remove_pool("gpt")
    assert len(failed) == 1
    assert str(failed[0]) == "pool 'gpt' was removed while the request waited"
    assert failed[0].pool == "gpt"  # type: ignore[attr-defined]


async def test_a_request_cancelled_while_waiting_for_a_pool_leaves_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as d:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                await start(nursery, d, "gpt", [], "holder", 5.0)
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(1.0):
                async with d.slot("gpt", conversation_id="c"):
                    pytest.fail("granted while both members are full")
            stats = d.statistics()
            assert stats.pools["gpt"].waiting == 0
            assert stats.providers["key-a"].withdrawn_total == 1
        stats = d.statistics()
        assert [stats.providers[name].in_flight for name in ("key-a", "key-b")] == [
            0,
            0,
        ]
        assert stats.providers["key-a"].granted_total == 1
        assert stats.providers["key-b"].granted_total == 1


async def test_closing_fails_the_requests_waiting_for_a_pool(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[BaseException] = []

    async def waits(d: Dispatcher) -> None:
        try:
            async with d.slot("gpt"):
                pass
        except DispatcherClosed as exc:
            errors.append(exc)

    async with (
        trio.open_nursery() as nursery,
        open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d,
    ):
        held = d.slot("key-a")
        await held.__aenter__()
        nursery.start_soon(waits, d)
        await trio.testing.wait_all_tasks_blocked()
    assert len(errors) == 1


async def test_pools_that_share_a_member_share_one_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1},
            pools={"gpt-4": ("key-a", "key-b"), "gpt-5": ("key-b",)},
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt-4", log, "one", 2.5)
        await start(nursery, d, "gpt-4", log, "two", 2.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt-4", log, "four-young", 1.0, started_at=-1.0)
        await start(nursery, d, "gpt-5", log, "five-old", 1.0, started_at=-5.0)
        await trio.testing.wait_all_tasks_blocked()
    # key-b frees first: gpt-5's request, the older, takes it, not gpt-4's.
    assert log[2:] == [("five-old", "key-b", 2.0), ("four-young", "key-a", 2.5)]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"pools": {"gpt": ()}}, ValueError, r"^pool 'gpt' must have a member$"),
        (
            {"pools": {"gpt": ("a", "a")}},
            ValueError,
            r"^pool 'gpt' names a member twice$",
        ),
        ({"pools": {"gpt": "ab"}}, TypeError, r"^the members of pool 'gpt' must be"),
        ({"pools": ["gpt"]}, TypeError, r"^pools must be a mapping"),
        (
            {"pools": {"key-a": ("key-b",)}},
            ValueError,
            r"^pool 'key-a' has the name of a provider$",
        ),
        (
            {"pools": {"gpt": ("key-a",), "key-a2": ("gpt",)}},
            ValueError,
            r"^pool 'gpt' has the name of a provider$",
        ),
        (
            {"pools": {"gpt": ("key-a",)}, "affinity_wait": -1},
            ValueError,
            r"affinity_wait",
        ),
    ],
)
def test_pools_are_checked_at_the_call(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        open_dispatcher({"key-a": 1}, **options)  # type: ignore[arg-type]


def test_pools_need_the_local_scheduler() -> None:
    with pytest.raises(ValueError, match=r"^pools need the local scheduler"):
        open_dispatcher_with(SchedulerActor.from_setup, {"a": 1}, pools={"p": ("a",)})


async def test_set_pool_is_checked() -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}
    ) as d:
        with pytest.raises(
            ValueError, match=r"^pool 'key-b' has the name of a provider$"
        ):
            d.set_pool("key-b", ("key-a",))
        with pytest.raises(ValueError, match=r"^pool 'x' must have a member$"):
            d.set_pool("x", ())
        # key-b, held on its own scheduler, joins with its holder, whose
        # release reaches the group's.
        async with d.slot("key-b") as held:
            d.set_pool("x", ("key-a", "key-b"))
            assert d.statistics().providers["key-b"].in_flight == 1
        assert held.member == "key-b"
        assert d.statistics().providers["key-b"].in_flight == 0
        assert d.pools()["x"] == ("key-a", "key-b")
        # Providers never used may form a pool of their own.
        d.set_pool("fresh", ("key-c", "key-d"))
        async with d.slot("fresh") as slot:
            assert slot.member == "key-c"  # unlimited, both: the first
        assert d.pools()["fresh"] == ("key-c", "key-d")


async def test_events_name_the_member_granted_and_the_pool(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch.events import Granted, Paused, Queued, Released  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        d.events() as events,
    ):
        async with trio.open_nursery() as nursery:
            await start(nursery, d, "gpt", log, "one", 1.0)
            await start(nursery, d, "key-b", log, "two", 1.0)
            await start(nursery, d, "gpt", log, "three", 1.0)
        d.report_rate_limit("key-a", 5.0)
        seen = [await events.__anext__() for _ in range(events.pending)]
    named = [
        (type(event).__name__, event.provider, getattr(event, "pool", None))
        for event in seen
        if isinstance(event, Granted | Queued | Released | Paused)
    ]
    assert named[:3] == [
        ("Granted", "key-a", "gpt"),
        ("Granted", "key-b", None),
        ("Queued", "gpt", "gpt"),
    ]
    assert ("Granted", log[2][1], "gpt") in named
    assert named[-1] == ("Paused", "key-a", None)
    assert {name for kind, name, _ in named if kind == "Released"} == {"key-a", "key-b"}


async def test_max_hold_cuts_a_pool_slot_held_too_long(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch import SlotHoldTimeout  # noqa: PLC0415

    async with open_dispatcher(
        {"key-a": 1}, pools={"gpt": ("key-a",)}, max_hold=5.0
    ) as d:
        with pytest.raises(SlotHoldTimeout):
            async with d.slot("gpt") as slot:
                assert slot.member == "key-a"
                await trio.sleep(60)
        assert trio.current_time() == 5.0
        assert d.statistics().providers["key-a"].in_flight == 0


async def test_set_pool_refuses_a_pool_as_a_member() -> None:
    async with open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d:
        with pytest.raises(
            ValueError, match=r"^pool 'x' names pools as members: 'gpt'$"
        ):
            d.set_pool("x", ("gpt",))
        assert d.pools() == {"gpt": ("key-a",)}


async def test_each_members_adaptive_limit_is_told_whatever_the_sum_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch import AdaptiveLimit  # noqa: PLC0415

    # key-b unlimited: the pool's limit is None, whatever key-a's does.
    async with open_dispatcher(
        {"key-a": AdaptiveLimit(initial=4, minimum=1, maximum=8)},
        pools={"gpt": ("key-a", "key-b")},
    ) as d:
        async with d.slot("key-a"):
            d.report_rate_limit("key-a", 1.0)
        assert d.limits()["key-a"] == d.statistics().providers["key-a"].limit
        assert d.limits()["key-a"] < 4


async def test_a_members_adaptive_move_is_an_event_naming_the_member(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch import AdaptiveLimit  # noqa: PLC0415
    from trio_dispatch.events import LimitChanged  # noqa: PLC0415

    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        d.events() as events,
    ):
        d.set_limit("key-b", AdaptiveLimit(initial=3, minimum=1, maximum=8))
        seen = [await events.__anext__() for _ in range(events.pending)]
    changes = [
        (event.provider, event.previous, event.limit)
        for event in seen
        if isinstance(event, LimitChanged)
    ]
    assert changes == [("key-b", 1, 3)]


# Providers joining a pool whose scheduler already runs: one never used
# joins as a new member; one scheduled on its own gives its scheduler up to
# the group's, with its limit, budgets, adaptive limit and pause, once
# nothing holds or waits there.


async def test_a_provider_never_used_joins_a_running_pool_and_takes_its_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "one", 10.0)
        await start(nursery, d, "gpt", log, "two", 10.0)
        await start(nursery, d, "gpt", log, "three", 10.0)
        await trio.sleep(1.0)
        assert d.statistics().pools["gpt"].waiting == 2
        # key-c is new to the dispatcher: it joins unlimited, and the two
        # waiting take it at once, in their order.
        d.set_pool("gpt", ("key-a", "key-c"))
        await trio.testing.wait_all_tasks_blocked()
        assert d.pools() == {"gpt": ("key-a", "key-c")}
        stats = d.statistics()
        assert stats.pools["gpt"].members == ("key-a", "key-c")
        assert stats.providers["key-c"].in_flight == 2
        # Its limit is set through the group, as any member's.
        d.set_limit("key-c", 2)
        await start(nursery, d, "key-c", log, "four", 1.0)
        assert d.statistics().providers["key-c"].waiting == 1
    # two and three are granted in one step (woken in either order).
    assert sorted(log, key=lambda entry: (entry[2], entry[0])) == [
        ("one", "key-a", 0.0),
        ("three", "key-c", 1.0),
        ("two", "key-c", 1.0),
        ("four", "key-c", 11.0),
    ]


async def test_a_provider_scheduled_on_its_own_joins_with_its_limit_and_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher({"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}) as d,
        trio.open_nursery() as nursery,
    ):
        # key-b serves on its own, then is paused until 4.0.
        async with d.slot("key-b") as slot:
            assert slot.member == "key-b"
        d.report_rate_limit("key-b", 4.0)
        await start(nursery, d, "gpt", log, "one", 10.0)
        await start(nursery, d, "gpt", log, "two", 10.0)
        await start(nursery, d, "gpt", log, "three", 10.0)
        await trio.sleep(1.0)
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.testing.wait_all_tasks_blocked()
        stats = d.statistics()
        assert stats.providers["key-b"].limit == 1
        assert stats.providers["key-b"].paused_until == 4.0
        assert stats.pools["gpt"].waiting == 2
        assert d.limits() == {"key-a": 1, "key-b": 1}
    # Its pause held: the oldest waiter took key-b when it ended, the next
    # waited for a free slot under key-b's limit of 1.
    assert log == [
        ("one", "key-a", 0.0),
        ("two", "key-b", 4.0),
        ("three", "key-a", 10.0),
    ]


async def test_a_provider_joins_with_its_adaptive_limit_and_learned_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}
    ) as d:
        d.set_limit("key-b", AdaptiveLimit(initial=3, minimum=1, maximum=8))
        d.observe_rate_limits(
            "key-b", RateLimitInfo(requests=Quota(limit=600, remaining=500))
        )
        async with d.slot("key-b"):
            pass
        before = d.statistics().providers["key-b"]
        assert before.adaptive
        assert before.budget is not None
        assert before.budget.learned
        d.set_pool("gpt", ("key-a", "key-b"))
        after = d.statistics().providers["key-b"]
        # The same adaptive limit, moved since by its success, and the same
        # learned budget: nothing started afresh.
        assert after.adaptive
        assert after.limit == before.limit
        assert after.budget == before.budget
        assert d.statistics().pools["gpt"].members == ("key-a", "key-b")


async def test_a_provider_busy_on_its_own_joins_with_its_holders_and_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher({"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "key-b", log, "own", 5.0)
        await start(nursery, d, "key-b", log, "own-next", 5.0)
        await start(nursery, d, "gpt", log, "one", 20.0)
        await start(nursery, d, "gpt", log, "two", 1.0)
        await trio.sleep(1.0)
        d.set_pool("gpt", ("key-a", "key-b"))
        stats = d.statistics()
        # key-b's holder holds there still; its waiter waits for it alone,
        # ahead of the pool's younger request.
        assert (
            stats.providers["key-b"].in_flight,
            stats.providers["key-b"].waiting,
        ) == (
            1,
            1,
        )
        assert stats.pools["gpt"].waiting == 1
        assert d.limits() == {"key-a": 1, "key-b": 1}
    assert log == [
        ("own", "key-b", 0.0),
        ("one", "key-a", 0.0),
        ("own-next", "key-b", 5.0),
        ("two", "key-b", 10.0),
    ]


async def test_pools_scheduled_apart_merge_with_their_holders_and_waiters_in_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1, "key-c": 1},
            pools={"gpt": ("key-a",), "spare": ("key-b", "key-c")},
        ) as d,
        trio.open_nursery() as nursery,
    ):
        # Each group busy, with requests waiting in each.
        await start(nursery, d, "gpt", log, "g0", 10.0)
        await start(nursery, d, "spare", log, "s0", 4.0)
        await start(nursery, d, "spare", log, "s1", 6.0)
        await start(nursery, d, "gpt", log, "g1", 1.0, started_at=-3.0)
        await start(nursery, d, "spare", log, "s2", 1.0, started_at=-2.0)
        await start(nursery, d, "key-b", log, "b-only", 1.0, started_at=-1.0)
        await trio.sleep(1.0)
        granted_b = d.statistics().providers["key-b"].granted_total
        # One group now: any of a, b, c for x, the oldest turn first.
        d.set_pool("x", ("key-a", "key-b"))
        assert d.pools() == {
            "gpt": ("key-a",),
            "spare": ("key-b", "key-c"),
            "x": ("key-a", "key-b"),
        }
        stats = d.statistics()
        assert stats.pools["gpt"].waiting == 1
        assert stats.pools["spare"].waiting == 1
        assert stats.providers["key-b"].waiting == 1
        # Its counts go on: the group's scheduler took them over.
        assert stats.providers["key-b"].granted_total == granted_b
        assert (
            stats.providers["key-b"].in_flight,
            stats.providers["key-c"].in_flight,
        ) == (1, 1)
        await start(nursery, d, "x", log, "x0", 1.0, started_at=-4.0)
        assert d.statistics().pools["x"].waiting == 1
    # At 4.0 key-b frees: x0 (the oldest, rank -4) may take it. At 5.0
    # key-b again: g1 (rank -3) cannot (gpt is key-a alone), s2 (-2) can,
    # before b-only (-1), which has key-b at 6.0, as key-c frees for none.
    # g1 waits for key-a, until 10.0.
    assert log == [
        ("g0", "key-a", 0.0),
        ("s0", "key-b", 0.0),
        ("s1", "key-c", 0.0),
        ("x0", "key-b", 4.0),
        ("s2", "key-b", 5.0),
        ("b-only", "key-b", 6.0),
        ("g1", "key-a", 10.0),
    ]


async def test_a_group_never_used_merges_into_a_running_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",), "spare": ("key-b",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "g0", 5.0)
        await start(nursery, d, "gpt", log, "g1", 5.0)
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "spare", log, "s0", 1.0)
        assert d.pools() == {"gpt": ("key-a", "key-b"), "spare": ("key-b",)}
    assert log == [("g0", "key-a", 0.0), ("g1", "key-b", 0.0), ("s0", "key-b", 5.0)]


async def test_groups_never_used_merge_before_their_scheduler_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",), "spare": ("key-b",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        d.set_pool("x", ("key-a", "key-b"))
        for name in ("x0", "x1"):
            await start(nursery, d, "x", log, name, 1.0)
        await start(nursery, d, "spare", log, "s0", 1.0)
    assert log == [("x0", "key-a", 0.0), ("x1", "key-b", 0.0), ("s0", "key-b", 1.0)]


async def test_a_conversation_keeps_its_member_across_a_merge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 2, "key-b": 2, "key-c": 2},
            pools={"gpt": ("key-a",), "spare": ("key-b", "key-c")},
            affinity_wait=5.0,
        ) as d,
        trio.open_nursery() as nursery,
    ):
        # c1's call goes to key-c (b busy), so its next prefers key-c.
        await start(nursery, d, "key-b", log, "busy", 100.0)
        await start(nursery, d, "spare", log, "first", 1.0, conversation_id="c1")
        await trio.sleep(2.0)
        d.set_pool("x", ("key-a", "key-b", "key-c"))
        # key-a has the most free slots, but c1 goes back to key-c.
        await start(nursery, d, "x", log, "next", 1.0, conversation_id="c1")
        nursery.cancel_scope.cancel()
    assert log[1:] == [("first", "key-c", 0.0), ("next", "key-c", 2.0)]


async def test_a_slot_asked_through_a_merged_group_names_the_member_it_got(
    autojump_clock: trio.testing.MockClock,
) -> None:
    members: list[str | None] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",), "spare": ("key-b",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        log: list[tuple[str, str | None, float]] = []
        await start(nursery, d, "gpt", log, "g0", 1.0)
        await start(nursery, d, "spare", log, "s0", 1.0)

        async def waiting_one() -> None:
            async with d.slot("gpt") as slot:
                members.append(slot.member)

        nursery.start_soon(waiting_one)
        await trio.testing.wait_all_tasks_blocked()
        # The waiting request asked through gpt's old group; granted in the
        # merged one, it names its member, not the pool.
        d.set_pool("x", ("key-a", "key-b"))
    assert members == ["key-a"]


async def test_a_new_pool_over_a_provider_scheduled_on_its_own_keeps_its_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher({"key-b": 1}) as d,
        trio.open_nursery() as nursery,
    ):
        d.report_rate_limit("key-b", 4.0)
        # A pool of its own, made at run time: the group's scheduler starts
        # now, with key-b's pause, and key-d, never used, beside it.
        d.set_pool("new", ("key-b", "key-d"))
        assert d.statistics().providers["key-b"].paused_until == 4.0
        await start(nursery, d, "key-b", log, "own", 1.0)
        await start(nursery, d, "new", log, "pooled", 1.0)
    assert log == [("pooled", "key-d", 0.0), ("own", "key-b", 4.0)]


async def test_a_request_moved_to_the_group_is_cancelled_there_and_leaves_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    gave_up: list[float] = []

    async def impatient() -> None:
        with trio.move_on_after(3.0):
            async with d.slot("key-b"):
                log.append(("never", "key-b", trio.current_time()))
        gave_up.append(trio.current_time())

    async with (
        open_dispatcher({"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "key-b", log, "own", 10.0)
        nursery.start_soon(impatient)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1.0)
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.sleep(3.0)
        stats = d.statistics().providers["key-b"]
        assert (stats.in_flight, stats.waiting) == (1, 0)
    assert gave_up == [3.0]
    assert log == [("own", "key-b", 0.0)]
    # The holder it brought counts as granted there, and released.
    final = d.statistics().providers["key-b"]
    assert (final.in_flight, final.waiting) == (0, 0)
    assert (final.granted_total, final.released_total) == (1, 1)


async def test_a_joining_providers_waiters_are_never_refused_for_a_full_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}, max_waiting=2
        ) as d,
        trio.open_nursery() as nursery,
    ):
        for name in ("p0", "p1", "p2"):
            await start(nursery, d, "gpt", log, name, 1.0)
        for name in ("b0", "b1", "b2"):
            await start(nursery, d, "key-b", log, name, 1.0)
        # Two wait on each side: four in the group's queue of two, admitted.
        d.set_pool("gpt", ("key-a", "key-b"))
        assert d.statistics().providers["key-a"].waiting == 0
        assert d.statistics().pools["gpt"].waiting == 2
    assert sorted(name for name, _, _ in log) == ["b0", "b1", "b2", "p0", "p1", "p2"]


async def test_a_younger_pool_request_never_passes_a_joining_members_held_back_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch import Budget  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []

    async def charged(name: str, tokens: int, seconds: float) -> None:
        async with d.slot("key-b", tokens=tokens) as slot:
            log.append((name, slot.member, trio.current_time()))
            await trio.sleep(seconds)

    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 2},
            pools={"gpt": ("key-a",)},
            budgets={"key-b": Budget(tokens_per_minute=1000)},
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "gpt", log, "p0", 100.0)
        nursery.start_soon(charged, "x", 900, 100.0)
        await trio.testing.wait_all_tasks_blocked()
        # H waits for key-b's budget, though a slot is free there.
        nursery.start_soon(charged, "H", 500, 1.0)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "gpt", log, "Q", 1.0)
        d.set_pool("gpt", ("key-a", "key-b"))
        await trio.testing.wait_all_tasks_blocked()
        # Q, younger, waits behind H: nobody passes the head its budget holds.
        assert [name for name, _, _ in log] == ["p0", "x"]
        nursery.cancel_scope.cancel()


async def test_a_learned_model_budget_goes_with_its_provider_into_a_new_pool(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"key-b": 1}) as d:
        await trio.sleep(100.0)
        d.observe_rate_limits(
            "key-b", RateLimitInfo(requests=Quota(limit=600, remaining=600)), model="m"
        )
        before = d.statistics().providers["key-b"].models
        d.set_pool("new", ("key-b", "key-d"))
        assert d.statistics().providers["key-b"].models == before
        assert "m" in before


async def test_moved_requests_events_name_their_member_and_count_from_their_first_ask(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch.events import Granted, Queued, Released  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher({"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",)}) as d,
        d.events() as events,
    ):
        async with trio.open_nursery() as nursery:
            await start(nursery, d, "key-b", log, "own", 5.0, conversation_id="c1")
            await start(nursery, d, "key-b", log, "next", 1.0, conversation_id="c2")
            await trio.sleep(1.0)
            d.set_pool("gpt", ("key-a", "key-b"))
        seen = [await events.__anext__() for _ in range(events.pending)]
    slots = [
        (type(e).__name__, e.provider, e.conversation_id)
        for e in seen
        if isinstance(e, Granted | Queued | Released)
    ]
    assert slots == [
        ("Granted", "key-b", "c1"),
        ("Queued", "key-b", "c2"),
        ("Released", "key-b", "c1"),
        ("Granted", "key-b", "c2"),
        ("Released", "key-b", "c2"),
    ]
    granted = [e for e in seen if isinstance(e, Granted)]
    released = [e for e in seen if isinstance(e, Released)]
    assert granted[1].wait == 5.0  # since it first asked, not since it moved
    assert [e.held for e in released] == [5.0, 1.0]


async def test_a_merged_groups_requests_keep_their_events_and_leave_nothing_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch.events import Granted, Queued, Released, Withdrawn  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []
    gave_up: list[float] = []

    async def impatient() -> None:
        with trio.move_on_after(3.0):
            async with d.slot("spare"):
                log.append(("never", None, trio.current_time()))
        gave_up.append(trio.current_time())

    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",), "spare": ("key-b",)}
        ) as d,
        d.events() as events,
    ):
        async with trio.open_nursery() as nursery:
            await start(nursery, d, "spare", log, "own", 5.0, conversation_id="c1")
            await start(nursery, d, "spare", log, "next", 1.0, conversation_id="c2")
            nursery.start_soon(impatient)
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1.0)
            d.set_pool("x", ("key-a", "key-b"))
            assert d.limits() == {"key-a": 1, "key-b": 1}
            await trio.sleep(3.0)
            stats = d.statistics()
            assert stats.providers["key-b"].in_flight == 1
            assert stats.pools["spare"].waiting == 1
        seen = [await events.__anext__() for _ in range(events.pending)]
    assert gave_up == [3.0]
    assert log == [("own", "key-b", 0.0), ("next", "key-b", 5.0)]
    final = d.statistics().providers["key-b"]
    assert (final.in_flight, final.waiting) == (0, 0)
    assert (final.granted_total, final.released_total) == (2, 2)
    slots = [
        (type(e).__name__, e.provider, e.pool, e.conversation_id)
        for e in seen
        if isinstance(e, Granted | Queued | Released | Withdrawn)
    ]
    assert slots == [
        ("Granted", "key-b", "spare", "c1"),
        ("Queued", "spare", "spare", "c2"),
        ("Queued", "spare", "spare", None),
        ("Withdrawn", "spare", "spare", None),
        ("Released", "key-b", "spare", "c1"),
        ("Granted", "key-b", "spare", "c2"),
        ("Released", "key-b", "spare", "c2"),
    ]
    granted = [e for e in seen if isinstance(e, Granted)]
    assert granted[1].wait == 5.0  # since it first asked, not since it moved


async def test_a_request_waiting_across_two_merges_names_its_member_and_is_held_to_max_hold(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str | None, float]] = []
    outcome: list[tuple[str, float]] = []

    async def long_holder() -> None:
        try:
            async with d.slot("pb") as slot:
                log.append(("b-waits", slot.member, trio.current_time()))
                await trio.sleep(100.0)
        except SlotHoldTimeout:
            outcome.append(("timed out", trio.current_time()))

    async with (
        open_dispatcher(
            {"a": 1, "b": 1, "c": 1},
            pools={"pa": ("a",), "pb": ("b",), "pc": ("c",)},
            max_hold=5.0,
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "pa", log, "a0", 4.0)
        await start(nursery, d, "pb", log, "b0", 1.0)
        # It waits through pb's view; pb's group merges into pa's, then
        # that one into pc's (the first of those named that runs).
        nursery.start_soon(long_holder)
        await trio.testing.wait_all_tasks_blocked()
        await start(nursery, d, "pc", log, "c0", 4.0)
        d.set_pool("ab", ("a", "b"))
        d.set_pool("ca", ("c", "a"))
    assert ("b-waits", "b", 1.0) in log
    assert outcome == [("timed out", 6.0)]


class _SetPoolOnGrant:
    """An event sink that calls ``set_pool`` on the first grant of ``pool``, from inside its scheduler's step."""

    def __init__(self, d: Dispatcher, pool: str, members: tuple[str, ...]) -> None:
        self.d, self.pool, self.members = d, pool, members
        self.errors: list[BaseException] = []
        self.statistics: list[set[str]] = []
        self.done = False

    def push(self, event: object) -> None:
        from trio_dispatch.events import Granted  # noqa: PLC0415

        if self.done or not isinstance(event, Granted) or event.pool != self.pool:
            return
        self.done = True
        try:
            self.d.set_pool("x", self.members)
        except RuntimeError as exc:
            self.errors.append(exc)
        self.statistics.append(set(self.d.statistics().providers))

    def close(self) -> None:
        pass


async def test_a_merge_refused_from_a_giving_way_groups_sink_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch.lowlevel import plumbing  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"a": 1, "b": 1, "c": 1}, pools={"pa": ("a",), "pb": ("b",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "pa", log, "a0", 1.0)
        await start(nursery, d, "c", log, "c0", 2.0)
        await start(nursery, d, "c", log, "c1", 1.0)  # waits on c's own scheduler
        # pb's scheduler would give way to pa's, but it is handling pb's grant.
        sink = _SetPoolOnGrant(d, "pb", ("a", "b", "c"))
        plumbing(d).observe_events(sink)
        await start(nursery, d, "pb", log, "b0", 1.0)
        assert [str(e) for e in sink.errors] == [
            "set_pool cannot move the scheduler of pools 'pb' while it handles a"
            " message (set_pool was called from its event sink?): nothing changed;"
            " call it from a task"
        ]
        assert d.pools() == {"pa": ("a",), "pb": ("b",)}
        await trio.sleep(2.0)
        await start(nursery, d, "pb", log, "b1", 1.0)
    assert log == [
        ("a0", "a", 0.0),
        ("c0", "c", 0.0),
        ("b0", "b", 0.0),
        ("c1", "c", 2.0),
        ("b1", "b", 2.0),
    ]


async def test_statistics_right_after_a_merge_from_the_targets_sink_show_what_joined(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch.lowlevel import plumbing  # noqa: PLC0415

    log: list[tuple[str, str | None, float]] = []
    async with (
        open_dispatcher(
            {"a": 1, "b": 1, "c": 1}, pools={"pa": ("a",), "pb": ("b",)}
        ) as d,
        trio.open_nursery() as nursery,
    ):
        await start(nursery, d, "pb", log, "b0", 5.0)
        await start(nursery, d, "c", log, "c0", 5.0)
        # From pa's own step: the merge (and c's join) wait for its end, and
        # a snapshot taken meanwhile leaves out what has not joined yet.
        sink = _SetPoolOnGrant(d, "pa", ("a", "b", "c"))
        plumbing(d).observe_events(sink)
        await start(nursery, d, "pa", log, "a0", 1.0)
        assert sink.errors == []
        assert sink.statistics == [{"a"}]
        assert set(d.statistics().providers) == {"a", "b", "c"}
        assert d.statistics().pools["x"].in_flight == 3


async def test_a_merged_queues_totals_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hold_for(provider: str, seconds: float) -> None:
        async with d.slot(provider):
            await trio.sleep(seconds)

    async with (
        open_dispatcher(
            {"a": 1, "b": 1, "c": 1}, pools={"pa": ("a",), "pb": ("b",)}, max_waiting=1
        ) as d,
        trio.open_nursery() as nursery,
    ):
        for provider in ("pa", "pb", "c"):
            nursery.start_soon(hold_for, provider, 100.0)
            await trio.testing.wait_all_tasks_blocked()
        for provider in ("pb", "c"):
            with trio.move_on_after(1.0):  # waits, then gives up: withdrawn
                async with d.slot(provider):
                    pass
            nursery.start_soon(hold_for, provider, 1.0)  # waits: the queue is full
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(QueueFull):
                async with d.slot(provider):
                    pass
        d.set_pool("x", ("a", "b", "c"))
        stats = d.statistics().providers
        nursery.cancel_scope.cancel()
    # One queue now, counting on from the three: pb's and c's.
    assert {
        name: (s.withdrawn_total, s.rejected_total) for name, s in stats.items()
    } == dict.fromkeys(("a", "b", "c"), (2, 2))


async def test_set_pool_with_a_backend_of_ones_own_is_refused_and_changes_nothing() -> (
    None
):
    async with open_dispatcher_with(SchedulerActor.from_setup, {"key-b": 1}) as d:
        async with d.slot("key-b"):
            pass
        with pytest.raises(ValueError, match=r"^pools need the local scheduler"):
            d.set_pool("new", ("key-b", "key-d"))
        assert "key-b" in d.statistics().providers
        assert d.pools() == {}


async def test_set_pool_refuses_a_pool_named_as_its_own_member() -> None:
    async with open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d:
        for members in (("key-a", "gpt"), ("gpt", "key-z")):
            with pytest.raises(ValueError, match=r"^pool 'gpt' has the name of a"):
                d.set_pool("gpt", members)
        with pytest.raises(ValueError, match=r"^pool 'new' has the name of a"):
            d.set_pool("new", ("new", "key-z"))
        assert d.pools() == {"gpt": ("key-a",)}
