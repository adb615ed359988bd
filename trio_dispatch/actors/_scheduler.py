"""The scheduler actor: one trio task per provider in use.

Design note. The actor owns a ``SlotPolicy`` and is the only code that
touches it. Everything reaches it as a typed message in one unbounded FIFO
``Mailbox``, so senders never block (``send`` works in a ``finally`` under
cancellation, without shielding) and a ``Cancel`` can never overtake its
``Acquire``.

Each time it wakes, the actor takes its whole backlog before it parks
again: under contention one wake-up handles a whole batch of releases and
acquires, and the grants they free are delivered to each waiter's own
``Reply`` right away. A grant is marked in the policy the moment it is
delivered; a grant that reaches a requester who has just given up is
ignored by its reply, and the requester's ``Cancel``, already behind in the
inbox, releases it. So slots never leak through that race.

The actor need not be woken for every message. While the provider has no
budget (of its own or of a model) and no pause, an ``Acquire``, ``Release``
or ``Cancel`` that finds
the inbox empty is handled at once in the sender's task, by the same
handler and with the same effect as if the actor's task had taken it next
(that is the order of the inbox); a release's grants go to their waiters
from there, as ``trio.CapacityLimiter`` hands a token on. A waiter woken
with a grant that was cancelled before it ran gives the grant back, as a
grant that reached it after its cancellation would be.

A message the policy refuses as a misuse (a ticket it already knows, the
release of a ticket that still waits, a bad limit) fails only the request it
concerns, never the actor: an ``Acquire`` is answered with the error, a
``Release`` of a waiting ticket withdraws that ticket and fails its
requester (granting it later would give a slot to a requester that thinks
it gave it back), and a ``SetLimit`` or ``Pause`` that nobody can be told
about is logged and dropped. The policy changes nothing when it refuses, so
its invariants hold.

Every message goes through one handler, ``_handle``. What each step of
the policy does (a ticket queued, granted, released, withdrawn or
refused; a pause, a resume, a new limit) goes to a ``Translator``, which
makes the log lines and, while anything listens to the dispatcher's
events (``EventHub.sinks``), the events; the Redis-shared scheduler uses
the same translator. Whether anything listens is checked once per batch,
so nobody listening costs one check per wake-up and a flag test per
message, and no event is built.

While the provider is paused, or its oldest waiter waits for budget, the
actor waits for its inbox with the policy's ``wake_at`` as deadline (the
pause's end, the instant the budget holds the waiter), and ticks the
policy whenever it wakes. Once its inbox is
closed, the actor handles nothing more: it stops and fails every waiter,
including those whose ``Acquire`` was still unread, with
``DispatcherClosed``. It does the same if it is cancelled.
"""

from __future__ import annotations

import collections
import itertools
import logging
from typing import TYPE_CHECKING, final

import trio

from .._dispatch._setup import policy_statistics
from .._exceptions import DispatcherClosed, QueueFull
from .._observe._hub import EventHub
from .._observe._translator import Translator
from .._policy._budgets import AdaptiveLimit
from .._validation import check_text
from ..messages._limits import Budget, Tenant, check_tenant
from ..messages._protocol import (
    Acquire,
    Adapt,
    Answered,
    Cancel,
    ObserveRateLimits,
    Pause,
    Release,
    ReportUsage,
    Resume,
    SchedulerMessage,
    SetLimit,
    SetModelBudget,
    SetTenant,
    Ticket,
)
from ._mailbox import Mailbox

if TYPE_CHECKING:
    from .._dispatch._backend import ProviderStatistics
    from .._dispatch._setup import BackendSetup
    from .._policy._ratelimits import RateLimitInfo
    from .._policy._slots import SlotPolicy
    from ..messages._protocol import Reply

_logger = logging.getLogger("trio_dispatch")

_new_ticket = tuple.__new__


