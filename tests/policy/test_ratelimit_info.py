"""RateLimitInfo and Quota: plain values, checked as they are made."""

from __future__ import annotations

import math

import pytest

from trio_dispatch import Quota, RateLimitInfo


def test_a_quota_keeps_what_it_was_given() -> None:
    quota = Quota(limit=500, remaining=499, reset=0.12)
    assert (quota.limit, quota.remaining, quota.reset) == (500, 499, 0.12)
    assert Quota() == Quota(limit=None, remaining=None, reset=None)


def test_info_is_empty_only_when_it_says_nothing() -> None:
    assert RateLimitInfo().empty
    assert not RateLimitInfo(retry_after=0.0).empty
    assert not RateLimitInfo(tokens=Quota()).empty


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("limit", -1, ValueError),
        ("remaining", -5, ValueError),
        ("limit", 1.5, TypeError),
        ("limit", True, TypeError),
        ("limit", "8", TypeError),
        ("reset", -0.1, ValueError),
        ("reset", math.inf, ValueError),
        ("reset", math.nan, ValueError),
        ("reset", "1s", TypeError),
    ],
)
def test_a_bad_figure_is_refused_at_once(
    field: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=field):
        Quota(**{field: value})  # type: ignore[arg-type]  # the point of the test


def test_info_takes_quotas_only() -> None:
    with pytest.raises(TypeError, match="requests"):
        RateLimitInfo(requests=500)  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(ValueError, match="retry_after"):
        RateLimitInfo(retry_after=-1.0)
