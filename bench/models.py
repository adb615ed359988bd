"""A slow and a fast model through one client, each with its own quota.

Usage::

    python bench/models.py [--quick] [--seconds S] [--arm NAME] [--json PATH]

OpenAI keeps rate limits per model, and the ``x-ratelimit-*`` headers of an
answer report the bucket of the model it answered. The fake LLM server
keeps them so too (``FakeQuotas.models``): here a slow model with a small
request quota and a fast model with a quota twenty times larger, both on
one API key, both far below what their agents would send. Closed-loop
agents of each model call it again as soon as an answer ends, retrying a
429 at once, over loopback HTTP, through one ``httpx2.AsyncClient`` and one
dispatcher provider, with no budget configured: every budget is learned
from the answers' headers. The server and the dispatcher both run on
trio's clock (``MockClock``, jumping whenever every task waits), so
minutes of traffic take seconds; the 429s are the server's own count.

Arms:

* ``shared``: one budget for both models, as the dispatcher learned before
  it knew of models: our ``OpenAIProvider`` (one per model, one HTTP
  client) inside ``dispatcher.slot("openai")``, its headers' figures told
  to ``dispatcher.observe_rate_limits("openai", info)``, no model named;
* ``per-model``: the same calls, the slot and the figures naming their
  model (``slot(..., model=m)``, ``observe_rate_limits(..., model=m)``):
  a budget per model, learned;
* ``transport``: the default path: the ``openai`` SDK on
  ``dispatcher.transport("openai")``, nothing wired (the transport reads
  each request body's ``model``);
* ``configured``: the same, with each model's quota configured as its own
  budget (``budgets={"openai/slow-model": Budget(requests_per_minute=30),
  ...}``), the figures learned besides.

Every arm reports its 429 share (of all requests, and per model) and each
model's goodput: answers per minute after a warm-up, beside its quota's
refill rate. Uses only the public API.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing

import trio_dispatch
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import OpenAIProvider, RateLimited
from trio_dispatch.testing import (
    FakeQuotas,
    FakeReply,
    FakeScript,
    open_fake_llm_server,
)

from _common import (
    command_line,
    count_option,
    environment,
    finish,
    plain,
    show_progress,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from trio_dispatch.testing import FakeLLMServer, FakeRequest

PROVIDER = "openai"
KEY = "sk-bench-models"
SLOW, FAST = "slow-model", "fast-model"


@attrs.frozen
class ModelLoad:
    """One model's quota at the server, its answers' latency, its agents."""

    per_minute: int
    latency: float
    agents: int


MODELS = {
    SLOW: ModelLoad(per_minute=30, latency=1.0, agents=4),
    FAST: ModelLoad(per_minute=600, latency=0.2, agents=12),
}
LIMIT = 16  # slots: enough for every agent, so the quotas alone bind
FILL = 0.1  # each bucket starts a tenth full: the refill rate binds early
WARM_UP = 10.0

ARMS = {
    "shared": "one budget for both models (figures told without a model)",
    "per-model": "a budget per model (slot and figures name the model)",
    "transport": "openai SDK on dispatcher.transport, nothing wired",
    "configured": "openai SDK on dispatcher.transport, a Budget per model",
}


def quotas() -> FakeQuotas:
    """The server's quotas: each model's requests per minute, on every key."""
    return FakeQuotas(
        models={
            model: FakeQuotas(requests_per_minute=load.per_minute, initial_fill=FILL)
            for model, load in MODELS.items()
        }
    )


def _reply(request: FakeRequest) -> FakeReply:
    load = MODELS.get(request.model or "")
    return FakeReply(text="ok", latency=0.0 if load is None else load.latency)


@attrs.frozen
class ModelFigures:
    """One model's figures in one arm.

    Attributes:
        model: The model.
        requests: Requests the server received for it.
        answered_429: Of those, answered 429 for its quota.
        per_minute: Answers completed per minute after the warm-up.
        quota_per_minute: Its quota's refill rate, requests per minute.
        goodput: ``per_minute / quota_per_minute``.
    """

    model: str
    requests: int
    answered_429: int
    per_minute: float
    quota_per_minute: int
    goodput: float


@attrs.frozen
class ArmResult:
    """One arm's figures."""

    arm: str
    label: str
    requests: int
    answered_429: int
    share_429: float
    models: tuple[ModelFigures, ...]

    def of(self, model: str) -> ModelFigures:
        """The figures of ``model``."""
        return next(m for m in self.models if m.model == model)


