"""The shared scheduler actor: one provider's slots, granted fleet-wide via Redis.

Design note. It is a ``Backend`` as ``SchedulerActor`` is (the same
messages through ``send``, the same ``Reply``), so ``Slot`` and the
dispatcher use either, and it follows the same rule: the sender of a
message takes it into the book at once (``_take``, the one handler),
unless a task is handling messages or a round's answer, which then takes
it before it goes on. Its own task (``run``) runs the rounds. This actor
is the only code that talks to Redis for its provider. It keeps its local
waiters in a ``SharedBook`` (oldest first) and, in rounds, sends the
ledger one ``step``: the leases given back and the entries withdrawn since
the last round, its oldest waiters to publish, its renewals, and a request
for the grants that the global queue allows it. Grants are delivered as in
the local actor; a grant that reaches a requester who has just given up is
released by that requester's ``Cancel`` in the next round.

A round runs when a message arrives, when a wake-up is published on the
provider's channel (every release, withdrawal, limit change and resume
publishes one), when leases and entries are due for renewal (every third
of the lease), when a pause ends, and, while anything waits, on a slow
poll: the safety net for a lost wake-up.

While the ledger cannot be reached nothing new is granted (the ledger
alone can say that a slot is free); holders keep their slots, waiters keep
waiting, and rounds are retried with a growing delay. A holder's lease is
sure to live until ``lease`` after the start of the last round that
granted or renewed it (Redis counts from when it ran the round, later):
at that moment, if no round has renewed it since, the holder's body is
cancelled and its slot given back with ``LeaseLost``, since the fleet may
grant that slot again from then on. Each grant and renewal moves the
holder's deadline (``lease_until``), so nothing here watches the time. A round whose
answer did not come may or may not have been applied: the next round that
reaches Redis sends the same releases, withdrawals and entries again (the
ledger's steps are idempotent), so nothing is queued twice and a grant the
lost answer carried reaches its waiter, or is given back if the waiter
left meanwhile. The leases and entries of a process that vanished expire
after ``lease``.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import uuid
from typing import TYPE_CHECKING, Final, final

import anyio
import attrs
import trio
from coredis.exceptions import RedisError

from .._dispatch._backend import provider_statistics
from .._dispatch._setup import member_as_provider, pool_as_provider
from .._exceptions import DispatcherClosed, QueueFull
from .._observe._hub import EventHub
from .._observe._translator import FLEET_PAUSE, Translator
from .._policy._budgets import AdaptiveLimit, BudgetStatistics, refilled
from .._policy._latency import LatencySignal
from .._policy._slots import (
    DEFAULT_AFFINITY_WAIT,
    DEFAULT_FAILURE_COOLDOWN,
    DEFAULT_FAILURE_THRESHOLD,
    MemberStatistics,
    PoolStatistics,
)
from .._policy._tenants import TenantStatistics
from .._util import put_or_remove
from ..actors._mailbox import Mailbox
from ..actors._scheduler import granted_on
from ..messages._protocol import (
    Acquire,
    Adapt,
    Answered,
    Cancel,
    Failed,
    ForMember,
    ObserveLatency,
    ObserveRateLimits,
    ObserveServerLoad,
    Pause,
    Release,
    RemovePool,
    ReportUsage,
    Resume,
    SchedulerMessage,
    SetLimit,
    SetModelBudget,
    SetPool,
    SetTenant,
    Ticket,
)
from ._ledger import LedgerMember, NamespaceLost, SeenModels, StepResult, wakes
from ._scripts import Seed, lane_text

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._dispatch._backend import ProviderStatistics
    from .._policy._budgets import Budget
    from .._policy._ratelimits import RateLimitInfo
    from .._policy._slots import ServiceState
    from ..messages._limits import Tenant
    from ..messages._protocol import Reply
    from ._book import SharedBook
    from ._ledger import Ledger, LedgerBudget, LedgerTenant
    from ._scripts import Plan

_logger = logging.getLogger("trio_dispatch")

# What a lost connection raises, from coredis, anyio or the socket below.
# The longest a round may take, answer included, before it counts as a
# failure of the backend; it also bounds how long a close can wait for it.
_ROUND_TIMEOUT: Final = 1.0

BACKEND_ERRORS: Final = (
    RedisError,
    OSError,
    TimeoutError,
    trio.BrokenResourceError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


_FIRST_RETRY: Final = 0.05
_PAUSE_SLACK: Final = 0.05
_LAST_RETRY: Final = 1.0


@final
@attrs.frozen
class SharedView:
    """What the last round saw of the whole fleet, for ``statistics()``.

    ``budget_ready_at`` is when the head of the fleet's queue will fit its
    budgets (trio clock), if they hold it back. ``models`` holds each
    model's budgets as the latest round that met the model saw them, and
    when (trio clock): a round reads only the models of its own requests.
    """

    in_flight: int = 0
    waiting: int = 0
    paused_until: float | None = None
    up: bool = True
    adaptive: AdaptiveLimit | None = None
    budget: LedgerBudget | None = None
    budget_at: float = 0.0
    budget_ready_at: float | None = None
    tenants: dict[str, LedgerTenant] = attrs.field(factory=dict)
    models: SeenModels = attrs.field(factory=SeenModels)

    def budget_statistics(self, now: float) -> BudgetStatistics | None:
        """The fleet's budgets at ``now``, as the last round saw them."""
        budget = self.budget
        if budget is None:
            return None
        return self._statistics(budget, now, budget.ready_in is not None)

    def model_statistics(self, now: float) -> dict[str, BudgetStatistics]:
        """Each model's fleet-wide budgets at ``now``, as the last round that met it saw them.

        Not those of learned budgets forgotten by ``now``.
        """
        return {
            model: self._statistics(budget, now, budget.ready_in is not None, at)
            for model, budget, at in self.models.items(now)
        }

    def tenant_statistics(self) -> dict[str, TenantStatistics]:
        """Each tenant of the fleet, as the last round saw it."""
        return {
            name: TenantStatistics(
                tenant=name,
                weight=tenant.weight,
                limit=tenant.limit,
                in_flight=tenant.in_flight,
                waiting=tenant.queued,
                service=tenant.service,
            )
            for name, tenant in sorted(self.tenants.items())
        }

    def _statistics(
        self,
        budget: LedgerBudget,
        now: float,
        waiting: bool,
        at: float | None = None,
    ) -> BudgetStatistics:
        seconds = max(0.0, now - (self.budget_at if at is None else at))
        return BudgetStatistics(
            requests_per_minute=budget.requests_per_minute,
            tokens_per_minute=budget.tokens_per_minute,
            requests_available=_level(
                budget.requests_available,
                budget.requests_capacity,
                budget.requests_per_minute,
                seconds,
            ),
            tokens_available=_level(
                budget.tokens_available,
                budget.tokens_capacity,
                budget.tokens_per_minute,
                seconds,
            ),
            learned=budget.learned,
            waiting_for_budget=waiting,
        )


