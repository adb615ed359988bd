"""OpenTelemetry metrics of a dispatcher: ``OpenTelemetryMetrics``.

Needs the ``otel`` extra (``opentelemetry-api`` only: the application
chooses the SDK and the exporter)::

    from opentelemetry.sdk.metrics import MeterProvider

    meter_provider = MeterProvider(metric_readers=[...])
    async with open_dispatcher(limits) as dispatcher:
        OpenTelemetryMetrics(dispatcher, meter_provider=meter_provider)
        ...

It records the GenAI client metrics of the semantic conventions,
``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``,
for every LLM call made through ``wrap_provider`` or a conversation, and
the limiter's own figures (see ``OpenTelemetryMetrics``).
"""

from .._util import fixup_module_metadata, raise_if_extra_missing

try:
    from .._observe._otel import DURATION_BUCKETS as DURATION_BUCKETS
    from .._observe._otel import TOKEN_BUCKETS as TOKEN_BUCKETS
    from .._observe._otel import OpenTelemetryMetrics as OpenTelemetryMetrics
except ModuleNotFoundError as exc:  # pragma: no cover (tested in a fresh interpreter)
    raise_if_extra_missing(exc, "trio_dispatch.otel", "otel", "opentelemetry")
    raise

__all__ = ["DURATION_BUCKETS", "TOKEN_BUCKETS", "OpenTelemetryMetrics"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, raise_if_extra_missing
