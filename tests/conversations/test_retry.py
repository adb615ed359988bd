"""Retry and backoff of a conversation's calls, as the pure functions they are."""

from __future__ import annotations

import random

import pytest

from trio_dispatch import ConversationOptions, ProviderError
from trio_dispatch._conversations._retry import backoff, should_retry
from trio_dispatch.providers import BadRequest, Overloaded, RateLimited, ServerError

OPTIONS = ConversationOptions(retry_backoff=0.5, max_backoff=3.0)
SERVER_ERROR = ServerError("boom", provider="p", status_code=500)


class _Ceiling(random.Random):
    """Draws the top of every range: the backoff's ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


class _Floor(random.Random):
    """Draws the bottom of every range: half the backoff's ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return a


def test_backoff_ceiling_doubles_from_retry_backoff_up_to_max_backoff() -> None:
    delays = [backoff(n, SERVER_ERROR, OPTIONS, _Ceiling(), None) for n in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_waits_at_least_half_its_ceiling() -> None:
    delays = [backoff(n, SERVER_ERROR, OPTIONS, _Floor(), None) for n in range(1, 6)]
    assert delays == [0.25, 0.5, 1.0, 1.5, 1.5]


def test_backoff_is_one_seeded_draw_per_call() -> None:
    rng = random.Random(7)
    delays = [backoff(n, SERVER_ERROR, OPTIONS, rng, None) for n in range(1, 4)]
    expected = random.Random(7)
    assert delays == [
        expected.uniform(0.25, 0.5),
        expected.uniform(0.5, 1.0),
        expected.uniform(1.0, 2.0),
    ]


def test_backoff_of_a_very_late_attempt_does_not_overflow() -> None:
    assert backoff(10**6, SERVER_ERROR, OPTIONS, _Ceiling(), None) == 3.0


@pytest.mark.parametrize("busy", [RateLimited, Overloaded])
@pytest.mark.parametrize(
    ("max_pause", "delay"),
    [
        (None, 0.5),  # limited: the dispatcher's pause honours Retry-After
        (60.0, 5.0),  # unlimited: waited here
        (2.0, 2.0),  # unlimited: waited here, up to max_pause
    ],
)
def test_retry_after_is_waited_here_only_with_a_max_pause(
    busy: type[RateLimited | Overloaded], max_pause: float | None, delay: float
) -> None:
    error = busy("busy", provider="p", status_code=429, retry_after=5.0)
    assert backoff(1, error, OPTIONS, _Ceiling(), max_pause) == delay


def test_backoff_longer_than_retry_after_is_kept() -> None:
    error = RateLimited("busy", provider="p", status_code=429, retry_after=0.1)
    assert backoff(3, error, OPTIONS, _Ceiling(), 60.0) == 2.0


def test_errors_without_retry_after_back_off_as_usual() -> None:
    no_hint = RateLimited("busy", provider="p", status_code=429)
    assert backoff(1, no_hint, OPTIONS, _Ceiling(), 60.0) == 0.5


@pytest.mark.parametrize(
    ("error", "attempt", "expected"),
    [
        (SERVER_ERROR, 1, True),
        (SERVER_ERROR, 3, True),
        (SERVER_ERROR, 4, False),  # max_attempts=4: the fourth was the last
        (BadRequest("no", provider="p", status_code=400), 1, False),
    ],
)
def test_only_retryable_errors_are_retried_and_only_max_attempts_times(
    error: ProviderError, attempt: int, expected: bool
) -> None:
    assert should_retry(error, attempt, ConversationOptions()) is expected
