"""``AdaptiveLimit(signal="latency")``: the rule in the core, exactly.

``LatencySignal`` alone (the verdict of each round, the floors), then the
limit it moves inside ``SlotPolicy``. The rule against a server that
queues, in virtual time, is in ``tests/integrations/test_latency_limit.py``.
"""

from __future__ import annotations

import pytest

from trio_dispatch import AdaptiveLimit
from trio_dispatch._policy._latency import (
    FLAT,
    GROWING,
    IDLE_QUEUE,
    QUEUED,
    WINDOW,
    LatencySignal,
)
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket


def calls(  # one round of identical calls
    signal: LatencySignal,
    n: int,
    *,
    now: float = 0.0,
    first_token: float = 0.1,
    between: float | None = 0.01,
    duration: float = 1.0,
    prompt: int = 100,
    in_flight: int = 4,
    limit: int = 4,
) -> list[int | None]:
    return [
        signal.observe(now, first_token, between, duration, prompt, in_flight, limit)
        for _ in range(n)
    ]


# -- the verdict of a round ------------------------------------------------------


def test_a_round_is_one_call_per_slot_of_the_limit() -> None:
    signal = LatencySignal()
    assert calls(signal, 4, limit=4) == [None, None, None, 1]
    # At least two calls, even under a limit of 1.
    assert calls(signal, 2, now=10.0, in_flight=1, limit=1) == [None, 1]


def test_a_round_counts_only_the_calls_granted_since_the_limit_moved() -> None:
    signal = LatencySignal()
    assert calls(signal, 4)[-1] == 1  # moved at 0.0
    # Calls of 1 s ending at 0.5 were granted at -0.5, under the old limit:
    # they teach the floors, not the round.
    assert calls(signal, 8, now=0.5, first_token=0.05) == [None] * 8
    assert signal.first_token_floor(100) == 0.05
    # Granted at 0.0, with the move: they count.
    assert calls(signal, 4, now=1.0, first_token=0.05)[-1] == 1


def test_no_queue_and_the_batch_paying_with_the_limit_in_use_goes_up() -> None:
    signal = LatencySignal()
    # Every call at its floors: no queue, steps no slower than alone.
    assert calls(signal, 4)[-1] == 1


def test_a_limit_not_in_use_holds() -> None:
    signal = LatencySignal()
    # 2 of 4 in flight: the calls say nothing about a higher limit.
    assert calls(signal, 4, in_flight=2)[-1] == 0


def test_a_queue_on_the_server_brings_it_down_by_its_length() -> None:
    signal = LatencySignal()
    calls(signal, 4)  # the floors: 0.1 s to the first token
    # Each call waited 0.5 s of its 1 s in the server's queue, 4 in
    # flight: 4 * 0.5 = 2 requests queued on average (Little's law).
    assert calls(signal, 4, now=10.0, first_token=0.6)[-1] == -2


def test_a_queue_just_above_the_threshold_brings_it_down_by_one() -> None:
    signal = LatencySignal()
    calls(signal, 4)
    # Two calls of four waited half their second: 4 * 1 / 4 = 1 queued.
    verdicts = [
        signal.observe(10.0, first, 0.01, 1.0, 100, 4, 4)
        for first in (0.1, 0.1, 0.6, 0.6)
    ]
    assert verdicts[-1] == -1


def test_one_slow_answer_in_a_round_weighs_at_most_a_slot() -> None:
    signal = LatencySignal()
    calls(signal, 8, in_flight=8, limit=8)
    # One answer 50 s late among eight of 1 s: its excess counts as much
    # as the rest of its time (1 s): 8 * 1 / 9 queued, down by one only.
    verdicts = [
        signal.observe(60.0, first, 0.01, duration, 100, 8, 8)
        for first, duration in [(0.1, 1.0)] * 7 + [(50.1, 51.0)]
    ]
    assert verdicts[-1] == -1


def test_a_queue_below_the_threshold_but_above_idle_holds() -> None:
    signal = LatencySignal()
    calls(signal, 4)
    # 4 * 0.1 = 0.4 queued: neither up nor down.
    assert IDLE_QUEUE < 0.4 < QUEUED
    assert calls(signal, 4, now=10.0, first_token=0.2)[-1] == 0


