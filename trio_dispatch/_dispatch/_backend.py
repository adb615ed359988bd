"""The backend interface: what the dispatcher asks of one provider's scheduler.

The dispatcher holds one ``Backend`` per provider and never asks which
kind it is: the local ``SchedulerActor`` (one process, on ``SlotPolicy``)
and the Redis-shared scheduler (a fleet, through the ledger) both
implement it, and so can a third written with the names of
``trio_dispatch.lowlevel`` alone.

A backend is an actor: one task (``run``, which the dispatcher starts in
its nursery) owns its state, and every change to that state goes through
its message handling. Every method below except ``run`` is synchronous and
never blocks, so a slot is given back from a ``finally`` under
cancellation without a shield. The methods that queue a message raise
``trio.ClosedResourceError`` once the backend is closed.

``run(stop_when_idle=True)`` may return ``True`` when the provider is
unlimited and nothing is held, waiting or queued; the dispatcher calls
``run`` again when the provider is next used, on the same backend, which
keeps its counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._policy._budgets import AdaptiveLimit, BudgetStatistics
    from .._policy._ratelimits import RateLimitInfo
    from .._policy._tenants import TenantStatistics
    from ..messages._limits import Budget, Tenant
    from ..messages._protocol import Reply, Ticket


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
) -> ProviderStatistics:
    """The snapshot of ``provider``: every backend's, built one way.

    ``own`` is the scheduler's own counts (its policy's, or the Redis
    book's), ``fleet`` what a shared backend saw of the fleet (``None`` for
    a local one): then ``in_flight`` and ``waiting`` are the fleet's, and
    ``local_in_flight`` and ``local_waiting`` this process's.
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
    )


class Backend(Protocol):
    """One provider's scheduler, as the dispatcher uses it.

    Requests: ``ticket`` orders one, ``acquire`` queues it with the
    ``Reply`` the answer goes to (``Slot`` is one), and exactly one of
    ``release`` (once granted) or ``cancel`` (any time; of a granted
    ticket it is a release) ends it. A ticket names the tenant it is made
    for and the model it asks for, if any: the next free slot goes to the
    waiting tenant with the least service for its weight, and a request of
    a model needs that model's budget too. Settings: ``set_limit``,
    ``pause``, ``resume``, ``set_tenant``, ``set_model_budget``, and what
    the provider's answers teach (``answered``, ``report_usage``,
    ``observe_rate_limits``).
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

    def acquire(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None = None,
        tokens: int = 0,
    ) -> None:
        """Queue a request; its grant or refusal goes to ``reply``."""
        ...

    def release(self, ticket: Ticket) -> None:
        """Give back the slot of a granted ticket."""
        ...

    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a ticket: a waiting one leaves, a granted one is released."""
        ...

    def answered(self, ticket: Ticket) -> None:
        """The answer of a granted ticket's request has started."""
        ...

    def report_usage(self, ticket: Ticket, tokens: int) -> None:
        """The tokens a granted ticket's request used, to correct its charge."""
        ...

    def set_limit(self, limit: int | AdaptiveLimit | None) -> None:
        """A new limit: fixed, adaptive, or ``None`` for unlimited."""
        ...

    def pause(self, reported_at: float, retry_after: float | None) -> None:
        """A rate-limit answer came at ``reported_at``: pause the grants."""
        ...

    def resume(self) -> None:
        """End the pause now, and its backoff streak."""
        ...

    def set_tenant(self, tenant: str, settings: Tenant | None) -> None:
        """Give ``tenant`` a weight and a cap from now on; ``None``: the defaults.

        Raising a cap or a weight may grant at once; lowering a cap lets
        the tenant's holders finish.

        Raises:
            TypeError: ``tenant`` is not a string, or ``settings`` is not a
                ``Tenant`` or ``None``.
            ValueError: ``tenant`` is empty or longer than 256 characters.
        """
        ...

    def set_model_budget(self, model: str, budget: Budget) -> None:
        """Give ``model`` a budget of its own, beside the provider's.

        A request for ``model`` is granted only when both budgets hold
        it. The budget starts full; figures from the model's answers still
        lower it (as they do the provider's).

        Raises:
            TypeError: ``model`` is not a string or ``budget`` not a
                ``Budget``.
            ValueError: ``model`` is empty.
        """
        ...

    def observe_rate_limits(
        self, observed_at: float, info: RateLimitInfo, model: str | None = None
    ) -> None:
        """The rate-limit figures of one of the provider's answers.

        ``model`` is the model the answer is for: the figures teach that
        model's budget (learned from its first figures on); ``None``, the
        provider's.
        """
        ...

    def adaptive_value(self) -> int | None:
        """An adaptive limit's current value, or ``None`` if not known here."""
        ...

    def handle_backlog(self) -> None:
        """Handle the queued messages now, in the calling task, if it can."""
        ...

    def statistics(self) -> ProviderStatistics:
        """A snapshot of the provider, every message queued so far handled.

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
