"""Fleets of conversations against the fake server's quotas, over sockets.

The fake LLM server keeps real per-key quotas (``FakeQuotas``): buckets of
requests and tokens per minute that refill continuously, a concurrency cap,
429s with the true ``Retry-After`` and rate-limit headers on every answer.
Our own providers talk to it over loopback and report what its headers say
(``on_rate_limits=dispatcher.observe_rate_limits``) and its 429s
(``on_rate_limit=dispatcher.report_rate_limit``); conversations run the
turns. The server's buckets and the dispatcher both run on trio's clock, so
``autojump_clock`` runs minutes of traffic in about a second, and the 429s
counted are the server's own (``FakeServerStatistics.quota_refusals``).

The fleets speak OpenAI's format, whose resets are durations and read true
in virtual time. Anthropic's are wall-clock times, which the fake server
maps from trio's clock once, so under a clock that jumps they drift from
the client's wall clock by the virtual time gained, and the learned pace
with them.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio
import trio.testing

from trio_dispatch import (
    AdaptiveLimit,
    ConversationOptions,
    Dispatcher,
    open_dispatcher,
)
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import (
    FakeQuotas,
    FakeReply,
    FakeScript,
    open_fake_llm_server,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Conversation, TurnResult
    from trio_dispatch.testing import FakeLLMServer

PROVIDER = "openai"
KEY = "sk-fleet"
OPTIONS = ConversationOptions(
    max_tokens=64, retry_backoff=0.5, max_backoff=4.0, max_attempts=20, seed=10
)


@asynccontextmanager
async def open_fleet(
    quotas: FakeQuotas,
    reply: FakeReply,
    limit: int | AdaptiveLimit,
    *,
    learn_budgets: bool = True,
) -> AsyncIterator[tuple[FakeLLMServer, OpenAIProvider, Dispatcher]]:
    """A quota-keeping server, and a provider reporting to a dispatcher."""
    async with (
        open_fake_llm_server(FakeScript(default=reply), quotas=quotas) as server,
        open_dispatcher(
            {PROVIDER: limit}, learn_budgets=learn_budgets, default_pause=1.0
        ) as dispatcher,
    ):
        provider = OpenAIProvider(
            base_url=server.openai_base_url,
            api_key=KEY,
            model="fake",
            read_timeout=120.0,
            on_rate_limit=dispatcher.report_rate_limit,
            on_rate_limits=dispatcher.observe_rate_limits,
        )
        async with provider:
            yield server, provider, dispatcher


async def run_fleet(
    dispatcher: Dispatcher,
    provider: OpenAIProvider,
    *,
    conversations: int,
    turns: int,
    think: float,
) -> list[TurnResult]:
    """Every conversation asks ``turns`` questions, ``think`` seconds apart."""
    results: list[TurnResult] = []

    async def agent(conversation: Conversation, n: int) -> None:
        # Spread the starts over the first seconds, as a fleet comes up.
        await trio.sleep(n * 0.05)
        for turn in range(turns):
            results.append(await conversation.ask(f"agent {n} asks question {turn}"))
            await trio.sleep(think)

    async with trio.open_nursery() as nursery:
        for n in range(conversations):
            conversation = dispatcher.start_conversation(
                provider, conversation_id=f"agent-{n}", options=OPTIONS
            )
            nursery.start_soon(agent, conversation, n)
    return results


CONVERSATIONS = 40
TURNS = 5
# Demand well above the quotas: 40 agents asking about every 1.5 s would
# send about 1,600 requests a minute, and 100,000 tokens.
FLEET_QUOTAS = FakeQuotas(requests_per_minute=120, tokens_per_minute=20_000)
FLEET_REPLY = FakeReply(text="word " * 40, latency=1.0)


async def fleet_refusals(*, learn_budgets: bool) -> tuple[int, int]:
    """Run the fleet with no budget configured: the 429s and the requests."""
    async with open_fleet(
        FLEET_QUOTAS, FLEET_REPLY, 16, learn_budgets=learn_budgets
    ) as (server, provider, dispatcher):
        results = await run_fleet(
            dispatcher, provider, conversations=CONVERSATIONS, turns=TURNS, think=0.5
        )
        # Every turn completes, each with its answer.
        assert len(results) == CONVERSATIONS * TURNS
        assert {result.text for result in results} == {FLEET_REPLY.text}
        stats = server.statistics()
        assert stats.completed == CONVERSATIONS * TURNS
        provider_stats = dispatcher.statistics().providers[PROVIDER]
        # The figures are the model's (the provider asks for "fake"): they
        # teach its budget, and the provider's own has none.
        assert provider_stats.budget is None
        budget = provider_stats.models.get("fake")
        if learn_budgets:
            # The server's own figures, learned from its headers.
            assert budget is not None
            assert budget.learned
            assert (budget.requests_per_minute, budget.tokens_per_minute) == (
                120,
                20_000,
            )
        else:
            assert budget is None
    return stats.quota_refusals, stats.requests_total


async def test_a_fleet_with_no_budget_configured_stays_under_the_quotas(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refusals, requests = await fleet_refusals(learn_budgets=True)
    assert refusals <= 0.02 * requests


async def test_the_same_fleet_not_learning_budgets_meets_many_429s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The control: the quotas bind, so the figure above is the budgets' doing.
    refusals, requests = await fleet_refusals(learn_budgets=False)
    assert refusals > 0.25 * requests


async def test_an_adaptive_limit_far_too_high_converges_to_the_servers_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """AIMD converges to the cap, then probes one above it now and then.

    Converged means: from the warm-up on, the limit (sampled every quarter
    of a virtual second) stays within ``[cap - 1, cap + 1]``, and the
    server's 429s are the probes' alone, at most one for every ``cap``
    requests (a probe needs ``cap`` successes to raise the limit to
    ``cap + 1``, and its 429 lowers it again).
    """
    cap = 8
    warm_up = 30.0
    quotas = FakeQuotas(max_concurrency=cap, busy_retry_after=1.0)
    limit = AdaptiveLimit(initial=64, minimum=1, maximum=64)
    # (time, limit, the server's quota refusals, its requests) over the run.
    samples: list[tuple[float, int, int, int]] = []
    async with open_fleet(quotas, FakeReply(latency=2.0), limit) as (
        server,
        provider,
        dispatcher,
    ):

        async def sample() -> None:
            while True:
                stats = server.statistics()
                samples.append(
                    (
                        trio.current_time(),
                        dispatcher.limits()[PROVIDER],
                        stats.quota_refusals,
                        stats.requests_total,
                    )
                )
                await trio.sleep(0.25)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            results = await run_fleet(
                dispatcher, provider, conversations=CONVERSATIONS, turns=10, think=0.1
            )
            nursery.cancel_scope.cancel()
        stats = server.statistics()
        held = dispatcher.statistics().providers[PROVIDER].peak_in_flight
    assert len(results) == CONVERSATIONS * 10
    assert stats.completed == CONVERSATIONS * 10
    # The fleet came up far above the cap (slots held at once, as the
    # dispatcher counts them: what the server sees at once depends on when
    # its refusals are over), and met it.
    assert samples[0][1] == 64
    assert held > 2 * cap
    assert stats.quota_refusals > 0
    converged = [s for s in samples if s[0] >= warm_up]
    assert len(converged) >= 100  # over 25 virtual seconds of it
    assert {s[1] for s in converged} <= {cap - 1, cap, cap + 1}
    refused = converged[-1][2] - converged[0][2]
    sent = converged[-1][3] - converged[0][3]
    assert refused <= sent / cap
