"""Rate-limit headers of both wire formats, read into RateLimitInfo.

The recorded header sets below are real answers, as published:

* ``OPENAI_DOCS``: the sample values of the header table in OpenAI's rate
  limits guide (platform.openai.com/docs/guides/rate-limits, "Rate limits
  in headers").
* ``OPENAI_RECORDED``: a chat completions answer of 26 May 2025, as posted
  on community.openai.com ("How to get rate limit reset time for response
  API?", topic 1268905), including its ``*_usage_based`` extras.
* ``AZURE_UNKNOWN``: what Azure OpenAI's Responses API sent in November
  2025, as posted on Microsoft Q&A ("Azure OpenAI Responses API
  x-ratelimit headers values -1, 0", question 5625878).
* ``ANTHROPIC_RECORDED``: a Messages answer of 21 August 2025, as recorded
  by the tidyllm R package's test fixtures
  (tests/testthat/claude/api.anthropic.com/v1/messages-e050b5-POST.R);
  the header names are those of Anthropic's rate limits page
  (docs.anthropic.com/en/api/rate-limits, "Response headers"). Its
  resets are a second before its own ``date``: full again, ``0.0``.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import Quota, RateLimitInfo
from trio_dispatch._wire._anthropic import read_rate_limits as anthropic_rate_limits
from trio_dispatch._wire._headers import MAX_COUNT, MAX_SECONDS, MalformedHeaderLog
from trio_dispatch._wire._openai import read_rate_limits as openai_rate_limits
from trio_dispatch.providers._errors import Redactor

OPENAI_DOCS = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}

OPENAI_RECORDED = {
    "date": "Mon, 26 May 2025 05:00:04 GMT",
    "content-type": "application/json",
    "x-ratelimit-limit-requests": "5000",
    "x-ratelimit-limit-tokens": "160000",
    "x-ratelimit-limit-tokens_usage_based": "160000",
    "x-ratelimit-remaining-requests": "4999",
    "x-ratelimit-remaining-tokens": "159976",
    "x-ratelimit-remaining-tokens_usage_based": "159976",
    "x-ratelimit-reset-requests": "12ms",
    "x-ratelimit-reset-tokens": "9ms",
    "x-ratelimit-reset-tokens_usage_based": "9ms",
}

AZURE_UNKNOWN = {
    "x-ratelimit-limit-tokens": "-1",
    "x-ratelimit-remaining-tokens": "-1",
    "x-ratelimit-reset-tokens": "0",
}

ANTHROPIC_RECORDED = {
    "date": "Thu, 21 Aug 2025 12:41:00 GMT",
    "content-type": "application/json",
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "96000",
    "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:59Z",
    "request-id": "req_011CSLsW7mFqvHHnzrKdKjAE",
}

DATE = datetime(2025, 8, 21, 12, 41, 0, tzinfo=UTC)


# -- recorded answers ----------------------------------------------------------


def test_openai_documented_sample() -> None:
    assert openai_rate_limits(OPENAI_DOCS) == RateLimitInfo(
        requests=Quota(limit=60, remaining=59, reset=1.0),
        tokens=Quota(limit=150_000, remaining=149_984, reset=360.0),
    )


def test_openai_recorded_answer() -> None:
    assert openai_rate_limits(OPENAI_RECORDED) == RateLimitInfo(
        requests=Quota(limit=5000, remaining=4999, reset=0.012),
        tokens=Quota(limit=160_000, remaining=159_976, reset=0.009),
    )


def test_azure_minus_one_means_no_such_limit() -> None:
    info = openai_rate_limits(AZURE_UNKNOWN)
    assert info == RateLimitInfo()
    assert info.empty


def test_anthropic_recorded_answer_counts_resets_from_its_date() -> None:
    info = anthropic_rate_limits(ANTHROPIC_RECORDED)
    assert info == RateLimitInfo(
        requests=Quota(limit=1000, remaining=999, reset=0.0),
        tokens=Quota(limit=96_000, remaining=96_000, reset=0.0),
        input_tokens=Quota(limit=80_000, remaining=80_000, reset=0.0),
        output_tokens=Quota(limit=16_000, remaining=16_000, reset=0.0),
    )


def test_anthropic_429_with_retry_after() -> None:
    headers = {
        "date": "Thu, 21 Aug 2025 12:41:00 GMT",
        "retry-after": "17",
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2025-08-21T12:41:17Z",
    }
    assert anthropic_rate_limits(headers) == RateLimitInfo(
        requests=Quota(limit=50, remaining=0, reset=17.0), retry_after=17.0
    )


def test_openai_429_prefers_retry_after_ms() -> None:
    headers = {**OPENAI_DOCS, "retry-after": "2", "retry-after-ms": "1500"}
    assert openai_rate_limits(headers).retry_after == 1.5


def test_names_are_matched_in_any_case() -> None:
    upper = {name.upper(): value for name, value in OPENAI_DOCS.items()}
    assert openai_rate_limits(upper) == openai_rate_limits(OPENAI_DOCS)


def test_no_headers_is_empty() -> None:
    assert openai_rate_limits({}).empty
    assert anthropic_rate_limits({"date": "Thu, 21 Aug 2025 12:41:00 GMT"}).empty


# -- OpenAI's durations --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("0.5s", 0.5),
        ("17.28s", 17.28),
        ("0s", 0.0),
        ("0", 0.0),
        ("2", 2.0),  # a plain number, as some compatible servers send
        ("1.5", 1.5),
        ("250us", 0.00025),
        ("100ns", 1e-7),
        (" 1m ", 60.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    info = openai_rate_limits({"x-ratelimit-reset-requests": text})
    assert info.requests is not None
    assert info.requests.reset == pytest.approx(seconds, rel=1e-12, abs=0)


# -- partial, malformed, unknown and enormous -----------------------------------


def test_partial_headers_give_partial_quotas() -> None:
    info = openai_rate_limits({"x-ratelimit-remaining-tokens": "42"})
    assert info == RateLimitInfo(tokens=Quota(remaining=42))
    info = anthropic_rate_limits(
        {"anthropic-ratelimit-output-tokens-limit": "8000"}, now=DATE
    )
    assert info == RateLimitInfo(output_tokens=Quota(limit=8000))


def test_a_limit_of_zero_means_no_such_limit() -> None:
    headers = {
        "x-ratelimit-limit-requests": "0",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-remaining-tokens": "0",  # without a limit: exhausted
    }
    assert openai_rate_limits(headers) == RateLimitInfo(tokens=Quota(remaining=0))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-ratelimit-limit-requests", "sixty"),
        ("x-ratelimit-limit-requests", "1e3"),
        ("x-ratelimit-limit-requests", ""),
        ("x-ratelimit-limit-requests", "-5"),
        ("x-ratelimit-reset-requests", "soon"),
        ("x-ratelimit-reset-requests", "1d"),
        ("x-ratelimit-reset-requests", "-3s"),
        ("x-ratelimit-reset-requests", "-2"),
        ("x-ratelimit-reset-requests", "5" * 100 + "s"),
        ("retry-after", "later"),
    ],
)
def test_a_malformed_header_is_ignored_and_reported(name: str, value: str) -> None:
    reported: list[tuple[str, str]] = []
    headers = {**OPENAI_DOCS, name: value}
    info = openai_rate_limits(headers, on_malformed=lambda *args: reported.append(args))
    assert reported == [(name, value)]
    figures = openai_rate_limits(OPENAI_DOCS)
    assert info.tokens == figures.tokens
    assert info.retry_after is None
    assert info.requests is not None
    if name == "x-ratelimit-limit-requests":
        assert info.requests == Quota(limit=None, remaining=59, reset=1.0)
    elif name.startswith("x-ratelimit-reset"):
        assert info.requests == Quota(limit=60, remaining=59, reset=None)


@pytest.mark.parametrize(
    "value",
    ["tomorrow", "2025-08-21", "2025-13-40T99:00:00Z", "1755780060", "T" * 100],
)
def test_a_malformed_anthropic_reset_is_ignored_and_reported(value: str) -> None:
    reported: list[tuple[str, str]] = []
    headers = {**ANTHROPIC_RECORDED, "anthropic-ratelimit-requests-reset": value}
    info = anthropic_rate_limits(
        headers, on_malformed=lambda *args: reported.append(args)
    )
    assert reported == [("anthropic-ratelimit-requests-reset", value)]
    assert info.requests == Quota(limit=1000, remaining=999, reset=None)


def test_minus_one_is_unknown_without_a_report() -> None:
    reported: list[tuple[str, str]] = []
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "-1",
        "x-ratelimit-reset-requests": "-1",
    }
    info = openai_rate_limits(headers, on_malformed=lambda *a: reported.append(a))
    assert info == RateLimitInfo(requests=Quota(limit=60))
    assert reported == []


def test_enormous_values_are_capped() -> None:
    headers = {
        "x-ratelimit-limit-tokens": "9" * 40,
        "x-ratelimit-remaining-tokens": "123456789012345",
        "x-ratelimit-reset-tokens": "99999999h",
        "retry-after": "1" + "0" * 30,
    }
    assert openai_rate_limits(headers) == RateLimitInfo(
        tokens=Quota(limit=MAX_COUNT, remaining=MAX_COUNT, reset=MAX_SECONDS),
        retry_after=MAX_SECONDS,
    )
    far = {
        "anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z",
        "retry-after": "Fri, 31 Dec 9999 23:59:59 GMT",
    }
    assert anthropic_rate_limits(far, now=DATE) == RateLimitInfo(
        tokens=Quota(reset=MAX_SECONDS), retry_after=MAX_SECONDS
    )


def test_fractional_counts_are_floored() -> None:
    info = openai_rate_limits({"x-ratelimit-remaining-tokens": "149984.7"})
    assert info.tokens == Quota(remaining=149_984)


# -- Anthropic's clock -----------------------------------------------------------


def test_now_is_used_while_it_agrees_with_the_date() -> None:
    headers = {
        "date": "Thu, 21 Aug 2025 12:41:00 GMT",
        "anthropic-ratelimit-requests-reset": "2025-08-21T12:41:10.5Z",
    }
    now = DATE + timedelta(seconds=0.75)
    info = anthropic_rate_limits(headers, now=now)
    assert info.requests == Quota(reset=9.75)


def test_the_date_wins_over_a_skewed_clock() -> None:
    headers = {
        "date": "Thu, 21 Aug 2025 12:41:00 GMT",
        "anthropic-ratelimit-requests-reset": "2025-08-21T12:41:10Z",
    }
    skewed = DATE + timedelta(minutes=5)
    assert anthropic_rate_limits(headers, now=skewed).requests == Quota(reset=10.0)


def test_without_a_date_now_is_the_reference() -> None:
    headers = {"anthropic-ratelimit-tokens-reset": "2025-08-21T14:41:30+02:00"}
    naive = datetime(2025, 8, 21, 12, 41, 0)  # naive means UTC
    assert anthropic_rate_limits(headers, now=naive).tokens == Quota(reset=30.0)


def test_a_reset_in_the_past_is_now() -> None:
    headers = {"anthropic-ratelimit-tokens-reset": "2025-08-21T12:00:00Z"}
    assert anthropic_rate_limits(headers, now=DATE).tokens == Quota(reset=0.0)


# -- the log ---------------------------------------------------------------------


def test_a_malformed_header_is_logged_once_per_name_without_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_dispatch")
    key = "sk-test-Zq8vXw3Lp9RtYb6N"
    log = MalformedHeaderLog("openai", Redactor(key))
    bad = {
        "x-ratelimit-limit-requests": f"key {key}",
        "x-ratelimit-reset-tokens": "x" * 60,
    }
    for _ in range(3):
        openai_rate_limits(bad, on_malformed=log)
    other = MalformedHeaderLog("vllm")
    openai_rate_limits(bad, on_malformed=other)
    lines = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "trio_dispatch",
            logging.WARNING,
            "openai: ignoring the x-ratelimit-limit-requests header, which does"
            " not parse: 'key [redacted]'",
        ),
        (
            "trio_dispatch",
            logging.WARNING,
            "openai: ignoring the x-ratelimit-reset-tokens header, which does"
            f" not parse: '{'x' * 37}...'",
        ),
        (
            "trio_dispatch",
            logging.WARNING,
            "vllm: ignoring the x-ratelimit-limit-requests header, which does"
            f" not parse: 'key {key}'",
        ),
        (
            "trio_dispatch",
            logging.WARNING,
            "vllm: ignoring the x-ratelimit-reset-tokens header, which does"
            f" not parse: '{'x' * 37}...'",
        ),
    ]
    assert key not in caplog.text.split("vllm")[0]


# -- any headers at all ------------------------------------------------------------

_NAMES = [
    *(
        f"x-ratelimit-{f}-{k}"
        for f in ("limit", "remaining", "reset")
        for k in ("requests", "tokens")
    ),
    *(
        f"anthropic-ratelimit-{k}-{f}"
        for k in ("requests", "tokens", "input-tokens", "output-tokens")
        for f in ("limit", "remaining", "reset")
    ),
    "retry-after",
    "retry-after-ms",
    "date",
]
_VALUES = st.one_of(
    st.text(max_size=80),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["-1", "0", "1h2m3.5s", "6m0s", "nan", "inf", "1e999", ".s", "5"]),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")),
)
_HEADERS = st.dictionaries(
    st.one_of(
        st.sampled_from(_NAMES),
        st.sampled_from(_NAMES).map(str.upper),
        st.text(max_size=20),
    ),
    _VALUES,
    max_size=12,
)


def _check(info: RateLimitInfo) -> None:
    for quota in (info.requests, info.tokens, info.input_tokens, info.output_tokens):
        if quota is None:
            continue
        for count in (quota.limit, quota.remaining):
            assert count is None or 0 <= count <= MAX_COUNT
        assert quota.reset is None or 0.0 <= quota.reset <= MAX_SECONDS
    if info.retry_after is not None:
        assert 0.0 <= info.retry_after <= MAX_SECONDS
        assert math.isfinite(info.retry_after)


@settings(max_examples=300, deadline=None)
@given(
    headers=_HEADERS,
    now=st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))),
)
def test_any_headers_never_raise(headers: dict[str, str], now: datetime | None) -> None:
    reported: list[tuple[str, str]] = []

    def report(name: str, value: str) -> None:
        reported.append((name, value))

    _check(openai_rate_limits(headers, now=now, on_malformed=report))
    _check(anthropic_rate_limits(headers, now=now, on_malformed=report))
    assert all(name == name.lower() for name, _ in reported)
