"""The fake LLM server's per-key quotas: refill, 429s, headers, round trips."""

from __future__ import annotations

import json
import math
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import Quota, RateLimitInfo
from trio_dispatch._wire._anthropic import read_rate_limits as anthropic_rate_limits
from trio_dispatch._wire._anthropic import rfc3339
from trio_dispatch._wire._openai import go_duration
from trio_dispatch._wire._openai import read_rate_limits as openai_rate_limits
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider, RateLimited
from trio_dispatch.testing import (
    FakeLLMServer,
    FakeQuotas,
    FakeReply,
    FakeScript,
    Fault,
    open_fake_llm_server,
)
from trio_dispatch.testing._quotas import QuotaBook, Refusal

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trio_dispatch.testing import WireFormat

KEY = "sk-fake-quota-key"
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


# -- the buckets, with times given ------------------------------------------------


def test_requests_refill_continuously() -> None:
    book = QuotaBook(FakeQuotas(requests_per_minute=60))
    for _ in range(60):
        assert book.admit(KEY, 0, 0.0) is None
        book.settle(KEY, 0, 0, 0.0)
    assert book.admit(KEY, 0, 0.0) == Refusal("requests", 1.0)
    assert book.admit(KEY, 0, 0.25) == Refusal("requests", 0.75)
    assert book.admit(KEY, 0, 1.0) is None
    assert book.rate_limits(KEY, 1.0) == RateLimitInfo(
        requests=Quota(limit=60, remaining=0, reset=60.0)
    )
    assert book.rate_limits(KEY, 31.5) == RateLimitInfo(
        requests=Quota(limit=60, remaining=30, reset=29.5)
    )
    # Full again, and never fuller.
    assert book.rate_limits(KEY, 500.0).requests == Quota(60, 60, 0.0)


def test_tokens_are_charged_the_estimate_then_the_usage() -> None:
    book = QuotaBook(FakeQuotas(tokens_per_minute=600))  # 10 a second
    assert book.estimate(30, 70) == 100
    for _ in range(6):
        assert book.admit(KEY, 100, 0.0) is None
    assert book.admit(KEY, 100, 0.0) == Refusal("tokens", 10.0)
    # One request used 40 of its 100: 60 come back at once.
    book.settle(KEY, 100, 40, 0.0)
    assert book.rate_limits(KEY, 0.0).tokens == Quota(600, 60, 54.0)
    assert book.admit(KEY, 100, 0.0) == Refusal("tokens", 4.0)
    # One used 250: the bucket is in debt, and says 0 left.
    book.settle(KEY, 100, 250, 0.0)
    assert book.rate_limits(KEY, 0.0).tokens == Quota(600, 0, 69.0)
    assert book.admit(KEY, 100, 0.0) == Refusal("tokens", 19.0)
    assert book.admit(KEY, 100, 19.0) is None


def test_the_longest_wait_decides() -> None:
    book = QuotaBook(FakeQuotas(requests_per_minute=2, tokens_per_minute=60))
    assert book.admit(KEY, 10, 0.0) is None
    assert book.admit(KEY, 50, 0.0) is None
    # Requests: 1 needed, 0 there, 2 a minute: 30 s. Tokens: 5 needed: 5 s.
    assert book.admit(KEY, 5, 0.0) == Refusal("requests", 30.0)
    assert book.admit(KEY, 45, 30.0) == Refusal("tokens", 15.0)


def test_concurrency_and_too_large() -> None:
    book = QuotaBook(
        FakeQuotas(tokens_per_minute=100, max_concurrency=2, busy_retry_after=1.5)
    )
    assert book.admit(KEY, 1, 0.0) is None
    assert book.admit(KEY, 1, 0.0) is None
    assert book.admit(KEY, 1, 0.0) == Refusal("concurrency", 1.5)
    assert book.admit("another key", 1, 0.0) is None
    book.settle(KEY, 1, 1, 0.0)
    assert book.admit(KEY, 101, 0.0) == Refusal("too_large", None)
    assert book.admit(KEY, 1, 0.0) is None


