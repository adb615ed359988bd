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
    Acquire,
    Adapt,
    Answered,
    Backend,
    BackendSetup,
    Cancel,
    ObserveLatency,
    ObserveRateLimits,
    ObserveServerLoad,
    Pause,
    Release,
    ReportUsage,
    Resume,
    SchedulerActor,
    SetLimit,
    SetModelBudget,
    SetTenant,
    SlotPolicy,
    Ticket,
)

if TYPE_CHECKING:
    from trio_dispatch import ProviderStatistics
    from trio_dispatch.lowlevel import SchedulerMessage

# What each message asks, as the backend interface's methods were named.
_CALLED: dict[type, str] = {
    Acquire: "acquire",
    Release: "release",
    Cancel: "cancel",
    Answered: "answered",
    ReportUsage: "report_usage",
    ObserveLatency: "observe_latency",
    ObserveServerLoad: "observe_server_load",
    SetLimit: "set_limit",
    Adapt: "set_limit",
    Pause: "pause",
    Resume: "resume",
    SetTenant: "set_tenant",
    SetModelBudget: "set_model_budget",
    ObserveRateLimits: "observe_rate_limits",
}


@final
class CountingBackend:
    """The local scheduler of one provider, counting the calls it gets.

    Each message is counted under the name of what it asks
    (``"acquire"``, ``"set_tenant"``...), and kept in ``sent``, in order. With ``refusal`` or
    ``granting_at`` set, it answers an ``Acquire``
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
        self.sent: list[SchedulerMessage] = []
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

    def send(self, message: SchedulerMessage) -> None:
        self.calls[_CALLED[type(message)]] += 1
        self.sent.append(message)
        if isinstance(message, Acquire) and self.refusal is not None:
            message.reply.refused(self.refusal)
        elif isinstance(message, Acquire) and self.granting_at is not None:
            message.reply.granted(message.ticket, self.granting_at)
        else:
            self.inner.send(message)

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
