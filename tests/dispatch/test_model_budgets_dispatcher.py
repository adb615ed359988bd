"""Budgets per model through the real dispatcher, its transport and providers.

Two models sent through one ``dispatcher.transport("openai")`` (one
client, one provider) to the fake LLM server, served in the test's own
trio run (``httpx2.ASGITransport``), in virtual time: a model's budget
(``"provider/model"``) holds back that model's calls and no other's, and
what an answer of a model says of its limits teaches that model's budget.
"""

from __future__ import annotations

import json
from typing import Any, final

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import (
    Budget,
    Dispatcher,
    Quota,
    RateLimitInfo,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch._integrations._hooks import takes_model
from trio_dispatch.lowlevel import Plumbing
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import FakeLLMServer, FakeQuotas, FakeReply, FakeScript

URL = "http://fake.test/v1/chat/completions"


def body(model: str | None, **fields: Any) -> bytes:  # noqa: ANN401 (JSON values)
    """A streamed chat completions body asking ``model`` (none if ``None``)."""
    named = {} if model is None else {"model": model}
    return json.dumps(
        {
            **named,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            **fields,
        }
    ).encode()


async def call(client: httpx2.AsyncClient, model: str | None) -> int:
    """One model call, read to its end: its status."""
    async with client.stream("POST", URL, content=body(model)) as response:
        await response.aread()
        return response.status_code


def asgi(server: FakeLLMServer) -> httpx2.ASGITransport:
    """The fake server, served in this trio run: no sockets, virtual time."""
    return httpx2.ASGITransport(app=server)  # type: ignore[arg-type]  # an ASGI app; its annotations are narrower than httpx2's


def client_of(dispatcher: Dispatcher, server: FakeLLMServer) -> httpx2.AsyncClient:
    """An SDK's client: its model calls hold slots of ``"openai"``."""
    inner = asgi(server)
    return httpx2.AsyncClient(
        transport=dispatcher.transport("openai", inner=inner),
        headers={"authorization": "Bearer sk-test"},
    )


async def test_a_model_held_back_by_its_budget_holds_back_no_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(default=FakeReply(latency=1.0)))
    done: dict[str, list[float]] = {"slow": [], "fast": []}
    async with (
        open_dispatcher(
            {"openai": 4},
            # 6 requests a minute for the slow model: 6 at once, then one
            # every 10 s; the fast model has no budget of its own.
            budgets={"openai/slow": Budget(requests_per_minute=6)},
        ) as dispatcher,
        client_of(dispatcher, server) as client,
    ):

        async def ask(model: str) -> None:
            assert await call(client, model) == 200
            done[model].append(trio.current_time())

        async with trio.open_nursery() as nursery:
            # Eight slow calls first: the oldest wait for the slow budget.
            for _ in range(8):
                nursery.start_soon(ask, "slow")
                await trio.testing.wait_all_tasks_blocked()
            for _ in range(8):
                nursery.start_soon(ask, "fast")
                await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["openai"]
    # The slow model: 4 slots at t=0 (the limit), 2 more at t=1 (its
    # bucket's last 2), then one per 10 s as its budget refills.
    assert done["slow"] == pytest.approx([1.0] * 4 + [2.0] * 2 + [11.0, 21.0])
    # The fast model is never held to the slow one's pace: it takes every
    # slot the slow model's budget leaves free, from t=1 on.
    assert done["fast"] == [2.0] * 2 + [3.0] * 4 + [4.0] * 2
    assert stats.granted_total == 16
    assert set(stats.models) == {"slow"}
    assert stats.budget is None


async def test_a_model_s_figures_teach_that_model_s_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=50.0))
    async with open_dispatcher({"openai": 2}) as dispatcher:
        dispatcher.observe_rate_limits("openai", figures, model="gpt-4o")
        stats = dispatcher.statistics().providers["openai"]
        assert stats.budget is None
        assert set(stats.models) == {"gpt-4o"}
        # Figures of no model teach the provider's own budget.
        dispatcher.observe_rate_limits("openai", figures)
        stats = dispatcher.statistics().providers["openai"]
        assert stats.budget is not None
        assert set(stats.models) == {"gpt-4o"}


