"""``PrometheusCollector``: the exposition, parsed back, against ``statistics()``."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trio_dispatch import (
    BudgetStatistics,
    DispatcherStatistics,
    ProviderStatistics,
    QueueFull,
    Tenant,
    TenantStatistics,
    lowlevel,
    open_dispatcher,
)
from trio_dispatch._observe import _prometheus as prometheus
from trio_dispatch._observe._hub import EventHub
from trio_dispatch.events import Granted, Refused, Released, Withdrawn
from trio_dispatch.metrics import DEFAULT_WAIT_BUCKETS, PrometheusCollector

from .._helpers import settle

if TYPE_CHECKING:
    from collections.abc import Mapping

    from trio_dispatch import Dispatcher
    from trio_dispatch._observe._hub import EventSink


def scrape(
    registry: CollectorRegistry,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed by prometheus_client's own parser."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def expected(
    stats: DispatcherStatistics,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The gauges and counters that ``statistics()`` says, by sample."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name, p in stats.providers.items():
        label = (("provider", name),)
        out[("trio_dispatch_slots_in_use", label)] = p.in_flight
        if p.limit is not None:
            out[("trio_dispatch_slots_limit", label)] = p.limit
        out[("trio_dispatch_waiting", label)] = p.waiting
        out[("trio_dispatch_paused", label)] = 1 if p.paused else 0
        out[("trio_dispatch_backend_up", label)] = 1 if p.backend_up else 0
        out[("trio_dispatch_grants_total", label)] = p.granted_total
        out[("trio_dispatch_releases_total", label)] = p.released_total
        out[("trio_dispatch_withdrawn_total", label)] = p.withdrawn_total
        out[("trio_dispatch_rejected_total", label)] = p.rejected_total
    return out


async def test_the_exposition_matches_statistics_under_load(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(7)
    waits: dict[str, list[float]] = {"a": [], "b": []}

    async def agent(dispatcher: Dispatcher, provider: str) -> None:
        await trio.sleep(rng.uniform(0, 5))
        asked = trio.current_time()
        try:
            async with dispatcher.slot(provider) as slot:
                assert slot.granted_at is not None
                waits[provider].append(slot.granted_at - asked)
                await trio.sleep(rng.uniform(0.1, 2))
        except QueueFull:
            pass

    async with open_dispatcher({"a": 3, "b": 2}, max_waiting=40) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        snapshots = []
        async with trio.open_nursery() as nursery:
            for index in range(150):
                nursery.start_soon(agent, dispatcher, "ab"[index % 2])
            for _ in range(6):
                await trio.sleep(1)
                dispatcher.report_rate_limit("b", 0.5)
                # Mid-run, with slots held and requests waiting: the scrape
                # and the snapshot are taken with no checkpoint between.
                samples = scrape(registry)
                stats = dispatcher.statistics()
                snapshots.append(stats)
                for key, value in expected(stats).items():
                    assert samples[key] == value, key
        await settle()
        samples = scrape(registry)
        stats = dispatcher.statistics()
    assert any(s.providers["a"].waiting > 3 for s in snapshots)
    assert any(s.providers["b"].rejected_total for s in snapshots)
    for key, value in expected(stats).items():
        assert samples[key] == value, key
    for provider, seen in waits.items():
        label = ("provider", provider)
        assert samples[("trio_dispatch_queue_wait_seconds_count", (label,))] == len(
            seen
        )
        assert samples[("trio_dispatch_queue_wait_seconds_count", (label,))] == (
            stats.providers[provider].granted_total
        )
        assert samples[("trio_dispatch_queue_wait_seconds_sum", (label,))] == (
            pytest.approx(sum(seen))
        )
        for bound in (*DEFAULT_WAIT_BUCKETS, math.inf):
            le = "+Inf" if bound == math.inf else str(bound)
            bucket = ("trio_dispatch_queue_wait_seconds_bucket", (("le", le), label))
            assert samples[bucket] == sum(1 for w in seen if w <= bound), bucket
    assert samples[("trio_dispatch_rate_limited_total", (("provider", "b"),))] == 6
    assert samples[("trio_dispatch_rate_limited_total", (("provider", "a"),))] == 0


async def test_a_scrape_from_another_thread_reads_in_the_trio_thread() -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        async with dispatcher.slot("p"):
            text = await trio.to_thread.run_sync(generate_latest, registry)
    assert 'trio_dispatch_slots_in_use{provider="p"} 1.0' in text.decode()
    assert 'trio_dispatch_slots_limit{provider="p"} 2.0' in text.decode()


def test_a_scrape_after_the_run_reports_nothing() -> None:
    registry = CollectorRegistry()

    async def main() -> None:
        async with open_dispatcher({"p": 2}) as dispatcher:
            registry.register(PrometheusCollector(dispatcher))

    trio.run(main)
    assert generate_latest(registry) == b""


async def test_unlimited_providers_have_no_limit_sample_and_no_conversation_label() -> (
    None
):
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        async with dispatcher.slot("free", conversation_id="secret-conversation"):
            text = generate_latest(registry).decode()
    assert 'trio_dispatch_slots_in_use{provider="free"} 1.0' in text
    assert "trio_dispatch_slots_limit{" not in text
    assert "secret-conversation" not in text
    assert "conversation" not in text


@pytest.mark.parametrize(
    ("buckets", "error"),
    [
        ((), ValueError),
        ((1.0, 1.0), ValueError),
        ((2.0, 1.0), ValueError),
        ((0.0, 1.0), ValueError),
        ((1.0, math.inf), ValueError),
        ((1.0, math.nan), ValueError),
        (("1",), TypeError),
        ((True,), TypeError),
        ("1", TypeError),
        (1.0, TypeError),
    ],
)
async def test_bad_wait_buckets_are_refused(
    buckets: object, error: type[Exception]
) -> None:
    async with open_dispatcher() as dispatcher:
        with pytest.raises(
            error,
            match=r"^wait_buckets must be increasing positive finite numbers, got ",
        ):
            PrometheusCollector(dispatcher, wait_buckets=buckets)  # type: ignore[arg-type]  # the error is the point


class HandBuilt:
    """What a collector reads of a dispatcher, built by hand.

    Events pushed through a hub, configured tenants and statistics set by
    the test.
    """

    def __init__(self, configured: dict[str, Tenant]) -> None:
        self.hub = EventHub()
        self.configured = configured
        self.stats = DispatcherStatistics({}, closed=False)

    def observe_events(self, sink: EventSink) -> None:
        self.hub.attach(sink)

    def tenants(self) -> dict[str, Tenant]:
        return dict(self.configured)

    def statistics(self) -> DispatcherStatistics:
        return self.stats


@pytest.fixture(autouse=True)
def _hand_built_plumbing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hand-built dispatcher is its own plumbing, for the collector."""
    real = lowlevel.plumbing

    def plumbing(dispatcher: Dispatcher | HandBuilt) -> object:
        return dispatcher if isinstance(dispatcher, HandBuilt) else real(dispatcher)

    monkeypatch.setattr(prometheus, "plumbing", plumbing)


