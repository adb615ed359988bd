"""The OpenTelemetry metrics; public in ``trio_dispatch.otel``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

import trio
from opentelemetry import metrics

from .._dispatch._dispatcher import plumbing
from .._dispatch._turn import current_turn
from .._version import __version__
from ._hub import (
    Granted,
    Paused,
    read_in_trio,
    tenant_figures,
    tenant_label,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    from .._dispatch._dispatcher import Dispatcher
    from .._dispatch._statistics import DispatcherStatistics
    from .._provider import Provider
    from ..messages import Usage
    from ..messages._limits import Tenant
    from ._hub import DispatchEvent

__all__ = ["DURATION_BUCKETS", "TOKEN_BUCKETS", "OpenTelemetryMetrics"]

# The conventions' advice: from 10 ms, doubling; from 1 token, times 4.
DURATION_BUCKETS: Final = tuple(round(0.01 * 2**i, 2) for i in range(14))
"""``gen_ai.client.operation.duration``'s bucket boundaries, from the conventions."""

TOKEN_BUCKETS: Final = tuple(4**i for i in range(14))
"""``gen_ai.client.token.usage``'s bucket boundaries, from the conventions."""

_PROVIDER: Final = "gen_ai.provider.name"
_MODEL: Final = "gen_ai.request.model"
_POOL: Final = "trio_dispatch.pool"
_TENANT: Final = "trio_dispatch.tenant"

if TYPE_CHECKING:
    _Callback = Callable[[CallbackOptions], Iterable[Observation]]