async def _slot_calls(
    stack: AsyncExitStack,
    dispatcher: trio_dispatch.Dispatcher,
    server: FakeLLMServer,
    *,
    per_model: bool,
) -> Callable[[str], Awaitable[bool]]:
    """Calls by our provider in a slot; figures told with their model or not."""
    import httpx2  # noqa: PLC0415 (the HTTP client every provider shares)

    http = await stack.enter_async_context(httpx2.AsyncClient(timeout=600.0))
    providers = {
        model: OpenAIProvider(
            PROVIDER,
            base_url=server.openai_base_url,
            api_key=KEY,
            model=model,
            client=http,
            read_timeout=600.0,
        )
        for model in MODELS
    }
    request = ChatRequest([ChatMessage("user", "hi")])

    def answered(
        slot: trio_dispatch.Slot, info: trio_dispatch.RateLimitInfo | None
    ) -> None:
        """An integration of one's own: the answer started, then its figures."""
        if info is None:
            return
        slot.answered()
        if per_model:
            dispatcher.observe_rate_limits(PROVIDER, info, model=slot.model)
        else:
            dispatcher.observe_rate_limits(PROVIDER, info)

    async def call(model: str) -> bool:
        named: dict[str, Any] = {"model": model} if per_model else {}
        async with dispatcher.slot(PROVIDER, **named) as slot:
            try:
                async with providers[model].stream(request) as events:
                    answered(slot, events.rate_limits)
                    async for _ in events:
                        pass
            except RateLimited as error:
                answered(slot, error.rate_limits)
                dispatcher.report_rate_limit(PROVIDER, error.retry_after)
                return False
        return True

    return call


async def _transport_calls(
    stack: AsyncExitStack, dispatcher: trio_dispatch.Dispatcher, server: FakeLLMServer
) -> Callable[[str], Awaitable[bool]]:
    """Calls by the ``openai`` SDK on the dispatcher's transport."""
    import httpx2  # noqa: PLC0415 (only for this arm)
    import openai  # noqa: PLC0415

    http = await stack.enter_async_context(
        httpx2.AsyncClient(transport=dispatcher.transport(PROVIDER), timeout=600.0)
    )
    client = openai.AsyncOpenAI(
        api_key=KEY, base_url=server.openai_base_url, http_client=http, max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": "hi"}]

    async def call(model: str) -> bool:
        try:
            stream = await client.chat.completions.create(
                model=model, messages=messages, stream=True
            )
        except openai.RateLimitError:
            return False
        async with stream:
            async for _ in stream:
                pass
        return True

    return call


async def _run_arm(arm: str, seconds: float) -> ArmResult:
    answered: dict[str, list[float]] = {model: [] for model in MODELS}
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            open_fake_llm_server(FakeScript(choose=_reply), quotas=quotas())
        )
        budgets = {
            f"{PROVIDER}/{model}": trio_dispatch.Budget(
                requests_per_minute=load.per_minute
            )
            for model, load in MODELS.items()
        }
        dispatcher = await stack.enter_async_context(
            trio_dispatch.open_dispatcher(
                {PROVIDER: LIMIT}, budgets=budgets if arm == "configured" else None
            )
        )
        if arm in ("transport", "configured"):
            call = await _transport_calls(stack, dispatcher, server)
        else:
            call = await _slot_calls(
                stack, dispatcher, server, per_model=arm == "per-model"
            )
        start = trio.current_time()

        async def agent(model: str) -> None:
            while True:
                if await call(model):
                    answered[model].append(trio.current_time() - start)

        with trio.move_on_at(start + seconds):
            async with trio.open_nursery() as nursery:
                for model, load in MODELS.items():
                    for _ in range(load.agents):
                        nursery.start_soon(agent, model)
        stats = server.statistics()
    window = seconds - WARM_UP
    figures = []
    for model, load in MODELS.items():
        done = sum(1 for at in answered[model] if at >= WARM_UP)
        per_minute = 60.0 * done / window
        figures.append(
            ModelFigures(
                model=model,
                requests=stats.requests_by_model.get(model, 0),
                answered_429=stats.quota_refusals_by_model.get(model, 0),
                per_minute=per_minute,
                quota_per_minute=load.per_minute,
                goodput=per_minute / load.per_minute,
            )
        )
    requests = stats.requests_total
    return ArmResult(
        arm=arm,
        label=ARMS[arm],
        requests=requests,
        answered_429=stats.quota_refusals,
        share_429=stats.quota_refusals / requests if requests else 0.0,
        models=tuple(figures),
    )


