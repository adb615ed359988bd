"""One process of a fleet of conversations against the fake server's quotas.

Run as ``python -m tests._budget_worker '<json settings>'``. It opens a
dispatcher (shared through Redis when ``redis_url`` is set, else its own),
prints ``{"ready": true, "limit": ...}``, and waits for a line on stdin, so
that the whole fleet starts together. Then it runs ``count``
conversations of ``questions`` turns each, and, when they are done, prints
the turns completed, the provider's limit as ``statistics()`` showed it
after each turn (with the phase: how many more lines stdin had brought by
then), the final limit and the budgets.

Settings: ``name``, ``base_url``, ``api_key``, ``redis_url`` (or ``null``),
``namespace``, ``lease``, ``limit`` (an int, or the keyword arguments of an
``AdaptiveLimit``), ``count``, ``questions``, ``think`` (seconds between a
conversation's turns), ``retry_backoff`` and ``max_backoff`` (how a
conversation retries what the server refuses).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import trio

from trio_dispatch import (
    AdaptiveLimit,
    ConversationOptions,
    Dispatcher,
    open_dispatcher,
)
from trio_dispatch.providers import OpenAIProvider

from ._fleet_worker import backend, say

PROVIDER = "openai"


def limit_of(dispatcher: Dispatcher) -> int | None:
    return dispatcher.statistics().providers[PROVIDER].limit


async def run(settings: dict[str, Any]) -> None:
    limit = settings["limit"]
    if isinstance(limit, dict):
        limit = AdaptiveLimit(**limit)
    options = ConversationOptions(
        max_attempts=100,
        retry_backoff=settings["retry_backoff"],
        max_backoff=settings["max_backoff"],
        max_tokens=16,
    )
    async with (
        trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin,
        open_dispatcher(
            {PROVIDER: limit},
            **backend(settings),
            default_pause=0.1,
            max_pause=2.0,
        ) as dispatcher,
    ):
        provider = OpenAIProvider(
            base_url=settings["base_url"],
            api_key=settings["api_key"],
            model="fake",
            read_timeout=30.0,
            on_rate_limit=dispatcher.report_rate_limit,
            on_rate_limits=dispatcher.observe_rate_limits,
        )
        async with provider:
            say(ready=True, limit=limit_of(dispatcher))
            phase = -1

            async def read_lines() -> None:
                nonlocal phase
                while chunk := await stdin.receive_some():
                    phase += chunk.count(b"\n")
                    if phase >= 0:
                        started.set()

            turns = 0
            limits: list[tuple[int, int | None]] = []

            async def agent(n: int) -> None:
                nonlocal turns
                conversation = dispatcher.start_conversation(
                    provider,
                    conversation_id=f"{settings['name']}-{n}",
                    options=options,
                )
                for q in range(settings["questions"]):
                    await conversation.ask(f"{settings['name']} agent {n} asks {q}")
                    turns += 1
                    limits.append((phase, limit_of(dispatcher)))
                    await trio.sleep(settings["think"])

            started = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_lines)
                await started.wait()
                async with trio.open_nursery() as agents:
                    for n in range(settings["count"]):
                        agents.start_soon(agent, n)
                nursery.cancel_scope.cancel()
            stats = dispatcher.statistics().providers[PROVIDER]
            # The budget in force: the model's, where its answers taught one
            # (their figures are the model's), else the provider's own (a
            # configured one, the fleet's).
            budget = stats.models.get("fake", stats.budget)
            say(
                turns=turns,
                limits=limits,
                limit=limit_of(dispatcher),
                budget=None
                if budget is None
                else {
                    "requests_per_minute": budget.requests_per_minute,
                    "tokens_per_minute": budget.tokens_per_minute,
                    "learned": budget.learned,
                },
            )


def main() -> None:
    trio.run(run, json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