@final
class OpenTelemetryMetrics:
    """A dispatcher's metrics through the OpenTelemetry API.

    The GenAI client metrics of the semantic conventions, recorded for every
    LLM call made through ``wrap_provider`` (so every call of every
    conversation):

    - ``gen_ai.client.operation.duration`` (histogram, ``s``): from the
      request's first byte to the stream's end, the slot's wait excluded;
    - ``gen_ai.client.token.usage`` (histogram, ``{token}``): the tokens a
      call's answer reported, with ``gen_ai.token.type`` ``input`` (the
      whole prompt, cache reads and writes included) or ``output``.

    Both carry ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name``
    (the provider's ``id``), ``gen_ai.request.model`` (the provider's
    ``model``, when it has one), ``trio_dispatch.tenant`` (when the call is
    made in a turn for a tenant; bounded as below) and, for a call that
    failed, ``error.type`` (the exception's class name), with the
    conventions' bucket boundaries as advice to the SDK.

    And the limiter's figures, by ``gen_ai.provider.name``:
    ``trio_dispatch.slots.in_use``, ``trio_dispatch.slots.limit``,
    ``trio_dispatch.requests.waiting`` and ``trio_dispatch.paused``
    (gauges read from ``statistics()`` at each collection),
    ``trio_dispatch.queue.wait`` (histogram, ``s``; also by
    ``trio_dispatch.tenant`` for a request made for a tenant, by
    ``gen_ai.request.model`` for one that named its model, and by
    ``trio_dispatch.pool`` for one of a pool, whose member granted is then
    its ``gen_ai.provider.name``) and
    ``trio_dispatch.rate_limits`` (counter of the rate-limit reports that
    paused the provider). Per tenant, by
    ``gen_ai.provider.name`` and ``trio_dispatch.tenant``:
    ``trio_dispatch.tenant.slots.in_use``,
    ``trio_dispatch.tenant.requests.waiting`` and
    ``trio_dispatch.tenant.service`` (the service counter of a configured
    tenant), gauges read from ``statistics()``.

    ``trio_dispatch.tenant`` is bounded as the Prometheus ``tenant`` label
    is: a configured tenant (``dispatcher.tenants()``) by its name, every
    other tenant as ``"other"``, so traffic alone never makes new attribute
    sets; a request made for no tenant has no such attribute on the
    histograms (as before tenants existed), and counts in ``"other"`` on
    the per-tenant gauges, which cover the whole provider.

    A pool's members are providers like the others, in every figure; a
    call through a pool (``PoolProvider``) is its member's provider's, by
    that provider's ``id``.

    Only the API is used: the application chooses the SDK, its readers and
    exporters (``meter_provider``, or the global one). Create it inside the
    dispatcher's trio run, when the dispatcher opens; it counts from then on.

    Args:
        dispatcher: The dispatcher to report on.
        meter_provider: Where the meter comes from; ``None`` for the global
            ``MeterProvider``.
    """

    def __init__(
        self, dispatcher: Dispatcher, *, meter_provider: MeterProvider | None = None
    ) -> None:
        meter = metrics.get_meter(
            "trio_dispatch", __version__, meter_provider=meter_provider
        )
        self._dispatcher = dispatcher
        self._token = trio.lowlevel.current_trio_token()
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._wait = meter.create_histogram(
            "trio_dispatch.queue.wait",
            unit="s",
            description="Seconds from asking for a slot to getting it.",
        )
        self._rate_limits = meter.create_counter(
            "trio_dispatch.rate_limits",
            unit="{report}",
            description="Rate-limit reports that paused the provider.",
        )
        for name, unit, description in _GAUGES:
            meter.create_observable_gauge(
                name, [self._gauge(name)], unit=unit, description=description
            )
        machinery = plumbing(dispatcher)
        machinery.observe_calls(self)
        machinery.observe_events(self)

    def __repr__(self) -> str:
        return f"<OpenTelemetryMetrics {self._dispatcher!r}>"

    # CallObserver

    def call_ended(
        self,
        provider: Provider,
        duration: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        """Record one LLM call's duration and token usage."""
        attributes: dict[str, str] = {
            "gen_ai.operation.name": "chat",
            _PROVIDER: provider.id,
        }
        model = getattr(provider, "model", None)
        if isinstance(model, str):
            attributes[_MODEL] = model
        turn = current_turn()
        if turn is not None and turn.tenant is not None:
            attributes[_TENANT] = self._label(turn.tenant)
        if error is not None:
            attributes["error.type"] = type(error).__qualname__
        self._duration.record(duration, attributes)
        if usage is not None:
            for kind, tokens in (
                ("input", usage.prompt_tokens),
                ("output", usage.output_tokens),
            ):
                self._tokens.record(tokens, {**attributes, "gen_ai.token.type": kind})

    # EventSink

    def push(self, event: DispatchEvent) -> None:
        """Record a grant's wait or a rate-limit report."""
        if type(event) is Granted:
            if event.wait is not None:
                attributes = {_PROVIDER: event.provider}
                if event.tenant is not None:
                    attributes[_TENANT] = self._label(event.tenant)
                if event.model is not None:
                    attributes[_MODEL] = event.model
                if event.pool is not None:
                    # A pool's grant: its member is the provider.
                    attributes[_POOL] = event.pool
                self._wait.record(event.wait, attributes)
        elif type(event) is Paused:
            self._rate_limits.add(1, {_PROVIDER: event.provider})

    def close(self) -> None:
        """The dispatcher closed: nothing more to record."""

    def _label(self, tenant: str) -> str:
        """``trio_dispatch.tenant`` of ``tenant``: bounded by the configuration."""
        return tenant_label(tenant, self._dispatcher.tenants())

    def _gauge(self, name: str) -> _Callback:
        """The callback of gauge ``name``: the statistics read at each collection."""

        def read() -> dict[str, list[Observation]]:
            dispatcher = self._dispatcher
            return _gauges(dispatcher.statistics(), dispatcher.tenants())

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            gauges = read_in_trio(read, self._token)
            return [] if gauges is None else gauges[name]

        return callback


_GAUGES: Final = (
    ("trio_dispatch.slots.in_use", "{slot}", "Slots held now."),
    ("trio_dispatch.slots.limit", "{slot}", "The concurrency limit."),
    ("trio_dispatch.requests.waiting", "{request}", "Requests waiting for a slot now."),
    ("trio_dispatch.paused", "1", "1 while grants are paused after a rate limit."),
    ("trio_dispatch.tenant.slots.in_use", "{slot}", "Slots held now."),
    (
        "trio_dispatch.tenant.requests.waiting",
        "{request}",
        "Requests waiting for a slot now.",
    ),
    (
        "trio_dispatch.tenant.service",
        "s",
        "A configured tenant's slot-seconds received, over its weight.",
    ),
)
"""The gauges: four by provider, then three by provider and tenant."""


def _gauges(
    stats: DispatcherStatistics, configured: dict[str, Tenant]
) -> dict[str, list[Observation]]:
    """Every gauge's observations now, by name (a figure that is ``None``: none)."""
    gauges: dict[str, list[Observation]] = {name: [] for name, _, _ in _GAUGES}
    by_provider = [gauges[name] for name, _, _ in _GAUGES[:4]]
    by_tenant = [gauges[name] for name, _, _ in _GAUGES[4:]]
    for name, provider in sorted(stats.providers.items()):
        figures = (
            provider.in_flight,
            provider.limit,  # None, unlimited: not observed
            provider.waiting,
            int(provider.paused),
        )
        for observations, value in zip(by_provider, figures, strict=True):
            if value is not None:
                observations.append(metrics.Observation(value, {_PROVIDER: name}))
        for label, values in sorted(tenant_figures(provider, configured).items()):
            attributes = {_PROVIDER: name, _TENANT: label}
            for observations, figure in zip(by_tenant, values, strict=True):
                if figure is not None:
                    observations.append(metrics.Observation(figure, attributes))
    return gauges
