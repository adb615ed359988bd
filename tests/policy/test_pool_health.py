"""Members' health in the pure core: failures, out of service, half-open, fallbacks."""

from __future__ import annotations

import math

import pytest

from trio_dispatch.lowlevel import MemberStatistics, SlotPolicy, Ticket


def t(rank: float, seq: int) -> Ticket:
    return Ticket(rank, seq, 0, None, None)


def pool(
    *limits: int | None,
    threshold: int = 3,
    cooldown: float = 30.0,
    affinity_wait: float = 2.0,
) -> SlotPolicy:
    """A policy whose members are ``a``, ``b``, ... with ``limits``."""
    names = "abcd"
    policy = SlotPolicy(
        limits[0],
        provider=names[0],
        affinity_wait=affinity_wait,
        failure_threshold=threshold,
        failure_cooldown=cooldown,
    )
    for name, limit in zip(names[1:], limits[1:], strict=False):
        assert policy.add_member(name, limit) == []
    return policy


def health(policy: SlotPolicy, name: str) -> tuple[int, float | None, bool, int]:
    """``name``'s failures, end of cooldown, whether half-open, and outages."""
    statistics = policy.member_statistics()[name]
    return (
        statistics.failures,
        statistics.out_of_service_until,
        statistics.half_open,
        statistics.outages_total,
    )


def members_of(policy: SlotPolicy, tickets: list[Ticket]) -> list[str | None]:
    return [policy.member_of(ticket) for ticket in tickets]


def test_a_member_goes_out_of_service_at_the_threshold_and_the_other_takes_all() -> (
    None
):
    policy = pool(4, 4, threshold=3, cooldown=30.0)
    held = [t(0, i) for i in range(3)]
    for ticket in held:
        assert policy.acquire(ticket, member="a") == [ticket]
    rows = []
    for now, ticket in zip([1.0, 2.0, 3.0], held, strict=True):
        assert policy.fail(ticket, now) == []
        rows.append(health(policy, "a"))
    assert rows == [(1, None, False, 0), (2, None, False, 0), (3, 33.0, False, 1)]
    # Four free slots on a, out of service: every grant goes to b.
    newcomers = [t(1, 3), t(2, 4), t(3, 5), t(4, 6)]
    assert [policy.acquire(ticket) for ticket in newcomers] == [[x] for x in newcomers]
    assert members_of(policy, newcomers) == ["b", "b", "b", "b"]
    assert policy.acquire(t(5, 7)) == []
    assert policy.acquire(t(6, 8), member="a") == []  # a's own wait as well
    assert policy.member_statistics()["a"].in_flight == 0
    assert policy.wake_at == 33.0


def test_every_member_out_of_service_the_tickets_wait_for_the_first_back() -> None:
    policy = pool(1, 1, threshold=1, cooldown=10.0)
    policy.acquire(t(0, 0))
    policy.acquire(t(0, 1))
    assert members_of(policy, [t(0, 0), t(0, 1)]) == ["a", "b"]
    assert policy.fail(t(0, 0), 0.0) == []
    assert policy.fail(t(0, 1), 4.0) == []
    assert policy.acquire(t(1, 2)) == []
    assert policy.acquire(t(2, 3)) == []
    statistics = policy.statistics()
    assert (statistics.waiting, statistics.rejected_total) == (2, 0)
    assert policy.wake_at == 10.0
    assert policy.tick(9.5) == []
    # a's cooldown ends: it takes one probe, the oldest waiting.
    assert policy.tick(10.0) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "a"
    assert health(policy, "a") == (1, None, True, 1)
    assert policy.wake_at == 14.0
    assert policy.tick(14.0) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "b"
    assert policy.wake_at is None


def half_open_pool() -> SlotPolicy:
    """a (limit 4) half-open, holding its probe t(1, 2); b (limit 1) holds t(0, 1).

    t(2, 3) and t(3, 4) wait.
    """
    policy = pool(4, 1, threshold=1, cooldown=5.0)
    assert policy.acquire(t(0, 0)) == [t(0, 0)]
    assert policy.member_of(t(0, 0)) == "a"
    assert policy.fail(t(0, 0), 0.0) == []
    assert policy.acquire(t(0, 1)) == [t(0, 1)]
    assert policy.member_of(t(0, 1)) == "b"
    for ticket in [t(1, 2), t(2, 3), t(3, 4)]:
        assert policy.acquire(ticket) == []
    assert policy.tick(5.0) == [t(1, 2)]  # one probe, though a has 4 free slots
    assert policy.member_of(t(1, 2)) == "a"
    return policy