def provider_stats(
    provider: str,
    in_flight: int,
    waiting: int,
    *,
    tenants: Mapping[str, TenantStatistics] | None = None,
    budget: BudgetStatistics | None = None,
    models: Mapping[str, BudgetStatistics] | None = None,
) -> ProviderStatistics:
    return ProviderStatistics(
        provider,
        4,
        in_flight,
        waiting,
        False,
        None,
        0,
        0,
        0,
        0,
        0,
        0,
        budget=budget,
        models=models or {},
        tenants=tenants or {},
    )


def tenant_samples(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[tuple[str, str], float]:
    """The samples of one tenant family, by (provider, tenant)."""
    return {
        (dict(labels)["provider"], dict(labels)["tenant"]): value
        for (sample, labels), value in samples.items()
        if sample == name
    }


def granted(tenant: str | None, wait: float, provider: str = "p") -> Granted:
    return Granted(provider, 0.0, None, 0.0, wait, 1, 0, tenant=tenant)


async def test_only_configured_tenants_get_a_label_the_rest_are_other() -> None:
    dispatcher = HandBuilt({"acme": Tenant(weight=2.0, limit=3), "beta": Tenant()})
    registry = CollectorRegistry()
    collector = PrometheusCollector(dispatcher, wait_buckets=(1.0, 10.0))  # type: ignore[arg-type]  # what the collector reads, by hand
    registry.register(collector)
    hub = dispatcher.hub
    hub.emit(granted("acme", 0.5))
    hub.emit(granted("acme", 2.0))
    hub.emit(granted(None, 20.0))
    # A thousand tenants nobody configured: one series between them.
    for index in range(1000):
        hub.emit(granted(f"user-{index}", 0.0))
        hub.emit(Released("p", 1.0, None, 0.0, 1.0, 0, 0, tenant=f"user-{index}"))
    hub.emit(Withdrawn("p", 1.0, None, 0.0, 1.0, 0, 0, tenant="beta"))
    hub.emit(Refused("p", 1.0, None, 0.0, "full", 0, 0, tenant="gamma"))
    dispatcher.stats = DispatcherStatistics(
        {
            "p": provider_stats(
                "p",
                in_flight=4,
                waiting=7,
                tenants={
                    "acme": TenantStatistics("acme", 2.0, 3, 3, 1, 12.5),
                    "beta": TenantStatistics("beta", 1.0, None, 0, 2, 4.0),
                    "user-1": TenantStatistics("user-1", 1.0, None, 1, 1, 9.0),
                },
            )
        },
        closed=False,
    )
    samples = scrape(registry)
    tenants = {
        labels
        for (_, labels_), _value in samples.items()
        for labels in [dict(labels_).get("tenant")]
        if labels is not None
    }
    assert tenants == {"acme", "beta", "other"}
    assert tenant_samples(samples, "trio_dispatch_tenant_grants_total") == {
        ("p", "acme"): 2,
        ("p", "beta"): 0,
        ("p", "other"): 1001,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_releases_total") == {
        ("p", "acme"): 0,
        ("p", "beta"): 0,
        ("p", "other"): 1000,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_withdrawn_total")[
        ("p", "beta")
    ] == (1)
    assert tenant_samples(samples, "trio_dispatch_tenant_rejected_total") == {
        ("p", "acme"): 0,
        ("p", "beta"): 0,
        ("p", "other"): 1,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_queue_wait_seconds_count") == {
        ("p", "acme"): 2,
        ("p", "beta"): 0,
        ("p", "other"): 1001,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_queue_wait_seconds_sum") == {
        ("p", "acme"): 2.5,
        ("p", "beta"): 0,
        ("p", "other"): 20.0,
    }
    buckets = {
        (dict(labels)["tenant"], dict(labels)["le"]): value
        for (name, labels), value in samples.items()
        if name == "trio_dispatch_tenant_queue_wait_seconds_bucket"
    }
    assert buckets[("acme", "1.0")] == 1
    assert buckets[("acme", "10.0")] == 2
    assert buckets[("other", "10.0")] == 1000
    assert buckets[("other", "+Inf")] == 1001
    # Gauges from statistics: the configured tenants' own; "other" is what
    # the provider holds and queues beyond them.
    assert tenant_samples(samples, "trio_dispatch_tenant_slots_in_use") == {
        ("p", "acme"): 3,
        ("p", "beta"): 0,
        ("p", "other"): 1,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_waiting") == {
        ("p", "acme"): 1,
        ("p", "beta"): 2,
        ("p", "other"): 4,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_service") == {
        ("p", "acme"): 12.5,
        ("p", "beta"): 4.0,
    }
    assert samples[("trio_dispatch_tenant_weight", (("tenant", "acme"),))] == 2.0
    assert samples[("trio_dispatch_tenant_weight", (("tenant", "beta"),))] == 1.0
    assert samples[("trio_dispatch_tenant_limit", (("tenant", "acme"),))] == 3
    assert ("trio_dispatch_tenant_limit", (("tenant", "beta"),)) not in samples
    # The provider's own series are as they were: no tenant label.
    assert samples[
        ("trio_dispatch_queue_wait_seconds_count", (("provider", "p"),))
    ] == (1003)
    assert samples[("trio_dispatch_slots_in_use", (("provider", "p"),))] == 4


async def test_the_counts_kept_stay_bounded_without_a_scrape() -> None:
    dispatcher = HandBuilt({"acme": Tenant()})
    collector = PrometheusCollector(dispatcher)  # type: ignore[arg-type]  # what the collector reads, by hand
    accumulator = collector._accumulator
    for index in range(5000):
        dispatcher.hub.emit(granted(f"user-{index}", 0.0, provider="pq"[index % 2]))
    dispatcher.hub.emit(granted("acme", 0.0))
    assert accumulator.kept <= 1 + 1024
    kept = sum(len(counts) for counts in accumulator.tenants.values())
    assert kept <= 2 + 1 + 1024
    dispatcher.stats = DispatcherStatistics(
        {name: provider_stats(name, 0, 0) for name in "pq"}, closed=False
    )
    registry = CollectorRegistry()
    registry.register(collector)
    samples = tenant_samples(scrape(registry), "trio_dispatch_tenant_grants_total")
    assert samples == {
        ("p", "acme"): 1,
        ("p", "other"): 2500,
        ("q", "acme"): 0,
        ("q", "other"): 2500,
    }
    assert accumulator.kept == 1


async def test_a_tenant_configured_or_removed_moves_between_labels_counters_only_grow() -> (
    None
):
    dispatcher = HandBuilt({"acme": Tenant()})
    dispatcher.stats = DispatcherStatistics(
        {"p": provider_stats("p", 0, 0)}, closed=False
    )
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(dispatcher))  # type: ignore[arg-type]  # what the collector reads, by hand

    def grants() -> dict[tuple[str, str], float]:
        return tenant_samples(scrape(registry), "trio_dispatch_tenant_grants_total")

    dispatcher.hub.emit(granted("acme", 0.0))
    dispatcher.hub.emit(granted("beta", 0.0))
    assert grants() == {("p", "acme"): 1, ("p", "other"): 1}
    # Configured now: its earlier grant stays in "other", its next are its own.
    dispatcher.configured["beta"] = Tenant(weight=3.0)
    dispatcher.hub.emit(granted("beta", 0.0))
    assert grants() == {("p", "acme"): 1, ("p", "beta"): 1, ("p", "other"): 1}
    # Removed: its series goes, its grants join "other", which never goes down.
    del dispatcher.configured["acme"]
    assert grants() == {("p", "beta"): 1, ("p", "other"): 2}


