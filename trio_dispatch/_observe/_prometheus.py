"""The Prometheus collector; public in ``trio_dispatch.metrics``."""

from __future__ import annotations

import bisect
import itertools
import math
from functools import partial
from typing import TYPE_CHECKING, Final, final

import attrs
import trio
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from .._dispatch._dispatcher import plumbing
from ._hub import (
    OTHER_TENANT,
    Granted,
    Paused,
    Refused,
    Released,
    Withdrawn,
    read_in_trio,
    tenant_figures,
    tenant_label,
)

if TYPE_CHECKING:
    from collections.abc import (
        Callable,
        Container,
        Iterable,
        Iterator,
        Mapping,
        Sequence,
    )

    from prometheus_client.metrics_core import Metric

    from .._dispatch._dispatcher import Dispatcher
    from .._dispatch._statistics import DispatcherStatistics
    from ..messages._limits import Tenant
    from ._hub import DispatchEvent

__all__ = ["DEFAULT_WAIT_BUCKETS", "PrometheusCollector"]

DEFAULT_WAIT_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0,
)  # fmt: skip
"""The upper bounds of the wait histogram's buckets, in seconds (``+Inf`` added)."""


_COUNTS: Final = ("granted", "released", "withdrawn", "rejected")
# The count each slot event adds one to.
_KINDS: Final[dict[type, str]] = {
    Granted: "granted",
    Released: "released",
    Withdrawn: "withdrawn",
    Refused: "rejected",
}


@final
@attrs.define
class _Requests:
    """What happened to some requests of one provider, from the events.

    ``waits`` counts the grants' waits per bucket, ``wait_sum`` adds them.
    """

    waits: list[int]
    wait_sum: float = 0.0
    granted: int = 0
    released: int = 0
    withdrawn: int = 0
    rejected: int = 0

    def wait(self, index: int, wait: float) -> None:
        """Count one wait, in the bucket of ``index``."""
        self.waits[index] += 1
        self.wait_sum += wait

    def merge(self, other: _Requests) -> None:
        """Add ``other``'s counts to these."""
        self.waits = [a + b for a, b in zip(self.waits, other.waits, strict=True)]
        self.wait_sum += other.wait_sum
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def copy(self) -> _Requests:
        """A copy that no later event changes."""
        return attrs.evolve(self, waits=list(self.waits))


_FOLD_SLACK: Final = 1024
"""How many tenants not configured the collector counts apart between folds."""


