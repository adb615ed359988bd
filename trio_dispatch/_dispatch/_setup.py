"""What a new backend is told: ``BackendSetup``, one frozen value per provider.

``open_dispatcher_with(new_backend, ...)`` calls ``new_backend(setup)``
once per provider, when it is first limited or used; so does
``open_dispatcher`` for its own backends, the local ``SchedulerActor``
(``SchedulerActor.from_setup``) and the Redis-shared scheduler. The setup
holds everything the dispatcher knows that concerns the provider: its
limit, its budgets, the tenants, ``max_waiting``, the pauses' settings,
where the events go, the clock, and the callbacks by which a backend that
learns the fleet's limits and tenants (Redis) tells the dispatcher.
``policy()`` builds the ``SlotPolicy`` that honours all of it, so a
backend on the policy honours every option by one call, and
``policy_statistics`` reports such a policy as ``statistics()`` must.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from .._policy._budgets import Throttle
from .._policy._slots import SlotPolicy
from ._backend import provider_statistics

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._observe._translator import Translator
    from ..messages._limits import Budget, Tenant
    from ._backend import ProviderStatistics


@final
@attrs.frozen(kw_only=True)
class BackendSetup:
    """What the dispatcher hands the backend it makes for one provider.

    Made by the dispatcher only; a backend factory reads it.

    Attributes:
        provider: The provider's name.
        limit: The provider's limit known when the backend is made (an
            adaptive limit's current value), or ``None``. A limit set later
            reaches the backend through its protocol, as does a limit given
            to ``open_dispatcher`` for a local dispatcher.
        budget: The provider's own ``Budget`` (``budgets[provider]``), or
            ``None``.
        model_budgets: The budgets of its models (``budgets["provider/model"]``),
            by model.
        tenants: The tenants configured when it is made, by name; later
            changes reach the backend through its protocol.
        max_waiting: At most this many requests wait; one more is refused
            with ``QueueFull``. ``None`` for no bound.
        default_pause: The first pause of a streak of rate-limit reports
            that name no delay, in seconds.
        max_pause: The longest pause, in seconds.
        learn_budgets: Whether the budgets learn from the answers' figures.
        priority_aging: Seconds of turn age one priority class is worth
            (a ticket's rank already counts it).
        events: The ``Translator`` of this provider: tell it what each
            step did (queued, granted, released, refused, paused...), and it
            makes the log lines and the events ``Dispatcher.events()``
            yields. Its ``listening`` says whether anything listens.
        clock: The dispatcher's clock (``trio.current_time``).
        learn_limit: Call ``learn_limit(provider, limit)`` when the
            provider's limit changes other than by a ``SetLimit`` or
            ``Adapt`` the dispatcher sent: an adaptive limit's moves, a
            limit set elsewhere (another process). ``Dispatcher.limits()``
            shows what it was told.
        learn_tenant: Call ``learn_tenant(tenant, settings)`` (``None``:
            the defaults) when it learns a tenant's setting made elsewhere.
    """

    provider: str
    limit: int | None
    budget: Budget | None
    model_budgets: Mapping[str, Budget]
    tenants: Mapping[str, Tenant]
    max_waiting: int | None
    default_pause: float
    max_pause: float
    learn_budgets: bool
    priority_aging: float
    events: Translator
    clock: Callable[[], float]
    learn_limit: Callable[[str, int | None], None]
    learn_tenant: Callable[[str, Tenant | None], None]

    def policy(self) -> SlotPolicy:
        """A new ``SlotPolicy`` of the provider that honours every setting here.

        Its limit, ``max_waiting``, pauses, budgets (the provider's and its
        models', learning as ``learn_budgets`` says) and tenants; its
        budgets start full now (``clock()``).
        """
        now = self.clock()
        learn = self.learn_budgets
        budget = self.budget
        policy = SlotPolicy(
            self.limit,
            provider=self.provider,
            max_waiting=self.max_waiting,
            default_pause=self.default_pause,
            max_pause=self.max_pause,
            throttle=None if budget is None else Throttle(budget, learn=learn, now=now),
            tenants=self.tenants,
            models={
                model: Throttle(model_budget, learn=learn, now=now)
                for model, model_budget in self.model_budgets.items()
            },
        )
        policy.advance(now)
        return policy


def policy_statistics(
    provider: str, policy: SlotPolicy, now: float
) -> ProviderStatistics:
    """``provider``'s snapshot at ``now``, as its ``policy`` sees it: one local backend's.

    Its counts and totals, its pause, its adaptive limit, and the budgets
    of the provider and its models and the tenants' shares at ``now``
    (through ``provider_statistics``, the one builder of every backend's).
    """
    stats = policy.statistics()
    throttle = policy.throttle
    return provider_statistics(
        provider,
        stats,
        limit=stats.limit,
        paused_until=stats.paused_until,
        adaptive=throttle is not None and throttle.adaptive is not None,
        budget=policy.budget_statistics(now),
        models=policy.model_budget_statistics(now),
        tenants=policy.tenant_statistics(now),
        server_load=policy.server_load,
    )
