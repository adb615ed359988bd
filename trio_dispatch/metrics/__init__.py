"""Prometheus metrics of a dispatcher: ``PrometheusCollector``.

Needs the ``metrics`` extra (``prometheus_client``)::

    registry = prometheus_client.CollectorRegistry()
    registry.register(PrometheusCollector(dispatcher))

Every metric is labelled by ``provider`` (the name a limit belongs to),
never by conversation:

======================================  =========  ================================
name                                    type       what
======================================  =========  ================================
``trio_dispatch_slots_in_use``          gauge      slots held now
``trio_dispatch_slots_limit``           gauge      the limit (limited providers)
``trio_dispatch_waiting``               gauge      requests waiting for a slot
``trio_dispatch_paused``                gauge      1 while grants are paused
``trio_dispatch_backend_up``            gauge      0 while Redis is unreachable
``trio_dispatch_queue_wait_seconds``    histogram  wait from request to grant
``trio_dispatch_grants_total``          counter    slots granted
``trio_dispatch_releases_total``        counter    slots given back
``trio_dispatch_withdrawn_total``       counter    requests cancelled while waiting
``trio_dispatch_rejected_total``        counter    requests refused (``QueueFull``)
``trio_dispatch_rate_limited_total``    counter    rate-limit reports that paused
======================================  =========  ================================

The gauges and the counters but one are read from
``dispatcher.statistics()`` at each scrape. The histogram and
``rate_limited_total`` are kept by the collector itself, from the
dispatcher's events, one per grant or report, with nothing lost however
busy the schedulers are: it counts what happens from its creation on, so
create it when the dispatcher opens. (While a collector exists, the
schedulers make their events; see ``dispatcher.events()``.)

A scrape may come from another thread (``prometheus_client``'s own HTTP
server runs in one): the collector then reads the dispatcher in its trio
thread, through ``trio.from_thread``.
"""

from .._util import fixup_module_metadata, raise_if_extra_missing

try:
    from .._prometheus import DEFAULT_WAIT_BUCKETS as DEFAULT_WAIT_BUCKETS
    from .._prometheus import PrometheusCollector as PrometheusCollector
except ModuleNotFoundError as exc:  # pragma: no cover (tested in a fresh interpreter)
    raise_if_extra_missing(exc, "trio_dispatch.metrics", "metrics", "prometheus_client")
    raise

__all__ = ["DEFAULT_WAIT_BUCKETS", "PrometheusCollector"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, raise_if_extra_missing