@final
class _Accumulator:
    """The collector's event sink: the wait histograms, the rate limits, the tenants.

    Each tenant's requests are counted under its own name as they come
    (``None`` for the pool of every tenant not configured, and of requests
    made for none); ``fold`` moves the counts of the tenants not configured
    now into the pool. Every collection folds, and so does an event that
    would count more than ``_FOLD_SLACK`` tenants beyond those configured at
    the last fold: however many tenants the traffic names, the counts kept
    are bounded, and the pool's counters never go down.
    """

    __slots__ = ("bounds", "configured", "fold_at", "kept", "rate_limited", "tenants")

    def __init__(
        self, bounds: tuple[float, ...], configured: Callable[[], Mapping[str, Tenant]]
    ) -> None:
        self.bounds = bounds
        self.configured = configured
        self.rate_limited: dict[str, int] = {}
        # provider -> tenant (None: the pool) -> its counts; the provider's
        # own are the sum of its tenants'.
        self.tenants: dict[str, dict[str | None, _Requests]] = {}
        # How many tenants are counted under their own name, and how many
        # may be before the next fold.
        self.kept = 0
        self.fold_at = _FOLD_SLACK

    def empty(self) -> _Requests:
        """Counts of nothing yet."""
        return _Requests([0] * (len(self.bounds) + 1))

    def push(self, event: DispatchEvent) -> None:
        """Count a slot event (a grant's wait too) or a pause."""
        if type(event) is Paused:
            provider = event.provider
            self.rate_limited[provider] = self.rate_limited.get(provider, 0) + 1
        elif isinstance(event, Granted | Released | Withdrawn | Refused):
            requests = self._requests(event.provider, event.tenant)
            kind = _KINDS[type(event)]
            setattr(requests, kind, getattr(requests, kind) + 1)
            if type(event) is Granted and event.wait is not None:
                requests.wait(bisect.bisect_left(self.bounds, event.wait), event.wait)

    def _requests(self, provider: str, tenant: str | None) -> _Requests:
        """The counts of ``tenant``'s requests of ``provider``, made if new."""
        counts = self.tenants.setdefault(provider, {})
        requests = counts.get(tenant)
        if requests is None:
            if tenant is not None:
                if self.kept >= self.fold_at:
                    self.fold(self.configured())
                self.kept += 1
            requests = counts[tenant] = self.empty()
        return requests

    def fold(self, configured: Container[str]) -> None:
        """Move the counts of every tenant not in ``configured`` into the pool."""
        kept = 0
        for counts in self.tenants.values():
            for tenant in [t for t in counts if t is not None and t not in configured]:
                pool = counts.get(None)
                if pool is None:
                    pool = counts[None] = self.empty()
                pool.merge(counts.pop(tenant))
            kept += len(counts) - (None in counts)
        self.kept = kept
        self.fold_at = kept + _FOLD_SLACK

    def close(self) -> None:
        """The dispatcher closed: the figures stay as they are."""