def _level(
    level: float | None,
    capacity: float | None,
    per_minute: float | None,
    seconds: float,
) -> float | None:
    """A bucket's level ``seconds`` after the round that saw it, if it has one."""
    if level is None or capacity is None or per_minute is None:
        return level
    return refilled(level, capacity, per_minute / 60.0, seconds)


@final
class _Share:
    """One provider's part of a shared scheduler: a provider's own, or a member's of a group.

    What this process asks the ledger to store for it (limits, pauses,
    resumes, its models' budgets), its figures and latency verdicts not
    sent yet, the settings the fleet holds for it (stored again where Redis
    lost them), what the last round saw of it, and this process's own
    counts of its slots.
    """

    __slots__ = (
        "fleet_budget",
        "fleet_models",
        "granted_total",
        "holding",
        "latency",
        "limit",
        "limit_writes",
        "member",
        "model_budgets",
        "name",
        "observed",
        "observed_models",
        "pauses",
        "peak_in_flight",
        "released_total",
        "resume",
        "seen",
        "verdicts",
        "view",
    )

    def __init__(self, name: str, member: str | None, limit: int | None) -> None:
        self.name = name
        # As the ledger's calls name it: None for a provider (its own keys).
        self.member = member
        self.limit = limit
        self.limit_writes: list[int | AdaptiveLimit | None] = []
        # A latency-signal limit: this process's own signal, over its own
        # calls, and its verdicts not yet sent. The ledger applies them to
        # the fleet's limit (Adaptive.move): the processes' shares of the
        # calls make their rounds, and move the limit together as one
        # process seeing every call would.
        self.latency: LatencySignal | None = None
        self.verdicts: list[int] = []
        # The latest rate-limit figures not yet sent: its own, each model's.
        self.observed: RateLimitInfo | None = None
        self.observed_models: dict[str, RateLimitInfo] = {}
        # Its models' budgets to store, the latest of each.
        self.model_budgets: dict[str, Budget] = {}
        self.pauses: list[float | None] = []
        self.resume = False
        # The fleet's settings as the last round saw them, with this
        # process's writes since: stored again where Redis lost them.
        self.fleet_budget: Budget | None = None
        self.fleet_models: dict[str, Budget] = {}
        self.view = SharedView()
        # A member's, as the last round saw it: its health and affinity.
        self.seen: LedgerMember | None = None
        self.granted_total = 0
        self.released_total = 0
        # This process's slots held on it now, and the most at once.
        self.holding = 0
        self.peak_in_flight = 0

    def idle(self) -> bool:
        """Nothing of it left to send."""
        return not (
            self.limit_writes
            or self.verdicts
            or self.pauses
            or self.resume
            or self.observed is not None
            or self.observed_models
            or self.model_budgets
        )

    def judge(self, limit: AdaptiveLimit | None) -> None:
        """A new limit: a latency signal starts afresh for it, or there is none.

        The verdicts not sent yet were of the old limit's rounds.
        """
        latency = limit is not None and limit.signal == "latency"
        self.latency = LatencySignal() if latency else None
        self.verdicts.clear()

    def take_figures(
        self,
    ) -> tuple[RateLimitInfo | None, dict[str, RateLimitInfo], list[int]]:
        """Its figures and verdicts, for a round: taken out until it fails."""
        taken = (self.observed, self.observed_models, self.verdicts)
        self.observed, self.observed_models, self.verdicts = None, {}, []
        return taken

    def figures_failed(
        self, observed: RateLimitInfo | None, by_model: dict[str, RateLimitInfo]
    ) -> None:
        """A round did not reach the ledger: its figures go with the next.

        But for its latency verdicts: the step may have applied them with
        its answer lost, and a move applied twice is no idempotent change
        (a rise in the slow start would double twice). The signal's next
        rounds judge again.
        """
        if self.observed is None:
            self.observed = observed
        # Figures that came since are newer.
        self.observed_models = by_model | self.observed_models

    def seed_limit(self) -> int | AdaptiveLimit | None:
        """Its limit as the fleet holds it: an adaptive one goes on from its current value."""
        adaptive = self.view.adaptive
        if adaptive is not None and self.limit is not None:
            return attrs.evolve(adaptive, initial=self.limit)
        return self.limit