async def test_a_transport_call_takes_its_body_s_model(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FakeLLMServer(FakeScript())
    slots: list[tuple[str | None, int]] = []
    hold = Plumbing.hold

    async def spy(
        self: Plumbing, provider: str, tokens: int = 0, model: str | None = None
    ) -> Any:  # noqa: ANN401 (hold's own result)
        slots.append((model, tokens))
        return await hold(self, provider, tokens, model)

    monkeypatch.setattr(Plumbing, "hold", spy)
    async with (
        open_dispatcher({"openai": 2}) as dispatcher,
        client_of(dispatcher, server) as client,
    ):
        assert await call(client, "gpt-4o") == 200
        # The fake server refuses a body without a model, as OpenAI does.
        assert await call(client, None) == 400
        # Not JSON: no model, no estimate.
        response = await client.post(URL, content=b"not json")
        assert response.status_code == 400
    assert [model for model, _ in slots] == ["gpt-4o", None, None]
    assert slots[0][1] > 0
    assert slots[2][1] == 0


async def test_our_provider_s_model_goes_with_its_slot_and_its_figures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    http = httpx2.AsyncClient(transport=asgi(server))
    async with (
        http,
        OpenAIProvider(
            id="openai",
            base_url="http://fake.test/v1",
            api_key="sk-test",
            model="gpt-4o-mini",
            client=http,
        ) as provider,
        open_dispatcher(
            {"openai": 2},
            budgets={"openai/gpt-4o-mini": Budget(requests_per_minute=600)},
        ) as dispatcher,
    ):
        limited = wrap_provider(provider, dispatcher)
        request = ChatRequest(messages=[ChatMessage("user", "hi")])
        async with limited.stream(request) as stream:
            async for _ in stream:
                pass
        stats = dispatcher.statistics().providers["openai"]
        assert set(stats.models) == {"gpt-4o-mini"}
        assert stats.models["gpt-4o-mini"].requests_per_minute == 600


@pytest.mark.parametrize("observer_takes_model", [True, False])
async def test_a_provider_tells_its_model_to_an_observer_that_takes_one(
    autojump_clock: trio.testing.MockClock, observer_takes_model: bool
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(requests_per_minute=60))
    told: list[tuple[str, str | None]] = []

    def with_model(
        provider: str, info: RateLimitInfo, *, model: str | None = None
    ) -> None:
        told.append((provider, model))

    def without(provider: str, info: RateLimitInfo) -> None:
        told.append((provider, None))

    http = httpx2.AsyncClient(transport=asgi(server))
    async with (
        http,
        OpenAIProvider(
            id="openai",
            base_url="http://fake.test/v1",
            api_key="sk-test",
            model="gpt-4o",
            client=http,
            on_rate_limits=with_model if observer_takes_model else without,
        ) as provider,
    ):
        request = ChatRequest(messages=[ChatMessage("user", "hi")])
        async with provider.stream(request) as stream:
            async for _ in stream:
                pass
    assert told == [("openai", "gpt-4o" if observer_takes_model else None)]


async def test_a_provider_s_own_two_argument_callback_teaches_its_call_s_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(requests_per_minute=60))
    http = httpx2.AsyncClient(transport=asgi(server))
    async with open_dispatcher({"openai": 2}) as dispatcher:

        def observe(provider: str, info: RateLimitInfo) -> None:
            # Told no model: the call under way in this task names it.
            dispatcher.observe_rate_limits(provider, info)

        async with (
            http,
            OpenAIProvider(
                id="openai",
                base_url="http://fake.test/v1",
                api_key="sk-test",
                model="gpt-4o",
                client=http,
                on_rate_limits=observe,
            ) as provider,
        ):
            request = ChatRequest(messages=[ChatMessage("user", "hi")])
            async with wrap_provider(provider, dispatcher).stream(request) as stream:
                async for _ in stream:
                    pass
        stats = dispatcher.statistics().providers["openai"]
    assert stats.budget is None
    assert stats.models["gpt-4o"].requests_per_minute == 60
    assert stats.models["gpt-4o"].learned


def _two(provider: str, info: RateLimitInfo) -> None: ...


def _keyword(
    provider: str, info: RateLimitInfo, *, model: str | None = None
) -> None: ...


def _named(provider: str, info: RateLimitInfo, model: str | None = None) -> None: ...


def _positional(
    provider: str, info: RateLimitInfo, model: str | None = None, /
) -> None: ...


def _anything(*args: object, **kwargs: object) -> None: ...


