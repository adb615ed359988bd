"""What ``Dispatcher.transport`` tells the budgets: estimates and figures.

A model call sent through the transport is charged its body's estimate,
its answer counts as started when its headers arrive, and the rate-limit
figures of those headers (OpenAI's or Anthropic's) reach
``Dispatcher.observe_rate_limits`` for the body's model (``"m"``): they
teach that model's budget. In memory (``httpx2.MockTransport``,
or httpx's for the legacy transport), in virtual time.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import Budget, open_dispatcher
from trio_dispatch._integrations._metering import estimate_json_tokens, json_body

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import BudgetStatistics, Dispatcher

URL = "https://llm.test/v1/chat/completions"
PROMPT = {"role": "user", "content": "x" * 40}
# 3 + 4 per message + ("user" and 40 x's: 44 characters + 3) // 4.
PROMPT_TOKENS = 3 + 4 + 47 // 4


def openai_figures(requests: int = 59, tokens: int = 5500) -> dict[str, str]:
    """OpenAI's headers: 60 requests and 6,000 tokens a minute, some spent."""
    return {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": str(requests),
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": str(tokens),
        "x-ratelimit-reset-tokens": "5s",
    }


def anthropic_figures(requests: int = 59, tokens: int = 5500) -> dict[str, str]:
    """The same figures as Anthropic writes them (resets as RFC 3339 times)."""
    now = datetime.now(UTC)

    def at(seconds: float) -> str:
        return (now + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    return {
        "anthropic-ratelimit-requests-limit": "60",
        "anthropic-ratelimit-requests-remaining": str(requests),
        "anthropic-ratelimit-requests-reset": at(1.0),
        "anthropic-ratelimit-tokens-limit": "6000",
        "anthropic-ratelimit-tokens-remaining": str(tokens),
        "anthropic-ratelimit-tokens-reset": at(5.0),
    }


FIGURES = {"openai": openai_figures, "anthropic": anthropic_figures}


class Body(httpx2.AsyncByteStream, httpx.AsyncByteStream):
    """A streamed body that ends when ``done`` is set."""

    def __init__(self) -> None:
        self.done = trio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await self.done.wait()
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        pass


def budget_of(dispatcher: Dispatcher, provider: str = "p") -> BudgetStatistics | None:
    """The budgets of ``provider`` now, its own (over all its models)."""
    return dispatcher.statistics().providers[provider].budget


def learned_of(dispatcher: Dispatcher, model: str = "m") -> BudgetStatistics | None:
    """The budgets of ``model`` of ``"p"`` now: what its answers' figures teach."""
    return dispatcher.statistics().providers["p"].models.get(model)


def chat(**fields: Any) -> bytes:  # noqa: ANN401 (JSON values)
    """A chat completions body: the prompt above and ``fields``."""
    return json.dumps({"model": "m", "messages": [PROMPT], **fields}).encode()


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("legacy", [False, True], ids=["httpx2", "httpx"])
async def test_the_figures_of_an_answer_teach_the_budgets(
    autojump_clock: trio.testing.MockClock, wire: str, legacy: bool
) -> None:
    module: Any = httpx if legacy else httpx2
    bodies: list[Body] = []
    # What the server has left after each call: it counted the call.
    left = [(59, 5500), (58, 5000)]
    async with open_dispatcher({"p": 2}) as dispatcher:

        def handle(request: Any) -> Any:  # noqa: ANN401 (either library's)
            bodies.append(Body())
            headers = FIGURES[wire](*left[len(bodies) - 1])
            return module.Response(200, headers=headers, stream=bodies[-1])

        transport = dispatcher.transport("p", inner=module.MockTransport(handle))
        async with module.AsyncClient(transport=transport) as client:
            assert learned_of(dispatcher) is None
            for requests, tokens in left:
                async with client.stream(
                    "POST", URL, content=chat(max_tokens=100)
                ) as response:
                    await trio.testing.wait_all_tasks_blocked()
                    # Still streaming, and learned: the call that carried
                    # the figures is counted by them, not taken again.
                    learned = learned_of(dispatcher)
                    assert learned is not None
                    assert learned.learned
                    assert (learned.requests_per_minute, learned.tokens_per_minute) == (
                        60,
                        6000,
                    )
                    assert (
                        learned.requests_available,
                        learned.tokens_available,
                    ) == (requests, tokens)
                    bodies[-1].done.set()
                    lines = [line async for line in response.aiter_lines() if line]
                    assert lines == ["data: first", "data: [DONE]"]
        assert dispatcher.statistics().providers["p"].in_flight == 0


async def test_a_rate_limit_answer_is_learned_from_and_pauses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            headers = {**openai_figures(), "retry-after-ms": "1500"}
            headers["x-ratelimit-remaining-tokens"] = "0"
            return httpx2.Response(429, headers=headers, json={"error": {}})

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.post(URL, content=chat(max_tokens=10))
        await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["p"]
    assert response.status_code == 429
    assert stats.paused_until == 1.5
    # The figures are the model's: its budget learned them, not the provider's.
    assert stats.budget is None
    assert stats.models["m"].tokens_available == 0


async def test_a_model_call_is_charged_its_estimate_and_nothing_else_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    budgets = {"p": Budget(tokens_per_minute=10_000, default_max_tokens=500)}
    async with open_dispatcher({"p": 2}, budgets=budgets) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200, json={"ok": True})

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        available: list[float | None] = []
        async with httpx2.AsyncClient(transport=transport) as client:
            for content in (
                chat(max_tokens=100),
                chat(),  # the budget's default_max_tokens
                b'{"model": "m", "input": "no messages"}',
                b"not json",
            ):
                await client.post(URL, content=content)
                await trio.testing.wait_all_tasks_blocked()
                budget = budget_of(dispatcher)
                assert budget is not None
                available.append(budget.tokens_available)
            await client.get("https://llm.test/v1/models")
        stats = dispatcher.statistics().providers["p"]
    first = 10_000 - (PROMPT_TOKENS + 100)
    second = first - (PROMPT_TOKENS + 500)
    assert available == [first, second, second, second]
    assert stats.granted_total == 4


