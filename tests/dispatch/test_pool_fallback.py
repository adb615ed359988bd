"""Members that fail, through the dispatcher: out of service, half-open, fallback.

Virtual time (``autojump_clock``): each test stages its requests with
``wait_all_tasks_blocked`` and asserts exact times, members and
statistics.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import Dispatcher, open_dispatcher
from trio_dispatch.events import ServiceChanged
from trio_dispatch.lowlevel import (
    Acquire,
    ForMember,
    SchedulerActor,
    SetPool,
    SlotPolicy,
)

from .._helpers import RecordingReply


def pool(**options: float) -> object:
    """A pool ``gpt`` of ``key-a`` and ``key-b``, 2 slots each."""
    return open_dispatcher(
        {"key-a": 2, "key-b": 2},
        pools={"gpt": ("key-a", "key-b")},
        **options,  # type: ignore[arg-type]
    )


async def fail_on(dispatcher: Dispatcher, provider: str) -> str | None:
    """One call on ``provider`` that fails before its answer: the member it failed on."""
    async with dispatcher.slot(provider) as slot:
        slot.failed()
        assert not slot.held
        return slot.member


async def test_failures_in_a_row_take_a_member_out_then_one_probe_brings_it_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher(
            {"key-a": 2, "key-b": 2},
            pools={"gpt": ("key-a", "key-b")},
            failure_threshold=2,
            failure_cooldown=10.0,
        ) as d,
        d.events() as events,
    ):
        assert await fail_on(d, "key-a") == "key-a"
        stats = d.statistics().providers["key-a"]
        assert (stats.failures, stats.out_of_service_until) == (1, None)
        assert await fail_on(d, "key-a") == "key-a"
        stats = d.statistics().providers["key-a"]
        assert stats.out_of_service_until == 10.0
        assert (stats.outages_total, stats.half_open) == (1, False)
        # Out: every request for the pool goes to key-b, free slots or not.
        log: list[tuple[str, str | None, float]] = []

        async def hold(name: str, provider: str, seconds: float) -> None:
            async with d.slot(provider) as slot:
                log.append((name, slot.member, trio.current_time()))
                await trio.sleep(seconds)

        async with trio.open_nursery() as nursery:
            for name in ("p1", "p2", "p3"):
                nursery.start_soon(hold, name, "gpt", 4.0)
                await trio.testing.wait_all_tasks_blocked()
            # Asked directly of key-a: it waits for the cooldown's end, then
            # probes it; the next waits for the probe's answer.
            nursery.start_soon(hold, "probe", "key-a", 3.0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(hold, "after", "key-a", 1.0)
            await trio.testing.wait_all_tasks_blocked()
            assert d.statistics().providers["key-a"].in_flight == 0
        seen = [await events.__anext__() for _ in range(events.pending)]
    assert log == [
        ("p1", "key-b", 0.0),
        ("p2", "key-b", 0.0),
        ("p3", "key-b", 4.0),
        ("probe", "key-a", 10.0),
        ("after", "key-a", 13.0),
    ]
    changes = [
        (event.provider, event.at, event.state, event.until)
        for event in seen
        if isinstance(event, ServiceChanged)
    ]
    assert changes == [
        ("key-a", 0.0, "out", 10.0),
        ("key-a", 10.0, "half_open", None),
        ("key-a", 13.0, "in", None),
    ]


async def test_a_probe_that_fails_takes_the_member_out_for_another_cooldown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with pool(failure_threshold=1, failure_cooldown=5.0) as d:  # type: ignore[attr-defined]
        await fail_on(d, "key-a")
        await trio.sleep(5.0)
        stats = d.statistics().providers["key-a"]
        assert (stats.half_open, stats.out_of_service_until) == (True, None)
        await fail_on(d, "key-a")  # the probe fails at 5.0
        stats = d.statistics().providers["key-a"]
        assert (stats.half_open, stats.out_of_service_until) == (False, 10.0)
        assert stats.outages_total == 2


async def test_every_member_out_the_requests_wait_not_fail(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with pool(failure_threshold=1, failure_cooldown=10.0) as d:  # type: ignore[attr-defined]
        await fail_on(d, "key-a")
        await trio.sleep(3.0)
        await fail_on(d, "key-b")
        granted: list[tuple[str | None, float]] = []

        async def ask() -> None:
            async with d.slot("gpt") as slot:
                granted.append((slot.member, trio.current_time()))
                await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask)
                await trio.testing.wait_all_tasks_blocked()
            assert d.statistics().pools["gpt"].waiting == 3
    # key-a's probe at 10; back in service after its probe's second, its
    # full share open (key-b's cooldown runs until 13).
    assert granted == [("key-a", 10.0), ("key-a", 11.0), ("key-a", 11.0)]


async def test_a_fallback_avoids_its_member_and_keeps_its_turns_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as d:
        log: list[tuple[str, str | None, float]] = []

        async def hold(name: str, started_at: float, seconds: float) -> None:
            async with d.slot("gpt", started_at=started_at) as slot:
                log.append((name, slot.member, trio.current_time()))
                await trio.sleep(seconds)

        async def old_call() -> None:
            async with d.slot("gpt", started_at=0.0) as slot:
                log.append(("old", slot.member, trio.current_time()))
                await trio.sleep(1.0)
                slot.failed()  # no answer from key-a
            assert slot.member is not None  # granted: it stays known
            async with d.slot(
                "gpt", started_at=slot.started_at, avoid=(slot.member,)
            ) as again:
                log.append(("old again", again.member, trio.current_time()))
                await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_call)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(hold, "young", 0.0, 5.0)
            await trio.testing.wait_all_tasks_blocked()
            for name in ("younger", "youngest"):
                nursery.start_soon(hold, name, 1.0, 1.0)
                await trio.testing.wait_all_tasks_blocked()
    # key-a, freed by the failure, goes to the next in line; the old turn's
    # call waits for key-b, and takes it before the younger ones.
    assert log == [
        ("old", "key-a", 0.0),
        ("young", "key-b", 0.0),
        ("younger", "key-a", 1.0),
        ("youngest", "key-a", 2.0),
        ("old again", "key-b", 5.0),
    ]


async def test_avoid_is_checked_and_ignored_for_a_provider_alone() -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1, "alone": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as d:
        with pytest.raises(TypeError, match=r"^avoid must be a list or tuple"):
            d.slot("gpt", avoid="key-a")
        with pytest.raises(TypeError, match=r"^avoid must be a list or tuple"):
            d.slot("gpt", avoid=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"avoid names every member of pool"):
            d.slot("gpt", avoid=("key-b", "key-a"))
        with pytest.raises(ValueError, match=r"^provider must be a non-empty string"):
            d.slot("gpt", avoid=("",))
        async with d.slot("alone", avoid=("key-a",)) as slot:
            assert slot.member == "alone"
        async with d.slot("gpt", avoid=("key-b", "elsewhere")) as slot:
            assert slot.member == "key-a"
        assert d.statistics().providers["alone"].granted_total == 1


async def test_a_provider_alone_counts_its_failures_and_never_goes_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"alone": 1}, failure_threshold=1) as d:
        for _ in range(3):
            assert await fail_on(d, "alone") == "alone"
        stats = d.statistics().providers["alone"]
        assert (stats.failures, stats.out_of_service_until, stats.outages_total) == (
            3,
            None,
            0,
        )
        async with d.slot("alone") as slot:
            assert slot.held
        assert d.statistics().providers["alone"].failures == 0  # answered


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"failure_threshold": 0}, ValueError, r"failure_threshold must be"),
        ({"failure_threshold": 1.5}, TypeError, r"failure_threshold must be"),
        ({"failure_threshold": True}, TypeError, r"failure_threshold must be"),
        ({"failure_cooldown": 0}, ValueError, r"failure_cooldown must be"),
        ({"failure_cooldown": -1.0}, ValueError, r"failure_cooldown must be"),
        ({"failure_cooldown": "5"}, TypeError, r"failure_cooldown must be"),
    ],
)
def test_the_failure_settings_are_checked_at_the_call(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        open_dispatcher({"key-a": 1}, **options)  # type: ignore[arg-type]


async def test_a_member_back_from_its_cooldown_is_probed_by_the_next_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # key-b has more free slots, but the probe goes first: key-a is tried
    # as soon as its cooldown ends, not when key-b happens to be full.
    async with open_dispatcher(
        {"key-a": 1, "key-b": 4},
        pools={"gpt": ("key-a", "key-b")},
        failure_threshold=1,
        failure_cooldown=5.0,
    ) as d:
        await fail_on(d, "key-a")
        async with d.slot("gpt") as slot:
            assert slot.member == "key-b"  # key-a is out
        await trio.sleep(5.0)
        async with d.slot("gpt") as probe:
            assert probe.member == "key-a"
            assert d.statistics().providers["key-a"].half_open
            async with d.slot("gpt") as other:
                assert other.member == "key-b"  # one probe only
        stats = d.statistics().providers["key-a"]
        assert (stats.half_open, stats.out_of_service_until) == (False, None)


async def test_a_scheduler_refuses_an_acquire_whose_avoid_is_a_string() -> None:
    # Sent by hand (the dispatcher checks avoid first): that request fails,
    # not the scheduler.
    policy = SlotPolicy(1, provider="key-a")
    policy.add_member("key-b", 1)
    actor = SchedulerActor("gpt", policy)
    actor.send(SetPool("gpt", ("key-a", "key-b")))
    bad, good = RecordingReply(), RecordingReply()
    actor.send(ForMember("gpt", Acquire(actor.ticket(0.0), bad, avoid="key-a")))  # type: ignore[arg-type]
    actor.send(ForMember("gpt", Acquire(actor.ticket(0.0), good, avoid=("key-a",))))
    assert [type(error) for error in bad.errors] == [TypeError]
    assert bad.grants == []
    assert [policy.member_of(grant.ticket) for grant in good.grants] == ["key-b"]