async def test_a_tenant_named_other_shares_the_series_of_the_rest() -> None:
    dispatcher = HandBuilt({"other": Tenant(weight=2.0)})
    dispatcher.stats = DispatcherStatistics(
        {
            "p": provider_stats(
                "p",
                3,
                0,
                tenants={"other": TenantStatistics("other", 2.0, None, 2, 0, 1.0)},
            )
        },
        closed=False,
    )
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(dispatcher))  # type: ignore[arg-type]  # what the collector reads, by hand
    dispatcher.hub.emit(granted("other", 0.0))
    dispatcher.hub.emit(granted(None, 0.0))
    samples = scrape(registry)
    assert tenant_samples(samples, "trio_dispatch_tenant_grants_total") == {
        ("p", "other"): 2
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_slots_in_use") == {
        ("p", "other"): 3
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_service") == {}


async def test_budgets_of_the_provider_and_of_each_model_are_gauges() -> None:
    dispatcher = HandBuilt({})
    dispatcher.stats = DispatcherStatistics(
        {
            "openai": provider_stats(
                "openai",
                0,
                0,
                budget=BudgetStatistics(600.0, None, 42.0, None, True, False),
                models={
                    "gpt-4o": BudgetStatistics(500.0, 30000.0, 3.5, 100.0, False, True),
                    "gpt-4o-mini": BudgetStatistics(None, 2e6, None, 1e6, True, False),
                },
            ),
            "local": provider_stats("local", 0, 0),
        },
        closed=False,
    )
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(dispatcher))  # type: ignore[arg-type]  # what the collector reads, by hand
    samples = scrape(registry)

    def budget(figure: str) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["provider"], dict(labels)["model"]): value
            for (name, labels), value in samples.items()
            if name == f"trio_dispatch_budget_{figure}"
        }

    assert budget("requests_per_minute") == {
        ("openai", ""): 600.0,
        ("openai", "gpt-4o"): 500.0,
    }
    assert budget("tokens_per_minute") == {
        ("openai", "gpt-4o"): 30000.0,
        ("openai", "gpt-4o-mini"): 2e6,
    }
    assert budget("requests_available") == {
        ("openai", ""): 42.0,
        ("openai", "gpt-4o"): 3.5,
    }
    assert budget("tokens_available") == {
        ("openai", "gpt-4o"): 100.0,
        ("openai", "gpt-4o-mini"): 1e6,
    }
    assert budget("held") == {
        ("openai", ""): 0,
        ("openai", "gpt-4o"): 1,
        ("openai", "gpt-4o-mini"): 0,
    }


