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
from .._exceptions import DispatcherClosed, QueueFull
from .._observe._hub import EventHub
from .._observe._translator import FLEET_PAUSE, Translator
from .._policy._budgets import AdaptiveLimit, BudgetStatistics, refilled
from .._policy._latency import LatencySignal
from .._policy._tenants import TenantStatistics
from .._util import put_or_remove
from ..actors._mailbox import Mailbox
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
from ._ledger import NamespaceLost, SeenModels, wakes
from ._scripts import Seed

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._dispatch._backend import ProviderStatistics
    from .._policy._budgets import Budget
    from .._policy._ratelimits import RateLimitInfo
    from ..messages._limits import Tenant
    from ..messages._protocol import Reply
    from ._book import SharedBook
    from ._ledger import Ledger, LedgerBudget, LedgerTenant, StepResult
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
class SharedSchedulerActor:
    """The scheduler of one provider whose limit is shared through Redis.

    Args:
        provider: The provider's name.
        book: Its bookkeeping, kept by the dispatcher across restarts.
        ledger: The namespace's scripts.
        limit: The limit known when it starts (stored in Redis if none is).
        default_pause: The backoff's first pause, as the dispatcher's.
        max_pause: The longest pause, as the dispatcher's.
        on_limit: Called with the stored limit whenever a round learns it.
        on_tenant: Called with a tenant's settings (``None``: not
            configured) whenever a round learns that the fleet's changed.
    """

    __slots__ = (
        "_backoff",
        "_crash",
        "_default_pause",
        "_dirty",
        "_entered",
        "_epoch",
        "_events",
        "_fleet_budget",
        "_fleet_models",
        "_fleet_tenants",
        "_handling",
        "_holding",
        "_inbox",
        "_last_round",
        "_latency",
        "_ledger",
        "_limit_writes",
        "_max_pause",
        "_model_budgets",
        "_next_renew",
        "_observed",
        "_observed_models",
        "_on_limit",
        "_on_tenant",
        "_pauses",
        "_replies",
        "_resume",
        "_retry_at",
        "_running",
        "_seq",
        "_tenant_writes",
        "_verdicts",
        "_view",
        "book",
        "limit",
        "provider",
    )

    def __init__(
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
    ) -> None:
        self.provider = provider
        self.book = book
        self.limit = limit
        self._ledger = ledger
        self._default_pause = default_pause
        self._max_pause = max_pause
        self._on_limit = on_limit
        self._on_tenant = on_tenant
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
        self._limit_writes: list[int | AdaptiveLimit | None] = []
        # A latency-signal limit: this process's own signal, over its own
        # calls, and its verdicts not yet sent. The ledger applies them to
        # the fleet's limit (Adaptive.move): the processes' shares of the
        # calls make their rounds, and move the limit together as one
        # process seeing every call would.
        self._latency: LatencySignal | None = None
        self._verdicts: list[int] = []
        # The latest rate-limit figures not yet sent to the ledger: the
        # provider's, and each model's.
        self._observed: RateLimitInfo | None = None
        self._observed_models: dict[str, RateLimitInfo] = {}
        # Tenants' settings and models' budgets to store, the latest of each.
        self._tenant_writes: dict[str, Tenant | None] = {}
        self._model_budgets: dict[str, Budget] = {}
        # The fleet's settings as the last round saw them, with this
        # process's writes since: stored again by the round that finds
        # the namespace lost (its epoch changed: see Ledger.step), which
        # the ledger tells only a round that knows its epoch ("": none).
        self._epoch = ""
        self._fleet_budget: Budget | None = None
        self._fleet_models: dict[str, Budget] = {}
        self._fleet_tenants: dict[str, Tenant] = {}
        self._pauses: list[float | None] = []
        self._resume = False
        self._dirty = True
        self._next_renew = -math.inf
        self._last_round = -math.inf
        self._retry_at = -math.inf
        self._backoff = _FIRST_RETRY
        self._view = SharedView()
        # What each round and message does becomes events and log lines
        # there, as for the local scheduler.
        self._events = Translator(
            provider, EventHub() if hub is None else hub, FLEET_PAUSE
        )
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
    def view(self) -> SharedView:
        """The fleet as the last round saw it."""
        return self._view

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
        book = self.book
        now = trio.current_time()
        return provider_statistics(
            self.provider,
            book,
            fleet=view,
            limit=self.limit,
            paused_until=view.paused_until,
            adaptive=view.adaptive is not None,
            budget=view.budget_statistics(now),
            models=view.model_statistics(now),
            tenants=view.tenant_statistics(),
        )

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
                    self._view = SharedView(models=self._view.models)
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
            self.limit is None
            and not self.book.busy()
            and not self._inbox.queue
            and not self._inbox.closed
            and not self._limit_writes
            and not self._verdicts
            and not self._pauses
            and not self._resume
            and self._observed is None
            and not self._observed_models
            and not self._tenant_writes
            and not self._model_budgets
        )

    def _deadline(self) -> float:
        book = self.book
        deadline = math.inf
        if book.in_flight or book.waiting:
            deadline = self._next_renew
        if book.waiting:
            # The safety net for a lost wake-up, and the end of a pause.
            poll = min(1.0, self._ledger.lease / 3)
            deadline = min(deadline, self._last_round + poll)
            view = self._view
            if view.paused_until is not None:
                deadline = min(deadline, view.paused_until)
            if view.budget_ready_at is not None:
                deadline = min(deadline, view.budget_ready_at)
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
        if isinstance(message, Release):
            self._holding.pop(message.ticket, None)
            before = book.in_flight, book.waiting
            try:
                book.release(message.ticket)
            except RuntimeError as exc:
                reply = self._replies.pop(message.ticket)
                book.cancel(message.ticket)
                reply.refused(exc)
            if listening:
                events.left(message.ticket, now, before, book.in_flight, book.waiting)
        elif isinstance(message, Acquire):
            self._acquire(message, now)
        elif isinstance(message, Cancel | Failed):
            # A call failed before its answer is no success: its grant goes
            # back as one withdrawn (a provider alone has nowhere else to go).
            before = book.in_flight, book.waiting
            self._replies.pop(message.ticket, None)
            self._holding.pop(message.ticket, None)
            book.cancel(message.ticket)
            if listening:
                events.left(message.ticket, now, before, book.in_flight, book.waiting)
        else:
            self._take_setting(message, now)

    def _take_setting(  # noqa: PLR0912  # one branch per kind of message
        self,
        message: SetLimit
        | Adapt
        | Pause
        | Resume
        | ReportUsage
        | ObserveLatency
        | ObserveServerLoad
        | ObserveRateLimits
        | SetTenant
        | SetModelBudget
        | ForMember
        | SetPool
        | RemovePool,
        now: float,
    ) -> None:
        """A message about the provider's limits, pauses, budgets or tenants."""
        if isinstance(message, (ForMember, SetPool, RemovePool)):
            # Pools are the local scheduler's: open_dispatcher refuses them
            # with redis_url, so only a misuse sends these here.
            error = ValueError("pools are not shared through Redis")
            if isinstance(message, ForMember) and isinstance(message.message, Acquire):
                message.message.reply.refused(error)
            else:
                _logger.error(
                    "the scheduler of %r ignored %r: %s", self.provider, message, error
                )
        elif isinstance(message, SetTenant):
            self._tenant_writes.pop(message.tenant, None)
            self._tenant_writes[message.tenant] = message.settings
            put_or_remove(self._fleet_tenants, message.tenant, message.settings)
        elif isinstance(message, SetModelBudget):
            self._model_budgets.pop(message.model, None)
            self._model_budgets[message.model] = message.budget
            # One of no rate (it hands both back to the figures) stores nothing.
            self._fleet_models[message.model] = message.budget
        elif isinstance(message, SetLimit):
            self._events.limit_changed(self.limit, message.limit, now)
            self.limit = message.limit
            self._limit_writes.append(message.limit)
            self._judge(None)
        elif isinstance(message, Adapt):
            self._events.limit_changed(self.limit, message.limit.initial, now)
            self.limit = message.limit.initial
            self._limit_writes.append(message.limit)
            self._judge(message.limit)
        elif isinstance(message, Pause):
            self._pauses.append(message.retry_after)
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
                self._observed = message.info
            else:
                self._observed_models[message.model] = message.info
        else:
            self._resume = True

    def _judge(self, limit: AdaptiveLimit | None) -> None:
        """A new limit: a latency signal starts afresh for it, or there is none.

        The verdicts not sent yet were of the old limit's rounds.
        """
        latency = limit is not None and limit.signal == "latency"
        self._latency = LatencySignal() if latency else None
        self._verdicts.clear()

    def _observe_latency(self, message: ObserveLatency, now: float) -> None:
        """A call of this process ended: its signal judges it, its verdict goes with the next round."""
        signal, limit = self._latency, self.limit
        if signal is None or limit is None or not self.book.holds(message.ticket):
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
            self._view.in_flight if seen else self.book.in_flight,
            limit,
        )
        if change:
            self._verdicts.append(change)

    def _acquire(self, message: Acquire, now: float) -> None:
        ticket = message.ticket
        # The ticket's rank (its turn's start less its priority's credit) on
        # the Redis server's clock, as this process reads it (to within
        # half a round trip), so that processes compare ranks whatever
        # their hosts' clocks say.
        arrival = self._ledger.clock.now()
        start = arrival - now + ticket.rank
        book = self.book
        events = self._events
        try:
            book.acquire(ticket, start, arrival, message.tokens)
        except (QueueFull, ValueError) as exc:
            if self._replies.get(ticket) is message.reply:
                self._replies.pop(ticket)
                book.cancel(ticket)
            message.reply.refused(exc)
            if isinstance(exc, QueueFull):
                events.refused(
                    ticket,
                    message.conversation_id,
                    now,
                    exc,
                    book.in_flight,
                    book.waiting,
                )
            return
        self._replies[ticket] = message.reply
        if events.listening:
            events.queued(
                ticket, message.conversation_id, now, book.in_flight, book.waiting
            )

    async def _round(self, now: float) -> None:
        renew = now >= self._next_renew
        plan: Plan | None = None
        result: StepResult | None = None
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
                observed, self._observed = self._observed, None
                by_model, self._observed_models = self._observed_models, {}
                verdicts, self._verdicts = self._verdicts, []
                step = functools.partial(
                    self._ledger.step,
                    self.provider,
                    book.node,
                    plan,
                    waiting=book.waiting,
                    observed=observed,
                    observed_models=by_model,
                    verdicts=verdicts,
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
                    self._failed(plan, observed, by_model)
                self._down(now, exc)
                return
        if plan is None or result is None:
            if plan is not None:
                self._failed(plan, observed, by_model)
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
        """The fleet's settings as this process knows them, to store where Redis lost them."""
        adaptive = self._view.adaptive
        limit: int | AdaptiveLimit | None = self.limit
        if adaptive is not None and self.limit is not None:
            # The adaptive limit goes on from its current value.
            limit = attrs.evolve(adaptive, initial=self.limit)
        return Seed(
            limit=limit,
            budget=self._fleet_budget,
            models=dict(self._fleet_models),
            tenants=dict(self._fleet_tenants),
        )

    def _failed(
        self,
        plan: Plan,
        observed: RateLimitInfo | None,
        by_model: dict[str, RateLimitInfo],
    ) -> None:
        """A round did not reach the ledger: its changes go with the next.

        But for its latency verdicts: the step may have applied them with
        its answer lost, and a move applied twice is no idempotent change
        (a rise in the slow start would double twice). The signal's next
        rounds judge again.
        """
        self.book.failed(plan)
        if self._observed is None:
            self._observed = observed
        # Figures that came since are newer.
        self._observed_models = by_model | self._observed_models

    async def _write(self) -> None:
        """Store the limits, pauses and resumes asked for, in order."""
        ledger = self._ledger
        provider = self.provider
        while self._limit_writes:
            stored = await ledger.set_limit(provider, self._limit_writes[0])
            self._limit_writes.pop(0)
            self._learn_limit(stored)
        while self._tenant_writes:
            tenant, settings = next(iter(self._tenant_writes.items()))
            await ledger.set_tenant(provider, tenant, settings)
            # Unless a newer setting came while it was on its way.
            if self._tenant_writes.get(tenant, settings) is settings:
                self._tenant_writes.pop(tenant, None)
        while self._model_budgets:
            model, budget = next(iter(self._model_budgets.items()))
            await ledger.set_budget(provider, budget, model=model)
            if self._model_budgets.get(model) is budget:
                self._model_budgets.pop(model)
        while self._pauses:
            await ledger.pause(
                provider,
                self._pauses[0],
                default_pause=self._default_pause,
                max_pause=self._max_pause,
            )
            self._pauses.pop(0)
        if self._resume:
            await ledger.resume(provider)
            self._resume = False

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
        self._learn_limit(result.limit)
        self._learn_settings(result)
        book = self.book
        paused_until = now + result.paused_for if result.paused_for else None
        self._emit_pause(self._view.paused_until, paused_until, now)
        grants = book.applied(plan, result.granted)
        if result.counting and book.group():
            # Its waiters count for their tenants: the next round sends them.
            self._dirty = True
        replies = self._replies
        holding = self._holding
        # Redis ran the round after ``now``: the leases it granted or
        # renewed live until ``lease`` after ``now`` at least. An unlimited
        # provider's leases need no watch: nobody can be over-admitted.
        until = math.inf if self.limit is None else now + self._ledger.lease
        if renewed:
            for leased in holding.values():
                leased.lease_until(until)
        for ticket in grants:
            reply = replies.pop(ticket)
            reply.lease_until(until)
            holding[ticket] = reply
            reply.granted(ticket, now)
        if grants and self._events.listening:
            self._events.granted(grants, now, book.in_flight, book.waiting)
        budget = result.budget
        readies = [m.ready_in for m in result.models.values() if m.ready_in is not None]
        if budget is not None and budget.ready_in is not None:
            readies.append(budget.ready_in)
        ready_in = min(readies, default=None)
        models = self._view.models
        models.update(result, now)
        adaptive = self._adaptive_of(result.adaptive)
        if not self._limit_writes:
            # The fleet's limit, as stored (perhaps by another process):
            # judged here too if it follows latency.
            latency = adaptive is not None and adaptive.signal == "latency"
            if latency != (self._latency is not None):
                self._judge(adaptive)
        self._view = SharedView(
            in_flight=result.in_flight,
            waiting=result.waiting,
            paused_until=paused_until,
            up=True,
            adaptive=adaptive,
            budget=budget,
            budget_at=now,
            budget_ready_at=None if ready_in is None else now + ready_in,
            tenants=result.tenants,
            models=models,
        )
        if book.unsent():
            # Grants or entries for tickets that left while the round was
            # on its way: give them back in another round now.
            self._dirty = True

    def _adaptive_of(
        self, bounds: tuple[int, int, float, str] | None
    ) -> AdaptiveLimit | None:
        """The stored adaptive limit, at its current value (``self.limit``)."""
        if bounds is None or self.limit is None:
            return None
        low, high, backoff, signal = bounds
        previous = self._view.adaptive
        if previous is not None and (
            previous.initial,
            previous.minimum,
            previous.maximum,
            previous.backoff,
            previous.signal,
        ) == (self.limit, low, high, backoff, signal):
            return previous
        return AdaptiveLimit(
            initial=min(high, max(low, self.limit)),
            minimum=low,
            maximum=high,
            backoff=backoff,
            signal="latency" if signal == "latency" else "rate_limits",
        )

    def _emit_pause(
        self, before: float | None, after: float | None, now: float
    ) -> None:
        """The fleet's pause, as a round saw it, began, grew or ended."""
        # Read on Redis' clock through a round trip: an end that moves by
        # less than _PAUSE_SLACK is the same pause.
        if after is not None and (before is None or after > before + _PAUSE_SLACK):
            self._events.paused(now, after, None)
        elif after is None and before is not None:
            self._events.resumed(now, "expired")

    def _learn_settings(self, result: StepResult) -> None:
        """The fleet's epoch, budgets and tenants, as a round saw them."""
        self._epoch = result.epoch
        budget = result.budget
        self._fleet_budget = None if budget is None else budget.configured()
        # A round answers only the models it met (all of them on the first):
        # the others stay as last seen.
        models = dict(self._fleet_models)
        for model, shown in result.models.items():
            put_or_remove(models, model, shown.configured())
        tenants = result.configured_tenants()
        # Those written since the round began are newer than what it saw.
        models |= self._model_budgets
        for tenant, settings in self._tenant_writes.items():
            put_or_remove(tenants, tenant, settings)
        self._fleet_models = models
        before, self._fleet_tenants = self._fleet_tenants, tenants
        if self._on_tenant is not None:
            for tenant in sorted(before.keys() | tenants.keys()):
                if before.get(tenant) != tenants.get(tenant):
                    self._on_tenant(tenant, tenants.get(tenant))

    def _learn_limit(self, stored: int | None) -> None:
        if stored != self.limit and not self._limit_writes:
            self._events.limit_changed(self.limit, stored, trio.current_time())
            self.limit = stored
            self._on_limit(self.provider, stored)

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
        for reply in replies:
            reply.refused(
                DispatcherClosed(
                    f"the dispatcher closed while waiting for {self.provider!r}"
                )
            )
        for ticket in book.waiters():
            book.cancel(ticket)
        for ticket in book.holders():
            book.release(ticket)
        plan = book.plan(self.limit, renew=False)
        verdicts, self._verdicts = self._verdicts, []
        if not (plan.release or plan.withdraw or self._limit_writes or verdicts):
            return
        # Cleanup awaits only shielded, and briefly: what is not given
        # back here expires after the lease. A limit set just before the
        # end is stored still: the fleet keeps it.
        with trio.move_on_after(1.0, shield=True):
            try:
                await self._write()
                await self._ledger.step(
                    self.provider, book.node, plan, verdicts=verdicts
                )
            except BACKEND_ERRORS:
                book.failed(plan)


def new_node() -> str:
    """A name for one process's share of a provider, unique in the fleet."""
    return uuid.uuid4().hex[:16]
