"""The server's own load as a gate (``_policy._server``), in the core and in the policy."""

from __future__ import annotations

import pytest

from trio_dispatch import ServerLoad
from trio_dispatch._policy._server import ServerGate
from trio_dispatch.lowlevel import SlotPolicy, Ticket


def load(running: int, waiting: int = 0) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting)


def test_no_reading_holds_nothing() -> None:
    gate = ServerGate()
    assert gate.holds(100)
    gate.observe(None, 0)
    assert gate.holds(100)


def test_a_queue_on_the_server_holds_every_grant_and_teaches_its_slots() -> None:
    gate = ServerGate()
    gate.observe(load(6, 2), held=3)
    assert not gate.holds(0)
    assert gate.slots == 6


def test_with_its_slots_known_a_grant_needs_a_free_one() -> None:
    gate = ServerGate()
    gate.observe(load(6, 1), held=6)
    # The queue is gone, 4 run (2 of them ours, 2 the others'), and we
    # hold 2: 2 free.
    gate.observe(load(4), held=2)
    assert gate.holds(2)
    assert gate.holds(3)  # one granted since: 5 of 6
    assert not gate.holds(4)  # two granted since: 6 of 6
    # One of ours given back since the reading: room again.
    assert gate.holds(1)


def test_a_reading_between_our_end_on_the_server_and_our_give_back() -> None:
    gate = ServerGate()
    gate.observe(load(2, 1), held=2)
    # Our two ended on the server (it runs none), but we still held them
    # at the reading: nobody else runs, so we may run 2, not 4.
    gate.observe(load(0), held=2)
    assert gate.holds(0)
    assert gate.holds(1)
    assert not gate.holds(2)


def test_a_reading_before_our_grant_reaches_the_server() -> None:
    gate = ServerGate()
    gate.observe(load(3, 1), held=0)
    # We held 2, the server ran 1 (the other on its way): ours, both.
    gate.observe(load(1), held=2)
    assert gate.holds(2)
    assert not gate.holds(3)


def test_without_its_slots_known_an_empty_queue_holds_nothing() -> None:
    gate = ServerGate()
    gate.observe(load(50), held=0)
    assert gate.holds(1_000)
    assert gate.slots is None


def test_a_failed_reading_holds_nothing_and_keeps_the_slots_learned() -> None:
    gate = ServerGate()
    gate.observe(load(4, 9), held=0)
    gate.observe(None, held=0)
    assert gate.holds(10)
    assert gate.slots == 4


def test_the_slots_follow_the_latest_reading_with_a_queue() -> None:
    gate = ServerGate()
    gate.observe(load(4, 1), held=0)
    gate.observe(load(8, 3), held=0)  # a replica added behind the same address
    gate.observe(load(7), held=0)
    assert gate.slots == 8
    assert gate.holds(0)


# -- in the policy ----------------------------------------------------------------


def tickets(count: int) -> list[Ticket]:
    return [Ticket(float(n), n) for n in range(count)]


def test_the_policy_grants_nothing_while_the_server_queues() -> None:
    policy = SlotPolicy(10)
    first, second, third = tickets(3)
    assert policy.observe_server_load(load(4, 2)) == []
    assert policy.acquire(first) == []  # it would queue on the server
    assert policy.acquire(second) == []
    # The queue drained and one slot of the server's 4 is free: the
    # oldest goes, the next waits for another.
    assert policy.observe_server_load(load(3)) == [first]
    assert policy.acquire(third) == []
    assert policy.server_load == (load(3), 4)
    # Ours ended: its slot is free again, for the next oldest.
    assert policy.release(first) == [second]


def test_the_policys_limit_still_applies_under_a_roomy_server() -> None:
    policy = SlotPolicy(1)
    first, second = tickets(2)
    assert policy.observe_server_load(load(0)) == []
    assert policy.acquire(first) == [first]
    assert policy.acquire(second) == []


def test_a_failed_reading_lets_the_limit_alone_decide() -> None:
    policy = SlotPolicy(5)
    policy.observe_server_load(load(4, 1))
    waiting = tickets(3)
    for ticket in waiting:
        assert policy.acquire(ticket) == []
    assert policy.observe_server_load(None) == waiting
    assert policy.server_load == (None, 4)


@pytest.mark.parametrize("held", [0, 2])
def test_the_first_reading_without_a_queue_lets_everyone_through(held: int) -> None:
    policy = SlotPolicy(None)
    for ticket in tickets(held):
        policy.acquire(ticket)
    assert policy.observe_server_load(load(held)) == []
    assert policy.acquire(Ticket(9.0, 9)) == [Ticket(9.0, 9)]