async def test_a_thousand_unconfigured_tenants_make_one_other_series(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def ask(tenant: str | None) -> None:
        async with dispatcher.slot("p", tenant=tenant):
            await trio.sleep(1)

    async with open_dispatcher(
        {"p": 2}, tenants={"acme": Tenant(weight=2.0, limit=1)}
    ) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        async with trio.open_nursery() as nursery:
            for index in range(1000):
                nursery.start_soon(ask, f"user-{index}")
            for _ in range(3):
                nursery.start_soon(ask, "acme")
            nursery.start_soon(ask, None)
            await trio.sleep(10.5)
            mid = scrape(registry)
            stats = dispatcher.statistics().providers["p"]
        samples = scrape(registry)
    tenants = {
        dict(labels).get("tenant")
        for (_, labels) in samples
        if "tenant" in dict(labels)
    }
    assert tenants == {"acme", "other"}
    assert tenant_samples(samples, "trio_dispatch_tenant_grants_total") == {
        ("p", "acme"): 3,
        ("p", "other"): 1001,
    }
    assert tenant_samples(samples, "trio_dispatch_tenant_releases_total") == {
        ("p", "acme"): 3,
        ("p", "other"): 1001,
    }
    # Mid-run, the gauges add up to the provider's.
    in_use = tenant_samples(mid, "trio_dispatch_tenant_slots_in_use")
    waiting = tenant_samples(mid, "trio_dispatch_tenant_waiting")
    assert sum(in_use.values()) == stats.in_flight == 2
    assert sum(waiting.values()) == stats.waiting
    assert in_use[("p", "acme")] == stats.tenants["acme"].in_flight
    assert ("p", "acme") in tenant_samples(mid, "trio_dispatch_tenant_service")
    assert samples[("trio_dispatch_tenant_weight", (("tenant", "acme"),))] == 2.0
    assert samples[("trio_dispatch_tenant_limit", (("tenant", "acme"),))] == 1


async def test_tenant_series_add_up_to_the_providers_and_never_go_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Random traffic of configured, unconfigured and no tenants, with
    # tenants configured and removed while it runs: at every scrape, the
    # tenant families add up to the provider's series, the label values
    # are the configured tenants and "other", and no counter goes down.
    rng = random.Random(21)
    names = [*["acme", "beta", "gamma", None] * 5, *(f"user-{i}" for i in range(20))]

    async def agent(dispatcher: Dispatcher) -> None:
        await trio.sleep(rng.uniform(0, 20))
        tenant = rng.choice(names)
        with trio.move_on_after(rng.uniform(0.5, 6)):
            try:
                async with dispatcher.slot(rng.choice("pq"), tenant=tenant):
                    await trio.sleep(rng.uniform(0.1, 2))
            except QueueFull:
                pass

    counters = [
        "trio_dispatch_tenant_grants_total",
        "trio_dispatch_tenant_releases_total",
        "trio_dispatch_tenant_withdrawn_total",
        "trio_dispatch_tenant_rejected_total",
        "trio_dispatch_tenant_queue_wait_seconds_count",
    ]
    async with open_dispatcher(
        {"p": 3, "q": 2}, max_waiting=20, tenants={"acme": Tenant(weight=2.0)}
    ) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        seen: dict[tuple[str, str, str], float] = {}
        scrapes = 0
        async with trio.open_nursery() as nursery:
            for _ in range(400):
                nursery.start_soon(agent, dispatcher)
            for step in range(25):
                await trio.sleep(1)
                if step == 5:
                    dispatcher.set_tenant("beta", Tenant(limit=1))
                if step == 12:
                    dispatcher.remove_tenant("acme")
                if step == 15:
                    dispatcher.set_tenant("gamma", Tenant(weight=0.5))
                samples = scrape(registry)
                stats = dispatcher.statistics()
                configured = set(dispatcher.tenants())
                scrapes += 1
                for provider, p in stats.providers.items():
                    for family, total in [
                        ("trio_dispatch_tenant_slots_in_use", p.in_flight),
                        ("trio_dispatch_tenant_waiting", p.waiting),
                        ("trio_dispatch_tenant_grants_total", p.granted_total),
                        ("trio_dispatch_tenant_releases_total", p.released_total),
                        ("trio_dispatch_tenant_withdrawn_total", p.withdrawn_total),
                        ("trio_dispatch_tenant_rejected_total", p.rejected_total),
                    ]:
                        values = {
                            tenant: value
                            for (name, tenant), value in tenant_samples(
                                samples, family
                            ).items()
                            if name == provider
                        }
                        assert set(values) == configured | {"other"}, family
                        assert sum(values.values()) == total, (family, provider)
                for family in counters:
                    for (provider, tenant), value in tenant_samples(
                        samples, family
                    ).items():
                        key = (family, provider, tenant)
                        # A removed tenant's series ends; while it is shown
                        # it never goes down, nor does "other".
                        assert value >= seen.get(key, 0), key
                        seen[key] = value
                seen = {
                    key: value
                    for key, value in seen.items()
                    if key[2] in configured | {"other"}
                }
    assert scrapes == 25
    # The run went through every path: grants to the configured tenants
    # and the rest, withdrawals and refusals.
    for family in counters[:4]:
        assert seen[(family, "p", "other")] > 0, family
    assert seen[("trio_dispatch_tenant_grants_total", "p", "beta")] > 0
    assert seen[("trio_dispatch_tenant_grants_total", "q", "gamma")] > 0


async def test_a_pool_has_its_own_samples_and_its_members_their_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 2}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))
        async with trio.open_nursery() as nursery:

            async def hold(seconds: float, conversation: str) -> None:
                async with dispatcher.slot("gpt", conversation_id=conversation):
                    await trio.sleep(seconds)

            for index, seconds in enumerate((3.0, 3.0, 3.0, 1.0)):
                nursery.start_soon(hold, seconds, f"c{index}")
                await trio.testing.wait_all_tasks_blocked()
            samples = scrape(registry)
            pool = (("pool", "gpt"),)
            assert samples[("trio_dispatch_pool_slots_in_use", pool)] == 3
            assert samples[("trio_dispatch_pool_slots_limit", pool)] == 3
            assert samples[("trio_dispatch_pool_waiting", pool)] == 1
            assert (
                samples[("trio_dispatch_slots_in_use", (("provider", "key-b"),))] == 2
            )
            assert (
                samples[("trio_dispatch_slots_in_use", (("provider", "key-a"),))] == 1
            )
            assert ("trio_dispatch_slots_in_use", (("provider", "gpt"),)) not in samples
        samples = scrape(registry)
        stats = dispatcher.statistics()
        assert samples[("trio_dispatch_pool_affinity_hits_total", pool)] == (
            stats.pools["gpt"].affinity_hits
        )
        assert samples[("trio_dispatch_pool_affinity_moves_total", pool)] == (
            stats.pools["gpt"].affinity_moves
        )
        # Each grant's wait counts for the member granted, none for the pool.
        waits = {
            labels: value
            for (name, labels), value in samples.items()
            if name == "trio_dispatch_queue_wait_seconds_count"
        }
        assert sum(waits.values()) == 4
        assert set(waits) == {(("provider", "key-a"),), (("provider", "key-b"),)}