def test_buckets_may_start_partly_spent() -> None:
    quotas = FakeQuotas(requests_per_minute=60, tokens_per_minute=600, initial_fill=0.1)
    book = QuotaBook(quotas)
    # A key's first request finds a tenth of each bucket, at any time.
    assert book.rate_limits(KEY, 100.0) == RateLimitInfo(
        requests=Quota(limit=60, remaining=6, reset=54.0),
        tokens=Quota(limit=600, remaining=60, reset=54.0),
    )
    for _ in range(6):
        assert book.admit(KEY, 10, 100.0) is None
    assert book.admit(KEY, 10, 100.0) == Refusal("requests", 1.0)
    # From there it refills as any bucket does, up to full.
    assert book.admit(KEY, 10, 101.0) is None
    assert book.rate_limits(KEY, 200.0).requests == Quota(60, 60, 0.0)
    assert QuotaBook(FakeQuotas(requests_per_minute=60, initial_fill=0)).admit(
        KEY, 0, 0.0
    ) == Refusal("requests", 1.0)


def test_a_request_without_max_tokens_is_charged_the_default() -> None:
    assert QuotaBook(FakeQuotas()).estimate(12, None) == 12
    assert QuotaBook(FakeQuotas(default_max_tokens=500)).estimate(12, None) == 512


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("requests_per_minute", 0, ValueError),
        ("tokens_per_minute", -1, ValueError),
        ("max_concurrency", 1.5, TypeError),
        ("default_max_tokens", -1, ValueError),
        ("busy_retry_after", math.nan, ValueError),
        ("initial_fill", 1.5, ValueError),
        ("initial_fill", "full", TypeError),
    ],
)
def test_quotas_are_checked(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        FakeQuotas(**{field: value})  # type: ignore[arg-type]  # the point of the test


# -- per-model quotas ---------------------------------------------------------------

SLOW, FAST = "slow-model", "fast-model"


def test_named_models_keep_buckets_of_their_own() -> None:
    quotas = FakeQuotas(
        requests_per_minute=6,
        models={
            SLOW: FakeQuotas(requests_per_minute=2),
            FAST: FakeQuotas(requests_per_minute=60, tokens_per_minute=600),
        },
    )
    book = QuotaBook(quotas)
    for _ in range(2):
        assert book.admit(KEY, 10, 0.0, SLOW) is None
    # The slow model's 2 a minute are spent: 30 s to wait for the next...
    assert book.admit(KEY, 10, 0.0, SLOW) == Refusal("requests", 30.0)
    # ...while the fast one and the unnamed ones have all of theirs.
    for _ in range(5):
        assert book.admit(KEY, 10, 0.0, FAST) is None
    assert book.rate_limits(KEY, 0.0, FAST) == RateLimitInfo(
        requests=Quota(limit=60, remaining=55, reset=5.0),
        tokens=Quota(limit=600, remaining=550, reset=5.0),
    )
    assert book.rate_limits(KEY, 0.0, SLOW) == RateLimitInfo(
        requests=Quota(limit=2, remaining=0, reset=60.0)
    )
    # Models not named, and requests naming none, share the key's buckets.
    for model in ("other", None, "yet another"):
        for _ in range(2):
            assert book.admit(KEY, 0, 0.0, model) is None
    assert book.admit(KEY, 0, 0.0, "other") == Refusal("requests", 10.0)
    assert book.rate_limits(KEY, 0.0) == book.rate_limits(KEY, 0.0, "a fourth")
    assert book.rate_limits(KEY, 0.0).requests == Quota(6, 0, 60.0)
    # Another key has every bucket full.
    assert book.rate_limits("another key", 0.0, SLOW).requests == Quota(2, 2, 0.0)
    # Each refills at its own rate.
    assert book.admit(KEY, 10, 30.0, SLOW) is None
    assert book.rate_limits(KEY, 30.0, FAST).requests == Quota(60, 60, 0.0)


def test_per_model_gives_every_model_the_figures_of_its_own() -> None:
    book = QuotaBook(
        FakeQuotas(
            requests_per_minute=60,
            per_model=True,
            models={SLOW: FakeQuotas(requests_per_minute=1)},
        )
    )
    assert book.admit(KEY, 0, 0.0, SLOW) is None
    assert book.admit(KEY, 0, 0.0, SLOW) == Refusal("requests", 60.0)
    for model in ("a", "b", None):
        for _ in range(60):
            assert book.admit(KEY, 0, 0.0, model) is None
        assert book.admit(KEY, 0, 0.0, model) == Refusal("requests", 1.0)


def test_a_models_figures_are_all_its_own() -> None:
    quotas = FakeQuotas(
        max_concurrency=5,
        default_max_tokens=100,
        models={
            SLOW: FakeQuotas(
                tokens_per_minute=600,
                max_concurrency=1,
                busy_retry_after=2.0,
                default_max_tokens=7,
                initial_fill=0.5,
            )
        },
    )
    book = QuotaBook(quotas)
    assert book.estimate(3, None, SLOW) == 10
    assert book.estimate(3, None, FAST) == book.estimate(3, None) == 103
    assert book.estimate(3, 1, SLOW) == 4
    assert book.rate_limits(KEY, 0.0, SLOW).tokens == Quota(600, 300, 30.0)
    assert book.admit(KEY, 10, 0.0, SLOW) is None
    assert book.admit(KEY, 10, 0.0, SLOW) == Refusal("concurrency", 2.0)
    for _ in range(5):
        assert book.admit(KEY, 10, 0.0, FAST) is None
    assert book.admit(KEY, 10, 0.0) == Refusal("concurrency", None)
    book.settle(KEY, 10, 4, 0.0, SLOW)
    assert book.rate_limits(KEY, 0.0, SLOW).tokens == Quota(600, 296, 30.4)
    assert book.admit(KEY, 10, 0.0, SLOW) is None


def test_which_figures_a_model_is_held_to() -> None:
    slow = FakeQuotas(requests_per_minute=2)
    quotas = FakeQuotas(requests_per_minute=6, models={SLOW: slow})
    assert quotas.for_model(SLOW) is slow
    assert quotas.for_model(FAST) is quotas
    assert quotas.for_model(None) is quotas
    assert quotas.keeps_apart(SLOW)
    assert not quotas.keeps_apart(FAST)
    assert not quotas.keeps_apart(None)
    every = attrs.evolve(quotas, per_model=True)
    assert every.keeps_apart(FAST)
    assert every.keeps_apart(SLOW)
    assert not every.keeps_apart(None)


def test_models_are_copied_and_quotas_stay_values() -> None:
    named = {SLOW: FakeQuotas(requests_per_minute=2)}
    quotas = FakeQuotas(models=named)
    named[FAST] = FakeQuotas()
    assert list(quotas.models) == [SLOW]
    assert quotas == FakeQuotas(models={SLOW: FakeQuotas(requests_per_minute=2)})
    assert quotas != FakeQuotas(models={SLOW: FakeQuotas(requests_per_minute=3)})
    assert hash(quotas) == hash(FakeQuotas())  # the models are not hashed


@pytest.mark.parametrize(
    ("models", "per_model", "error", "match"),
    [
        ([SLOW], False, TypeError, r"^models must be a mapping of model names"),
        ({"": FakeQuotas()}, False, ValueError, r"^models' names must be a non-empty"),
        ({1: FakeQuotas()}, False, TypeError, r"^models' names must be a non-empty"),
        (
            {SLOW: {"requests_per_minute": 2}},
            False,
            TypeError,
            r"^models\['slow-model'\] must be a FakeQuotas, got",
        ),
        (
            {SLOW: FakeQuotas(models={FAST: FakeQuotas()})},
            False,
            ValueError,
            r"^models\['slow-model'\] must be a FakeQuotas without models",
        ),
        (
            {SLOW: FakeQuotas(per_model=True)},
            False,
            ValueError,
            r"^models\['slow-model'\] must be a FakeQuotas without models",
        ),
        ({}, 1, TypeError, r"^per_model must be True or False, got 1$"),
    ],
)
def test_per_model_quotas_are_checked(
    models: object, per_model: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        FakeQuotas(models=models, per_model=per_model)  # type: ignore[arg-type]  # the point of the test


def test_a_server_wants_fake_quotas() -> None:
    with pytest.raises(TypeError, match=r"^quotas must be a FakeQuotas or None"):
        FakeLLMServer(FakeScript(), quotas={"requests_per_minute": 5})  # type: ignore[arg-type]  # the point


# -- the header formats ------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.012, "12ms"),
        (0.0121, "13ms"),
        (1.0, "1s"),
        (17.28, "17.28s"),
        (360.0, "6m0s"),
        (3723.5, "1h2m3.5s"),
        (3600.0, "1h0m0s"),
    ],
)
def test_go_durations(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_rfc3339() -> None:
    assert rfc3339(1755780059.0) == "2025-08-21T12:40:59Z"
    assert rfc3339(1755780059.1234) == "2025-08-21T12:40:59.124Z"


@given(st.integers(min_value=0, max_value=86_400_000))
def test_our_durations_read_back_exactly(ms: int) -> None:
    headers = {"x-ratelimit-reset-tokens": go_duration(ms / 1000)}
    info = openai_rate_limits(headers)
    assert info.tokens == Quota(reset=ms / 1000)


# -- the ASGI app, in memory, in virtual time -------------------------------------


def _body(
    wire: WireFormat, *, max_tokens: int | None = None, model: str = "m"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "x" * 200}],
        "stream": True,
    }
    if wire == "anthropic" or max_tokens is not None:
        body["max_tokens"] = 0 if max_tokens is None else max_tokens
    return body