def test_steps_that_stop_paying_bring_it_down_by_one() -> None:
    signal = LatencySignal()
    calls(signal, 2, in_flight=1, limit=2)  # the floor: 10 ms between tokens
    # 4 in flight, each step 4 times slower: 1 per extra sequence, the
    # same throughput as one call at a time.
    assert FLAT <= (4 - 1) / 3
    assert calls(signal, 4, between=0.04)[-1] == -1


def test_steps_that_grow_but_still_pay_let_it_grow_below_the_bar() -> None:
    signal = LatencySignal()
    calls(signal, 2, in_flight=1, limit=2)
    # 0.5 per extra sequence: 4 in flight give 4 / 2.5 = 1.6 times the throughput.
    assert calls(signal, 4, now=10.0, between=0.025)[-1] == 1
    # 0.8 per extra sequence: below FLAT, above GROWING: it holds.
    assert GROWING <= (3.4 - 1) / 3 < FLAT
    assert calls(signal, 4, now=20.0, between=0.034)[-1] == 0


def test_calls_without_a_time_between_tokens_judge_by_the_queue_alone() -> None:
    signal = LatencySignal()
    assert calls(signal, 4, between=None)[-1] == 1
    assert signal.between_floor is None


def test_the_first_token_floor_is_per_prompt_size() -> None:
    signal = LatencySignal()
    # Long prompts take longer to the first token: not a queue.
    calls(signal, 4, first_token=0.1, prompt=100)
    assert calls(signal, 4, now=10.0, first_token=2.0, prompt=5_000)[-1] == 1
    assert signal.first_token_floor(100) == 0.1
    assert signal.first_token_floor(120) == 0.1  # the same power of two
    assert signal.first_token_floor(5_000) == 2.0
    assert signal.first_token_floor(20_000) is None


# -- the floors follow the server ---------------------------------------------------


def test_a_faster_server_lowers_the_floors_at_once() -> None:
    signal = LatencySignal()
    calls(signal, 4, first_token=0.5, between=0.02)
    calls(signal, 1, first_token=0.2, between=0.01, now=1.0)
    assert signal.first_token_floor(100) == 0.2
    assert signal.between_floor == 0.01


def test_a_slower_server_raises_the_floors_within_a_window() -> None:
    signal = LatencySignal()
    calls(signal, 4, first_token=0.1, between=0.01)
    half = WINDOW / 2
    # Within the window the old floor holds: the slower calls look queued.
    assert calls(signal, 4, first_token=0.3, between=0.02, now=half)[-1] == -1
    assert signal.first_token_floor(100) == 0.1
    # A window after the old floor was last seen, only the new one is left.
    calls(signal, 4, first_token=0.3, between=0.02, now=2 * half)
    assert signal.first_token_floor(100) == 0.3
    assert signal.between_floor == 0.02
    assert calls(signal, 4, first_token=0.3, between=0.02, now=2 * half + 1)[-1] == 1


def test_a_floor_not_seen_for_a_whole_window_is_forgotten() -> None:
    signal = LatencySignal()
    calls(signal, 1, first_token=0.1)
    calls(signal, 1, first_token=0.4, now=10 * WINDOW)
    assert signal.first_token_floor(100) == 0.4


# -- the limit it moves ---------------------------------------------------------------


def latency_policy(initial: int, minimum: int = 1, maximum: int = 64) -> SlotPolicy:
    spec = AdaptiveLimit(
        initial=initial, minimum=minimum, maximum=maximum, signal="latency"
    )
    return SlotPolicy(None, throttle=Throttle(adaptive=spec))


def held(policy: SlotPolicy, count: int, first: int = 0) -> list[Ticket]:
    tickets = [Ticket(0.0, first + n) for n in range(count)]
    for ticket in tickets:
        assert policy.acquire(ticket) == [ticket]
    return tickets


def round_of(
    policy: SlotPolicy, tickets: list[Ticket], at: float, first_token: float = 0.1
) -> None:
    """Each ticket's 1 s call ends at ``at`` with these timings, then gives its slot back."""
    policy.advance(at)
    for ticket in tickets:
        policy.observe_latency(ticket, first_token, 0.01, 1.0, 100)
    for ticket in tickets:
        policy.release(ticket)


def test_successes_alone_move_a_latency_limit_nothing() -> None:
    policy = latency_policy(2)
    for ticket in held(policy, 2):
        policy.release(ticket)
    assert policy.limit == 2


