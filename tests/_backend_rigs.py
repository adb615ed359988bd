"""A third backend, written with ``trio_dispatch.lowlevel`` names alone.

``CountingBackend`` wraps the local scheduler and counts what the
dispatcher asks of it; ``Made`` is the factory ``open_dispatcher_with``
takes, one of them per provider. Shared by the tests of the backend
interface and of tenants.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, final

from trio_dispatch.lowlevel import (
    Backend,
    BackendSetup,
    Reply,
    SchedulerActor,
    SlotPolicy,
    Ticket,
)

if TYPE_CHECKING:
    from trio_dispatch import (
        AdaptiveLimit,
        Budget,
        ProviderStatistics,
        RateLimitInfo,
        Tenant,
    )


@final
class CountingBackend:
    """The local scheduler of one provider, counting the calls it gets.

    With ``refusal`` or ``granting_at`` set, it answers an ``acquire``
    itself, through the ``Reply``'s public names, instead of the local
    scheduler: refused with ``refusal``, or granted at ``granting_at``.
    """

    def __init__(self, provider: str | BackendSetup) -> None:
        self.inner = (
            SchedulerActor(provider, SlotPolicy(None))
            if isinstance(provider, str)
            else SchedulerActor.from_setup(provider)
        )
        self.calls: collections.Counter[str] = collections.Counter()
        self.refusal: Exception | None = None
        self.granting_at: float | None = None

    @property
    def provider(self) -> str:
        return self.inner.provider

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        return self.inner.ticket(rank, priority, tenant, model)

    def acquire(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None = None,
        tokens: int = 0,
    ) -> None:
        self.calls["acquire"] += 1
        if self.refusal is not None:
            reply.refused(self.refusal)
        elif self.granting_at is not None:
            reply.granted(ticket, self.granting_at)
        else:
            self.inner.acquire(ticket, reply, conversation_id, tokens)

    def release(self, ticket: Ticket) -> None:
        self.calls["release"] += 1
        self.inner.release(ticket)

    def cancel(self, ticket: Ticket) -> None:
        self.calls["cancel"] += 1
        self.inner.cancel(ticket)

    def answered(self, ticket: Ticket) -> None:
        self.calls["answered"] += 1
        self.inner.answered(ticket)

    def report_usage(self, ticket: Ticket, tokens: int) -> None:
        self.calls["report_usage"] += 1
        self.inner.report_usage(ticket, tokens)

    def set_limit(self, limit: int | AdaptiveLimit | None) -> None:
        self.calls["set_limit"] += 1
        self.inner.set_limit(limit)

    def pause(self, reported_at: float, retry_after: float | None) -> None:
        self.calls["pause"] += 1
        self.inner.pause(reported_at, retry_after)

    def resume(self) -> None:
        self.calls["resume"] += 1
        self.inner.resume()

    def set_tenant(self, tenant: str, settings: Tenant | None) -> None:
        self.calls["set_tenant"] += 1
        self.inner.set_tenant(tenant, settings)

    def set_model_budget(self, model: str, budget: Budget) -> None:
        self.calls["set_model_budget"] += 1
        self.inner.set_model_budget(model, budget)

    def observe_rate_limits(
        self, observed_at: float, info: RateLimitInfo, model: str | None = None
    ) -> None:
        self.calls["observe_rate_limits"] += 1
        self.inner.observe_rate_limits(observed_at, info, model)

    def adaptive_value(self) -> int | None:
        return self.inner.adaptive_value()

    def handle_backlog(self) -> None:
        self.inner.handle_backlog()

    def statistics(self) -> ProviderStatistics:
        self.calls["statistics"] += 1
        return self.inner.statistics()

    def close(self) -> None:
        self.calls["close"] += 1
        self.inner.close()

    async def run(self, *, stop_when_idle: bool = False) -> bool:
        self.calls["run"] += 1
        return await self.inner.run(stop_when_idle=stop_when_idle)


class Made:
    """The factory given to ``open_dispatcher_with``: one backend per provider."""

    def __init__(self) -> None:
        self.backends: dict[str, CountingBackend] = {}
        self.setups: dict[str, BackendSetup] = {}

    def __call__(self, setup: BackendSetup) -> Backend:
        assert setup.provider not in self.backends, "made twice"
        self.setups[setup.provider] = setup
        backend = self.backends[setup.provider] = CountingBackend(setup)
        return backend
