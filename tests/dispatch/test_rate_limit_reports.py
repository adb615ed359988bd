"""Providers report every answer's rate-limit figures to ``on_rate_limits``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import attrs
import httpx2
import pytest

from trio_dispatch import Quota, RateLimitInfo
from trio_dispatch.providers import (
    AnthropicProvider,
    OpenAIProvider,
    RateLimited,
    RateLimitObserver,
    RateLimitReporter,
)
from trio_dispatch.testing import FakeReply, FakeScript, Fault, ScriptedProvider

from .._wires import HELLO, SSE_HEADERS, collect, fixture

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._wires import HTTPProvider

KEY = "sk-test-Zq8vXw3Lp9RtYb6N"

OPENAI_HEADERS = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-tokens": "6m0s",
}
OPENAI_INFO = RateLimitInfo(
    requests=Quota(limit=60, remaining=59, reset=1.0),
    tokens=Quota(limit=150_000, remaining=149_984, reset=360.0),
)
ANTHROPIC_HEADERS = {
    "date": "Thu, 21 Aug 2025 12:41:00 GMT",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:41:30Z",
}
# The provider's own clock is far from that date: the date decides.
ANTHROPIC_INFO = RateLimitInfo(requests=Quota(limit=1000, remaining=999, reset=30.0))


class Make(Protocol):
    """A provider on ``client``, with these rate-limit callbacks."""

    def __call__(
        self,
        client: httpx2.AsyncClient,
        observer: RateLimitObserver | None,
        reporter: RateLimitReporter | None = None,
    ) -> HTTPProvider: ...


Wire = tuple[
    Make,
    str,
    dict[str, str],
    RateLimitInfo,
]


def _openai(
    client: httpx2.AsyncClient,
    observer: RateLimitObserver | None,
    reporter: RateLimitReporter | None = None,
) -> HTTPProvider:
    return OpenAIProvider(
        base_url="http://x/v1",
        api_key=KEY,
        model="m",
        client=client,
        on_rate_limits=observer,
        on_rate_limit=reporter,
    )


def _anthropic(
    client: httpx2.AsyncClient,
    observer: RateLimitObserver | None,
    reporter: RateLimitReporter | None = None,
) -> HTTPProvider:
    return AnthropicProvider(
        base_url="http://x",
        api_key=KEY,
        model="m",
        client=client,
        on_rate_limits=observer,
        on_rate_limit=reporter,
    )


WIRES: list[Wire] = [
    (_openai, "openai_text.sse", OPENAI_HEADERS, OPENAI_INFO),
    (_anthropic, "anthropic_text.sse", ANTHROPIC_HEADERS, ANTHROPIC_INFO),
]
IDS = ["openai", "anthropic"]


def _client(status: int, headers: dict[str, str], body: bytes) -> httpx2.AsyncClient:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers=headers, content=body)

    return httpx2.AsyncClient(transport=httpx2.MockTransport(answer))


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_a_success_is_reported_before_the_stream_is_returned(
    wire: Wire,
) -> None:
    make, body, headers, info = wire
    seen: list[tuple[str, RateLimitInfo]] = []
    async with _client(200, {**SSE_HEADERS, **headers}, fixture(body)) as client:
        provider = make(client, lambda *args: seen.append(args))
        async with provider.stream(HELLO) as events:
            assert seen == [(provider.id, info)]
            assert [event async for event in events]
    assert seen == [(provider.id, info)]


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_a_429_is_reported_before_it_is_raised(wire: Wire) -> None:
    make, _, headers, info = wire
    order: list[str] = []
    seen: list[RateLimitInfo] = []

    def observe(provider: str, figures: RateLimitInfo) -> None:
        order.append("on_rate_limits")
        seen.append(figures)

    answer = {**headers, "retry-after": "7", "content-type": "application/json"}
    async with _client(429, answer, b'{"error": {"message": "slow down"}}') as client:
        provider = make(client, observe, lambda *_: order.append("on_rate_limit"))
        with pytest.raises(RateLimited):
            async with provider.stream(HELLO):
                pass  # pragma: no cover (entering raises)
    assert seen == [
        RateLimitInfo(requests=info.requests, tokens=info.tokens, retry_after=7.0)
    ]
    assert order == ["on_rate_limits", "on_rate_limit"]


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_an_answer_without_figures_is_not_reported(wire: Wire) -> None:
    make, body, _, _ = wire
    seen: list[object] = []
    async with _client(200, SSE_HEADERS, fixture(body)) as client:
        await collect(make(client, lambda *args: seen.append(args)))
    assert seen == []


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_a_failing_observer_is_logged_and_the_answer_goes_on(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    make, body, headers, _ = wire

    def observe(provider: str, figures: RateLimitInfo) -> None:
        raise RuntimeError("the observer broke")

    async with _client(200, {**SSE_HEADERS, **headers}, fixture(body)) as client:
        provider = make(client, observe)
        events = await collect(provider)
    assert events
    [record] = caplog.records
    assert (record.name, record.levelno) == ("trio_dispatch", logging.ERROR)
    assert record.getMessage() == f"{provider.id}: the on_rate_limits observer failed"
    assert record.exc_info is not None


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_a_malformed_header_is_logged_once_and_never_fails_the_call(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    make, body, headers, info = wire
    name = next(n for n in headers if n.endswith(("requests-limit", "limit-requests")))
    bad = {**SSE_HEADERS, **headers, name: f"oops {KEY}"}
    seen: list[RateLimitInfo] = []
    async with _client(200, bad, fixture(body)) as client:
        provider = make(client, lambda _, figures: seen.append(figures))
        for _ in range(3):
            assert await collect(provider)
    assert info.requests is not None
    partial = attrs.evolve(info, requests=attrs.evolve(info.requests, limit=None))
    assert seen == [partial] * 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{provider.id}: ignoring the {name} header, which does not parse: "
        "'oops [redacted]'"
    ]
    assert KEY not in caplog.text


@pytest.mark.parametrize("make", [_openai, _anthropic], ids=IDS)
async def test_an_observer_must_be_callable(
    make: Callable[[httpx2.AsyncClient, object], HTTPProvider],
) -> None:
    async with httpx2.AsyncClient() as client:
        with pytest.raises(TypeError, match=r"^on_rate_limits must be callable$"):
            make(client, "dispatcher.observe_rate_limits")
    with pytest.raises(TypeError, match=r"^on_rate_limits must be callable$"):
        ScriptedProvider(on_rate_limits=42)  # type: ignore[arg-type]  # the point


# -- ScriptedProvider ------------------------------------------------------------


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_scripted_status_faults_report_their_retry_headers(wire: str) -> None:
    seen: list[tuple[str, RateLimitInfo]] = []
    script = FakeScript(
        replies=(
            FakeReply(fault=Fault("rate_limit", retry_after=2)),
            FakeReply(fault=Fault("overloaded", retry_after_ms=1500)),
            FakeReply(fault=Fault("server_error")),
            FakeReply(),
        )
    )
    provider = ScriptedProvider(
        script,
        wire=wire,  # type: ignore[arg-type]  # a parametrised literal
        on_rate_limits=lambda *args: seen.append(args),
    )
    for _ in range(3):
        with pytest.raises(Exception):  # noqa: PT011, B017 (three kinds on purpose)
            await collect(provider)
    assert await collect(provider)
    assert seen == [
        ("scripted", RateLimitInfo(retry_after=2.0)),
        ("scripted", RateLimitInfo(retry_after=1.5)),
    ]


async def test_a_failing_scripted_observer_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def observe(provider: str, figures: RateLimitInfo) -> None:
        raise RuntimeError("the observer broke")

    provider = ScriptedProvider(
        FakeScript(FakeReply(fault=Fault("rate_limit", retry_after=1))),
        on_rate_limits=observe,
    )
    with pytest.raises(RateLimited):
        await collect(provider)
    [record] = caplog.records
    assert record.getMessage() == "scripted: the on_rate_limits observer failed"