async def test_a_pools_members_show_their_service(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 2, "alone": 1},
        pools={"gpt": ("key-a", "key-b")},
        failure_threshold=2,
        failure_cooldown=10.0,
    ) as dispatcher:
        registry = CollectorRegistry()
        registry.register(PrometheusCollector(dispatcher))

        async def fail(member: str) -> None:
            async with dispatcher.slot(member) as slot:
                slot.failed()

        await fail("key-a")
        await fail("key-b")
        await fail("key-a")
        out = scrape(registry)
        await trio.sleep(10.0)
        probing = scrape(registry)
    a, b = (("provider", "key-a"),), (("provider", "key-b"),)
    assert out[("trio_dispatch_member_out_of_service", a)] == 1
    assert out[("trio_dispatch_member_out_of_service", b)] == 0
    assert out[("trio_dispatch_member_failures", a)] == 2
    assert out[("trio_dispatch_member_failures", b)] == 1
    assert out[("trio_dispatch_member_outages_total", a)] == 1
    assert out[("trio_dispatch_member_half_open", a)] == 0
    assert probing[("trio_dispatch_member_out_of_service", a)] == 0
    assert probing[("trio_dispatch_member_half_open", a)] == 1
    # A provider in no pool has none of these series.
    alone = (("provider", "alone"),)
    assert ("trio_dispatch_member_failures", alone) not in out