@final
@attrs.frozen
class _Snapshot:
    """What one scrape reports, read in the dispatcher's trio thread."""

    statistics: DispatcherStatistics
    configured: Mapping[str, Tenant]
    rate_limited: dict[str, int]
    tenants: dict[str, dict[str | None, _Requests]]


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
        self._accumulator = _Accumulator(bounds, dispatcher.tenants)
        plumbing(dispatcher).observe_events(self._accumulator)

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
        dispatcher = self._dispatcher
        accumulator = self._accumulator
        configured = dispatcher.tenants()
        accumulator.fold(configured)
        return _Snapshot(
            dispatcher.statistics(),
            configured,
            dict(accumulator.rate_limited),
            {
                provider: {tenant: counts.copy() for tenant, counts in per.items()}
                for provider, per in accumulator.tenants.items()
            },
        )

    def _families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        yield from self._provider_families(snapshot)
        yield from self._tenant_families(snapshot)
        yield from _budget_families(snapshot.statistics)
        yield from _pool_families(snapshot.statistics)

    def _provider_families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        providers = snapshot.statistics.providers
        labels = ["provider"]

        gauge = partial(GaugeMetricFamily, labels=labels)
        counter = partial(CounterMetricFamily, labels=labels)

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
        counts = {
            "granted": counter("trio_dispatch_grants", "Slots granted."),
            "released": counter("trio_dispatch_releases", "Slots given back."),
            "withdrawn": counter(
                "trio_dispatch_withdrawn", "Requests cancelled while they waited."
            ),
            "rejected": counter(
                "trio_dispatch_rejected", "Requests refused because too many waited."
            ),
        }
        rate_limited = counter(
            "trio_dispatch_rate_limited",
            "Rate-limit reports that paused the provider.",
        )
        waits = HistogramMetricFamily(
            "trio_dispatch_queue_wait_seconds",
            "Seconds from asking for a slot to getting it.",
            labels=labels,
        )
        for name, stats in sorted(providers.items()):
            value = [name]
            in_use.add_metric(value, stats.in_flight)
            if stats.limit is not None:
                limit.add_metric(value, stats.limit)
            waiting.add_metric(value, stats.waiting)
            paused.add_metric(value, 1 if stats.paused else 0)
            up.add_metric(value, 1 if stats.backend_up else 0)
            for kind, family in counts.items():
                family.add_metric(value, getattr(stats, f"{kind}_total"))
            rate_limited.add_metric(value, snapshot.rate_limited.get(name, 0))
            # The provider's waits: its tenants' (and the pool's) together.
            total = self._accumulator.empty()
            for requests in snapshot.tenants.get(name, {}).values():
                total.merge(requests)
            self._add_waits(waits, value, total)
        yield from (in_use, limit, waiting, paused, up, waits)
        yield from (*counts.values(), rate_limited)

    def _tenant_families(self, snapshot: _Snapshot) -> Iterator[Metric]:
        labels = ["provider", "tenant"]

        gauge = partial(GaugeMetricFamily, labels=labels)
        counter = partial(CounterMetricFamily, labels=labels)

        in_use = gauge("trio_dispatch_tenant_slots_in_use", "Slots a tenant holds now.")
        waiting = gauge(
            "trio_dispatch_tenant_waiting", "A tenant's requests waiting for a slot."
        )
        service = gauge(
            "trio_dispatch_tenant_service",
            "A configured tenant's service counter: slot-seconds over its weight.",
        )
        counts = {
            "granted": counter(
                "trio_dispatch_tenant_grants", "Slots granted to a tenant."
            ),
            "released": counter(
                "trio_dispatch_tenant_releases", "Slots a tenant gave back."
            ),
            "withdrawn": counter(
                "trio_dispatch_tenant_withdrawn",
                "A tenant's requests cancelled while they waited.",
            ),
            "rejected": counter(
                "trio_dispatch_tenant_rejected",
                "A tenant's requests refused because too many waited.",
            ),
        }
        waits = HistogramMetricFamily(
            "trio_dispatch_tenant_queue_wait_seconds",
            "Seconds from a tenant's asking for a slot to getting it.",
            labels=labels,
        )
        weight = GaugeMetricFamily(
            "trio_dispatch_tenant_weight",
            "A configured tenant's share weight.",
            labels=["tenant"],
        )
        cap = GaugeMetricFamily(
            "trio_dispatch_tenant_limit",
            "A configured tenant's cap on each provider's slots.",
            labels=["tenant"],
        )
        configured = snapshot.configured
        for tenant, settings in sorted(configured.items()):
            if tenant == OTHER_TENANT:
                continue
            weight.add_metric([tenant], settings.weight)
            if settings.limit is not None:
                cap.add_metric([tenant], settings.limit)
        for name, stats in sorted(snapshot.statistics.providers.items()):
            counted: dict[str, _Requests] = {}
            for named, requests in snapshot.tenants.get(name, {}).items():
                # The pool and the tenants not configured share a label.
                label = tenant_label(named, configured)
                counted.setdefault(label, self._accumulator.empty()).merge(requests)
            for label, (held, queued, counter_) in sorted(
                tenant_figures(stats, configured).items()
            ):
                value = [name, label]
                in_use.add_metric(value, held)
                waiting.add_metric(value, queued)
                if counter_ is not None:
                    service.add_metric(value, counter_)
                requests = counted.get(label) or self._accumulator.empty()
                for kind, family in counts.items():
                    family.add_metric(value, getattr(requests, kind))
                self._add_waits(waits, value, requests)
        yield from (in_use, waiting, service, waits, weight, cap)
        yield from counts.values()

    def _add_waits(
        self, family: HistogramMetricFamily, value: list[str], requests: _Requests
    ) -> None:
        # Each bucket's ``le`` label as ``prometheus_client`` writes its own.
        bounds = [*map(repr, self._accumulator.bounds), "+Inf"]
        cumulative = itertools.accumulate(requests.waits)
        buckets = list(zip(bounds, cumulative, strict=True))
        family.add_metric(value, buckets, sum_value=requests.wait_sum)