@pytest.mark.parametrize(
    ("observer", "told"),
    [
        (_two, False),
        (_keyword, True),
        (_named, True),
        (_positional, False),
        (_anything, True),
        (min, False),  # a builtin without a signature to read
    ],
    ids=["two", "keyword", "named", "positional", "anything", "builtin"],
)
def test_an_observer_is_told_the_model_if_it_takes_a_model_keyword(
    observer: Any,  # noqa: ANN401 (any callable)
    told: bool,
) -> None:
    assert takes_model(observer) is told


# -- learned per model: two models, two quotas, one client ---------------------

#: Each model's quota at the server, requests a minute: the slow one's is an
#: eighth of the fast one's. Each starts at 5% of a minute's worth.
MODEL_QUOTAS = {"slow": 30, "fast": 240}
RUN = 120.0  # seconds of virtual time


@final
class ByModel(httpx2.AsyncBaseTransport):
    """One fake server per model behind one transport.

    As a provider keeps its quotas per model, a call goes to the server of
    its body's model.
    """

    def __init__(self, servers: dict[str, FakeLLMServer]) -> None:
        self.inner = {model: asgi(server) for model, server in servers.items()}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        model = json.loads(request.content)["model"]
        return await self.inner[model].handle_async_request(request)


async def model_fleet(*, learn_budgets: bool) -> dict[str, list[int]]:
    """Four agents per model, one client, for ``RUN`` s: each call's status."""
    servers = {
        model: FakeLLMServer(
            FakeScript(default=FakeReply(text="ok", latency=0.5)),
            quotas=FakeQuotas(requests_per_minute=quota, initial_fill=0.05),
        )
        for model, quota in MODEL_QUOTAS.items()
    }
    statuses: dict[str, list[int]] = {model: [] for model in MODEL_QUOTAS}
    async with (
        open_dispatcher({"openai": 8}, learn_budgets=learn_budgets) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("openai", inner=ByModel(servers)),
            headers={"authorization": "Bearer sk-test"},
        ) as client,
    ):
        end = trio.current_time() + RUN

        async def agent(model: str) -> None:
            while trio.current_time() < end:
                statuses[model].append(await call(client, model))

        async with trio.open_nursery() as nursery:
            for model in MODEL_QUOTAS:
                for _ in range(4):
                    nursery.start_soon(agent, model)
        if learn_budgets:
            models = dispatcher.statistics().providers["openai"].models
            assert {
                model: stats.requests_per_minute for model, stats in models.items()
            } == ({model: float(quota) for model, quota in MODEL_QUOTAS.items()})
    return statuses


async def test_each_model_learns_its_own_quota_and_the_fast_one_keeps_its_pace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statuses = await model_fleet(learn_budgets=True)
    calls = sum(len(answers) for answers in statuses.values())
    refused = sum(answers.count(429) for answers in statuses.values())
    assert refused <= 0.02 * calls
    # Each model at its own quota's pace: what the bucket held, then its rate.
    for model, quota in MODEL_QUOTAS.items():
        served = statuses[model].count(200)
        ideal = quota * (0.05 + RUN / 60)
        assert 0.9 * ideal <= served <= ideal + 4, (model, served, ideal)
    # The control: the same fleet paced by nothing but its pauses. The slow
    # model's 429s pause the provider for both models, and the fast one
    # loses half its pace.
    blind = await model_fleet(learn_budgets=False)
    assert blind["slow"].count(429) > 0.5 * len(blind["slow"])
    assert blind["fast"].count(200) < 0.6 * statuses["fast"].count(200)


async def test_models_seen_once_are_forgotten_and_a_configured_one_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=100, remaining=99))
    budgets = {"openai/kept": Budget(requests_per_minute=10)}
    async with open_dispatcher({"openai": 4}, budgets=budgets) as dispatcher:
        for k in range(300):
            async with dispatcher.slot("openai", model=f"ft-{k}"):
                dispatcher.observe_rate_limits("openai", figures, model=f"ft-{k}")
        dispatcher.observe_rate_limits("openai", figures, model="kept")
        stats = dispatcher.statistics().providers["openai"]
        assert len(stats.models) == 301
        await trio.sleep(61.0)
        async with dispatcher.slot("openai", model="now"):
            dispatcher.observe_rate_limits("openai", figures, model="now")
        assert set(dispatcher.statistics().providers["openai"].models) == {
            "kept",
            "now",
        }