def run_arm(arm: str, *, seconds: float) -> ArmResult:
    """Run one arm for ``seconds`` of virtual time and return its figures."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    clock = trio.testing.MockClock(autojump_threshold=0)
    with warnings.catch_warnings():
        # The openai SDK leaves the async generators under a stream unclosed
        # when it stops at [DONE]; trio warns when they are collected.
        warnings.filterwarnings(
            "ignore",
            message=r"Async generator '(openai|httpx2|httpcore2)\.",
            category=ResourceWarning,
        )
        return trio.run(_run_arm, arm, seconds, clock=clock)


@attrs.frozen
class ModelsReport:
    """Every arm's figures for one fleet."""

    seconds: float
    warm_up: float
    limit: int
    models: dict[str, dict[str, Any]]
    arms: tuple[ArmResult, ...]
    environment: dict[str, str]

    def to_json(self) -> str:
        return json.dumps(plain(self), indent=2)

    def to_markdown(self) -> str:
        slow, fast = self.models[SLOW], self.models[FAST]
        lines = [
            f"Two models through one client, {self.seconds:g} virtual seconds"
            f" (figures after a {self.warm_up:g} s warm-up), {self.limit} slots:"
            f" {slow['agents']} agents of a slow model ({slow['per_minute']}"
            f" requests/min, answers in {slow['latency']:g} s),"
            f" {fast['agents']} of a fast one ({fast['per_minute']}/min,"
            f" {fast['latency']:g} s); budgets learned from the headers",
            "",
            "| arm | 429 share | slow 429s | fast 429s | slow answers/min"
            " (of quota) | fast answers/min (of quota) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for arm in self.arms:
            s, f = arm.of(SLOW), arm.of(FAST)
            lines.append(
                f"| {arm.label} | {arm.share_429:.2%}"
                f" ({arm.answered_429}/{arm.requests})"
                f" | {s.answered_429}/{s.requests} | {f.answered_429}/{f.requests}"
                f" | {s.per_minute:.1f} ({s.goodput:.0%})"
                f" | {f.per_minute:.1f} ({f.goodput:.0%}) |"
            )
        return "\n".join(lines) + "\n"


def run_models(*, seconds: float, arms: Sequence[str] = tuple(ARMS)) -> ModelsReport:
    """Run every arm (or those given) on the same fleet."""
    results = []
    for arm in arms:
        show_progress(ARMS[arm])
        results.append(run_arm(arm, seconds=seconds))
    return ModelsReport(
        seconds=seconds,
        warm_up=WARM_UP,
        limit=LIMIT,
        models={model: plain(load) for model, load in MODELS.items()},
        arms=tuple(results),
        environment=environment(httpx2=True),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print markdown, and write JSON with ``--json``."""
    parser = command_line(__doc__, quick="60 virtual seconds")
    parser.add_argument("--seconds", type=count_option(), default=300)
    parser.add_argument(
        "--arm", action="append", choices=list(ARMS), help="run only this arm"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = run_models(
        seconds=60 if args.quick else args.seconds,
        arms=tuple(args.arm) if args.arm else tuple(ARMS),
    )
    finish(
        report,
        json_path=args.json,
        started=started,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
