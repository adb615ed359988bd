"""Rate-limit pauses end to end: ``max_pause``, the backoff, ``resume``.

Through the real providers (answers from ``httpx2.MockTransport``), the
conversation actor, the SDK transport and the dispatcher, in virtual time,
with exact times.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import math
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import ConversationOptions, DispatcherClosed, open_dispatcher
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider

from .._helpers import settle, task_names, unknown_provider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch.providers import RateLimitReporter

FIXTURES = Path(__file__).parent.parent / "fixtures"
SSE_HEADERS = {"content-type": "text/event-stream"}
QUICK_RETRIES = ConversationOptions(retry_backoff=0.01)

# What a server may send that would pause a provider for decades.
ENDLESS = [
    pytest.param({"retry-after": "999999999"}, id="retry-after"),
    pytest.param({"retry-after-ms": "999999999999"}, id="retry-after-ms"),
    pytest.param({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, id="http-date"),
]


class Answers:
    """Scripted HTTP answers, one per request, and when each request came."""

    def __init__(self, *answers: httpx2.Response) -> None:
        self.answers = list(answers)
        self.sent_at: list[float] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.sent_at.append(trio.current_time())
        return self.answers.pop(0)


def ok(name: str) -> httpx2.Response:
    return httpx2.Response(
        200, headers=SSE_HEADERS, content=(FIXTURES / name).read_bytes()
    )


def refused(status: int, headers: dict[str, str] | None = None) -> httpx2.Response:
    kind = "rate_limit_error" if status == 429 else "overloaded_error"
    body = {"type": "error", "error": {"type": kind, "message": "slow down"}}
    return httpx2.Response(status, headers=headers, content=json.dumps(body).encode())


@asynccontextmanager
async def openai(
    answers: Answers, on_rate_limit: RateLimitReporter | None = None
) -> AsyncIterator[OpenAIProvider]:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answers)) as client:
        yield OpenAIProvider(
            base_url="https://api.test/v1",
            api_key="k",
            model="m",
            client=client,
            on_rate_limit=on_rate_limit,
        )


@asynccontextmanager
async def anthropic(
    answers: Answers, on_rate_limit: RateLimitReporter | None = None
) -> AsyncIterator[AnthropicProvider]:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answers)) as client:
        yield AnthropicProvider(
            api_key="k", model="m", client=client, on_rate_limit=on_rate_limit
        )


# -- rate limits that never end ---------------------------------------------------


@pytest.mark.parametrize("headers", ENDLESS)
@pytest.mark.parametrize("limited", [True, False], ids=["limited", "unlimited"])
async def test_a_retry_after_of_decades_pauses_for_max_pause_only(
    headers: dict[str, str], limited: bool, autojump_clock: trio.testing.MockClock
) -> None:
    # Limited, the dispatcher's pause waits; unlimited, the conversation's
    # own backoff does. Both stop at max_pause (60 s by default).
    answers = Answers(refused(429, headers), ok("openai_text.sse"))
    async with (
        openai(answers) as provider,
        open_dispatcher({provider.id: 1} if limited else {}) as dispatcher,
    ):
        with contextlib.nullcontext() if limited else unknown_provider(provider.id):
            conversation = dispatcher.start_conversation(
                provider, options=QUICK_RETRIES
            )
        result = await conversation.ask("hello")
    assert answers.sent_at == [0.0, 60.0]
    assert (result.retries, result.finished_at) == (1, 60.0)


@pytest.mark.parametrize("limited", [True, False], ids=["limited", "unlimited"])
async def test_max_pause_is_the_dispatchers_own(
    limited: bool, autojump_clock: trio.testing.MockClock
) -> None:
    answers = Answers(
        refused(529, {"retry-after": "999999999"}), ok("anthropic_text.sse")
    )
    async with (
        anthropic(answers) as provider,
        open_dispatcher(
            {provider.id: 1} if limited else {}, default_pause=0.5, max_pause=5
        ) as dispatcher,
    ):
        with contextlib.nullcontext() if limited else unknown_provider(provider.id):
            conversation = dispatcher.start_conversation(
                provider, options=QUICK_RETRIES
            )
        await conversation.ask("hello")
    assert answers.sent_at == [0.0, 5.0]


async def test_resume_lifts_a_pause_that_outlived_remove_and_set_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        dispatcher.report_rate_limit("p", retry_after=999_999_999)
        dispatcher.remove_limit("p")
        dispatcher.set_limit("p", 1)
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.paused_until) == (True, 60.0)

        async def call() -> None:
            async with dispatcher.slot("p") as slot:
                assert slot.granted_at is not None
                granted.append(slot.granted_at)

        nursery.start_soon(call)
        await trio.sleep(5)
        assert granted == []
        dispatcher.resume("p")
        await settle()
        assert granted == [5.0]
        assert not dispatcher.statistics().providers["p"].paused


async def test_resume_grants_at_once_in_ticket_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[tuple[float, float]] = []
    async with open_dispatcher({"p": 2}) as dispatcher, trio.open_nursery() as nursery:

        async def call(started_at: float) -> None:
            async with dispatcher.slot("p", started_at=started_at) as slot:
                assert slot.granted_at is not None
                granted.append((started_at, slot.granted_at))
                await trio.sleep(10)

        nursery.start_soon(call, -1.0)
        await settle()
        dispatcher.report_rate_limit("p", retry_after=50)
        for started_at in [-0.2, -0.9, -0.5]:
            nursery.start_soon(call, started_at)
            await settle()
        await trio.sleep(4)
        dispatcher.resume("p")
        await trio.sleep(20)
    # One slot was held until 10: resume granted the oldest turn at once,
    # the next when that holder left, the youngest when another did.
    assert granted == [(-1.0, 0.0), (-0.9, 4.0), (-0.5, 10.0), (-0.2, 14.0)]


async def test_resume_checks_its_argument_and_ignores_a_provider_never_used() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            ValueError, match=r"^provider must be a non-empty string, got ''$"
        ):
            dispatcher.resume("")
        with pytest.raises(
            TypeError, match=r"^provider must be a non-empty string, got None$"
        ):
            dispatcher.resume(None)  # type: ignore[arg-type]  # the point
        dispatcher.resume("never-used")
        dispatcher.resume("p")  # not paused: nothing to do
        await settle()
        schedulers = [n for n in task_names() if n.startswith("trio_dispatch sch")]
        assert schedulers == ["trio_dispatch scheduler 'p'"]
        assert not dispatcher.statistics().providers["p"].paused
    with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
        dispatcher.resume("p")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"max_pause": 0},
            ValueError,
            "max_pause must be a positive number of seconds, got 0",
        ),
        (
            {"max_pause": -1},
            ValueError,
            "max_pause must be a positive number of seconds, got -1",
        ),
        (
            {"max_pause": math.nan},
            ValueError,
            "max_pause must be a positive number of seconds, got nan",
        ),
        (
            {"max_pause": math.inf},
            ValueError,
            "max_pause must be a positive number of seconds, got inf",
        ),
        (
            {"max_pause": "60"},
            TypeError,
            "max_pause must be a positive number of seconds, got '60'",
        ),
        (
            {"max_pause": 0.5},
            ValueError,
            r"default_pause must be at most max_pause=0\.5, got 1\.0",
        ),
        (
            {"default_pause": 90, "max_pause": 60},
            ValueError,
            "default_pause must be at most max_pause=60, got 90",
        ),
    ],
)
def test_bad_pause_options_are_refused_at_the_call(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        open_dispatcher(**options)


# -- pauses without a Retry-After, or with one that names no delay ---------------


async def test_an_overloaded_answer_without_retry_after_pauses_one_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Anthropic's 529 usually names no delay: the turn takes 1 s, not 30.
    answers = Answers(refused(529), ok("anthropic_text.sse"))
    async with (
        anthropic(answers) as provider,
        open_dispatcher({provider.id: 1}) as dispatcher,
    ):
        conversation = dispatcher.start_conversation(provider, options=QUICK_RETRIES)
        result = await conversation.ask("hello")
    assert answers.sent_at == [0.0, 1.0]
    assert (result.started_at, result.finished_at) == (0.0, 1.0)


# A Retry-After that names no delay (0, negative, milliseconds 0, a date in
# the past) is no delay: pausing for nothing would let every waiter go again
# at once into the same 429. It backs off as no header does.
URL = "https://llm.test/v1/chat/completions"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
# Enough to end a storm quickly when the pause is not there.
STORM = 500


def refusals() -> list[dict[str, str]]:
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    return [
        {"retry-after": "0"},
        {"retry-after": "-5"},
        {"retry-after-ms": "0"},
        {"retry-after": past},
    ]


@pytest.mark.parametrize(
    "headers", refusals(), ids=["zero", "negative", "zero-ms", "date-in-the-past"]
)
async def test_a_429_that_names_no_delay_backs_off_through_the_transport(
    autojump_clock: trio.testing.MockClock, headers: dict[str, str]
) -> None:
    sent: list[float] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(trio.current_time())
        return httpx2.Response(429, headers=headers, json={"error": {}})

    async def agent(client: httpx2.AsyncClient) -> None:
        while len(sent) < STORM:
            response = await client.post(URL, content=BODY)
            assert response.status_code == 429

    async with open_dispatcher({"p": 8}, default_pause=1.0) as dispatcher:
        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            start = trio.current_time()
            with trio.move_on_after(2.0):
                async with trio.open_nursery() as nursery:
                    for _ in range(8):
                        nursery.start_soon(agent, client)
            # 8 at once, a pause of 1 s, 8 more, then a pause of 2 s.
            assert [when - start for when in sent] == [0.0] * 8 + [1.0] * 8
            stats = dispatcher.statistics().providers["p"]
            assert stats.paused_until == start + 3.0


async def test_consecutive_refusals_double_the_pause_and_a_success_resets_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = Answers(
        refused(529),
        refused(503),
        refused(429),
        ok("anthropic_text.sse"),
        refused(529),
        ok("anthropic_text.sse"),
    )
    async with (
        anthropic(answers) as provider,
        open_dispatcher({provider.id: 1}) as dispatcher,
    ):
        conversation = dispatcher.start_conversation(provider, options=QUICK_RETRIES)
        await conversation.ask("first")
        await conversation.ask("second")
    assert answers.sent_at == [0.0, 1.0, 3.0, 7.0, 7.0, 8.0]


async def test_the_backoff_stops_growing_at_max_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers = Answers(*[refused(529)] * 5, ok("anthropic_text.sse"))
    async with (
        anthropic(answers) as provider,
        open_dispatcher({provider.id: 1}, max_pause=3) as dispatcher,
    ):
        conversation = dispatcher.start_conversation(
            provider, options=attrs.evolve(QUICK_RETRIES, max_attempts=6)
        )
        await conversation.ask("hello")
    assert answers.sent_at == [0.0, 1.0, 3.0, 6.0, 9.0, 12.0]


async def test_requests_refused_together_share_one_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Three requests in flight at once, all refused: one round, one second,
    # not 1 + 2 + 4 as if each refusal came after the last pause.
    answers = Answers(*[refused(529)] * 3, *[ok("anthropic_text.sse")] * 3)
    async with (
        anthropic(answers) as provider,
        open_dispatcher({provider.id: 3}) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        for _ in range(3):
            conversation = dispatcher.start_conversation(
                provider, options=QUICK_RETRIES
            )
            nursery.start_soon(conversation.ask, "hello")
    assert answers.sent_at == [0.0] * 3 + [1.0] * 3


async def test_one_answer_reported_twice_counts_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The provider's on_rate_limit and the conversation's wrapper both
    # report each refusal: the backoff still doubles once per refusal.
    answers = Answers(refused(529), refused(529), ok("anthropic_text.sse"))
    async with open_dispatcher({"anthropic": 1}) as dispatcher:
        report = dispatcher.report_rate_limit
        async with anthropic(answers, on_rate_limit=report) as provider:
            conversation = dispatcher.start_conversation(
                provider, options=QUICK_RETRIES
            )
            await conversation.ask("hello")
    assert answers.sent_at == [0.0, 1.0, 3.0]
