"""The Prometheus collector; public in ``trio_dispatch.metrics``."""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Final, final

import trio
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from .actors._observe import Granted, Paused, read_in_trio

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from prometheus_client.metrics_core import Metric

    from .actors._dispatcher import Dispatcher
    from .actors._observe import DispatchEvent
    from .actors._statistics import DispatcherStatistics

__all__ = ["DEFAULT_WAIT_BUCKETS", "PrometheusCollector"]

DEFAULT_WAIT_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""The upper bounds of the wait histogram's buckets, in seconds (``+Inf`` added)."""


@final
class _Waits:
    """One provider's wait histogram: a count per bucket, their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0


@final
class _Accumulator:
    """The collector's event sink: the wait histograms and the rate limits."""

    __slots__ = ("bounds", "rate_limited", "waits")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.waits: dict[str, _Waits] = {}
        self.rate_limited: dict[str, int] = {}

    def push(self, event: DispatchEvent) -> None:
        if type(event) is Granted:
            wait = event.wait
            if wait is None:
                return
            waits = self.waits.get(event.provider)
            if waits is None:
                waits = self.waits[event.provider] = _Waits(len(self.bounds) + 1)
            waits.counts[bisect.bisect_left(self.bounds, wait)] += 1
            waits.sum += wait
        elif type(event) is Paused:
            provider = event.provider
            self.rate_limited[provider] = self.rate_limited.get(provider, 0) + 1

    def close(self) -> None:
        """The dispatcher closed: the figures stay as they are."""


@final
class _Snapshot:
    __slots__ = ("rate_limited", "statistics", "waits")

    def __init__(
        self,
        statistics: DispatcherStatistics,
        waits: dict[str, tuple[list[int], float]],
        rate_limited: dict[str, int],
    ) -> None:
        self.statistics = statistics
        self.waits = waits
        self.rate_limited = rate_limited


@final
class PrometheusCollector(Collector):
    """A Prometheus collector of one dispatcher, for any ``CollectorRegistry``.

    Create it inside the trio run of the dispatcher, when the dispatcher
    opens; register it with ``registry.register(collector)``. See the
    module's docstring for the metrics.

    Args:
        dispatcher: The dispatcher to report on.
        wait_buckets: The upper bounds of the wait histogram's buckets, in
            seconds: increasing, positive, finite (``+Inf`` is added).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
    ) -> None:
        bounds = _check_buckets(wait_buckets)
        self._dispatcher = dispatcher
        self._token = trio.lowlevel.current_trio_token()
        self._accumulator = _Accumulator(bounds)
        dispatcher.observe_events(self._accumulator)

    def __repr__(self) -> str:
        return f"<PrometheusCollector {self._dispatcher!r}>"

    def collect(self) -> Iterable[Metric]:
        """The metrics now; called by the registry at each scrape."""
        snapshot = read_in_trio(self._snapshot, self._token)
        if snapshot is None:
            # The dispatcher's trio run is over: nothing to report.
            return []
        return list(self._families(snapshot))

    def describe(self) -> Iterable[Metric]:
        """Nothing: the registry then takes the names from a first ``collect``."""
        return []

    def _snapshot(self) -> _Snapshot:
        accumulator = self._accumulator
        return _Snapshot(
            self._dispatcher.statistics(),
            {
                provider: (list(waits.counts), waits.sum)
                for provider, waits in accumulator.waits.items()
            },
            dict(accumulator.rate_limited),
        )

    def _families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        providers = snapshot.statistics.providers
        labels = ["provider"]

        def gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=labels)

        def counter(name: str, documentation: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, documentation, labels=labels)

        in_use = gauge("trio_dispatch_slots_in_use", "Slots held now.")
        limit = gauge(
            "trio_dispatch_slots_limit", "The concurrency limit of a limited provider."
        )
        waiting = gauge("trio_dispatch_waiting", "Requests waiting for a slot now.")
        paused = gauge(
            "trio_dispatch_paused", "1 while grants are paused after a rate limit."
        )
        up = gauge(
            "trio_dispatch_backend_up", "0 while the shared backend cannot be reached."
        )
        grants = counter("trio_dispatch_grants", "Slots granted.")
        releases = counter("trio_dispatch_releases", "Slots given back.")
        withdrawn = counter(
            "trio_dispatch_withdrawn", "Requests cancelled while they waited."
        )
        rejected = counter(
            "trio_dispatch_rejected", "Requests refused because too many waited."
        )
        rate_limited = counter(
            "trio_dispatch_rate_limited",
            "Rate-limit reports that paused the provider.",
        )
        waits = HistogramMetricFamily(
            "trio_dispatch_queue_wait_seconds",
            "Seconds from asking for a slot to getting it.",
            labels=labels,
        )
        bounds = self._accumulator.bounds
        for name, stats in sorted(providers.items()):
            value = [name]
            in_use.add_metric(value, stats.in_flight)
            if stats.limit is not None:
                limit.add_metric(value, stats.limit)
            waiting.add_metric(value, stats.waiting)
            paused.add_metric(value, 1 if stats.paused else 0)
            up.add_metric(value, 1 if stats.backend_up else 0)
            grants.add_metric(value, stats.granted_total)
            releases.add_metric(value, stats.released_total)
            withdrawn.add_metric(value, stats.withdrawn_total)
            rejected.add_metric(value, stats.rejected_total)
            rate_limited.add_metric(value, snapshot.rate_limited.get(name, 0))
            counts, total = snapshot.waits.get(name, ([0] * (len(bounds) + 1), 0.0))
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip([*bounds, math.inf], counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), cumulative))
            waits.add_metric(value, buckets, sum_value=total)
        yield from (in_use, limit, waiting, paused, up, waits)
        yield from (grants, releases, withdrawn, rejected, rate_limited)


def _le(bound: float) -> str:
    """A bucket's ``le`` label, as ``prometheus_client`` writes its own."""
    return "+Inf" if bound == math.inf else repr(bound)


def _check_buckets(buckets: object) -> tuple[float, ...]:
    rule = "wait_buckets must be increasing positive finite numbers"
    if isinstance(buckets, str | bytes) or not hasattr(buckets, "__iter__"):
        raise TypeError(f"{rule}, got {buckets!r}")
    bounds = tuple(buckets)
    for bound in bounds:
        if not isinstance(bound, int | float) or isinstance(bound, bool):
            raise TypeError(f"{rule}, got {buckets!r}")
    if not bounds or any(
        not math.isfinite(b) or b <= 0 or (i and b <= bounds[i - 1])
        for i, b in enumerate(bounds)
    ):
        raise ValueError(f"{rule}, got {buckets!r}")
    return tuple(float(b) for b in bounds)