def test_a_half_open_member_takes_exactly_one_probe_whatever_its_limit() -> None:
    policy = half_open_pool()
    assert health(policy, "a") == (1, None, True, 1)
    assert policy.acquire(t(4, 5)) == []
    assert policy.tick(6.0) == []
    assert policy.waiters() == [t(2, 3), t(3, 4), t(4, 5)]
    # b's slot goes to the oldest; a still takes nothing more.
    assert policy.release(t(0, 1)) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "b"
    assert policy.member_statistics()["a"].in_flight == 1
    assert policy.wake_at is None


def test_a_probe_released_opens_the_members_full_limit_again() -> None:
    policy = half_open_pool()
    assert policy.acquire(t(4, 5)) == []
    assert policy.release(t(1, 2)) == [t(2, 3), t(3, 4), t(4, 5)]
    assert members_of(policy, [t(2, 3), t(3, 4), t(4, 5)]) == ["a", "a", "a"]
    assert health(policy, "a") == (0, None, False, 1)
    assert policy.member_statistics()["a"].in_flight == 3


def test_a_probe_failed_takes_the_member_out_for_a_full_cooldown_from_then() -> None:
    policy = half_open_pool()
    assert policy.fail(t(1, 2), 7.0) == []
    assert health(policy, "a") == (1, 12.0, False, 2)
    assert policy.wake_at == 12.0
    assert policy.tick(11.5) == []
    assert policy.tick(12.0) == [t(2, 3)]  # the next probe
    assert policy.member_of(t(2, 3)) == "a"
    assert health(policy, "a") == (1, None, True, 2)
    assert policy.waiters() == [t(3, 4)]


def test_a_probe_cancelled_leaves_the_member_half_open_for_the_next() -> None:
    policy = half_open_pool()
    # A grant that raced its cancellation: no success, no failure.
    assert policy.cancel(t(1, 2)) == [t(2, 3)]
    assert policy.member_of(t(2, 3)) == "a"
    assert health(policy, "a") == (1, None, True, 1)
    assert policy.waiters() == [t(3, 4)]
    # t(2, 3) was the new probe: its success brings a back.
    assert policy.release(t(2, 3)) == [t(3, 4)]
    assert policy.member_of(t(3, 4)) == "a"
    assert health(policy, "a") == (0, None, False, 1)


