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

from trio_dispatch import QueueFull, open_dispatcher
from trio_dispatch.metrics import DEFAULT_WAIT_BUCKETS, PrometheusCollector

from ._helpers import settle

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher, DispatcherStatistics


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
