"""A process's clock read as the Redis server's: the offset and its samples.

``ServerClock`` is pure: each test feeds it exchanges (sent, answered, the
server's time) on a local clock the test sets, and reads the offset.
"""

from __future__ import annotations

from trio_dispatch._redis._clock import ServerClock


class Local:
    """A local clock the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_before_any_sample_the_local_clock_is_read_as_it_is() -> None:
    local = Local()
    clock = ServerClock(local)
    local.now = 12.5
    assert (clock.offset, clock.round_trip, clock.now()) == (0.0, None, 12.5)


def test_the_offset_is_the_servers_time_less_the_middle_of_the_exchange() -> None:
    local = Local()
    clock = ServerClock(local)
    # Sent at 100, answered at 100.2: the server read 130.1 in between,
    # so the local clock is 30 s behind.
    clock.sample(100.0, 100.2, 130.1)
    local.now = 200.0
    assert round(clock.offset, 9) == 30.0
    assert round(clock.round_trip or 0, 9) == 0.2
    assert round(clock.now(), 9) == 230.0


def test_the_sample_of_the_shortest_round_trip_wins_in_its_window() -> None:
    clock = ServerClock(Local(), window=10.0)
    clock.sample(0.0, 0.010, 5.005)  # offset 5.000, 10 ms
    clock.sample(1.0, 1.200, 6.300)  # offset 5.200, 200 ms: a loaded moment
    assert round(clock.offset, 9) == 5.0
    clock.sample(2.0, 2.002, 7.002)  # offset 5.001, 2 ms: better
    assert round(clock.offset, 9) == 5.001


def test_a_changed_offset_is_taken_within_two_windows() -> None:
    clock = ServerClock(Local(), window=10.0)
    clock.sample(0.0, 0.001, 5.0005)  # offset 5, 1 ms
    # The local clock stepped 3 s ahead: the offset is now 2, seen through
    # round trips longer than the best of the first window.
    clock.sample(10.5, 10.505, 12.5025)  # a new window; the first is kept
    assert round(clock.offset, 6) == 5.0
    clock.sample(21.0, 21.005, 23.0025)  # the first window is gone
    assert round(clock.offset, 6) == 2.0


def test_a_window_long_gone_is_not_kept_beside_a_new_sample() -> None:
    clock = ServerClock(Local(), window=10.0)
    clock.sample(0.0, 0.001, 5.0005)
    # An hour idle: the old sample, however good, says nothing of now.
    clock.sample(3600.0, 3600.100, 3602.050)
    assert round(clock.offset, 6) == 2.0
    assert round(clock.round_trip or 0, 6) == 0.1


def test_an_answer_before_its_exchange_was_sent_is_no_sample() -> None:
    clock = ServerClock(Local())
    clock.sample(10.0, 9.0, 50.0)
    assert (clock.offset, clock.round_trip) == (0.0, None)