def test_the_slow_start_doubles_it_each_round_until_the_first_decrease() -> None:
    policy = latency_policy(2, maximum=20)
    round_of(policy, held(policy, 2), 10.0)
    assert policy.limit == 4
    round_of(policy, held(policy, 4, first=10), 20.0)
    assert policy.limit == 8
    # The server queues: 8 * 0.5 = 4 queued, down by 4.
    round_of(policy, held(policy, 8, first=20), 30.0, first_token=0.6)
    assert policy.limit == 4
    # After it, up by one, after two rounds of room: the rise to 8 found a
    # queue, so rises wait for twice as many rounds as before.
    round_of(policy, held(policy, 4, first=30), 40.0)
    assert policy.limit == 4
    round_of(policy, held(policy, 4, first=40), 50.0)
    assert policy.limit == 5
    # That rise held (no queue at 5): the next comes after one round.
    round_of(policy, held(policy, 5, first=50), 60.0)
    assert policy.limit == 6


def test_rises_that_find_a_queue_come_ever_more_rarely() -> None:
    signal = LatencySignal()
    calls(signal, 4)  # the floors; a rise (the slow start)
    # Each rise past 4 finds a queue: the rounds of room between two
    # rises double, 2, 4, 8, then 16 at most.
    now = 10.0
    waits = []
    for _ in range(5):
        verdict = calls(signal, 5, now=now, first_token=0.6, in_flight=5, limit=5)[-1]
        assert verdict is not None
        assert verdict < 0
        now += 10.0
        rounds = 0
        while calls(signal, 4, now=now)[-1] == 0:
            rounds += 1
            now += 10.0
        waits.append(rounds + 1)
        now += 10.0
    assert waits == [2, 4, 8, 16, 16]


def test_it_never_leaves_its_bounds() -> None:
    policy = latency_policy(4, minimum=4, maximum=5)
    round_of(policy, held(policy, 4), 10.0)
    assert policy.limit == 5  # doubled, cut at maximum
    round_of(policy, held(policy, 5, first=10), 20.0, first_token=0.6)
    assert policy.limit == 4  # 5 * 0.5 = 2.5 queued: down by 2, cut at minimum


def test_a_rise_grants_the_waiters_it_lets_through() -> None:
    policy = latency_policy(2)
    tickets = held(policy, 2)
    waiter = Ticket(1.0, 99)
    assert policy.acquire(waiter) == []
    assert policy.observe_latency(tickets[0], 0.1, 0.01, 1.0, 100) == []
    # The round's end doubles the limit: the waiter goes.
    assert policy.observe_latency(tickets[1], 0.1, 0.01, 1.0, 100) == [waiter]
    assert policy.limit == 4


def test_rate_limits_still_bring_it_down() -> None:
    policy = latency_policy(10)
    held(policy, 10)
    policy.report_rate_limit(0.0)
    assert policy.limit == 9


@pytest.mark.parametrize(
    "make",
    [
        lambda: SlotPolicy(4),
        lambda: SlotPolicy(
            None, throttle=Throttle(adaptive=AdaptiveLimit(initial=4, maximum=8))
        ),
    ],
    ids=["fixed", "rate-limit signal"],
)
def test_other_limits_ignore_the_timings(make: object) -> None:
    policy = make()  # type: ignore[operator]
    tickets = held(policy, 4)
    for ticket in tickets:
        assert policy.observe_latency(ticket, 0.1, 0.01, 1.0, 100) == []
    assert policy.limit == 4


def test_the_timings_of_a_ticket_that_holds_nothing_are_ignored() -> None:
    policy = latency_policy(2)
    (ticket, other) = held(policy, 2)
    policy.release(ticket)
    assert policy.observe_latency(ticket, 0.1, 0.01, 1.0, 100) == []
    assert policy.observe_latency(Ticket(5.0, 50), 0.1, 0.01, 1.0, 100) == []
    # Neither counted towards the round: one more call does not end it.
    assert policy.observe_latency(other, 0.1, 0.01, 1.0, 100) == []
    assert policy.limit == 2


def test_the_signal_is_checked_when_made() -> None:
    with pytest.raises(
        ValueError, match=r"^signal must be one of 'rate_limits', 'latency', got 'rtt'$"
    ):
        AdaptiveLimit(initial=1, maximum=2, signal="rtt")  # type: ignore[arg-type]
    assert AdaptiveLimit(initial=1, maximum=2).signal == "rate_limits"
