"""Each call's token timings reach its slot's scheduler, from every integration.

``wrap_provider`` (and so conversations) times our providers' token events;
``Dispatcher.transport`` times the server-sent events of the body it passes
to the SDK. Both tell the slot once, at the answer's end, before the slot
goes back (``Slot.report_timing``, an ``ObserveLatency``), in virtual time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio

from trio_dispatch import wrap_provider
from trio_dispatch._integrations._metering import (
    estimate_json_prompt_tokens,
    estimate_prompt_tokens,
)
from trio_dispatch.lowlevel import ObserveLatency, Release, open_dispatcher_with
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.testing import (
    FakeLLMServer,
    FakeReply,
    FakeScript,
    ScriptedProvider,
    StreamingASGITransport,
)

from .._backend_rigs import Made

if TYPE_CHECKING:
    import trio.testing

    from trio_dispatch.lowlevel import SchedulerMessage

REQUEST = ChatRequest([ChatMessage("user", "x" * 400)], max_tokens=100)
# Five tokens: the first 0.5 s after the request, then one every 0.1 s.
REPLY = FakeReply(
    text="one two three four five",
    output_tokens=5,
    time_to_first_token=0.5,
    tokens_per_second=10,
)


def timings(sent: list[SchedulerMessage]) -> list[ObserveLatency]:
    """The timings reported, each checked to come before its slot's release."""
    released = {m.ticket for m in sent if isinstance(m, Release)}
    reports = [m for m in sent if isinstance(m, ObserveLatency)]
    for report in reports:
        assert report.ticket in released
        assert sent.index(report) < sent.index(Release(report.ticket))
    return reports


async def test_a_providers_answer_reports_its_token_timings(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    provider = ScriptedProvider(FakeScript(default=REPLY), id="p")
    async with open_dispatcher_with(made, {"p": 1}) as dispatcher:
        limited = wrap_provider(provider, dispatcher)
        async with limited.stream(REQUEST) as events:
            async for _ in events:
                pass
    (report,) = timings(made.backends["p"].sent)
    assert report.first_token == 0.5
    assert report.between_tokens == pytest.approx(0.1)
    assert report.duration == pytest.approx(0.9)
    assert report.prompt_tokens == estimate_prompt_tokens(REQUEST)


async def test_an_answer_left_early_reports_nothing_and_still_gives_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    provider = ScriptedProvider(FakeScript(default=REPLY), id="p")
    async with open_dispatcher_with(made, {"p": 1}) as dispatcher:
        limited = wrap_provider(provider, dispatcher)
        async with limited.stream(REQUEST) as events:
            await anext(aiter(events))
        assert dispatcher.statistics().providers["p"].in_flight == 0
    sent = made.backends["p"].sent
    assert timings(sent) == []
    assert any(isinstance(m, Release) for m in sent)


# Each wire format's request, as an SDK sends it: path, headers, body.
CALLS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "openai": (
        "/v1/chat/completions",
        {"authorization": "Bearer sk-test"},
        {
            "model": "m",
            "stream": True,
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "x" * 400}],
        },
    ),
    "anthropic": (
        "/v1/messages",
        {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"},
        {
            "model": "m",
            "stream": True,
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "x" * 400}],
        },
    ),
}


@pytest.mark.parametrize("wire", sorted(CALLS))
async def test_a_transports_event_stream_reports_its_token_timings(
    wire: str, autojump_clock: trio.testing.MockClock
) -> None:
    # The stream's opening events (OpenAI's role, Anthropic's message_start)
    # come at once, its closing ones with the last token: neither counts.
    path, headers, body = CALLS[wire]
    made = Made()
    server = FakeLLMServer(FakeScript(default=REPLY), api_key="sk-test")
    async with (
        open_dispatcher_with(made, {"p": 1}) as d,
        httpx2.AsyncClient(
            transport=d.transport("p", inner=StreamingASGITransport(server))
        ) as http,
        http.stream(
            "POST", f"http://fake.test{path}", json=body, headers=headers
        ) as response,
    ):
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            pass
    (report,) = timings(made.backends["p"].sent)
    assert report.first_token == 0.5
    assert report.between_tokens == pytest.approx(0.1)
    assert report.duration == pytest.approx(0.9)
    assert report.prompt_tokens == estimate_json_prompt_tokens(body)