def _pool_families(statistics: DispatcherStatistics) -> Iterator[Metric]:
    """Each pool's slots, waiting requests and affinity (its members are providers)."""
    labels = ["pool"]
    in_use = GaugeMetricFamily(
        "trio_dispatch_pool_slots_in_use", "Slots its members hold now.", labels=labels
    )
    limit = GaugeMetricFamily(
        "trio_dispatch_pool_slots_limit",
        "Its members' limits added up, while none is unlimited.",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "trio_dispatch_pool_waiting",
        "Requests waiting for the pool now.",
        labels=labels,
    )
    hits = CounterMetricFamily(
        "trio_dispatch_pool_affinity_hits",
        "Requests granted on the member they preferred (their previous call's).",
        labels=labels,
    )
    moves = CounterMetricFamily(
        "trio_dispatch_pool_affinity_moves",
        "Requests granted on another member than the one they preferred.",
        labels=labels,
    )
    for name, stats in sorted(statistics.pools.items()):
        value = [name]
        in_use.add_metric(value, stats.in_flight)
        if stats.limit is not None:
            limit.add_metric(value, stats.limit)
        waiting.add_metric(value, stats.waiting)
        hits.add_metric(value, stats.affinity_hits)
        moves.add_metric(value, stats.affinity_moves)
    yield from (in_use, limit, waiting, hits, moves)
    yield from _member_families(statistics)


def _member_families(statistics: DispatcherStatistics) -> Iterator[Metric]:
    """Each pool member's service: out, half-open, its failures in a row, its outages."""
    labels = ["provider"]
    out = GaugeMetricFamily(
        "trio_dispatch_member_out_of_service",
        "1 while a pool's member is out of service after failures in a row.",
        labels=labels,
    )
    half_open = GaugeMetricFamily(
        "trio_dispatch_member_half_open",
        "1 while a pool's member back from its cooldown takes one request.",
        labels=labels,
    )
    failures = GaugeMetricFamily(
        "trio_dispatch_member_failures",
        "A pool's member's calls failed in a row before their answer.",
        labels=labels,
    )
    outages = CounterMetricFamily(
        "trio_dispatch_member_outages",
        "Times a pool's member was taken out of service.",
        labels=labels,
    )
    providers = statistics.providers
    members = sorted(
        {member for pool in statistics.pools.values() for member in pool.members}
    )
    for name in members:
        stats = providers.get(name)
        if stats is None:
            continue
        value = [name]
        out.add_metric(value, 0 if stats.out_of_service_until is None else 1)
        half_open.add_metric(value, 1 if stats.half_open else 0)
        failures.add_metric(value, stats.failures)
        outages.add_metric(value, stats.outages_total)
    yield from (out, half_open, failures, outages)


def _budget_families(statistics: DispatcherStatistics) -> Iterator[Metric]:
    """Each provider's budgets (``model=""``) and each of its models' own."""
    labels = ["provider", "model"]
    figures = [
        ("requests_per_minute", "The request budget per minute in use."),
        ("tokens_per_minute", "The token budget per minute in use."),
        ("requests_available", "Requests the budget holds now."),
        ("tokens_available", "Tokens the budget holds now."),
    ]
    families = [
        (
            field,
            GaugeMetricFamily(
                f"trio_dispatch_budget_{field}", documentation, labels=labels
            ),
        )
        for field, documentation in figures
    ]
    held = GaugeMetricFamily(
        "trio_dispatch_budget_held",
        "1 while the oldest waiter waits for this budget, not for a slot.",
        labels=labels,
    )
    for name, stats in sorted(statistics.providers.items()):
        budgets = [("", stats.budget), *sorted(stats.models.items())]
        for model, budget in budgets:
            if budget is None:
                continue
            value = [name, model]
            for field, family in families:
                figure = getattr(budget, field)
                if figure is not None:
                    family.add_metric(value, figure)
            held.add_metric(value, 1 if budget.waiting_for_budget else 0)
    yield from (family for _, family in families)
    yield held


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