def _prompt_estimate(body: dict[str, Any]) -> int:
    # The charging rule the server documents: a token per 4 characters.
    return max(1, len(json.dumps(body["messages"])) // 4)


def _auth(wire: WireFormat, key: str = KEY) -> list[tuple[bytes, bytes]]:
    if wire == "openai":
        return [(b"authorization", f"Bearer {key}".encode())]
    return [(b"x-api-key", key.encode()), (b"anthropic-version", b"2023-06-01")]


async def _call(
    server: FakeLLMServer,
    wire: WireFormat,
    body: dict[str, Any],
    auth: list[tuple[bytes, bytes]] | None = None,
    *,
    before_end: Callable[[], Awaitable[None]] | None = None,
) -> tuple[int, dict[str, str]]:
    """One request straight into the ASGI app: its status and headers.

    ``before_end`` runs as the app hands over the answer's last bytes,
    before they go: where a client that reads them may ask again at once.
    """
    scope = {
        "type": "http",
        "method": "POST",
        "path": PATHS[wire],
        "headers": [*(_auth(wire) if auth is None else auth)],
        "client": ("127.0.0.1", 1),
    }
    incoming = [{"type": "http.request", "body": json.dumps(body).encode()}]
    done = trio.Event()
    start: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif not message.get("more_body", False):
            if before_end is not None:
                await before_end()
            done.set()

    await server(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers


def _figures(wire: WireFormat, headers: dict[str, str], now: float) -> RateLimitInfo:
    if wire == "openai":
        return openai_rate_limits(headers)
    from datetime import UTC, datetime  # noqa: PLC0415 (this branch only)

    return anthropic_rate_limits(headers, now=datetime.fromtimestamp(now, UTC))


WIRES = ["openai", "anthropic"]


@pytest.mark.parametrize("wire", WIRES)
async def test_every_answer_carries_the_headers_and_refill_is_exact(
    wire: WireFormat, autojump_clock: trio.testing.MockClock
) -> None:
    quotas = FakeQuotas(requests_per_minute=60, tokens_per_minute=6000)
    server = FakeLLMServer(
        FakeScript(replies=(FakeReply(fault=Fault("server_error")),)), quotas=quotas
    )
    body = _body(wire)
    cost = _prompt_estimate(body)
    # A scripted 500: charged a request, its tokens given back.
    status, headers = await _call(server, wire, body)
    assert status == 500
    figures = _figures(wire, headers, server.wall_time(trio.current_time()))
    assert figures.requests == Quota(limit=60, remaining=59, reset=1.0)
    assert figures.tokens == Quota(limit=6000, remaining=6000 - cost, reset=cost / 100)
    assert server.rate_limits(KEY).tokens == Quota(6000, 6000, 0.0)
    # Two streams at t=0, then one 1.5 s later.
    for _ in range(2):
        status, headers = await _call(server, wire, body)
        assert status == 200
    await trio.sleep(1.5)
    status, headers = await _call(server, wire, body)
    figures = _figures(wire, headers, server.wall_time(trio.current_time()))
    # 60 - 3 + 1.5 - 1 = 57.5 requests: 57 whole, full in 2.5 s.
    assert figures.requests == Quota(limit=60, remaining=57, reset=2.5)
    # A bad request is charged nothing, and says so too.
    status, headers = await _call(server, wire, {"model": "m", "stream": True})
    assert status == 400
    assert _figures(wire, headers, server.wall_time(trio.current_time())).requests == (
        Quota(limit=60, remaining=57, reset=2.5)
    )
    # Without a key there is no key's figures to give.
    status, headers = await _call(server, wire, body, auth=[])
    assert status == 401
    assert _figures(wire, headers, 0.0).empty
    stats = server.statistics()
    assert stats.quota_refusals == 0
    usage = cost + len(FakeReply().text.split())  # prompt and one token a word
    assert stats.tokens_served == 3 * usage


@pytest.mark.parametrize("wire", WIRES)
async def test_429_retry_after_is_the_true_wait_rounded_up(
    wire: WireFormat, autojump_clock: trio.testing.MockClock
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(requests_per_minute=2))
    body = _body(wire)
    for _ in range(2):
        assert (await _call(server, wire, body))[0] == 200
    status, headers = await _call(server, wire, body)
    assert status == 429
    assert headers["retry-after"] == "30"
    assert headers.get("retry-after-ms") == ("30000" if wire == "openai" else None)
    await trio.sleep(10.25)
    status, headers = await _call(server, wire, body)
    assert status == 429
    assert headers["retry-after"] == "20"  # 19.75 s, rounded up
    figures = _figures(wire, headers, server.wall_time(trio.current_time()))
    assert figures.retry_after == (19.75 if wire == "openai" else 20.0)
    assert figures.requests == Quota(limit=2, remaining=0, reset=49.75)
    await trio.sleep(19.75)
    assert (await _call(server, wire, body))[0] == 200
    stats = server.statistics()
    assert stats.quota_refusals == 2
    assert stats.responses_by_status == {200: 3, 429: 2}


async def test_a_token_refusal_waits_for_the_tokens(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(tokens_per_minute=600))
    body = _body("openai", max_tokens=50)
    cost = _prompt_estimate(body) + 50
    used = _prompt_estimate(body) + len(FakeReply().text.split())
    admitted = 0
    while (await _call(server, "openai", body))[0] == 200:
        admitted += 1
    # Each stream is corrected to what it used as soon as it ends.
    level, expected = 600, 0
    while level >= cost:
        level, expected = level - used, expected + 1
    assert admitted == expected
    assert server.rate_limits(KEY).tokens == Quota(600, level, (600 - level) / 10)
    _, headers = await _call(server, "openai", body)
    wait = (cost - level) / 10
    assert headers["retry-after-ms"] == str(math.ceil(wait * 1000))
    assert headers["retry-after"] == str(math.ceil(wait))


async def test_the_concurrency_cap(autojump_clock: trio.testing.MockClock) -> None:
    slow = FakeReply(latency=5.0)
    server = FakeLLMServer(
        FakeScript(default=slow), quotas=FakeQuotas(max_concurrency=2)
    )
    statuses: list[tuple[float, int, str | None]] = []

    async def one() -> None:
        status, headers = await _call(server, "anthropic", _body("anthropic"))
        statuses.append((trio.current_time(), status, headers.get("retry-after")))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
    assert sorted(statuses) == [(0.0, 429, None), (5.0, 200, None), (5.0, 200, None)]
    assert server.statistics().peak_in_flight == 3  # the refused one arrived too


@pytest.mark.parametrize("wire", WIRES)
async def test_an_answer_is_over_for_the_server_before_its_last_bytes_go(
    wire: WireFormat, autojump_clock: trio.testing.MockClock
) -> None:
    # A client that has read a whole answer may ask again at once, however
    # late the server's task runs again: by then the answer neither counts
    # in flight nor holds the concurrency cap, so a client held to the cap
    # never meets a 429 that is only the server's lag.
    server = FakeLLMServer(
        FakeScript(default=FakeReply(text="ok", latency=1.0)),
        quotas=FakeQuotas(max_concurrency=1),
    )
    seen: list[tuple[str, int]] = []

    async def look(what: str) -> None:
        seen.append((what, server.statistics().in_flight))

    async def ask_again() -> None:
        await look("streamed")
        status, _ = await _call(
            server, wire, _body(wire), before_end=partial(look, "again")
        )
        seen.append(("again", status))

    status, _ = await _call(server, wire, _body(wire), before_end=ask_again)
    assert status == 200
    # A 429, and an error, are over before they go too.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_call, server, wire, _body(wire))
        await trio.testing.wait_all_tasks_blocked()
        refused, _ = await _call(
            server, wire, _body(wire), before_end=partial(look, "refused")
        )
    unknown_key, _ = await _call(
        server, wire, _body(wire), [], before_end=partial(look, "unauthorised")
    )
    assert (refused, unknown_key) == (429, 401)
    assert seen == [
        ("streamed", 0),
        ("again", 0),
        ("again", 200),
        ("refused", 1),
        ("unauthorised", 0),
    ]
    assert server.statistics().in_flight == 0


@pytest.mark.parametrize("wire", WIRES)
async def test_each_answer_reports_its_models_buckets(
    wire: WireFormat, autojump_clock: trio.testing.MockClock
) -> None:
    quotas = FakeQuotas(
        requests_per_minute=600,
        models={
            SLOW: FakeQuotas(requests_per_minute=2),
            FAST: FakeQuotas(requests_per_minute=120),
        },
    )
    server = FakeLLMServer(FakeScript(), quotas=quotas)
    calls: list[tuple[str, int, Quota | None]] = []

    async def call(model: str) -> None:
        status, headers = await _call(server, wire, _body(wire, model=model))
        now = server.wall_time(trio.current_time())
        calls.append((model, status, _figures(wire, headers, now).requests))

    for model in (SLOW, FAST, SLOW, FAST, SLOW, "other"):
        await call(model)
    assert calls == [
        (SLOW, 200, Quota(2, 1, 30.0)),
        (FAST, 200, Quota(120, 119, 0.5)),
        (SLOW, 200, Quota(2, 0, 60.0)),
        (FAST, 200, Quota(120, 118, 1.0)),
        # The slow model's bucket is empty; its 429 says so, and when.
        (SLOW, 429, Quota(2, 0, 60.0)),
        ("other", 200, Quota(600, 599, 0.1)),
    ]
    assert server.rate_limits(KEY, SLOW).requests == Quota(2, 0, 60.0)
    assert server.rate_limits(KEY, FAST).requests == Quota(120, 118, 1.0)
    assert server.rate_limits(KEY).requests == Quota(600, 599, 0.1)
    await trio.sleep(30.0)
    calls.clear()
    await call(SLOW)
    assert calls == [(SLOW, 200, Quota(2, 0, 60.0))]
    stats = server.statistics()
    assert stats.quota_refusals == 1
    assert stats.requests_by_model == {SLOW: 4, FAST: 2, "other": 1}
    assert stats.quota_refusals_by_model == {SLOW: 1}


async def test_a_body_without_a_string_model_goes_to_the_keys_buckets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    quotas = FakeQuotas(requests_per_minute=1, per_model=True)
    server = FakeLLMServer(FakeScript(), quotas=quotas)
    body = _body("openai")
    body["model"] = 4
    status, headers = await _call(server, "openai", body)
    assert status == 200
    assert openai_rate_limits(headers).requests == Quota(1, 0, 60.0)
    assert server.rate_limits(KEY).requests == Quota(1, 0, 60.0)
    assert server.rate_limits(KEY, "4").requests == Quota(1, 1, 0.0)
    status, headers = await _call(server, "openai", body)
    assert status == 429
    # A bad request for a model: that model's figures.
    status, headers = await _call(server, "openai", {"model": "4", "stream": True})
    assert status == 400
    assert openai_rate_limits(headers).requests == Quota(1, 1, 0.0)
    stats = server.statistics()
    assert (stats.quota_refusals, stats.requests_total) == (1, 3)
    assert stats.requests_by_model == {"4": 1}
    assert stats.quota_refusals_by_model == {}
    with pytest.raises(TypeError, match=r"^model must be a string or None, got 4$"):
        server.rate_limits(KEY, 4)  # type: ignore[arg-type]  # the point of the test


# -- round trips: our providers against the server, over sockets ------------------


@pytest.mark.parametrize("wire", WIRES)
async def test_round_trip_figures_equal_the_server_state(
    wire: WireFormat, mock_clock: trio.testing.MockClock
) -> None:
    # A still clock: the state does not move while the bytes travel. The
    # reply's usage is its estimate, so nothing is corrected at the end.
    quotas = FakeQuotas(requests_per_minute=3, tokens_per_minute=60_000)
    reply = FakeReply(output_tokens=20)
    seen: list[RateLimitInfo] = []
    request = ChatRequest([ChatMessage("user", "Hello " * 30)], max_tokens=20)
    async with open_fake_llm_server(FakeScript(default=reply), quotas=quotas) as server:
        provider: OpenAIProvider | AnthropicProvider
        if wire == "openai":
            provider = OpenAIProvider(
                base_url=server.openai_base_url,
                api_key=KEY,
                model="m",
                on_rate_limits=lambda _, info: seen.append(info),
            )
        else:
            provider = AnthropicProvider(
                base_url=server.anthropic_base_url,
                api_key=KEY,
                model="m",
                on_rate_limits=lambda _, info: seen.append(info),
            )
        async with provider:
            states = []
            for _ in range(3):
                async with provider.stream(request) as events:
                    async for _event in events:
                        pass
                states.append(server.rate_limits(KEY))
            with pytest.raises(RateLimited) as refused:
                async with provider.stream(request):
                    pass  # pragma: no cover (entering raises)
            states.append(server.rate_limits(KEY))
    assert refused.value.retry_after == 20.0
    assert [s.requests for s in states] == [
        Quota(3, 2, 20.0),
        Quota(3, 1, 40.0),
        Quota(3, 0, 60.0),
        Quota(3, 0, 60.0),
    ]
    assert states[2].tokens is not None
    assert states[2].tokens.remaining is not None
    assert states[2].tokens.remaining < 60_000
    assert len(seen) == 4
    assert seen[3].retry_after == 20.0
    for info, state in zip(seen, states, strict=True):
        if wire == "openai":
            assert (info.requests, info.tokens) == (state.requests, state.tokens)
            continue
        # Anthropic's resets are wall-clock times: they come back less the
        # real time the round trip took.
        for got, want in ((info.requests, state.requests), (info.tokens, state.tokens)):
            assert got is not None
            assert want is not None
            assert (got.limit, got.remaining) == (want.limit, want.remaining)
            assert got.reset is not None
            assert want.reset is not None
            assert want.reset - 2.0 <= got.reset <= want.reset
