"""``parse_retry_after``: the delay a provider asked for, from its headers."""

from __future__ import annotations

import email.utils
import math

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch.providers import parse_retry_after

NOW = 1_700_000_000.0  # a fixed "now", so HTTP-dates give exact delays


def http_date(unix_time: float) -> str:
    return email.utils.formatdate(unix_time, usegmt=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),  # not RFC 9110, but servers send it and SDKs accept it
    ],
)
def test_delay_seconds(value: str, expected: float) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) == expected


def test_http_date_is_relative_to_now() -> None:
    headers = {"retry-after": http_date(NOW + 30)}
    assert parse_retry_after(headers, NOW) == 30.0


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"retry-after": "0"}, id="zero"),
        pytest.param({"retry-after": "0.0"}, id="zero-point-zero"),
        pytest.param({"retry-after": "-3"}, id="negative"),
        pytest.param({"retry-after-ms": "0"}, id="zero-ms"),
        pytest.param({"retry-after-ms": "-20"}, id="negative-ms"),
        pytest.param({"retry-after": http_date(NOW - 3600)}, id="date-in-the-past"),
        pytest.param({"retry-after": http_date(NOW)}, id="date-now"),
        pytest.param({"retry-after": "0", "retry-after-ms": "0"}, id="both-zero"),
    ],
)
def test_a_delay_that_is_not_positive_is_no_header(headers: dict[str, str]) -> None:
    # "Now" would let every waiter go at once into the same 429: the
    # dispatcher backs off instead, as without the header.
    assert parse_retry_after(headers, NOW) is None


def test_a_zero_retry_after_ms_falls_back_to_a_positive_retry_after() -> None:
    assert parse_retry_after({"retry-after-ms": "0", "retry-after": "2"}, NOW) == 2.0


def test_http_date_with_a_numeric_zone() -> None:
    headers = {"retry-after": "Tue, 14 Nov 2023 23:14:20 +0100"}  # NOW + 60 s
    assert parse_retry_after(headers, NOW) == 60.0


def test_retry_after_ms_takes_precedence() -> None:
    headers = {"retry-after": "30", "retry-after-ms": "1500"}
    assert parse_retry_after(headers, NOW) == 1.5


def test_retry_after_ms_alone() -> None:
    assert parse_retry_after({"retry-after-ms": "250"}, NOW) == 0.25


def test_garbage_retry_after_ms_falls_back_to_retry_after() -> None:
    headers = {"retry-after": "4", "retry-after-ms": "soon"}
    assert parse_retry_after(headers, NOW) == 4.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "soon",
        "1e3",
        "nan",
        "inf",
        "-inf",
        "0x10",
        "1_000",
        "5 seconds",
        "Tue, 99",
        "9" * 400,  # a number, but not a finite one
        "Tue, 14 Nov 99999999999999999999 23:14:20 GMT",  # a year past any clock
    ],
)
def test_garbage_is_ignored(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, NOW) is None
    assert parse_retry_after({"retry-after-ms": value}, NOW) is None


def test_no_header() -> None:
    assert parse_retry_after({}, NOW) is None
    assert parse_retry_after({"content-type": "application/json"}, NOW) is None


def test_names_are_case_insensitive_in_a_plain_dict() -> None:
    assert parse_retry_after({"Retry-After": "3"}, NOW) == 3.0
    assert parse_retry_after({"Retry-After-Ms": "3000"}, NOW) == 3.0


def test_httpx_headers() -> None:
    headers = httpx2.Headers({"Retry-After": "9", "X-Other": "1"})
    assert parse_retry_after(headers, NOW) == 9.0


@given(
    retry_after=st.one_of(st.none(), st.text(max_size=40)),
    retry_after_ms=st.one_of(st.none(), st.text(max_size=40)),
)
def test_any_header_gives_none_or_a_finite_non_negative_delay(
    retry_after: str | None, retry_after_ms: str | None
) -> None:
    headers = {}
    if retry_after is not None:
        headers["retry-after"] = retry_after
    if retry_after_ms is not None:
        headers["retry-after-ms"] = retry_after_ms
    delay = parse_retry_after(headers, NOW)
    assert delay is None or (math.isfinite(delay) and delay > 0)


@given(st.integers(min_value=1, max_value=10**9))
def test_any_delta_seconds_round_trips(seconds: int) -> None:
    assert parse_retry_after({"retry-after": str(seconds)}, NOW) == seconds
