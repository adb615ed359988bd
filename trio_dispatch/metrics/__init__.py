"""Prometheus metrics of a dispatcher: ``PrometheusCollector``.

Needs the ``metrics`` extra (``prometheus_client``)::

    registry = prometheus_client.CollectorRegistry()
    registry.register(PrometheusCollector(dispatcher))

The provider's metrics are labelled by ``provider`` (the name a limit
belongs to), never by conversation:

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

The same figures per tenant are families of their own, labelled by
``provider`` and ``tenant``, so the provider's series above stay exactly
as they were (no dashboard breaks) and each tenant family sums, over
``tenant``, to its provider's figure (the counters, for a collector made
as the dispatcher opened):

============================================  =========  =========================
name                                          type       what
============================================  =========  =========================
``trio_dispatch_tenant_slots_in_use``         gauge      slots the tenant holds
``trio_dispatch_tenant_waiting``              gauge      its requests waiting
``trio_dispatch_tenant_service``              gauge      its service counter
``trio_dispatch_tenant_queue_wait_seconds``   histogram  its waits for a slot
``trio_dispatch_tenant_grants_total``         counter    slots granted to it
``trio_dispatch_tenant_releases_total``       counter    slots it gave back
``trio_dispatch_tenant_withdrawn_total``      counter    its requests cancelled
``trio_dispatch_tenant_rejected_total``       counter    its requests refused
============================================  =========  =========================

The ``tenant`` label is bounded by the configuration, not by the traffic:
only the tenants configured at the scrape (``dispatcher.tenants()``: from
``open_dispatcher(tenants=...)``, ``set_tenant`` or the admin API) get a
series of their own, every provider one for each; every other tenant, and
every request made for no tenant, is counted under ``tenant="other"``,
so a thousand users the operator never configured make one series, not a
thousand. The ``other`` gauges are what the
provider holds and queues beyond the configured tenants; ``other`` has no
service counter (the scheduler compares tenants' counters, never their
sum). A removed tenant's series end and its counts join ``other``, whose
counters never go down; a tenant configured later counts under its own
name from then on. (A tenant configured under the name ``other`` shares
that series.) ``trio_dispatch_tenant_weight`` and
``trio_dispatch_tenant_limit`` (gauges, by ``tenant``) show each
configured tenant's weight and cap.

The budgets are gauges labelled by ``provider`` and ``model``: the
provider's own budget, over all its models, with ``model=""`` (which
PromQL reads as no ``model`` label), and each model's own (configured as
``"provider/model"`` or learned from that model's answers) under its
name: ``trio_dispatch_budget_requests_per_minute``,
``..._tokens_per_minute``, ``..._requests_available`` and
``..._tokens_available`` (each where the budget has it) and
``trio_dispatch_budget_held`` (1 while the oldest waiter waits for that
budget). Models are not folded like tenants: they are named by the
application's code, not its users, and a provider has only the models of
its catalogue, so their number stays small.

A pool's members are providers like the others (their slots, waits and
counters under ``provider``: a grant's wait counts for the member it was
granted on). Each pool has its own gauges and counters, labelled by
``pool``: ``trio_dispatch_pool_slots_in_use``,
``trio_dispatch_pool_slots_limit`` (while no member is unlimited),
``trio_dispatch_pool_waiting``, and ``trio_dispatch_pool_affinity_hits_total``
and ``..._moves_total`` (requests granted on the member of their
conversation's previous call, or on another). Each member of a pool has,
under ``provider``, ``trio_dispatch_member_out_of_service`` and
``trio_dispatch_member_half_open`` (1 while it is), its calls failed in a
row (``trio_dispatch_member_failures``) and the times it was taken out of
service (``trio_dispatch_member_outages_total``).

The gauges and the provider's counters but one are read from
``dispatcher.statistics()`` at each scrape. The histograms, the tenants'
counters and ``rate_limited_total`` are kept by the collector itself, from
the dispatcher's events, one per grant or report, with nothing lost however
busy the schedulers are: it counts what happens from its creation on, so
create it when the dispatcher opens. (While a collector exists, the
schedulers make their events; see ``dispatcher.events()``.)

A scrape may come from another thread (``prometheus_client``'s own HTTP
server runs in one): the collector then reads the dispatcher in its trio
thread, through ``trio.from_thread``.
"""

from .._util import fixup_module_metadata, raise_if_extra_missing

try:
    from .._observe._prometheus import DEFAULT_WAIT_BUCKETS as DEFAULT_WAIT_BUCKETS
    from .._observe._prometheus import PrometheusCollector as PrometheusCollector
except ModuleNotFoundError as exc:  # pragma: no cover (tested in a fresh interpreter)
    raise_if_extra_missing(exc, "trio_dispatch.metrics", "metrics", "prometheus_client")
    raise

__all__ = ["DEFAULT_WAIT_BUCKETS", "PrometheusCollector"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata, raise_if_extra_missing
