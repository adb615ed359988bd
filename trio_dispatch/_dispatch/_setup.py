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
from .._policy._slots import (
    DEFAULT_AFFINITY_WAIT,
    DEFAULT_FAILURE_COOLDOWN,
    DEFAULT_FAILURE_THRESHOLD,
    MemberState,
    PolicyStatistics,
    SlotPolicy,
)
from ._backend import provider_statistics
from ._pools import groups_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .._observe._translator import Translator
    from .._policy._budgets import BudgetStatistics
    from .._policy._slots import MemberStatistics, PoolStatistics
    from .._policy._tenants import TenantStatistics
    from .._server_load._load import ServerLoad
    from ..messages._limits import Budget, Tenant
    from ..messages._protocol import Ticket
    from ._backend import Counts, Fleet, ProviderStatistics


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
        members: For the scheduler of a group of pooled providers (see
            ``open_dispatcher``'s ``pools``), the setups of its other
            members (``provider`` is the first): their limits and budgets.
            Empty for one provider.
        pools: The pools over the members, by name; empty for one provider.
        affinity_wait: How long a request waits for the member of its
            conversation's previous call while another could serve it.
        failure_threshold: A member's calls failed in a row that take it
            out of service.
        failure_cooldown: Seconds a member stays out of service.
        carried: What the provider learned and holds under a scheduler it
            had before (its budgets, adaptive limit, pause and holders,
            ``SlotPolicy.member_state``), for a provider that joins a pool
            at run time: the new policy takes them on instead of starting
            afresh. ``None``: none.
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
    members: tuple[BackendSetup, ...] = ()
    pools: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    affinity_wait: float = DEFAULT_AFFINITY_WAIT
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    failure_cooldown: float = DEFAULT_FAILURE_COOLDOWN
    carried: MemberState | None = None

    def policy(self) -> SlotPolicy:
        """A new ``SlotPolicy`` of the provider that honours every setting here.

        Its limit, ``max_waiting``, pauses, budgets (the provider's and its
        models', learning as ``learn_budgets`` says) and tenants; its
        budgets start full now (``clock()``). For a group of pooled
        providers, each member with its own, and the pools.
        """
        now = self.clock()
        policy = SlotPolicy(
            self.limit,
            provider=self.provider,
            max_waiting=self.max_waiting,
            default_pause=self.default_pause,
            max_pause=self.max_pause,
            throttle=self._throttle(now),
            tenants=self.tenants,
            models=self._model_throttles(now),
            affinity_wait=self.affinity_wait,
            failure_threshold=self.failure_threshold,
            failure_cooldown=self.failure_cooldown,
            now=now,
        )
        if self.carried is not None:
            policy.carry(self.carried)
        for member in self.members:
            member.join(policy, now)
        for pool, names in self.pools.items():
            policy.set_pool(pool, names)
        return policy

    def join(
        self,
        policy: SlotPolicy,
        now: float,
        waiting: Iterable[tuple[Ticket, int]] = (),
    ) -> list[Ticket]:
        """Make the provider a member of ``policy`` (a group's), with its limit, budgets and pause.

        And, ``carried``, the holders it brings, and ``waiting``, the
        tickets that waited for it under its own scheduler (each with its
        estimate), queued in their place before anything is granted on it.

        Returns the tickets it takes at once.

        Raises:
            ValueError: It is a member or a pool of ``policy`` already.
        """
        carried = self.carried
        return policy.add_member(
            self.provider,
            self.limit,
            throttle=self._throttle(now),
            models=self._model_throttles(now),
            carried=carried,
            waiting=waiting,
        )

    def _throttle(self, now: float) -> Throttle | None:
        """The throttle of the provider's own budget, if it has one (carried: as it was)."""
        if self.carried is not None:
            return self.carried.throttle
        budget = self.budget
        if budget is None:
            return None
        return Throttle(budget, learn=self.learn_budgets, now=now)

    def _model_throttles(self, now: float) -> dict[str, Throttle]:
        """The throttles of its models' budgets, by model (carried: as they were)."""
        if self.carried is not None:
            return dict(self.carried.models)
        return {
            model: Throttle(model_budget, learn=self.learn_budgets, now=now)
            for model, model_budget in self.model_budgets.items()
        }


def fleet_name(pools: Iterable[str]) -> str:
    """The name a group of ``pools`` has in a fleet's ledger: the same in every process.

    Its pools' names, sorted, each as its length, a colon and the text
    (so that any text is a name), after ``"pools "``.
    """
    return "pools " + "".join(f"{len(pool)}:{pool}" for pool in sorted(pools))


def fleet_groups(
    pools: Mapping[str, tuple[str, ...]],
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each pooled provider's group in a fleet's ledger: its name and its members, in order.

    The groups ``open_dispatcher``'s ``pools`` make (pools that share a
    member are one), as the dispatcher makes them.
    """
    return {
        name: (fleet_name(group.pools), tuple(group.members))
        for name, group in groups_of(pools).items()
        if name not in group.pools
    }


def pooled(policy: SlotPolicy) -> bool:
    """Whether ``policy`` schedules pooled providers: several members, or a pool."""
    return len(policy.members) > 1 or bool(policy.pools)


def policy_statistics(
    provider: str, policy: SlotPolicy, now: float, *, member: str | None = None
) -> ProviderStatistics:
    """``provider``'s snapshot at ``now``, as its ``policy`` sees it: one local backend's.

    Its counts and totals, its pause, its adaptive limit, and the budgets
    of the provider and its models and the tenants' shares at ``now``
    (through ``provider_statistics``, the one builder of every backend's).
    With ``member``, that member's, of a pooled policy: its limit, pause,
    budgets, server and the slots it holds; ``waiting`` counts the
    requests waiting for it alone (asked of it, or preferring it), and the
    queue's totals (withdrawn, refused, the most waiting) are the whole
    policy's, whose one queue it shares.
    """
    stats = policy.statistics()
    if member is None:
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
            # A provider alone: its failures in a row (it never goes out).
            health=None
            if pooled(policy)
            else next(iter(policy.member_statistics().values())),
        )
    if member in policy.pools:
        pool = policy.pool_statistics()[member]
        return pool_as_provider(
            provider,
            pool,
            policy.member_statistics(),
            stats,
            policy.tenant_statistics(now),
        )
    own = policy.member_statistics()[member]
    adaptive, budget = policy.member_budgets(member, now)
    return member_as_provider(
        provider,
        own,
        stats,
        adaptive=adaptive,
        budget=budget,
        models=policy.model_budget_statistics(now, member=member),
        tenants=policy.tenant_statistics(now),
        server_load=policy.member_server_load(member),
    )


def member_as_provider(  # what a member's snapshot is made of
    provider: str,
    own: MemberStatistics,
    queue: Counts,
    *,
    adaptive: bool,
    budget: BudgetStatistics | None,
    models: Mapping[str, BudgetStatistics],
    tenants: Mapping[str, TenantStatistics],
    server_load: tuple[ServerLoad | None, int | None] = (None, None),
    fleet: Fleet | None = None,
) -> ProviderStatistics:
    """A member's snapshot as a provider's: every scheduler of a pool builds it so.

    Its own slots (``own``), and the totals of the queue it shares
    (``queue``); ``fleet``, a shared scheduler's view of the member.
    """
    counts = PolicyStatistics(
        limit=own.limit,
        in_flight=own.in_flight,
        waiting=own.waiting,
        paused_until=own.paused_until,
        granted_total=own.granted_total,
        released_total=own.released_total,
        withdrawn_total=queue.withdrawn_total,
        rejected_total=queue.rejected_total,
        peak_in_flight=own.peak_in_flight,
        peak_waiting=queue.peak_waiting,
    )
    return provider_statistics(
        provider,
        counts,
        fleet=fleet,
        limit=own.limit,
        paused_until=own.paused_until,
        adaptive=adaptive,
        budget=budget,
        models=models,
        tenants=tenants,
        server_load=server_load,
        affinity=(own.affinity_hits, own.affinity_moves),
        health=own,
    )


def pool_as_provider(
    provider: str,
    pool: PoolStatistics,
    members: Mapping[str, MemberStatistics],
    queue: Counts,
    tenants: Mapping[str, TenantStatistics],
    *,
    fleet: Fleet | None = None,
) -> ProviderStatistics:
    """A pool's snapshot as a provider's: what an integration reads of the name it uses.

    Its limit, slots and waiting requests (``PoolStatistics``); paused while
    every limited member is, until the first of them resumes; its members'
    grants and releases added up, and the queue's totals; ``fleet``, a
    shared scheduler's view of the pool.
    """
    own = [members[name] for name in pool.members]
    pauses = [m.paused_until for m in own if m.limit is not None]
    paused_until = (
        min(pauses) if pauses and None not in pauses else None  # type: ignore[type-var]  # no None
    )
    counts = PolicyStatistics(
        limit=pool.limit,
        in_flight=pool.in_flight,
        waiting=pool.waiting,
        paused_until=paused_until,
        granted_total=sum(m.granted_total for m in own),
        released_total=sum(m.released_total for m in own),
        withdrawn_total=queue.withdrawn_total,
        rejected_total=queue.rejected_total,
        peak_in_flight=queue.peak_in_flight,
        peak_waiting=queue.peak_waiting,
    )
    return provider_statistics(
        provider,
        counts,
        fleet=fleet,
        limit=pool.limit,
        paused_until=paused_until,
        adaptive=False,
        budget=None,
        models={},
        tenants=tenants,
        affinity=(pool.affinity_hits, pool.affinity_moves),
    )
