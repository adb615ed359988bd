"""The backend interface: what the dispatcher asks of one provider's scheduler.

The dispatcher holds one ``Backend`` per provider and never asks which
kind it is: the local ``SchedulerActor`` (one process, on ``SlotPolicy``)
and the Redis-shared scheduler (a fleet, through the ledger) both
implement it, and so can a third written with the names of
``trio_dispatch.lowlevel`` alone.

A backend is an actor: its state changes only by the typed messages it
is sent, handled one at a time in the order they were sent; ``Backend``
says what else it promises. It is made by a factory from the
``BackendSetup`` the dispatcher hands it (``open_dispatcher_with``), as
the two built-in backends are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._policy._budgets import BudgetStatistics
    from .._policy._slots import MemberStatistics
    from .._policy._tenants import TenantStatistics
    from .._server_load._load import ServerLoad
    from ..messages._protocol import SchedulerMessage, Ticket


@final
@attrs.frozen
class ProviderStatistics:
    """One provider, limited or not, as its scheduler sees it.

    Attributes:
        provider: The provider's name.
        limit: The limit the scheduler enforces, or ``None`` for an
            unlimited provider (every request is granted at once, and still
            counted).
        in_flight: Slots held now.
        waiting: Requests waiting for a slot now.
        paused: Whether grants are paused by a rate-limit report.
        paused_until: When the pause ends (trio clock), or ``None``.
        granted_total: Slots granted since the provider was first used.
        released_total: Slots given back.
        withdrawn_total: Requests cancelled while they waited.
        rejected_total: Requests refused with ``QueueFull``.
        peak_in_flight: The most slots ever held at once.
        peak_waiting: The most requests ever waiting at once.
        backend: ``"local"`` for a dispatcher of its own, ``"redis"`` for
            one that shares its limits through Redis (``redis_url``). Then
            ``limit``, ``in_flight``, ``waiting`` and ``paused_until`` are
            the fleet's, as the latest exchange with Redis saw them (at most
            a poll interval old), and the totals and peaks are this
            process's own.
        backend_up: Whether the backend can grant: ``False`` while Redis
            is unreachable (nothing new is granted then).
        local_in_flight: Slots held by this process (``in_flight`` when
            local).
        local_waiting: Requests waiting in this process (``waiting`` when
            local).
        adaptive: Whether ``limit`` is an ``AdaptiveLimit``'s current value.
        budget: The request and token budgets, configured or learned from
            the provider's answers, or ``None`` if there is none.
        models: The budgets of each model of the provider (configured as
            ``"provider/model"`` or learned from that model's answers), by
            model name; ``budget`` is the provider's own, over all models.
        tenants: Each tenant the provider has seen or been configured
            with, by name (requests made for no tenant are not shown).
        server_load: What the provider's server said of its load at the
            latest reading (``open_dispatcher``'s ``server_load``), or
            ``None``: not read, or the latest reading failed.
        server_slots: The server's slots, learned from a reading with a
            queue (it runs all it can then), or ``None`` until then.
        affinity_hits: For a member of a pool, the requests granted on it
            that preferred it (their conversation's previous call was
            granted on it); 0 otherwise.
        affinity_moves: For a member of a pool, the requests that
            preferred it and were granted on another member, having waited
            ``affinity_wait`` for it or found it out of their pool.
        failures: For a member of a pool, its calls failed in a row
            before their answer (``Slot.failed``); 0 otherwise.
        out_of_service_until: For a member of a pool out of service (see
            ``open_dispatcher``'s ``failure_threshold``), when its cooldown
            ends (trio clock); ``None`` otherwise.
        half_open: For a member of a pool back from its cooldown, whether
            it takes one request (its probe) until that one gets its answer.
        outages_total: For a member of a pool, how many times it was
            taken out of service.
    """

    provider: str
    limit: int | None
    in_flight: int
    waiting: int
    paused: bool
    paused_until: float | None
    granted_total: int
    released_total: int
    withdrawn_total: int
    rejected_total: int
    peak_in_flight: int
    peak_waiting: int
    backend: Literal["local", "redis"] = "local"
    backend_up: bool = True
    local_in_flight: int = 0
    local_waiting: int = 0
    adaptive: bool = False
    budget: BudgetStatistics | None = None
    models: Mapping[str, BudgetStatistics] = attrs.field(factory=dict)
    tenants: Mapping[str, TenantStatistics] = attrs.field(factory=dict)
    server_load: ServerLoad | None = None
    server_slots: int | None = None
    affinity_hits: int = 0
    affinity_moves: int = 0
    failures: int = 0
    out_of_service_until: float | None = None
    half_open: bool = False
    outages_total: int = 0


class _Occupancy(Protocol):
    """Slots held and requests waiting, now."""

    @property
    def in_flight(self) -> int: ...
    @property
    def waiting(self) -> int: ...


class Counts(_Occupancy, Protocol):
    """A scheduler's own counts: ``PolicyStatistics`` and the Redis book both."""

    @property
    def granted_total(self) -> int: ...
    @property
    def released_total(self) -> int: ...
    @property
    def withdrawn_total(self) -> int: ...
    @property
    def rejected_total(self) -> int: ...
    @property
    def peak_in_flight(self) -> int: ...
    @property
    def peak_waiting(self) -> int: ...


class Fleet(_Occupancy, Protocol):
    """What a shared backend's last round saw of the whole fleet."""

    @property
    def up(self) -> bool: ...


def provider_statistics(
    provider: str,
    own: Counts,
    *,
    limit: int | None,
    paused_until: float | None,
    adaptive: bool,
    budget: BudgetStatistics | None,
    models: Mapping[str, BudgetStatistics],
    tenants: Mapping[str, TenantStatistics],
    fleet: Fleet | None = None,
    server_load: tuple[ServerLoad | None, int | None] = (None, None),
    affinity: tuple[int, int] = (0, 0),
    health: MemberStatistics | None = None,
) -> ProviderStatistics:
    """The snapshot of ``provider``: every backend's, built one way.

    ``own`` is the scheduler's own counts (its policy's, or the Redis
    book's), ``fleet`` what a shared backend saw of the fleet (``None`` for
    a local one): then ``in_flight`` and ``waiting`` are the fleet's, and
    ``local_in_flight`` and ``local_waiting`` this process's. ``health``:
    a pool's member's, its failures and service.
    """
    seen: _Occupancy = own if fleet is None else fleet
    return ProviderStatistics(
        provider=provider,
        limit=limit,
        in_flight=seen.in_flight,
        waiting=seen.waiting,
        paused=paused_until is not None,
        paused_until=paused_until,
        granted_total=own.granted_total,
        released_total=own.released_total,
        withdrawn_total=own.withdrawn_total,
        rejected_total=own.rejected_total,
        peak_in_flight=own.peak_in_flight,
        peak_waiting=own.peak_waiting,
        backend="local" if fleet is None else "redis",
        backend_up=fleet is None or fleet.up,
        local_in_flight=own.in_flight,
        local_waiting=own.waiting,
        adaptive=adaptive,
        budget=budget,
        models=models,
        tenants=tenants,
        server_load=server_load[0],
        server_slots=server_load[1],
        affinity_hits=affinity[0],
        affinity_moves=affinity[1],
        failures=0 if health is None else health.failures,
        out_of_service_until=None if health is None else health.out_of_service_until,
        half_open=health is not None and health.half_open,
        outages_total=0 if health is None else health.outages_total,
    )


class Backend(Protocol):
    """One provider's scheduler, as the dispatcher uses it.

    Everything reaches a backend as a message of ``trio_dispatch.lowlevel``
    through ``send`` (``SchedulerMessage``): requests (``Acquire`` with a
    fresh ``ticket`` and the ``Reply`` its answer goes to, then exactly one
    of ``Release`` once granted or ``Cancel`` any time), what the answers
    teach (``Answered``, ``ReportUsage``, ``ObserveLatency``,
    ``ObserveRateLimits``) and the
    settings (``SetLimit``, ``Adapt``, ``Pause``, ``Resume``, ``SetTenant``,
    ``SetModelBudget``; each checked its values when it was made).

    What a backend promises:

    - **Order.** Messages take effect in the order they were sent, so a
      ``Cancel`` never overtakes its ``Acquire``. Free slots go to the
      waiting ticket of lowest ``(rank, seq)`` among those its budgets hold
      (and, with tenants, to the waiting tenant with the least service for
      its weight); a ticket's ``model`` needs that model's budget too.
    - **Answers.** Each ``Acquire`` is answered exactly once on its reply:
      ``granted`` or ``refused`` (``QueueFull`` past ``max_waiting``,
      ``DispatcherClosed`` once closed, the policy's ``ValueError`` or
      ``RuntimeError`` for a misuse), from ``send`` itself or from the
      backend's task. A grant that reaches a reply whose requester gave up
      is released by the requester's ``Cancel``.
    - **Never blocking.** ``send`` is synchronous and never blocks, so a
      slot is given back from a ``finally`` under cancellation without a
      shield; it raises ``trio.ClosedResourceError`` once the backend is
      closed.
    - **Leases.** A backend whose slots can be lost (the Redis-shared one)
      calls ``reply.lease_until(deadline)`` before a grant and at each
      renewal; one that cannot never calls it.
    - **Statistics.** ``statistics()`` reflects every message sent so far.
    - **Running.** ``run`` is started once in the dispatcher's nursery and
      serves until ``close`` or cancellation, then fails every waiter with
      ``DispatcherClosed``. ``run(stop_when_idle=True)`` may return
      ``True`` when the provider is unlimited and nothing is held, waiting
      or queued; the dispatcher calls ``run`` again when the provider is
      next used, on the same backend, which keeps its counters.
    """

    @property
    def provider(self) -> str:
        """The provider's name."""
        ...

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        """A fresh ticket of ``rank``: its ``seq`` orders it among equal ranks.

        ``tenant`` is the tenant the request is made for (``None``: the
        default tenant), ``model`` the model it asks for (``None``: none
        named); both are carried by the ticket, unchecked (the caller
        checked them).
        """
        ...

    def send(self, message: SchedulerMessage) -> None:
        """Hand the backend one message; never blocks.

        Raises:
            trio.ClosedResourceError: The backend is closed.
        """
        ...

    def statistics(self) -> ProviderStatistics:
        """A snapshot of the provider, every message sent so far counted.

        Its ``models`` and ``tenants`` show each model's budget and each
        tenant's share.
        """
        ...

    def close(self) -> None:
        """Refuse further messages; ``run`` stops and fails every waiter."""
        ...

    async def run(self, *, stop_when_idle: bool = False) -> bool:
        """Serve until closed or cancelled; ``True`` if it stopped when idle."""
        ...
