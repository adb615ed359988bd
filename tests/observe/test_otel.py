"""``OpenTelemetryMetrics``: GenAI client metrics, read with the SDK's in-memory reader."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio
import trio.testing
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from trio_dispatch import Tenant, open_dispatcher, wrap_provider
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.otel import DURATION_BUCKETS, TOKEN_BUCKETS, OpenTelemetryMetrics
from trio_dispatch.providers import RateLimited
from trio_dispatch.testing import FakeReply, FakeScript, Fault, ScriptedProvider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from trio_dispatch.messages import StreamEvent


class Modelled:
    """A provider with a ``model``, as the HTTP providers have one."""

    def __init__(self, inner: ScriptedProvider, model: str) -> None:
        self.inner = inner
        self.model = model

    @property
    def id(self) -> str:
        return self.inner.id

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        return self.inner.stream(request)


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every data point of every metric read now, by metric name."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


REQUEST = ChatRequest(messages=[ChatMessage("user", "hello")])


async def test_calls_record_duration_and_tokens_with_the_conventions_buckets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(
            FakeReply(
                text="hi",
                input_tokens=12,
                output_tokens=5,
                latency=2.0,
                time_to_first_token=0.5,
                cache_read_tokens=3,
            ),
            FakeReply(fault=Fault(kind="rate_limit", retry_after=1.0), latency=0.25),
        )
    )
    reader = InMemoryMetricReader()
    provider = Modelled(ScriptedProvider(script, id="acme"), "acme-large")
    async with open_dispatcher({"acme": 1}) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))
        limited = wrap_provider(provider, dispatcher)
        async with limited.stream(REQUEST) as events:
            async for _ in events:
                pass
        try:
            async with limited.stream(REQUEST) as events:
                async for _ in events:
                    pass
        except RateLimited:
            pass
        else:
            raise AssertionError("the second reply is a rate limit")
        found = points(reader)
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "acme",
        "gen_ai.request.model": "acme-large",
    }
    durations = {
        tuple(sorted(p.attributes.items())): p
        for p in found["gen_ai.client.operation.duration"]
    }
    ok = durations[tuple(sorted(base.items()))]
    failed = durations[tuple(sorted({**base, "error.type": "RateLimited"}.items()))]
    assert (ok.count, failed.count) == (1, 1)
    assert tuple(ok.explicit_bounds) == DURATION_BUCKETS
    assert ok.sum >= 2.5
    assert failed.sum == 0.25
    tokens = {
        p.attributes["gen_ai.token.type"]: p for p in found["gen_ai.client.token.usage"]
    }
    assert {k: (p.count, p.sum) for k, p in tokens.items()} == {
        "input": (1, 15),
        "output": (1, 5),
    }
    assert tuple(tokens["input"].explicit_bounds) == tuple(map(float, TOKEN_BUCKETS))
    assert dict(tokens["input"].attributes) == {**base, "gen_ai.token.type": "input"}
    (reports,) = found["trio_dispatch.rate_limits"]
    assert (reports.value, dict(reports.attributes)) == (
        1,
        {"gen_ai.provider.name": "acme"},
    )


async def test_limiter_figures_are_observed_from_statistics(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reader = InMemoryMetricReader()
    async with open_dispatcher({"p": 1}) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))
        async with trio.open_nursery() as nursery, dispatcher.slot("p"):

            async def waiter() -> None:
                async with dispatcher.slot("p"):
                    pass

            nursery.start_soon(waiter)
            await trio.sleep(2)
            found = points(reader)
        await trio.testing.wait_all_tasks_blocked()
        after = points(reader)
    values = {
        name: [(p.value, dict(p.attributes)) for p in found[name]]
        for name in (
            "trio_dispatch.slots.in_use",
            "trio_dispatch.slots.limit",
            "trio_dispatch.requests.waiting",
            "trio_dispatch.paused",
        )
    }
    label = {"gen_ai.provider.name": "p"}
    assert values == {
        "trio_dispatch.slots.in_use": [(1, label)],
        "trio_dispatch.slots.limit": [(1, label)],
        "trio_dispatch.requests.waiting": [(1, label)],
        "trio_dispatch.paused": [(0, label)],
    }
    (wait,) = after["trio_dispatch.queue.wait"]
    assert (wait.count, wait.sum) == (2, 2.0)


async def test_a_collection_from_another_thread_reads_in_the_trio_thread() -> None:
    reader = InMemoryMetricReader()
    async with open_dispatcher({"p": 3}) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))
        async with dispatcher.slot("p"), dispatcher.slot("p"):
            found = await trio.to_thread.run_sync(points, reader)
    (in_use,) = found["trio_dispatch.slots.in_use"]
    assert in_use.value == 2


async def test_waits_and_tenant_gauges_carry_the_tenant_bounded_and_the_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reader = InMemoryMetricReader()
    async with open_dispatcher({"p": 1}, tenants={"acme": Tenant()}) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))

        async def waiter() -> None:
            async with dispatcher.slot("p", tenant="stranger"):
                pass

        async with (
            trio.open_nursery() as nursery,
            dispatcher.slot("p", tenant="acme", model="m1"),
        ):
            nursery.start_soon(waiter)
            await trio.sleep(2)
            found = points(reader)
        await trio.testing.wait_all_tasks_blocked()
        async with dispatcher.slot("p"):
            pass
        after = points(reader)

    def by_tenant(name: str, points: dict[str, list[Any]]) -> dict[str, float]:
        return {
            p.attributes["trio_dispatch.tenant"]: p.value
            for p in points[name]
            if p.attributes["gen_ai.provider.name"] == "p"
        }

    assert by_tenant("trio_dispatch.tenant.slots.in_use", found) == {
        "acme": 1,
        "other": 0,
    }
    assert by_tenant("trio_dispatch.tenant.requests.waiting", found) == {
        "acme": 0,
        "other": 1,
    }
    assert set(by_tenant("trio_dispatch.tenant.service", found)) == {"acme"}
    waits = {
        tuple(sorted(p.attributes.items())): (p.count, p.sum)
        for p in after["trio_dispatch.queue.wait"]
    }
    assert waits == {
        (
            ("gen_ai.provider.name", "p"),
            ("gen_ai.request.model", "m1"),
            ("trio_dispatch.tenant", "acme"),
        ): (1, 0.0),
        (("gen_ai.provider.name", "p"), ("trio_dispatch.tenant", "other")): (1, 2.0),
        # No tenant: no such attribute, as before tenants existed.
        (("gen_ai.provider.name", "p"),): (1, 0.0),
    }


async def test_a_calls_metrics_carry_the_tenant_of_its_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(FakeReply(text="hi", input_tokens=1, output_tokens=1),)
    )
    reader = InMemoryMetricReader()
    provider = ScriptedProvider(script, id="acme")
    async with open_dispatcher(
        {"acme": 1}, tenants={"gold": Tenant(weight=3.0)}
    ) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))
        limited = wrap_provider(provider, dispatcher)
        for tenant in ("gold", "walk-in", None):
            with dispatcher.turn(tenant=tenant):
                async with limited.stream(REQUEST) as events:
                    async for _ in events:
                        pass
        found = points(reader)
    tenants = [
        p.attributes.get("trio_dispatch.tenant")
        for p in found["gen_ai.client.operation.duration"]
    ]
    assert sorted(map(str, tenants)) == ["None", "gold", "other"]


async def test_a_pools_waits_name_the_member_granted_and_the_pool(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reader = InMemoryMetricReader()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=MeterProvider([reader]))
        async with dispatcher.slot("gpt"), dispatcher.slot("gpt"):
            found = points(reader)
        after = points(reader)
    in_use = {
        p.attributes["gen_ai.provider.name"]: p.value
        for p in found["trio_dispatch.slots.in_use"]
    }
    assert in_use == {"key-a": 1, "key-b": 1}
    waits = {
        (p.attributes["gen_ai.provider.name"], p.attributes["trio_dispatch.pool"])
        for p in after["trio_dispatch.queue.wait"]
    }
    assert waits == {("key-a", "gpt"), ("key-b", "gpt")}