async def test_a_malformed_figure_is_logged_once_and_the_rest_is_learned(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            headers = {**openai_figures(), "x-ratelimit-limit-tokens": "lots"}
            return httpx2.Response(200, headers=headers, json={"ok": True})

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        with caplog.at_level(logging.WARNING, logger="trio_dispatch"):
            async with httpx2.AsyncClient(transport=transport) as client:
                for _ in range(2):
                    response = await client.post(URL, content=chat(max_tokens=1))
                    assert response.json() == {"ok": True}
        await trio.testing.wait_all_tasks_blocked()
        budget = learned_of(dispatcher)
    assert [record.getMessage() for record in caplog.records] == [
        "p: ignoring the x-ratelimit-limit-tokens header, which does not parse: 'lots'"
    ]
    assert budget is not None
    assert budget.requests_per_minute == 60
    assert budget.tokens_per_minute is None


async def test_answers_without_figures_teach_nothing() -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200, headers={"x-request-id": "1"}, json={})

        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            await client.post(URL, content=chat())
        await trio.testing.wait_all_tasks_blocked()
        assert budget_of(dispatcher) is None
        assert learned_of(dispatcher) is None


# -- the estimate of a body ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"messages": [PROMPT], "max_tokens": 100}, PROMPT_TOKENS + 100),
        ({"messages": [PROMPT], "max_completion_tokens": 7}, PROMPT_TOKENS + 7),
        ({"messages": [PROMPT]}, PROMPT_TOKENS + 50),
        ({"messages": [PROMPT], "max_tokens": 100, "n": 3}, PROMPT_TOKENS + 300),
        # Not counts: the default.
        ({"messages": [PROMPT], "max_tokens": True}, PROMPT_TOKENS + 50),
        ({"messages": [PROMPT], "max_tokens": -1, "n": "2"}, PROMPT_TOKENS + 50),
        # Anthropic's system prompt and content blocks; images not counted.
        (
            {
                "system": "s" * 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "y" * 36},
                            {"type": "image", "source": {"data": "A" * 10_000}},
                            {"type": "image_url", "image_url": {"url": "B" * 9_000}},
                        ],
                    }
                ],
                "max_tokens": 10,
            },
            # "s"*8, "user", "text", "y"*36: 52 characters.
            3 + 4 + 55 // 4 + 10,
        ),
        # Tools count, and every message's framing.
        (
            {
                "messages": [PROMPT, PROMPT],
                "tools": [{"type": "function", "function": {"name": "abcd"}}],
                "max_tokens": 0,
            },
            # 2 x 44, "function" and "abcd": 100 characters.
            3 + 8 + 103 // 4,
        ),
    ],
)
def test_a_body_is_estimated_like_a_chat_request(
    body: dict[str, Any], tokens: int
) -> None:
    assert estimate_json_tokens(json_body(json.dumps(body).encode()), 50) == tokens


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"messages": "hello", "max_tokens": 10}',
        b'{"input": ["hello"], "max_tokens": 10}',
        b'{"messages": [',
        b"{" * 100_000,
        b'{"messages": [{"content": "\xff"}]}',
    ],
)
def test_a_body_that_is_no_chat_is_charged_nothing(content: bytes) -> None:
    assert estimate_json_tokens(json_body(content), 50) == 0