@final
class SchedulerActor:
    """The scheduler of one provider.

    Construct it with its policy (the dispatcher makes it with
    ``from_setup``), start ``run`` in a nursery, and talk to it only with
    ``send``. ``policy`` may be read between checkpoints for
    statistics; it reflects every message the actor has handled so far, and
    every message sent so far right after ``handle_backlog``.
    """

    __slots__ = (
        "_batch",
        "_clock",
        "_events",
        "_hub",
        "_inbox",
        "_listening",
        "_plain",
        "_replies",
        "_seq",
        "_unlimited",
        "policy",
        "provider",
    )

    def __init__(
        self,
        provider: str,
        policy: SlotPolicy,
        hub: EventHub | None = None,
        *,
        events: Translator | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy
        if events is None:
            events = Translator(provider, EventHub() if hub is None else hub)
        self._hub = events.hub
        # What each step does becomes events and log lines there; events
        # only while anything listens, checked once per batch.
        self._events = events
        self._listening = False
        # No budget, no pause, nothing queued or being handled: a hot
        # message may be handled in the caller's task (see acquire). False
        # from the moment a message is queued until a batch has handled
        # every one (_queue, _settle), and once the inbox is closed, so that
        # the message meets the closed inbox and its error.
        self._plain = not policy.throttled and policy.wake_at is None
        # Whether the limit is None, kept with _plain: while that is true,
        # only a message changes the limit.
        self._unlimited = policy.limit is None
        self._inbox: Mailbox[SchedulerMessage] = Mailbox()
        # The messages taken from the inbox and not handled yet: if handling
        # one crashes the actor, those behind it are failed, not lost.
        self._batch: collections.deque[SchedulerMessage] = collections.deque()
        self._replies: dict[Ticket, Reply] = {}
        self._seq = itertools.count()
        # The clock's own method: trio.current_time() is two Python calls
        # more on every grant. Made outside a run (a test), the same as that.
        try:
            self._clock = trio.lowlevel.current_clock().current_time
        except RuntimeError:
            self._clock = trio.current_time

    @classmethod
    def from_setup(cls, setup: BackendSetup) -> SchedulerActor:
        """The local scheduler of ``setup.provider``, honouring every setting of ``setup``.

        The backend ``open_dispatcher`` makes for each provider without
        ``redis_url``: its policy is ``setup.policy()``, its events go to
        ``setup.events``.
        """
        return cls(setup.provider, setup.policy(), events=setup.events)

    def __repr__(self) -> str:
        return f"<SchedulerActor provider={self.provider!r} {self.policy!r}>"

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        """A fresh ticket; its ``seq`` matches the order of the inbox."""
        # tuple.__new__ is what Ticket's own __new__ calls, without its
        # Python frame: one ticket per request.
        return _new_ticket(Ticket, (rank, next(self._seq), priority, tenant, model))

    def send(self, message: SchedulerMessage) -> None:
        """Put a message in the inbox; never blocks.

        Raises:
            trio.ClosedResourceError: The actor has stopped.
        """
        self._queue(message)

    def _queue(self, message: SchedulerMessage) -> None:
        """Queue ``message``, which no later message overtakes.

        No message is handled in a caller's task again until a batch has
        handled every queued one (``_settle``).
        """
        self._plain = False
        self._inbox.send_nowait(message)

    def _settle(self) -> None:
        """After a batch: whether a hot message may be handled at once again."""
        policy = self.policy
        inbox = self._inbox
        self._plain = (
            not policy.throttled
            and policy.wake_at is None
            and not inbox.closed
            and not len(inbox)
        )
        self._unlimited = policy.limit is None

    def close(self) -> None:
        """Refuse further messages; the actor stops and fails the waiters."""
        self._inbox.close()
        self._plain = False

    # The Backend interface: each queues one message, never blocks, and
    # raises trio.ClosedResourceError once the actor is closed.

    # The hot path of every hand-off: when nothing is queued, no batch is
    # under way and the provider has no budget and no pause (nothing to
    # watch the clock for): ``_plain``, acquire, release and cancel go
    # through the actor's own handlers at once, in the calling task, exactly
    # as the actor's task would handle their messages next, and the grants a
    # release frees go to their waiters from here, as ``trio.CapacityLimiter``
    # hands a released token on. No message is built then. While nothing
    # listens and no tenant is counted, the handlers' common case is inline
    # here: a call less per message, and no clock read but for a grant. The
    # actor's task is not woken, unless an unlimited provider went idle (it
    # may stop then). Otherwise the message is queued, behind what came
    # before it. Protected like run: the policy changes and the requesters
    # are told together.

    @trio.lowlevel.enable_ki_protection
    def acquire(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None = None,
        tokens: int = 0,
    ) -> None:
        """Ask for a slot; the answer goes to ``reply``, perhaps before this returns."""
        if not self._plain:
            self._queue(Acquire(ticket, reply, conversation_id, tokens))
            return
        if self._listening or self._hub.sinks:
            self._listen()
        policy = self.policy
        if self._listening or policy.needs_clock:
            self._on_acquire(ticket, reply, conversation_id, tokens, None)
        else:
            try:
                grants = policy.acquire(ticket, tokens)
            except (QueueFull, ValueError) as exc:
                self._acquire_refused(ticket, reply, conversation_id, exc, None)
            else:
                if not grants:
                    self._replies[ticket] = reply
                elif len(grants) == 1 and grants[0] is ticket:
                    reply.granted(ticket, self._clock())
                else:
                    self._replies[ticket] = reply
                    self._deliver(grants, self._clock())
        if self._unlimited and not policy.in_flight and not policy.waiting:
            self._inbox.nudge()  # an idle unlimited provider's actor may stop

    @trio.lowlevel.enable_ki_protection
    def release(self, ticket: Ticket) -> None:
        """Give back the slot of a granted ticket."""
        if not self._plain:
            self._queue(Release(ticket))
            return
        if self._listening or self._hub.sinks:
            self._listen()
        policy = self.policy
        if self._listening or policy.needs_clock:
            self._on_release(ticket, None)
        else:
            try:
                grants = policy.release(ticket)
            except RuntimeError as exc:
                self._withdraw(ticket, exc)
            else:
                if grants:
                    # _deliver, inline (nothing listens).
                    now = self._clock()
                    replies = self._replies
                    for granted in grants:
                        replies.pop(granted).granted(granted, now)
        if self._unlimited and not policy.in_flight and not policy.waiting:
            self._inbox.nudge()  # an idle unlimited provider's actor may stop

    @trio.lowlevel.enable_ki_protection
    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a ticket, waiting or granted."""
        if not self._plain:
            self._queue(Cancel(ticket))
            return
        if self._listening or self._hub.sinks:
            self._listen()
        self._on_cancel(ticket, None)
        policy = self.policy
        if self._unlimited and not policy.in_flight and not policy.waiting:
            self._inbox.nudge()  # an idle unlimited provider's actor may stop

    def answered(self, ticket: Ticket) -> None:
        """The answer of a granted ticket's request has started."""
        self._queue(Answered(ticket))

    def report_usage(self, ticket: Ticket, tokens: int) -> None:
        """The tokens a granted ticket's request used."""
        self._queue(ReportUsage(ticket, tokens))

    def set_limit(self, limit: int | AdaptiveLimit | None) -> None:
        """A new limit: fixed, adaptive, or ``None`` for unlimited."""
        self._queue(
            Adapt(limit) if isinstance(limit, AdaptiveLimit) else SetLimit(limit)
        )

    def pause(self, reported_at: float, retry_after: float | None) -> None:
        """A rate-limit answer: pause the grants."""
        self._queue(Pause(reported_at, retry_after))

    def resume(self) -> None:
        """End the pause and its backoff streak."""
        self._queue(Resume())

    def set_tenant(self, tenant: str, settings: Tenant | None) -> None:
        """Give ``tenant`` a weight and a cap; ``None``: back to the defaults.

        Raises:
            TypeError: ``tenant`` is not a string, or ``settings`` not a
                ``Tenant`` or ``None``.
            ValueError: ``tenant`` is empty or too long.
            trio.ClosedResourceError: The actor has stopped.
        """
        check_tenant(tenant, settings)
        self._queue(SetTenant(tenant, settings))

    def set_model_budget(self, model: str, budget: Budget) -> None:
        """Give ``model`` a budget of its own, beside the provider's.

        Raises:
            TypeError: ``model`` is not a string or ``budget`` not a ``Budget``.
            ValueError: ``model`` is empty.
            trio.ClosedResourceError: The actor has stopped.
        """
        check_text(model, "model")
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a Budget, got {budget!r}")
        self._queue(SetModelBudget(model, budget))

    def observe_rate_limits(
        self, observed_at: float, info: RateLimitInfo, model: str | None = None
    ) -> None:
        """The rate-limit figures of one of the provider's answers (for ``model``)."""
        self._queue(ObserveRateLimits(observed_at, info, model))

    def adaptive_value(self) -> int | None:
        """The adaptive limit's current value, or ``None`` for a fixed one."""
        throttle = self.policy.throttle
        return None if throttle is None else throttle.limit

    def statistics(self) -> ProviderStatistics:
        """The provider's snapshot, every message sent so far handled."""
        self.handle_backlog()
        return policy_statistics(self.provider, self.policy, trio.current_time())

    # KeyboardInterrupt waits for the next checkpoint: between two, the actor
    # changes the policy and tells the requesters, which must go together.
    @trio.lowlevel.enable_ki_protection
    async def run(self, *, stop_when_idle: bool = False) -> bool:
        """Serve the inbox until it is closed or the task is cancelled.

        Args:
            stop_when_idle: Also stop as soon as the provider is unlimited
                and idle: no slot held, none waiting, nothing queued. Then
                nobody can have a ticket to release or cancel here, so no
                message can be lost; the inbox stays open, and ``run`` may
                be called again (the dispatcher does, on the next request).

        Returns:
            ``True`` if it stopped because it was idle.
        """
        inbox = self._inbox
        policy = self.policy
        handle = self._handle
        stopped_idle = False
        try:
            while True:
                # Checked before every wait, not only after a batch:
                # handle_backlog may have done this actor's work before its
                # task first ran, and then nothing would wake it.
                if stop_when_idle and policy.limit is None and self._idle():
                    # Nothing to fail, and the inbox stays open.
                    stopped_idle = True
                    return True
                paused_until = policy.wake_at
                if self._batch:
                    # Left by a crash in handle_backlog, which may have
                    # emptied the inbox: nothing would wake us for it.
                    await trio.lowlevel.checkpoint()
                elif paused_until is None:
                    await inbox.wait()
                else:
                    with trio.move_on_at(paused_until):
                        await inbox.wait()
                if inbox.closed:
                    return False
                now = trio.current_time()
                policy.advance(now)
                if self._batch:
                    self._handle_batch(inbox.take_all(), now)
                    continue
                # _handle_batch's common case, inline: this loop is the hot
                # path of every hand-off, and a call per wake-up shows.
                self._listen()
                batch = self._batch = inbox.take_all()
                while batch:
                    handle(batch[0], now)
                    batch.popleft()
                if policy.wake_at is not None:
                    self._tick(now)
                self._settle()
        finally:
            if not stopped_idle:
                self._shutdown()

    def _listen(self) -> None:
        """Check, once per batch, whether anything listens to the events."""
        if self._hub.sinks:
            self._listening = True
        elif self._listening:
            self._listening = False
            # Tickets that change while nothing listens would be misdated;
            # none is remembered while nothing listens.
            self._events.forget()

    def _idle(self) -> bool:
        """Unlimited, no slot held or waiting, nothing to handle: may stop."""
        policy = self.policy
        inbox = self._inbox
        return (
            policy.limit is None
            and not policy.in_flight
            and not policy.waiting
            and not len(inbox)
            and not inbox.closed
            and not self._batch
        )

    # Called from any task (statistics), so protected like run: a
    # KeyboardInterrupt between a policy change and its delivery would lose
    # a grant.
    @trio.lowlevel.enable_ki_protection
    def handle_backlog(self) -> None:
        """Handle every queued message now, in the calling task; never blocks.

        Afterwards ``policy`` reflects every message sent so far, and a
        pause that has run out has ended. The actor handles a batch the same
        way without a checkpoint, so this never splits one; its task, woken
        by those messages, finds nothing left to do. Costs a length check
        when the inbox is empty. Does nothing once the actor is closed.
        """
        inbox = self._inbox
        if inbox.closed:
            return
        if not len(inbox):
            paused_until = self.policy.wake_at
            if paused_until is None or trio.current_time() < paused_until:
                return
        self._handle_batch(inbox.take_all(), trio.current_time())

    def _handle_batch(
        self, messages: collections.deque[SchedulerMessage], now: float
    ) -> None:
        batch = self._batch
        if batch:
            # Left by a crash in handle_backlog: the actor's task meets the
            # same message next, in order, and crashes the usual way.
            batch.extend(messages)
        else:
            self._batch = batch = messages
        self.policy.advance(now)
        self._listen()
        while batch:
            self._handle(batch[0], now)
            batch.popleft()
        if self.policy.wake_at is not None:
            self._tick(now)
        self._settle()

    def _tick(self, now: float) -> None:
        """Tell the paused policy the time: a pause that ran out ends."""
        policy = self.policy
        paused = policy.paused_until is not None
        grants = policy.tick(now)
        if paused and policy.paused_until is None:
            self._events.resumed(now, "expired")
        if grants:
            self._deliver(grants, now)

    def _handle(self, message: SchedulerMessage, now: float) -> None:
        """Apply one message to the policy, and tell whoever it concerns.

        The one handler of every message: its outcomes go to the
        translator's events while anything listens (``_listening``, set
        per batch), and to its log lines always.
        """
        policy = self.policy
        # Ordered by how often each message comes; most free nothing, so
        # delivery is skipped when there is nothing to deliver. The policy's
        # refusals are caught per message: a misuse fails its own request,
        # never the actor (and a try costs nothing until it raises).
        if isinstance(message, Release):
            self._on_release(message.ticket, now)
            return
        if isinstance(message, Acquire):
            self._on_acquire(
                message.ticket,
                message.reply,
                message.conversation_id,
                message.tokens,
                now,
            )
            return
        if isinstance(message, Cancel):
            self._on_cancel(message.ticket, now)
            return
        if isinstance(message, SetLimit):
            previous = policy.limit
            try:
                grants = policy.set_limit(message.limit)
            except (TypeError, ValueError) as exc:
                self._drop(message, exc)
                return
            self._events.limit_changed(previous, message.limit, now)
        elif isinstance(message, Pause):
            self._pause(message, now)
            return
        else:
            grants = self._rarely(message, now)
        if grants:
            self._deliver(grants, now)

    # The handlers of the hot messages take their fields, not the message:
    # the caller's task runs them without building one (see acquire), and
    # passes ``now=None``: the clock is read only if a grant or an event
    # needs it, once (while anything listens, or once the policy counts
    # tenants' service, ``needs_clock``: at the start, and told to it).

    def _on_release(self, ticket: Ticket, now: float | None) -> None:
        policy = self.policy
        if now is None and (self._listening or policy.needs_clock):
            # Tenants' service needs the time of grants and releases.
            now = trio.current_time()
            policy.advance(now)
        listening = self._listening
        before = (policy.in_flight, policy.waiting) if listening else None
        try:
            grants = policy.release(ticket)
        except RuntimeError as exc:
            self._withdraw(ticket, exc)
            if listening:
                self._events.withdrawn(
                    ticket, _now(now), policy.in_flight, policy.waiting
                )
            return
        if before is not None:
            self._events.left(
                ticket, _now(now), before, policy.in_flight, policy.waiting, len(grants)
            )
        if grants:
            self._deliver(grants, _now(now))

    def _on_cancel(self, ticket: Ticket, now: float | None) -> None:
        policy = self.policy
        if now is None and (self._listening or policy.needs_clock):
            # Tenants' service needs the time of grants and releases.
            now = trio.current_time()
            policy.advance(now)
        self._replies.pop(ticket, None)
        before = (policy.in_flight, policy.waiting) if self._listening else None
        grants = policy.cancel(ticket)
        if before is not None:
            self._events.left(
                ticket, _now(now), before, policy.in_flight, policy.waiting, len(grants)
            )
        if grants:
            self._deliver(grants, _now(now))

    def _on_acquire(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None,
        tokens: int,
        now: float | None,
    ) -> None:
        policy = self.policy
        if now is None and (self._listening or policy.needs_clock):
            # Tenants' service needs the time of grants and releases.
            now = trio.current_time()
            policy.advance(now)
        try:
            grants = policy.acquire(ticket, tokens)
        except (QueueFull, ValueError) as exc:
            self._acquire_refused(ticket, reply, conversation_id, exc, now)
            return
        if len(grants) == 1 and grants[0] is ticket:
            reply.granted(ticket, _now(now))
            if self._listening:
                self._events.granted_at_once(
                    ticket, conversation_id, _now(now), policy.in_flight, policy.waiting
                )
            return
        # It waits, or its arrival let others through too (a held-back head
        # whose budget is back, another model's ticket): it queues like
        # any waiter, and every grant goes to its own reply.
        self._replies[ticket] = reply
        if self._listening:
            self._events.queued(
                ticket,
                conversation_id,
                _now(now),
                policy.in_flight,
                policy.waiting,
            )
        if grants:
            self._deliver(grants, _now(now))

    def _acquire_refused(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None,
        exc: QueueFull | ValueError,
        now: float | None,
    ) -> None:
        """The policy refused an acquire: fail its requester, and say so."""
        policy = self.policy
        withdrawn = self._replies.get(ticket) is reply
        self._refuse(ticket, reply, exc)
        if withdrawn and self._listening:
            self._events.withdrawn(ticket, _now(now), policy.in_flight, policy.waiting)
        if isinstance(exc, QueueFull):
            self._events.refused(
                ticket,
                conversation_id,
                _now(now),
                exc,
                policy.in_flight,
                policy.waiting,
            )

    def _rarely(
        self,
        message: Resume
        | ReportUsage
        | Answered
        | ObserveRateLimits
        | Adapt
        | SetTenant
        | SetModelBudget,
        now: float,
    ) -> list[Ticket]:
        """The messages that come least often: resume, budgets, limits, tenants."""
        policy = self.policy
        previous = policy.limit
        if isinstance(message, ReportUsage):
            grants = policy.report_usage(message.ticket, message.tokens)
        elif isinstance(message, ObserveRateLimits):
            grants = policy.observe_rate_limits(
                message.observed_at, message.info, message.model
            )
        elif isinstance(message, SetTenant):
            grants = policy.set_tenant(message.tenant, message.settings)
        elif isinstance(message, SetModelBudget):
            grants = policy.set_model_budget(message.model, message.budget)
        elif isinstance(message, Answered):
            policy.answered(message.ticket)
            return []
        elif isinstance(message, Adapt):
            grants = policy.set_limit(message.limit)
        else:
            paused = policy.paused_until is not None
            grants = policy.resume()
            if paused:
                self._events.resumed(now, "resumed")
        # The adaptive limit's own moves have no log line.
        self._events.limit_changed(previous, policy.limit, now, log=False)
        return grants

    def _pause(self, message: Pause, now: float) -> None:
        """Apply a rate-limit report, or drop it as a misuse."""
        policy = self.policy
        try:
            policy.report_rate_limit(message.reported_at, message.retry_after)
        except (TypeError, ValueError) as exc:
            self._drop(message, exc)
            return
        until = policy.paused_until if policy.limit is not None else None
        self._events.paused(now, until, message.retry_after)

    def _refuse(self, ticket: Ticket, reply: Reply, error: Exception) -> None:
        if self._replies.get(ticket) is reply:
            # The requester that waits on this ticket asked again: failing
            # it ends its wait, so its ticket must not be granted later to
            # a requester that is gone.
            self._withdraw(ticket, error)
            return
        reply.refused(error)

    def _withdraw(self, ticket: Ticket, error: Exception) -> None:
        reply = self._replies.pop(ticket)
        # It may have been the head a budget held back: the others it lets
        # through are granted now, and must be told.
        grants = self.policy.cancel(ticket)
        reply.refused(error)
        if grants:
            self._deliver(grants, trio.current_time())

    def _drop(self, message: SetLimit | Pause, error: Exception) -> None:
        _logger.error(
            "the scheduler of %r ignored %r: %s", self.provider, message, error
        )

    def _deliver(self, grants: list[Ticket], now: float) -> None:
        replies = self._replies
        for ticket in grants:
            replies.pop(ticket).granted(ticket, now)
        if self._listening:
            policy = self.policy
            self._events.granted(grants, now, policy.in_flight, policy.waiting)

    def _shutdown(self) -> None:
        self._inbox.close()
        self._plain = False
        pending = self._batch
        self._batch = collections.deque()
        pending.extend(self._inbox.take_all())
        for message in pending:
            if isinstance(message, Acquire):
                message.reply.refused(self._closed_error())
        replies = list(self._replies.values())
        self._replies.clear()
        for reply in replies:
            reply.refused(self._closed_error())

    def _closed_error(self) -> DispatcherClosed:
        return DispatcherClosed(
            f"the dispatcher closed while waiting for {self.provider!r}"
        )


def _now(now: float | None) -> float:
    """``now``, or the trio clock's time when it was not read yet."""
    return trio.current_time() if now is None else now