def test_a_probe_is_known_by_its_value_not_by_its_object() -> None:
    # Regression: the probe was compared by identity, so its end told with
    # an equal ticket (a Ticket is a tuple, rebuilt by whoever sends it) was
    # not the probe's: the member stayed half-open, its probe slot taken by
    # nobody, and took nothing ever again.
    policy = pool(1, 1, threshold=1, cooldown=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.fail(t(0, 0), 0.0)
    policy.tick(5.0)
    probe = t(1, 1)
    assert policy.acquire(probe, member="a") == [probe]
    same = t(1, 1)
    assert same == probe
    assert same is not probe
    assert policy.fail(same, 6.0) == []
    assert health(policy, "a") == (1, 11.0, False, 2)
    assert policy.tick(11.0) == []
    second = t(2, 2)
    assert policy.acquire(second, member="a") == [second]
    assert policy.release(t(2, 2)) == []
    assert health(policy, "a") == (0, None, False, 2)
    assert policy.acquire(t(3, 3), member="a") == [t(3, 3)]


def test_a_success_between_failures_ends_the_row() -> None:
    policy = pool(4, 4, threshold=3)
    held = [t(0, i) for i in range(4)]
    for ticket in held:
        policy.acquire(ticket, member="a")
    rows = []
    policy.fail(held[0], 1.0)
    rows.append(health(policy, "a"))
    policy.fail(held[1], 2.0)
    rows.append(health(policy, "a"))
    policy.release(held[2])
    rows.append(health(policy, "a"))
    policy.fail(held[3], 3.0)
    rows.append(health(policy, "a"))
    assert rows == [
        (1, None, False, 0),
        (2, None, False, 0),
        (0, None, False, 0),
        (1, None, False, 0),
    ]
    assert policy.acquire(t(1, 4), member="a") == [t(1, 4)]


def test_failures_of_other_holders_count_nothing_while_out_or_half_open() -> None:
    policy = pool(4, 1, threshold=2, cooldown=5.0)
    held = [t(0, i) for i in range(4)]
    for ticket in held:
        policy.acquire(ticket, member="a")
    rows = []
    policy.fail(held[0], 0.0)
    policy.fail(held[1], 0.0)
    rows.append(health(policy, "a"))
    # Sent before the outage, failed since: the member is out already.
    policy.fail(held[2], 1.0)
    rows.append(health(policy, "a"))
    assert policy.tick(5.0) == []
    rows.append(health(policy, "a"))
    assert policy.acquire(t(1, 4), member="a") == [t(1, 4)]  # the probe
    # An old holder fails while the probe holds: only the probe's counts.
    assert policy.fail(held[3], 6.0) == []
    rows.append(health(policy, "a"))
    assert policy.release(t(1, 4)) == []
    rows.append(health(policy, "a"))
    assert rows == [
        (2, 5.0, False, 1),
        (2, 5.0, False, 1),
        (2, None, True, 1),
        (2, None, True, 1),
        (0, None, False, 1),
    ]


def test_a_holder_that_succeeds_while_out_does_not_end_the_outage() -> None:
    policy = pool(2, 1, threshold=1, cooldown=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="a")
    policy.fail(t(0, 0), 0.0)
    assert policy.release(t(0, 1)) == []
    # Its row of failures ends; the cooldown runs on.
    assert health(policy, "a") == (0, 5.0, False, 1)
    assert policy.acquire(t(1, 2), member="a") == []
    assert policy.tick(5.0) == [t(1, 2)]


def test_a_fallback_avoids_the_members_it_failed_on() -> None:
    policy = pool(2, 2)
    # a would be first (as many free slots as b, added first).
    assert policy.acquire(t(5, 0), avoid=["a"]) == [t(5, 0)]
    assert policy.acquire(t(6, 1), avoid=("a",)) == [t(6, 1)]
    assert members_of(policy, [t(5, 0), t(6, 1)]) == ["b", "b"]
    assert policy.acquire(t(7, 2), avoid={"a"}) == []  # a's free slots are not its
    # Who avoids nothing takes a's slots, though the fallback waits.
    assert policy.acquire(t(8, 3)) == [t(8, 3)]
    assert policy.member_of(t(8, 3)) == "a"
    assert policy.release(t(8, 3)) == []
    assert policy.release(t(5, 0)) == [t(7, 2)]
    assert policy.member_of(t(7, 2)) == "b"


def test_a_fallback_keeps_its_place_ahead_of_younger_tickets() -> None:
    policy = pool(1, 1)
    policy.acquire(t(0, 0))  # a
    policy.acquire(t(0, 1))  # b
    assert policy.acquire(t(5, 2)) == []
    assert policy.acquire(t(1, 3), avoid=["a"]) == []  # arrived later, older turn
    assert policy.acquire(t(3, 4)) == []
    assert policy.waiters() == [t(1, 3), t(3, 4), t(5, 2)]
    # b frees: the fallback, the oldest, takes it.
    assert policy.release(t(0, 1)) == [t(1, 3)]
    assert policy.member_of(t(1, 3)) == "b"
    # a frees: the oldest that may take a goes.
    assert policy.release(t(0, 0)) == [t(3, 4)]
    assert policy.member_of(t(3, 4)) == "a"
    assert policy.release(t(1, 3)) == [t(5, 2)]
    assert policy.member_of(t(5, 2)) == "b"


def test_a_fallback_older_than_the_others_goes_first_on_the_member_it_may_take() -> (
    None
):
    policy = pool(1, 1)
    policy.acquire(t(0, 0))  # a
    policy.acquire(t(0, 1))  # b
    assert policy.acquire(t(2, 2)) == []
    assert policy.acquire(t(1, 3), avoid=["b"]) == []
    # b frees: the fallback may not take it; the next oldest does.
    assert policy.release(t(0, 1)) == [t(2, 2)]
    assert policy.member_of(t(2, 2)) == "b"
    assert policy.release(t(0, 0)) == [t(1, 3)]
    assert policy.member_of(t(1, 3)) == "a"


def test_avoid_is_ignored_when_it_covers_every_member() -> None:
    policy = pool(1, 1)
    assert policy.acquire(t(0, 0), avoid=["a", "b"]) == [t(0, 0)]
    assert policy.acquire(t(0, 1), avoid=["b", "a", "zz"]) == [t(0, 1)]
    assert members_of(policy, [t(0, 0), t(0, 1)]) == ["a", "b"]
    assert policy.acquire(t(1, 2), avoid=["a", "b"]) == []
    assert policy.release(t(0, 0)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "a"


def test_avoid_is_ignored_for_names_outside_the_pool_and_for_a_member_asked() -> None:
    policy = pool(1, 1, 1)
    policy.set_pool("p", ["b", "c"])
    # a is not in p: nothing is avoided, and b is first (added first).
    assert policy.acquire(t(0, 0), member="p", avoid=["a", "zz"]) == [t(0, 0)]
    assert policy.member_of(t(0, 0)) == "b"
    policy.release(t(0, 0))
    # Every member of p avoided: ignored.
    assert policy.acquire(t(0, 1), member="p", avoid=["b", "c"]) == [t(0, 1)]
    assert policy.member_of(t(0, 1)) == "b"
    policy.release(t(0, 1))
    assert policy.acquire(t(0, 2), member="p", avoid=["b"]) == [t(0, 2)]
    assert policy.member_of(t(0, 2)) == "c"
    # Asked for directly: it goes to that member, avoided or not.
    assert policy.acquire(t(0, 3), member="a", avoid=["a"]) == [t(0, 3)]
    assert policy.member_of(t(0, 3)) == "a"
    assert policy.acquire(t(1, 4), member="a", avoid=["a"]) == []
    assert policy.release(t(0, 2)) == []  # c's slot is not a's
    assert policy.release(t(0, 3)) == [t(1, 4)]
    assert policy.member_of(t(1, 4)) == "a"


def test_a_fallback_in_a_pool_whose_members_change_keeps_one_member_at_least() -> None:
    policy = pool(1, 1, 1)
    policy.set_pool("p", ["a", "b"])
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="b")
    assert policy.acquire(t(1, 2), member="p", avoid=["a"]) == []
    # Its pool is a alone now: it avoided a, but no other is left.
    assert policy.set_pool("p", ["a"]) == []
    assert policy.release(t(0, 0)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "a"


def test_an_avoided_preferred_member_is_not_preferred() -> None:
    policy = pool(2, 2)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="a")
    # It would wait for a (b is free); avoiding it, it goes to b at once.
    assert policy.acquire(t(1, 2), prefer="a", avoid=["a"]) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"
    assert policy.wake_at is None
    statistics = policy.member_statistics()["a"]
    assert (statistics.affinity_hits, statistics.affinity_moves) == (0, 0)


def test_a_fallback_waits_for_the_member_it_prefers_then_not_for_the_avoided() -> None:
    policy = pool(1, 1, 1, affinity_wait=2.0)
    policy.acquire(t(0, 0), member="b")
    policy.acquire(t(0, 1), member="c")
    # a is free but avoided; b is preferred and busy; c busy.
    assert policy.acquire(t(1, 2), prefer="b", avoid=["a"]) == []
    assert policy.member_statistics()["b"].waiting == 1
    assert policy.wake_at == 2.0
    assert policy.tick(2.0) == []  # its wait ends: any member but a
    assert policy.member_statistics()["b"].waiting == 0
    assert policy.release(t(0, 1)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "c"
    assert policy.member_statistics()["b"].affinity_moves == 1


def test_a_preferred_member_out_of_service_is_not_waited_for() -> None:
    policy = pool(1, 1, threshold=1, cooldown=30.0, affinity_wait=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.fail(t(0, 0), 0.0)
    policy.acquire(t(0, 1), member="b")
    assert policy.acquire(t(1, 2), prefer="a") == []
    assert policy.member_statistics()["a"].waiting == 0
    assert policy.wake_at == 30.0  # the cooldown, no wait for a
    assert policy.release(t(0, 1)) == [t(1, 2)]
    assert policy.member_of(t(1, 2)) == "b"


def test_a_preferred_member_half_open_is_not_waited_for_but_tried_first() -> None:
    policy = pool(2, 2, threshold=1, cooldown=30.0, affinity_wait=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.fail(t(0, 0), 0.0)
    assert policy.tick(30.0) == []
    # Half-open with its probe's slot free: it takes the one preferring it,
    # though b has more free slots.
    assert policy.acquire(t(1, 1), prefer="a") == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "a"
    # Its probe holds: the next preferring it is not kept waiting.
    assert policy.acquire(t(2, 2), prefer="a") == [t(2, 2)]
    assert policy.member_of(t(2, 2)) == "b"
    policy.acquire(t(3, 3), member="b")
    assert policy.acquire(t(4, 4), prefer="a") == []
    assert policy.member_statistics()["a"].waiting == 0
    assert policy.wake_at is None
    assert policy.release(t(2, 2)) == [t(4, 4)]
    assert policy.member_of(t(4, 4)) == "b"


def test_the_waiters_preferring_a_member_move_at_once_when_it_goes_out() -> None:
    policy = pool(2, 2, threshold=1, cooldown=30.0, affinity_wait=5.0)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="a")
    policy.acquire(t(0, 2), member="b")
    assert policy.acquire(t(1, 3), prefer="a") == []  # b has room: it waits for a
    assert policy.acquire(t(2, 4), prefer="a") == []
    assert policy.member_statistics()["a"].waiting == 2
    assert policy.wake_at == 5.0
    # a fails: they wait for any member now, in their order.
    assert policy.fail(t(0, 0), 1.0) == [t(1, 3)]
    assert policy.member_of(t(1, 3)) == "b"
    statistics = policy.member_statistics()["a"]
    assert (statistics.waiting, statistics.affinity_moves) == (0, 1)
    assert policy.waiters() == [t(2, 4)]
    assert policy.wake_at == 31.0
    assert policy.release(t(0, 2)) == [t(2, 4)]
    assert policy.member_of(t(2, 4)) == "b"


def test_a_ticket_asking_for_a_member_out_of_service_waits_for_it() -> None:
    policy = pool(1, 1, threshold=1, cooldown=10.0)
    policy.acquire(t(0, 0), member="a")
    policy.fail(t(0, 0), 0.0)
    assert policy.acquire(t(1, 1), member="a") == []
    assert policy.acquire(t(2, 2)) == [t(2, 2)]
    assert policy.member_of(t(2, 2)) == "b"
    assert policy.tick(10.0) == [t(1, 1)]
    assert policy.member_of(t(1, 1)) == "a"


def test_a_policy_of_one_member_counts_its_failures_but_stays_in_service() -> None:
    policy = SlotPolicy(1, failure_threshold=1, failure_cooldown=5.0)
    policy.acquire(t(0, 0))
    assert policy.acquire(t(1, 1)) == []
    assert policy.fail(t(0, 0), 0.0) == [t(1, 1)]
    assert policy.fail(t(1, 1), 0.0) == []
    statistics = policy.member_statistics()[""]
    assert (statistics.failures, statistics.out_of_service_until) == (2, None)
    assert policy.acquire(t(2, 2)) == [t(2, 2)]
    assert policy.wake_at is None


def test_fail_of_an_unknown_or_finished_ticket_does_nothing() -> None:
    policy = pool(1, 1, threshold=1)
    assert policy.fail(t(9, 9), 0.0) == []
    policy.acquire(t(0, 0))
    policy.release(t(0, 0))
    assert policy.fail(t(0, 0), 0.0) == []
    policy.acquire(t(0, 1))
    policy.fail(t(0, 1), 0.0)
    assert policy.fail(t(0, 1), 0.0) == []  # failed once already
    assert [health(policy, name) for name in "ab"] == [
        (1, 30.0, False, 1),
        (0, None, False, 0),
    ]
    assert policy.statistics().released_total == 2


def test_fail_of_a_waiting_ticket_is_misuse() -> None:
    policy = pool(1, 1, threshold=1)
    policy.acquire(t(0, 0))
    policy.acquire(t(0, 1))
    policy.acquire(t(1, 2))
    with pytest.raises(
        RuntimeError,
        match=r"^ticket Ticket\(.*\) is waiting, not holding a slot$",
    ):
        policy.fail(t(1, 2), 0.0)
    assert policy.waiters() == [t(1, 2)]
    assert [health(policy, name) for name in "ab"] == [(0, None, False, 0)] * 2


def test_fail_checks_its_time() -> None:
    policy = pool(1, 1)
    policy.acquire(t(0, 0))
    with pytest.raises(ValueError, match=r"^now must be a finite number, got nan$"):
        policy.fail(t(0, 0), math.nan)
    assert policy.member_of(t(0, 0)) == "a"


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        (
            {"failure_threshold": 0},
            ValueError,
            r"^failure_threshold must be a positive integer, got 0$",
        ),
        (
            {"failure_threshold": -1},
            ValueError,
            r"^failure_threshold must be a positive integer, got -1$",
        ),
        (
            {"failure_threshold": 1.5},
            TypeError,
            r"^failure_threshold must be a positive integer, got 1\.5$",
        ),
        (
            {"failure_threshold": True},
            TypeError,
            r"^failure_threshold must be a positive integer, got True$",
        ),
        (
            {"failure_cooldown": 0},
            ValueError,
            r"^failure_cooldown must be a positive number of seconds, got 0$",
        ),
        (
            {"failure_cooldown": -1.0},
            ValueError,
            r"^failure_cooldown must be a positive number of seconds, got -1\.0$",
        ),
        (
            {"failure_cooldown": math.inf},
            ValueError,
            r"^failure_cooldown must be a positive number of seconds, got inf$",
        ),
    ],
)
def test_failure_settings_are_checked(
    settings: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        SlotPolicy(1, **settings)  # type: ignore[arg-type]


def test_member_statistics_show_health() -> None:
    policy = pool(2, 1, threshold=2, cooldown=10.0)
    policy.acquire(t(0, 0), member="a")
    policy.acquire(t(0, 1), member="a")
    policy.fail(t(0, 0), 1.0)
    policy.fail(t(0, 1), 1.0)
    assert policy.member_statistics()["a"] == MemberStatistics(
        member="a",
        limit=2,
        in_flight=0,
        waiting=0,
        paused_until=None,
        granted_total=2,
        released_total=2,
        peak_in_flight=2,
        affinity_hits=0,
        affinity_moves=0,
        failures=2,
        out_of_service_until=11.0,
        half_open=False,
        outages_total=1,
    )
    policy.tick(11.0)
    policy.acquire(t(1, 2), member="a")
    statistics = policy.member_statistics()
    assert (statistics["a"].half_open, statistics["a"].in_flight) == (True, 1)
    assert statistics["b"] == MemberStatistics(
        member="b",
        limit=1,
        in_flight=0,
        waiting=0,
        paused_until=None,
        granted_total=0,
        released_total=0,
        peak_in_flight=0,
        affinity_hits=0,
        affinity_moves=0,
    )


def test_a_member_left_alone_is_back_in_service_at_once() -> None:
    # a is out, b removed: a lone member is never out of service, so the
    # tickets waiting for it are granted at once, and its change is told.
    policy = pool(2, 2, threshold=1, cooldown=30.0)
    assert policy.acquire(t(0, 0), member="a") == [t(0, 0)]
    assert policy.fail(t(0, 0), 0.0) == []
    assert policy.service_changes == [("a", "out", 30.0)]
    assert policy.acquire(t(1, 1), member="a") == []
    assert policy.remove_member("b") == ([t(1, 1)], [])
    assert health(policy, "a") == (1, None, False, 1)
    assert policy.service_changes == [("a", "out", 30.0), ("a", "in", None)]
    assert policy.wake_at is None
    # Alone, a failed probe or any failure keeps it in service.
    assert policy.fail(t(1, 1), 1.0) == []
    assert health(policy, "a") == (2, None, False, 1)


def test_a_half_open_member_left_alone_takes_its_full_share() -> None:
    policy = half_open_pool()
    policy.service_changes.clear()
    grants, orphans = policy.remove_member("b")
    assert orphans == []
    # Alone: back in service, three free slots of a for the two waiting.
    assert grants == [t(2, 3), t(3, 4)]
    assert members_of(policy, grants) == ["a", "a"]
    assert policy.service_changes == [("a", "in", None)]
    assert policy.fail(t(1, 2), 6.0) == []  # the probe that was: nothing
    assert health(policy, "a") == (2, None, False, 1)


def test_avoid_must_be_a_collection_of_names_not_a_string() -> None:
    policy = pool(1, 1)
    with pytest.raises(TypeError, match=r"^avoid must be a collection of member names"):
        policy.acquire(t(0, 0), avoid="ab")
    assert policy.statistics().waiting == policy.statistics().in_flight == 0
    assert policy.acquire(t(0, 0), avoid=("a",)) == [t(0, 0)]
    assert policy.member_of(t(0, 0)) == "b"