@final
class SharedSchedulerActor:
    """The scheduler of one provider, or one group of pooled providers, shared through Redis.

    Args:
        provider: The provider's name; a group's, its name in the ledger
            (``fleet_name``).
        book: Its bookkeeping, kept by the dispatcher across restarts;
            ``pooled`` for a group.
        ledger: The namespace's scripts.
        limit: The limit known when it starts (stored in Redis if none is).
        default_pause: The backoff's first pause, as the dispatcher's.
        max_pause: The longest pause, as the dispatcher's.
        on_limit: Called with the stored limit whenever a round learns it
            (a member's name with a member's).
        on_tenant: Called with a tenant's settings (``None``: not
            configured) whenever a round learns that the fleet's changed.
        members: A group's members, in order, each with its limit known
            when it starts (``limit`` is then unused); empty for a provider.
        pools: A group's pools, each with its members in order.
        events: The name its events and log lines give the group.
        affinity_wait: How long a group's request waits for its member.
        failure_threshold: A group member's failures in a row that take it
            out of service.
        failure_cooldown: How long a group member stays out of service.
    """

    __slots__ = (
        "_affinity",
        "_asked",
        "_backoff",
        "_crash",
        "_default_pause",
        "_dirty",
        "_entered",
        "_epoch",
        "_events",
        "_fleet_tenants",
        "_handling",
        "_holding",
        "_inbox",
        "_last_round",
        "_latest",
        "_ledger",
        "_max_pause",
        "_members",
        "_names",
        "_next_renew",
        "_on_limit",
        "_on_tenant",
        "_own",
        "_replies",
        "_retry_at",
        "_running",
        "_seq",
        "_settings",
        "_shares",
        "_tenant_writes",
        "_view",
        "book",
        "pools",
        "provider",
    )

    def __init__(  # a group's settings besides a provider's
        self,
        provider: str,
        book: SharedBook,
        ledger: Ledger,
        *,
        limit: int | None,
        default_pause: float,
        max_pause: float,
        on_limit: Callable[[str, int | None], None],
        on_tenant: Callable[[str, Tenant | None], None] | None = None,
        hub: EventHub | None = None,
        members: Mapping[str, int | None] | None = None,
        pools: Mapping[str, tuple[str, ...]] | None = None,
        events: str | None = None,
        affinity_wait: float = DEFAULT_AFFINITY_WAIT,
        failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
        failure_cooldown: float = DEFAULT_FAILURE_COOLDOWN,
    ) -> None:
        self.provider = provider
        self.book = book
        self._ledger = ledger
        self._default_pause = default_pause
        self._max_pause = max_pause
        self._on_limit = on_limit
        self._on_tenant = on_tenant
        # A provider is its own and only share; a group has one per member.
        self._shares = (
            {name: _Share(name, name, known) for name, known in members.items()}
            if members
            else {provider: _Share(provider, None, limit)}
        )
        self._own = next(iter(self._shares.values()))
        self._members: tuple[str, ...] = tuple(members or ())
        self.pools: dict[str, tuple[str, ...]] = dict(pools or {})
        self._settings = {
            "failure_threshold": failure_threshold,
            "failure_cooldown": failure_cooldown,
            "affinity_wait": affinity_wait,
        }
        # A group's: what each waiting ticket asked for (a member or a
        # pool), the names its events give it (its member once granted)
        # and its pool, its conversation while it waits, and the member of
        # each conversation's latest grant, which its next request prefers.
        self._asked: dict[Ticket, tuple[str, str | None]] = {}
        self._names: dict[Ticket, tuple[str, str | None]] = {}
        self._latest: dict[str, str] = {}
        # A group's: when each waiting ticket that prefers a member stops
        # waiting for it alone (``None`` until a round published it), so
        # that a round then gives it to another member at once.
        self._affinity: dict[Ticket, float | None] = {}
        # The messages sent while a task handles others (send), and the
        # run task's wake-ups.
        self._inbox: Mailbox[SchedulerMessage] = Mailbox()
        self._handling = False
        # The bug a handling met, for run to raise.
        self._crash: BaseException | None = None
        self._replies: dict[Ticket, Reply] = {}
        # The replies of the tickets holding a lease that can expire.
        self._holding: dict[Ticket, Reply] = {}
        # The book's: lease ids stay unique when a new actor takes over.
        self._seq = book.seq
        # Tenants' settings to store, the latest of each; the fleet's as
        # the last round saw them (see _Share for the rest), stored again
        # by the round that finds the namespace lost (its epoch changed:
        # see Ledger.step), which the ledger tells only a round that knows
        # its epoch ("": none).
        self._tenant_writes: dict[str, Tenant | None] = {}
        self._epoch = ""
        self._fleet_tenants: dict[str, Tenant] = {}
        self._dirty = True
        self._next_renew = -math.inf
        self._last_round = -math.inf
        self._retry_at = -math.inf
        self._backoff = _FIRST_RETRY
        self._view = SharedView()
        # What each round and message does becomes events and log lines
        # there, as for the local scheduler.
        self._events = Translator(
            provider if events is None else events,
            EventHub() if hub is None else hub,
            FLEET_PAUSE,
        )
        if self._members:
            self._events.names = self._names
        # Counted from now: the client stays open until run() is done,
        # even if the dispatcher closes before run() first gets to run. An
        # actor stopped when idle leaves, and enters again with its next
        # message.
        ledger.enter()
        self._entered = True
        self._running = False

    def __repr__(self) -> str:
        return f"<SharedSchedulerActor provider={self.provider!r} {self.book!r}>"

    @property
    def limit(self) -> int | None:
        """A provider's limit as last stored or set (a group's: ``None``)."""
        return None if self._members else self._own.limit

    @property
    def view(self) -> SharedView:
        """The fleet as the last round saw it."""
        return self._view

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a member or a pool of this group."""
        return name in self.pools or (bool(self._members) and name in self._shares)

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        """A fresh ticket; its ``seq`` matches the order of the inbox."""
        return Ticket(rank, next(self._seq), priority, tenant, model)

    # Protected like the local scheduler's: the book changes and the
    # requesters are told together.
    @trio.lowlevel.enable_ki_protection
    def send(self, message: SchedulerMessage) -> None:
        """Take ``message`` into the book now; never blocks.

        The same rule as the local scheduler's: handled at once in this
        task, unless a task is handling messages or a round's answer now
        (then that task takes it before it goes on). The round that sends
        it to Redis runs soon (an answer's start, ``Answered``, waits for
        the next).

        Raises:
            trio.ClosedResourceError: The actor is closed.
        """
        inbox = self._inbox
        if self._handling or inbox.closed:
            inbox.send_nowait(message)  # raises once closed
            return
        if not self._entered:
            # Its run() is about to start again, and will use the client.
            self._ledger.enter()
            self._entered = True
        self._handling = True
        try:
            self._take(message, trio.current_time())
            self._settle()
        except BaseException as exc:  # a bug: nothing else escapes _take
            self._crash = exc
            inbox.close()
        finally:
            self._handling = False

    def _settle(self) -> None:
        """Take the messages sent while this task handled others, in order."""
        inbox = self._inbox
        while inbox.queue:
            for message in inbox.take_all():
                self._take(message, trio.current_time())

    def statistics(self) -> ProviderStatistics:
        """The fleet's figures as the last round saw them, this process's own totals."""
        view = self._view
        own = self._own.view
        book = self.book
        now = trio.current_time()
        return provider_statistics(
            self.provider,
            book,
            fleet=view,
            limit=self.limit,
            paused_until=own.paused_until,
            adaptive=own.adaptive is not None,
            budget=own.budget_statistics(now),
            models=own.model_statistics(now),
            tenants=view.tenant_statistics(),
        )

    def member_of(self, ticket: Ticket) -> str | None:
        """A group's: the member ``ticket`` holds its slot on, or ``None`` if it holds none."""
        return self.book.member_of(ticket)

    def member_statistics(self, name: str) -> ProviderStatistics:
        """A group's member's snapshot, or a pool's, as ``statistics()`` is a provider's.

        The fleet's slots and settings as the last round saw them; its
        ``waiting`` counts this process's requests waiting for it alone,
        and its totals are this process's.
        """
        now = trio.current_time()
        asked = self._asked_counts()
        members = self._member_statistics(asked)
        tenants = self._view.tenant_statistics()
        up = self._view.up
        if name in self.pools:
            pool = self._pool_statistics(members, asked)[name]
            fleet = _Seen(pool.in_flight, pool.waiting, up)
            local = sum(members[member].in_flight for member in pool.members)
            pool = attrs.evolve(pool, in_flight=local)
            return pool_as_provider(
                name, pool, members, self.book, tenants, fleet=fleet
            )
        share = self._shares[name]
        own = members[name]
        return member_as_provider(
            name,
            own,
            self.book,
            adaptive=share.view.adaptive is not None,
            budget=share.view.budget_statistics(now),
            models=share.view.model_statistics(now),
            tenants=tenants,
            fleet=_Seen(share.view.in_flight, own.waiting, up),
        )

    def pool_statistics(self) -> dict[str, PoolStatistics]:
        """A group's pools, as the last round saw their members; ``waiting``: this process's."""
        asked = self._asked_counts()
        return self._pool_statistics(self._member_statistics(asked), asked)

    def _asked_counts(self) -> collections.Counter[str]:
        """This process's waiting requests, by the member or pool each asked for."""
        return collections.Counter(asked for asked, _ in self._asked.values())

    def _pool_statistics(
        self,
        members: dict[str, MemberStatistics],
        asked: collections.Counter[str],
    ) -> dict[str, PoolStatistics]:
        """``pool_statistics`` from the members' and the waiting counts."""
        shares = self._shares
        found = {}
        for pool, names in self.pools.items():
            own = [members[name] for name in names]
            limits = [m.limit for m in own]
            found[pool] = PoolStatistics(
                pool=pool,
                members=names,
                limit=None if None in limits else sum(limits),  # type: ignore[arg-type]  # no None
                in_flight=sum(shares[name].view.in_flight for name in names),
                waiting=asked[pool],
                affinity_hits=sum(m.affinity_hits for m in own),
                affinity_moves=sum(m.affinity_moves for m in own),
            )
        return found

    def _member_statistics(
        self, asked: collections.Counter[str]
    ) -> dict[str, MemberStatistics]:
        """Each member: the fleet's as the last round saw it, this process's totals."""
        found = {}
        for name, share in self._shares.items():
            seen = share.seen or LedgerMember(
                limit=share.limit, in_flight=0, paused_for=0
            )
            found[name] = MemberStatistics(
                member=name,
                limit=share.limit,
                in_flight=share.holding,
                waiting=asked[name],
                paused_until=share.view.paused_until,
                granted_total=share.granted_total,
                released_total=share.released_total,
                peak_in_flight=share.peak_in_flight,
                affinity_hits=seen.affinity_hits,
                affinity_moves=seen.affinity_moves,
                failures=seen.failures,
                out_of_service_until=None
                if seen.out_for is None
                else self._last_round + seen.out_for,
                half_open=seen.half_open,
                outages_total=seen.outages,
            )
        return found

    def wake(self, message: str | None = None) -> None:
        """Run a round soon: something changed in Redis. Never blocks.

        ``message`` is the wake-up's (``None``: a subscription began). One
        that is not for this process (``wakes``) is ignored: one signed by
        this process, whose round already saw what it changed, or one for
        other processes only; so is any while the actor is stopped (it runs
        a round when it starts again).
        """
        if not wakes(message, self.book.node) or not self._running:
            return
        if not self._dirty and not self._inbox.closed:
            self._dirty = True
            self._inbox.nudge()

    def close(self) -> None:
        """Refuse further messages; the actor stops and fails the waiters."""
        self._inbox.close()

    @trio.lowlevel.enable_ki_protection
    async def run(self, *, stop_when_idle: bool = False) -> bool:
        """Serve the inbox and the ledger until closed or cancelled.

        Args:
            stop_when_idle: Also stop once the provider is unlimited and
                nothing is held, waiting, queued or left to send.

        Returns:
            ``True`` if it stopped because it was idle.
        """
        inbox = self._inbox
        stopped_idle = False
        if not self._entered and not inbox.closed:
            self._ledger.enter()
            self._entered = True
        self._running = True
        self._dirty = True
        try:
            while True:
                if stop_when_idle and self._idle():
                    # The inbox stays open: the dispatcher runs this actor
                    # again on its next message. Until then the fleet is
                    # unknown here.
                    stopped_idle = True
                    # The models' budgets as last seen stay: a round shows
                    # only those of its own requests.
                    own = self._own
                    own.view = self._view = SharedView(models=own.view.models)
                    return True
                await self._sleep()
                if self._crash is not None:
                    raise self._crash
                if inbox.closed:
                    return False
                now = trio.current_time()
                if now < self._retry_at:
                    continue
                if not self._dirty and now < self._deadline():
                    # Only news that can wait for the next round.
                    continue
                self._dirty = False
                await self._round(now)
        finally:
            self._running = False
            try:
                if not stopped_idle:
                    await self._shutdown()
            finally:
                if self._entered:
                    self._entered = False
                    self._ledger.leave()

    async def _sleep(self) -> None:
        """Wait until a round is due: news, a retry, a renewal or a poll."""
        if not self._view.up:
            # The ledger is away: messages are taken into the book and wait
            # for the next retry.
            with trio.move_on_at(self._retry_at):
                await self._inbox.wait()
        elif not self._dirty:
            with trio.move_on_at(self._deadline()):
                await self._inbox.wait()

    def _idle(self) -> bool:
        return (
            not self._members
            and self._own.limit is None
            and not self.book.busy()
            and not self._inbox.queue
            and not self._inbox.closed
            and self._own.idle()
            and not self._tenant_writes
        )

    def _deadline(self) -> float:
        book = self.book
        deadline = math.inf
        if book.in_flight or book.waiting:
            deadline = self._next_renew
        if book.waiting:
            # The safety net for a lost wake-up, and the end of a pause, of
            # a budget's wait or of a member's cooldown.
            poll = min(1.0, self._ledger.lease / 3)
            deadline = min(deadline, self._last_round + poll)
            for end in self._affinity.values():
                if end is not None:
                    deadline = min(deadline, end)
            for share in self._shares.values():
                view = share.view
                if view.paused_until is not None:
                    deadline = min(deadline, view.paused_until)
                if view.budget_ready_at is not None:
                    deadline = min(deadline, view.budget_ready_at)
                seen = share.seen
                if seen is not None and seen.out_for is not None:
                    deadline = min(deadline, self._last_round + seen.out_for)
        return deadline

    def _take(self, message: SchedulerMessage, now: float) -> None:
        """Take one message into the book; the one handler of every message.

        All but an answer's start (``Answered``) call for a round now.
        """
        book = self.book
        if isinstance(message, Answered):
            book.answered(message.ticket)
            return
        events = self._events
        listening = events.listening
        if not listening:
            events.forget()
        if not self._dirty:
            self._dirty = True
            self._inbox.nudge()
        if isinstance(message, Release | Cancel | Failed):
            self._left(message, now)
        elif isinstance(message, Acquire):
            self._acquire(message, now, None)
        elif isinstance(message, ForMember):
            self._for_member(message, now)
        else:
            self._take_setting(message, now, self._own)

    def _left(self, message: Release | Cancel | Failed, now: float) -> None:
        """A holder gives its slot back, or a request leaves.

        A call failed before its answer is no success: its grant goes back
        as one withdrawn; a group's member counts it for its health, and
        the request may try another member.
        """
        book = self.book
        ticket = message.ticket
        before = book.in_flight, book.waiting
        self._holding.pop(ticket, None)
        self._given_back(ticket)
        if isinstance(message, Release):
            try:
                book.release(ticket)
            except RuntimeError as exc:
                reply = self._replies.pop(ticket)
                book.cancel(ticket)
                reply.refused(exc)
        else:
            self._replies.pop(ticket, None)
            if isinstance(message, Failed) and book.holds(ticket):
                book.fail(ticket)
            else:
                book.cancel(ticket)
        if self._events.listening:
            self._events.left(ticket, now, before, book.in_flight, book.waiting)
        self._ended(ticket)

    def _given_back(self, ticket: Ticket) -> None:
        """A group's holder gives its slot back: its member counts it."""
        if self._members:
            member = self.book.member_of(ticket)
            if member is not None:
                share = self._shares[member]
                share.released_total += 1
                share.holding -= 1

    def _ended(self, ticket: Ticket) -> None:
        """A group's ``ticket`` ended: what was kept for it goes."""
        if self._members:
            self._asked.pop(ticket, None)
            self._names.pop(ticket, None)
            self._affinity.pop(ticket, None)

    def _for_member(self, message: ForMember, now: float) -> None:
        """A message for one member or pool of a group: taken as itself, for it."""
        name = message.member
        inner = message.message
        share = self._shares.get(name) if self._members else None
        if isinstance(inner, Acquire) and (share is not None or name in self.pools):
            self._acquire(inner, now, name)
        elif share is not None and not isinstance(inner, Acquire):
            self._take_setting(inner, now, share)
        else:
            what = "member or pool" if isinstance(inner, Acquire) else "member"
            error = ValueError(f"no {what} {name!r} in this scheduler")
            if isinstance(inner, Acquire):
                inner.reply.refused(error)
            else:
                _logger.error(
                    "the scheduler of %r ignored %r: %s", self.provider, message, error
                )

    def _take_setting(  # noqa: PLR0912  # one branch per kind of message
        self,
        message: SchedulerMessage,
        now: float,
        share: _Share,
    ) -> None:
        """A message about a provider's or a member's limits, pauses, budgets, or the tenants."""
        member = share.member
        if isinstance(message, (SetPool, RemovePool)):
            # A fleet's pools are declared as it opens, the same in every
            # process: the dispatcher refuses to change them at run time.
            _logger.error(
                "the scheduler of %r ignored %r: a fleet's pools are fixed",
                self.provider,
                message,
            )
        elif isinstance(message, SetTenant):
            self._tenant_writes.pop(message.tenant, None)
            self._tenant_writes[message.tenant] = message.settings
            put_or_remove(self._fleet_tenants, message.tenant, message.settings)
        elif isinstance(message, SetModelBudget):
            share.model_budgets.pop(message.model, None)
            share.model_budgets[message.model] = message.budget
            # One of no rate (it hands both back to the figures) stores nothing.
            share.fleet_models[message.model] = message.budget
        elif isinstance(message, SetLimit):
            self._events.limit_changed(share.limit, message.limit, now, member=member)
            share.limit = message.limit
            share.limit_writes.append(message.limit)
            share.judge(None)
        elif isinstance(message, Adapt):
            limit = message.limit
            self._events.limit_changed(share.limit, limit.initial, now, member=member)
            share.limit = limit.initial
            share.limit_writes.append(limit)
            share.judge(limit)
        elif isinstance(message, Pause):
            share.pauses.append(message.retry_after)
        elif isinstance(message, ReportUsage):
            self.book.report_usage(message.ticket, message.tokens)
        elif isinstance(message, ObserveLatency):
            self._observe_latency(message, now)
        elif isinstance(message, ObserveServerLoad):
            # The fleet's grants know no server's load (open_dispatcher
            # refuses server_load with redis_url).
            return
        elif isinstance(message, ObserveRateLimits):
            if message.model is None:
                share.observed = message.info
            else:
                share.observed_models[message.model] = message.info
        elif isinstance(message, Resume):
            share.resume = True
        else:
            _logger.error("the scheduler of %r ignored %r", self.provider, message)

    def _observe_latency(self, message: ObserveLatency, now: float) -> None:
        """A call of this process ended: its member's signal judges it, its verdict goes with the next round."""
        book = self.book
        if not book.holds(message.ticket):
            return
        name = book.member_of(message.ticket) if self._members else None
        share = self._own if name is None else self._shares[name]
        signal, limit = share.latency, share.limit
        if signal is None or limit is None:
            return
        # Its company: the fleet's calls in flight as the latest round saw
        # them (the server serves the whole fleet), else this process's.
        seen = self._last_round != -math.inf
        change = signal.observe(
            now,
            message.first_token,
            message.between_tokens,
            message.duration,
            message.prompt_tokens,
            share.view.in_flight if seen else book.in_flight,
            limit,
        )
        if change:
            share.verdicts.append(change)

    def _acquire(self, message: Acquire, now: float, name: str | None) -> None:
        ticket = message.ticket
        # The ticket's rank (its turn's start less its priority's credit) on
        # the Redis server's clock, as this process reads it (to within
        # half a round trip), so that processes compare ranks whatever
        # their hosts' clocks say.
        arrival = self._ledger.clock.now()
        start = arrival - now + ticket.rank
        book = self.book
        events = self._events
        lane = ""
        conversation = message.conversation_id
        if name is not None:
            pool = name if name in self.pools else None
            # A pool's request prefers its conversation's latest member.
            prefer = (
                None
                if pool is None or conversation is None
                else self._latest.get(conversation)
            )
            lane = lane_text(name, message.avoid, prefer)
        try:
            book.acquire(ticket, start, arrival, message.tokens, lane=lane)
        except (QueueFull, ValueError) as exc:
            if self._replies.get(ticket) is message.reply:
                self._replies.pop(ticket)
                book.cancel(ticket)
                self._ended(ticket)
            message.reply.refused(exc)
            if isinstance(exc, QueueFull):
                events.refused(
                    ticket,
                    conversation,
                    now,
                    exc,
                    book.in_flight,
                    book.waiting,
                )
            return
        self._replies[ticket] = message.reply
        if name is not None:
            self._asked[ticket] = (name, conversation)
            self._names[ticket] = (name, pool)
            if prefer is not None and self._settings["affinity_wait"] > 0:
                self._affinity[ticket] = None
        if events.listening:
            events.queued(ticket, conversation, now, book.in_flight, book.waiting)

    def _step_figures(self) -> tuple[dict[str, object], Callable[[], None]]:
        """The figures and verdicts of a round, and what puts them back if it fails.

        A provider's as its own; a group's each with its member.
        """
        taken = {name: share.take_figures() for name, share in self._shares.items()}

        def failed() -> None:
            for name, (observed, by_model, _) in taken.items():
                self._shares[name].figures_failed(observed, by_model)

        if not self._members:
            observed, by_model, verdicts = taken[self.provider]
            return {
                "observed": observed,
                "observed_models": by_model,
                "verdicts": verdicts,
            }, failed
        figures: list[tuple[str, str | None, RateLimitInfo]] = []
        verdicts_on: list[tuple[str, int]] = []
        for name, (observed, by_model, verdicts) in taken.items():
            if observed is not None:
                figures.append((name, None, observed))
            figures += [(name, model, info) for model, info in by_model.items()]
            verdicts_on += [(name, change) for change in verdicts]
        return {
            "members": self._members,
            "pools": self.pools,
            "member_figures": figures,
            "member_verdicts": verdicts_on,
            **self._settings,
        }, failed

    async def _round(self, now: float) -> None:
        renew = now >= self._next_renew
        plan: Plan | None = None
        result: StepResult | None = None
        failed: Callable[[], None] | None = None
        # A round runs to its end even when the dispatcher closes meanwhile:
        # the book hands the round its releases, withdrawals and asks, and
        # only the answer completes them (a grant it brings is given back
        # by the shutdown that follows). Cancelled halfway, a lease given
        # back or granted in Redis would stay taken for a whole lease.
        # Bounded, so that a Redis that does not answer cannot hold the
        # close back for long.
        with trio.move_on_after(_ROUND_TIMEOUT, shield=True):
            try:
                await self._write()
                book = self.book
                plan = book.plan(self.limit, renew=renew)
                figures, failed = self._step_figures()
                step = functools.partial(
                    self._ledger.step,
                    self.provider,
                    book.node,
                    plan,
                    waiting=book.waiting,
                    **figures,  # type: ignore[arg-type]  # as _step_figures names them
                )
                try:
                    result = await step(
                        epoch=self._epoch,
                        seed=None if self._epoch else self._seed(),
                    )
                except NamespaceLost:
                    # Redis lost the namespace since the last round (it
                    # restarted empty, was flushed or failed over), and did
                    # nothing: the same again, with the settings to store.
                    result = await step(seed=self._seed())
                    # The holders' leases went with it: they register
                    # again in a round run at once, if not in this one.
                    self._next_renew = -math.inf
                    self._dirty = True
            except BACKEND_ERRORS as exc:
                if plan is not None:
                    self.book.failed(plan)
                if failed is not None:
                    failed()
                self._down(now, exc)
                return
        if plan is None or result is None:
            if plan is not None:
                self.book.failed(plan)
            if failed is not None:
                failed()
            self._down(
                now, TimeoutError(f"no answer within {_ROUND_TIMEOUT:g} seconds")
            )
            return
        self._handling = True
        try:
            self._up(now, renew, plan, result)
            self._settle()
        finally:
            self._handling = False

    def _seed(self) -> Seed:
        """The fleet's settings as this process knows them, to store where Redis lost them.

        A group's: its tenants, and each member's limit and budgets.
        """
        own = self._own
        if self._members:
            return Seed(
                tenants=dict(self._fleet_tenants),
                members={
                    name: Seed(
                        limit=None if share.limit_writes else share.seed_limit(),
                        budget=share.fleet_budget,
                        models=dict(share.fleet_models),
                    )
                    for name, share in self._shares.items()
                },
            )
        return Seed(
            limit=own.seed_limit(),
            budget=own.fleet_budget,
            models=dict(own.fleet_models),
            tenants=dict(self._fleet_tenants),
        )

    async def _write(self) -> None:
        """Store the limits, tenants, budgets, pauses and resumes asked for, in order."""
        ledger = self._ledger
        provider = self.provider
        members = self._members
        while self._tenant_writes:
            tenant, settings = next(iter(self._tenant_writes.items()))
            await ledger.set_tenant(provider, tenant, settings, members=members)
            # Unless a newer setting came while it was on its way.
            if self._tenant_writes.get(tenant, settings) is settings:
                self._tenant_writes.pop(tenant, None)
        for share in self._shares.values():
            member = share.member
            while share.limit_writes:
                stored = await ledger.set_limit(
                    provider, share.limit_writes[0], member=member
                )
                share.limit_writes.pop(0)
                self._learn_limit(share, stored)
            while share.model_budgets:
                model, budget = next(iter(share.model_budgets.items()))
                await ledger.set_budget(
                    provider, budget, model=model, member=member, members=members
                )
                if share.model_budgets.get(model) is budget:
                    share.model_budgets.pop(model)
            while share.pauses:
                await ledger.pause(
                    provider,
                    share.pauses[0],
                    default_pause=self._default_pause,
                    max_pause=self._max_pause,
                    member=member,
                )
                share.pauses.pop(0)
            if share.resume:
                await ledger.resume(provider, member=member)
                share.resume = False

    def _down(self, now: float, error: BaseException) -> None:
        if self._view.up:
            # The error as text: a log record that kept the exception would
            # keep its traceback's frames, and the dead connection, alive.
            _logger.warning(
                "the shared ledger of %r is unreachable, granting nothing: %s",
                self.provider,
                str(error),
            )
        self._view = attrs.evolve(self._view, up=False)
        for share in self._shares.values():
            share.view = attrs.evolve(share.view, up=False)
        self._ledger.lost()
        self._retry_at = now + self._backoff
        # At most a sixth of the lease: holders renew as soon as it is back,
        # well before their leases run out.
        self._backoff = min(2 * self._backoff, _LAST_RETRY, self._ledger.lease / 6)
        # Renew at once when it is back: Redis may have restarted empty.
        self._next_renew = -math.inf

    def _up(self, now: float, renewed: bool, plan: Plan, result: StepResult) -> None:
        if not self._view.up:
            _logger.warning("the shared ledger of %r is back", self.provider)
        self._backoff = _FIRST_RETRY
        self._retry_at = -math.inf
        self._last_round = now
        if renewed:
            self._next_renew = now + self._ledger.lease / 3
        self._learn_settings(result)
        book = self.book
        grants = book.applied(plan, result.granted, result.granted_on)
        self._affinity_ends(plan, now)
        if result.counting and book.group():
            # Its waiters count for their tenants: the next round sends them.
            self._dirty = True
        if self._members:
            for name, seen in result.members.items():
                share = self._shares.get(name)
                if share is not None:
                    self._learn_share(share, now, seen)
        else:
            self._learn_share(self._own, now, result)
        # Redis ran the round after ``now``: the leases it granted or
        # renewed live until ``lease`` after ``now`` at least. An unlimited
        # provider's leases need no watch: nobody can be over-admitted.
        until = now + self._ledger.lease
        if renewed:
            for ticket, leased in self._holding.items():
                leased.lease_until(self._lease_end(ticket, until))
        if grants:
            self._deliver(grants, now, until)
        self._view = SharedView(
            in_flight=result.in_flight,
            waiting=result.waiting,
            up=True,
            tenants=result.tenants,
        )
        if not self._members:
            own = self._own.view
            self._own.view = self._view = attrs.evolve(
                own,
                in_flight=result.in_flight,
                waiting=result.waiting,
                tenants=result.tenants,
            )
        if book.unsent():
            # Grants or entries for tickets that left while the round was
            # on its way: give them back in another round now.
            self._dirty = True

    def _affinity_ends(self, plan: Plan, now: float) -> None:
        """When each entry this round published waits for its member no longer.

        The step placed it, on the Redis server's clock, after ``now``:
        ``affinity_wait`` from then, and a little slack. An end this round
        has reached is dropped (if the step placed it a little later, the
        poll gives it elsewhere).
        """
        affinity = self._affinity
        if not affinity:
            return
        end = now + float(self._settings["affinity_wait"]) + _PAUSE_SLACK
        for ticket in plan.enqueued:
            if ticket in affinity and affinity[ticket] is None:
                affinity[ticket] = end
        for ticket, until in list(affinity.items()):
            if until is not None and until <= now:
                del affinity[ticket]

    def _deliver(self, grants: list[Ticket], now: float, until: float) -> None:
        """Tell each granted requester, its lease sure to live ``until``."""
        replies = self._replies
        holding = self._holding
        for ticket in grants:
            reply = replies.pop(ticket)
            if self._members:
                self._granted_on(ticket)
            reply.lease_until(self._lease_end(ticket, until))
            holding[ticket] = reply
            reply.granted(ticket, now)
        if self._events.listening:
            book = self.book
            self._events.granted(grants, now, book.in_flight, book.waiting)

    def _lease_end(self, ticket: Ticket, until: float) -> float:
        """Until when ``ticket``'s lease is sure to live: unwatched on an unlimited provider or member."""
        if self._members:
            member = self.book.member_of(ticket)
            limit = None if member is None else self._shares[member].limit
        else:
            limit = self._own.limit
        return math.inf if limit is None else until

    def _granted_on(self, ticket: Ticket) -> None:
        """A group's ``ticket`` was granted: its member counts it, its events name it, its conversation's next request prefers it."""
        member = self.book.member_of(ticket)
        assert member is not None  # granted: it holds
        share = self._shares[member]
        share.granted_total += 1
        share.holding += 1
        share.peak_in_flight = max(share.peak_in_flight, share.holding)
        _, conversation = self._asked.pop(ticket, (member, None))
        self._affinity.pop(ticket, None)
        granted_on(self._names, self._latest, ticket, member, conversation)

    def _learn_share(
        self, share: _Share, now: float, seen: StepResult | LedgerMember
    ) -> None:
        """What a round saw of a provider (its ``StepResult``) or of a member (its ``LedgerMember``)."""
        self._learn_limit(share, seen.limit)
        paused_until = now + seen.paused_for if seen.paused_for else None
        self._emit_pause(share, share.view.paused_until, paused_until, now)
        if isinstance(seen, LedgerMember):
            self._service_changed(share, seen, now)
            share.seen = seen
            share.fleet_budget = (
                None if seen.budget is None else seen.budget.configured()
            )
        adaptive = self._adaptive_of(share, seen.adaptive)
        budget = seen.budget
        readies = [m.ready_in for m in seen.models.values() if m.ready_in is not None]
        if budget is not None and budget.ready_in is not None:
            readies.append(budget.ready_in)
        ready_in = min(readies, default=None)
        models = share.view.models
        models.update(seen, now)
        # A round answers only the models it met (all of them on the first):
        # the others stay as last seen.
        fleet_models = dict(share.fleet_models)
        for model, shown in seen.models.items():
            put_or_remove(fleet_models, model, shown.configured())
        # Those written since the round began are newer than what it saw.
        share.fleet_models = fleet_models | share.model_budgets
        if not share.limit_writes:
            # The fleet's limit, as stored (perhaps by another process):
            # judged here too if it follows latency.
            latency = adaptive is not None and adaptive.signal == "latency"
            if latency != (share.latency is not None):
                share.judge(adaptive)
        share.view = SharedView(
            in_flight=seen.in_flight,
            paused_until=paused_until,
            up=True,
            adaptive=adaptive,
            budget=budget,
            budget_at=now,
            budget_ready_at=None if ready_in is None else now + ready_in,
            models=models,
        )

    def _service_changed(self, share: _Share, seen: LedgerMember, now: float) -> None:
        """A member went out of service, half-open, or back in, as a round saw it."""
        before = share.seen
        was = "in" if before is None else _service(before)
        state = _service(seen)
        if state != was:
            until = None if seen.out_for is None else now + seen.out_for
            self._events.service_changed(now, share.name, state, until)

    def _adaptive_of(
        self, share: _Share, bounds: tuple[int, int, float, str] | None
    ) -> AdaptiveLimit | None:
        """The stored adaptive limit, at its current value (``share.limit``)."""
        if bounds is None or share.limit is None:
            return None
        low, high, backoff, signal = bounds
        previous = share.view.adaptive
        if previous is not None and (
            previous.initial,
            previous.minimum,
            previous.maximum,
            previous.backoff,
            previous.signal,
        ) == (share.limit, low, high, backoff, signal):
            return previous
        return AdaptiveLimit(
            initial=min(high, max(low, share.limit)),
            minimum=low,
            maximum=high,
            backoff=backoff,
            signal="latency" if signal == "latency" else "rate_limits",
        )

    def _emit_pause(
        self, share: _Share, before: float | None, after: float | None, now: float
    ) -> None:
        """The fleet's pause of a provider or member, as a round saw it, began, grew or ended."""
        # Read on Redis' clock through a round trip: an end that moves by
        # less than _PAUSE_SLACK is the same pause.
        if after is not None and (before is None or after > before + _PAUSE_SLACK):
            self._events.paused(now, after, None, share.member)
        elif after is None and before is not None:
            self._events.resumed(now, "expired", share.member)

    def _learn_settings(self, result: StepResult) -> None:
        """The fleet's epoch, a provider's budget, and the tenants, as a round saw them."""
        self._epoch = result.epoch
        if not self._members:
            budget = result.budget
            self._own.fleet_budget = None if budget is None else budget.configured()
        tenants = result.configured_tenants()
        # Those written since the round began are newer than what it saw.
        for tenant, settings in self._tenant_writes.items():
            put_or_remove(tenants, tenant, settings)
        before, self._fleet_tenants = self._fleet_tenants, tenants
        if self._on_tenant is not None:
            for tenant in sorted(before.keys() | tenants.keys()):
                if before.get(tenant) != tenants.get(tenant):
                    self._on_tenant(tenant, tenants.get(tenant))

    def _learn_limit(self, share: _Share, stored: int | None) -> None:
        if stored != share.limit and not share.limit_writes:
            self._events.limit_changed(
                share.limit, stored, trio.current_time(), member=share.member
            )
            share.limit = stored
            self._on_limit(share.name, stored)

    async def _shutdown(self) -> None:
        self._inbox.close()
        self._handling = True
        try:
            self._settle()
        finally:
            self._handling = False
        book = self.book
        replies = list(self._replies.values())
        self._replies.clear()
        self._holding.clear()
        self._asked.clear()
        self._names.clear()
        self._affinity.clear()
        for reply in replies:
            reply.refused(
                DispatcherClosed(
                    f"the dispatcher closed while waiting for {self._events.provider!r}"
                )
            )
        for ticket in book.waiters():
            book.cancel(ticket)
        for ticket in book.holders():
            book.release(ticket)
        for share in self._shares.values():
            share.holding = 0
        plan = book.plan(self.limit, renew=False)
        figures, _ = self._step_figures()
        if not (
            plan.release
            or plan.withdraw
            or any(share.limit_writes for share in self._shares.values())
            or figures.get("verdicts")
            or figures.get("member_verdicts")
        ):
            return
        # Only the verdicts: figures that came at the close wait for no one.
        for key in ("observed", "member_figures"):
            figures.pop(key, None)
        figures.pop("observed_models", None)
        # Cleanup awaits only shielded, and briefly: what is not given
        # back here expires after the lease. A limit set just before the
        # end is stored still: the fleet keeps it.
        with trio.move_on_after(1.0, shield=True):
            try:
                await self._write()
                await self._ledger.step(
                    self.provider,
                    book.node,
                    plan,
                    **figures,  # type: ignore[arg-type]  # as _step_figures names them
                )
            except BACKEND_ERRORS:
                book.failed(plan)


def _service(seen: LedgerMember) -> ServiceState:
    """A member's service as a round saw it."""
    if seen.out_for is not None:
        return "out"
    return "half_open" if seen.half_open else "in"


@final
@attrs.frozen
class _Seen:
    """A member's or a pool's slots and waiters as the last round saw them (``Fleet``)."""

    in_flight: int
    waiting: int
    up: bool


def new_node() -> str:
    """A name for one process's share of a provider, unique in the fleet."""
    return uuid.uuid4().hex[:16]
