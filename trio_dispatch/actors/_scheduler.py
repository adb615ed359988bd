"""The scheduler actor: one per provider in use, on a ``SlotPolicy``.

Design note. The actor owns a ``SlotPolicy`` and is the only code that
touches it. Everything reaches it as a typed message through ``send``, and
every message is handled by one handler, ``_handle``, in the order it was
sent, so a ``Cancel`` never overtakes its ``Acquire``.

Which task runs the handler is one rule: the task that sends a message to
an idle actor handles it at once, and before it returns every message sent
meanwhile (by what the handling itself set off: a grant that reaches a
requester who gave up and gives it back); a message sent while a task is
handling waits in the inbox for that task. So ``send`` never blocks and
never waits for another task (it works in a ``finally`` under
cancellation, without a shield), a grant reaches its waiter's ``Reply``
from the releasing task as ``trio.CapacityLimiter`` hands a token on, and
``policy`` and ``statistics()`` reflect every message sent as soon as
``send`` returns. ``send`` is protected from ``KeyboardInterrupt``: the
policy changes and the requesters are told together.

The actor's own task (``run``) handles no message of its own: it keeps the
time. While the provider is paused, or its oldest waiter waits for budget,
it sleeps until the policy's ``wake_at`` (the pause's end, the instant the
budget holds the waiter) and then sends the actor a ``_Tick``, handled
like any message; it wakes early whenever a handling changed ``wake_at``,
closed the actor, or left an unlimited provider idle (``run`` may stop
then, see ``stop_when_idle``).

A grant is marked in the policy the moment it is delivered; a grant that
reaches a requester who has just given up is ignored by its reply, and the
requester's ``Cancel`` releases it. So slots never leak through that race.

A message the policy refuses as a misuse (a ticket it already knows, the
release of a ticket that still waits, a bad limit) fails only the request
it concerns, never the actor: an ``Acquire`` is answered with the error, a
``Release`` of a waiting ticket withdraws that ticket and fails its
requester (granting it later would give a slot to a requester that thinks
it gave it back), and a ``SetLimit`` or ``Pause`` that nobody can be told
about is logged and dropped. The policy changes nothing when it refuses,
so its invariants hold.

Anything else the handler raises is a bug: the actor stops at once (every
waiter and every message still queued fails with ``DispatcherClosed``, and
later sends raise ``trio.ClosedResourceError``) and ``run`` raises the
error, so that it reaches the dispatcher's nursery; the sender that met it
is not failed by another's bug.

What each step of the policy does (a ticket queued, granted, released,
withdrawn or refused; a pause, a resume, a new limit) goes to a
``Translator``, which makes the log lines and, while anything listens to
the dispatcher's events (``EventHub.sinks``), the events; the Redis-shared
scheduler uses the same translator. Whether anything listens is checked
once per handling, so nobody listening costs a flag test per message, and
no event is built.

Once closed, the actor handles nothing more: ``run`` stops and fails every
waiter with ``DispatcherClosed``. It does the same if it is cancelled.

A scheduler of pooled providers (``open_dispatcher``'s ``pools``) has a
policy of several members: a message for one member or pool comes in a
``ForMember`` and is handled as the same message, for that member. Its
grants say their member (``member_of``), and it remembers the member of
each conversation's latest grant, the member its next request prefers
(``affinity_wait``), for the ``MAX_CONVERSATIONS`` conversations seen last.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Protocol, TypeAlias, final

import attrs
import trio

from .._dispatch._setup import policy_statistics, pooled
from .._exceptions import DispatcherClosed, PoolRemoved, QueueFull
from .._observe._hub import EventHub
from .._observe._translator import Translator
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
from ._mailbox import Mailbox

if TYPE_CHECKING:
    import collections
    from collections.abc import Callable, Iterable, Mapping

    from .._dispatch._backend import ProviderStatistics
    from .._dispatch._setup import BackendSetup
    from .._policy._budgets import AdaptiveLimit
    from .._policy._slots import GroupState, MemberState, PoolStatistics, SlotPolicy
    from ..messages._protocol import Reply

_logger = logging.getLogger("trio_dispatch")

_new_ticket = tuple.__new__

#: Every scheduler's tickets are numbered by one count: a ticket is never
#: another scheduler's too, so tickets may move from one to another (a
#: provider that joins a pool, ``give_way``).
_SEQ = itertools.count()


class _Sends(Protocol):
    """Where a scheduler that gave way sends what still reaches it."""

    def send(self, message: SchedulerMessage) -> None: ...


@final
@attrs.frozen
class _Tick:
    """The time the policy waits for (``wake_at``) has come: the run task's message."""


_TICK = _Tick()


@final
@attrs.frozen
class Handover:
    """What a provider's own scheduler hands the group's it gives way to (``give_way``).

    Attributes:
        member: The provider.
        state: What it learned and holds (``SlotPolicy.member_state``).
        waiting: Its waiting requests, in their order, as the ``Acquire``
            each was (its reply, conversation and estimate).
        seen: Since when each of its requests waits or holds, for the
            events (``Translator.hand_over``).
    """

    member: str
    state: MemberState
    waiting: tuple[Acquire, ...]
    seen: Mapping[Ticket, tuple[str | None, float]]


@final
@attrs.frozen
class GroupHandover:
    """What a group's scheduler hands another group's as the groups merge (``give_way_whole``).

    Attributes:
        state: Its members, pools and queue (``SlotPolicy.group_state``).
        waiting: Its waiting requests, in their order, as the ``Acquire``
            each was (its reply, conversation and estimate).
        seen: Since when each of its requests waits or holds, for the
            events (``Translator.hand_over``).
        names: What each request's events name (its member, or what it
            asked for, and its pool).
        latest: The member of each conversation's latest grant, oldest
            first, which its next request prefers.
    """

    state: GroupState
    waiting: tuple[Acquire, ...]
    seen: Mapping[Ticket, tuple[str | None, float]]
    names: Mapping[Ticket, tuple[str, str | None]]
    latest: Mapping[str, str]


@final
@attrs.frozen
class _Join:
    """A provider joins this pooled scheduler (``add_member``, ``take_over``).

    ``setup``: it is made a member with what that says; ``None``: it is
    one already. ``handover``: what its own scheduler hands on, if it had
    one.
    """

    setup: BackendSetup | None
    handover: Handover | None


@final
@attrs.frozen
class _Merge:
    """A group's scheduler gave way to this one: its members, pools and requests join (``merge``).

    ``limits``: each of its members' limit as configured.
    """

    handover: GroupHandover
    limits: Mapping[str, int | AdaptiveLimit | None]


#: The actor's own messages, beside the protocol's.
_Own: TypeAlias = _Tick | _Join | _Merge

#: How many conversations' latest member a pooled scheduler remembers.
MAX_CONVERSATIONS = 65_536


@final
class SchedulerActor:
    """The scheduler of one provider.

    Construct it with its policy (the dispatcher makes it with
    ``from_setup``), start ``run`` in a nursery, and talk to it only with
    ``send``. ``on_limit(provider, limit)``, if given, is called whenever a
    message changed the limit, an adaptive limit's moves included. ``policy`` may be read between checkpoints for statistics; it
    reflects every message sent so far.
    """

    __slots__ = (
        "_clock",
        "_conversations",
        "_crash",
        "_events",
        "_forward",
        "_handling",
        "_hub",
        "_inbox",
        "_latest",
        "_limit",
        "_limits",
        "_listening",
        "_names",
        "_on_limit",
        "_replies",
        "_seq",
        "_sleeping_until",
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
        on_limit: Callable[[str, int | None], None] | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy
        # Told the limit whenever a handling changed it (an adaptive
        # limit's moves too): the dispatcher's limits() reads no backend.
        self._on_limit = on_limit
        self._limit = policy.limit
        if events is None:
            events = Translator(provider, EventHub() if hub is None else hub)
        self._hub = events.hub
        # What each step does becomes events and log lines there; events
        # only while anything listens, checked once per handling.
        self._events = events
        self._listening = False
        # The messages sent while a task handles others, for that task.
        self._inbox: Mailbox[SchedulerMessage | _Own] = Mailbox()
        # Whether a task is handling messages now (see send).
        self._handling = False
        # The wake_at the run task sleeps until: a handling that changes
        # the policy's wakes it to sleep again until the new one.
        self._sleeping_until: float | None = None
        # The bug the handler met, for run to raise.
        self._crash: BaseException | None = None
        self._replies: dict[Ticket, Reply] = {}
        # Pooled: each member's limit as last told, the conversation of
        # each waiting ticket, and the member of each conversation's
        # latest grant (oldest first), which its next request prefers.
        self._limits: dict[str, int | None] = (
            policy.member_limits() if pooled(policy) else {}
        )
        self._conversations: dict[Ticket, str] = {}
        self._latest: dict[str, str] = {}
        # Pooled: what each ticket's events name (its member once granted,
        # what it asked for until then) and its pool (see Translator.names).
        self._names: dict[Ticket, tuple[str, str | None]] = {}
        if self._limits:
            events.names = self._names
        self._seq = _SEQ
        # Where messages go once this scheduler gave way to a group's.
        self._forward: _Sends | None = None
        # The clock's own method: trio.current_time() is two Python calls
        # more on every message. Made outside a run (a test), the same as that.
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
        return cls(
            setup.provider,
            setup.policy(),
            events=setup.events,
            on_limit=setup.learn_limit,
        )

    def __repr__(self) -> str:
        return f"<SchedulerActor provider={self.provider!r} {self.policy!r}>"

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        """A fresh ticket; its ``seq`` matches the order of the messages."""
        # tuple.__new__ is what Ticket's own __new__ calls, without its
        # Python frame: one ticket per request.
        return _new_ticket(Ticket, (rank, next(self._seq), priority, tenant, model))

    # Protected like run: the policy changes and the requesters are told
    # together, and a KeyboardInterrupt between the two would lose a grant.
    @trio.lowlevel.enable_ki_protection
    def send(self, message: SchedulerMessage | _Own) -> None:
        """Hand the actor ``message``; never blocks.

        Handled before this returns, in this task, unless a task is
        handling messages now (then that task handles it before it returns):
        its answers to any ``Reply`` may come before this returns.

        Raises:
            trio.ClosedResourceError: The actor is closed.
        """
        inbox = self._inbox
        if self._handling or inbox.closed:
            self._send_later(message)
            return
        # One handling: this message, then every one sent meanwhile.
        self._handling = True
        policy = self.policy
        batch: collections.deque[SchedulerMessage | _Own] | None = None
        try:
            now = self._clock()
            policy.advance(now)
            if self._listening or self._hub.sinks:
                self._listen()
            self._handle(message, now)
            while inbox.queue:
                batch = inbox.take_all()
                while batch:
                    self._handle(batch[0], now)
                    batch.popleft()
            wake_at = policy.wake_at
            if wake_at is not None:
                self._tick(now)
                wake_at = policy.wake_at
            if policy.service_changes:
                self._service_changed(now)
        except BaseException as exc:  # a bug: nothing else escapes _handle
            self._handling = False
            self._crashed(exc, [message] if batch is None else list(batch))
            return
        self._handling = False
        limit = policy.limit
        if self._limits:
            # Pooled: each member's limit, whatever their sum does.
            self._limit = limit
            if self._on_limit is not None:
                self._tell_limits()
        elif limit != self._limit:
            self._limit = limit
            if self._on_limit is not None:
                self._on_limit(self.provider, limit)
        # Wake the run task when what it sleeps for changed: the time to
        # tick the policy, or an unlimited provider now idle (it may stop).
        if wake_at != self._sleeping_until or (
            limit is None and not policy.in_flight and not policy.waiting
        ):
            inbox.nudge()

    def _send_later(self, message: SchedulerMessage | _Own) -> None:
        """``message`` for the task handling now; once closed, refused or sent where it gave way."""
        forward = self._forward
        if forward is not None and not isinstance(message, _Own):
            # It gave way to a group's scheduler: its holders' releases
            # (and the rest) are the group's now.
            forward.send(message)
            return
        self._inbox.send_nowait(message)  # raises once closed

    def _service_changed(self, now: float) -> None:
        """Tell each member's move out of service, to half-open and back, in order."""
        changes = self.policy.service_changes
        for member, state, until in changes:
            self._events.service_changed(now, member, state, until)
        changes.clear()

    def _tell_limits(self) -> None:
        """Pooled: tell ``on_limit`` each member's limit that changed."""
        assert self._on_limit is not None
        told = self._limits
        for member, limit in self.policy.member_limits().items():
            if member not in told or told[member] != limit:
                told[member] = limit
                self._on_limit(member, limit)

    def add_member(self, setup: BackendSetup, handover: Handover | None = None) -> None:
        """Make ``setup.provider`` a member of this pooled scheduler, now.

        With its limit, budgets and pause as ``setup`` says (``carried``:
        those it learned under a scheduler of its own, and its holders),
        and the requests ``handover`` brings waiting for it, in their
        place; then the requests waiting for any member may take it.
        Handled as a message, in its order among the others.

        Raises:
            trio.ClosedResourceError: The actor is closed.
        """
        self.send(_Join(setup, handover))

    def take_over(self, handover: Handover) -> None:
        """Take over what a member's own scheduler handed on (``give_way``): its waiting requests.

        For a member made with its ``carried`` state already (a group's
        scheduler made after it gave way). Handled as a message.

        Raises:
            trio.ClosedResourceError: The actor is closed.
        """
        self.send(_Join(None, handover))

    def merge(
        self,
        handover: GroupHandover,
        limits: Mapping[str, int | AdaptiveLimit | None],
    ) -> None:
        """Take in a group whose scheduler gave way to this one (``give_way_whole``).

        Its members, each with its limit in ``limits`` and what it learned
        and holds, its pools, and its waiting requests in their place, all
        before anything is granted (``SlotPolicy.merge``). Handled as a
        message, in its order among the others.

        Raises:
            trio.ClosedResourceError: The actor is closed.
        """
        self.send(_Merge(handover, limits))

    def give_way(self, to: _Sends) -> Handover:
        """Hand this provider over to a group's scheduler that takes it as a member.

        Returns what it learned and holds, for the group's policy to take
        on (``BackendSetup.carried``), and its waiting requests, for the
        group's scheduler to take over in their place (``add_member``,
        ``take_over``). From now on every message sent here goes ``to``
        (its holders' releases, their answers' news, a waiting request's
        cancellation), and ``run`` stops without failing anyone.

        Raises:
            RuntimeError: It is handling a message, or closed.
            ValueError: Its policy is a group's (``member_state``).
        """
        self._check_idle()
        state = self.policy.member_state()
        waiting, seen = self._hand_off(state.waiting, state.holders)
        self._leave(to)
        return Handover(self.provider, state, waiting, seen)

    def give_way_whole(self, to: _Sends) -> GroupHandover:
        """Hand this group over, whole, to another group's scheduler (``merge``).

        As ``give_way`` does a provider's: its members, pools and queue,
        and its waiting requests, for the other to take in their place;
        every message sent here goes ``to`` from now on.

        Raises:
            RuntimeError: It is handling a message, or closed.
        """
        self._check_idle()
        state = self.policy.group_state()
        holders = [ticket for _, member in state.members for ticket in member.holders]
        waiting, seen = self._hand_off(
            [(each.ticket, each.tokens) for each in state.waiting], holders
        )
        names = self._names
        tickets = [*holders, *(acquire.ticket for acquire in waiting)]
        handover = GroupHandover(
            state,
            waiting,
            seen,
            {ticket: names[ticket] for ticket in tickets if ticket in names},
            dict(self._latest),
        )
        self._leave(to)
        return handover

    def _check_idle(self) -> None:
        if self._handling or self._inbox.closed:
            raise RuntimeError("a scheduler gives way only while idle and open")

    def _hand_off(
        self, asked: Iterable[tuple[Ticket, int]], holders: Iterable[Ticket]
    ) -> tuple[tuple[Acquire, ...], dict[Ticket, tuple[str | None, float]]]:
        """The requests waiting (``asked``, with their estimates) as ``Acquire``, and the events' record of them and of ``holders``, taken from here."""
        waiting: list[Acquire] = []
        for ticket, tokens in asked:
            reply = self._replies.pop(ticket)
            waiting.append(Acquire(ticket, reply, _conversation_of(reply), tokens))
        seen = self._events.hand_over([*holders, *(a.ticket for a in waiting)])
        return tuple(waiting), seen

    def _leave(self, to: _Sends) -> None:
        """Gave way: every message goes ``to`` from now on, and ``run`` stops."""
        self._forward = to
        self._inbox.close()

    @property
    def handling(self) -> bool:
        """Whether a task is handling its messages now (it cannot ``give_way`` then)."""
        return self._handling

    @property
    def closed(self) -> bool:
        """Whether it takes no message of its own any more: closed, stopped by a bug, or gave way."""
        return self._inbox.closed

    def close(self) -> None:
        """Refuse further messages; ``run`` stops and fails every waiter."""
        self._inbox.close()

    def statistics(self) -> ProviderStatistics:
        """The provider's snapshot now: every message sent so far handled.

        A pause or a budget wait that has run out ends first, as the run
        task would end it when it next wakes.
        """
        self._tick_if_due()
        return policy_statistics(self.provider, self.policy, self._clock())

    def member_of(self, ticket: Ticket) -> str | None:
        """The member on which ``ticket`` holds its slot, or ``None`` if it holds none."""
        return self.policy.member_of(ticket)

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a member or a pool of this scheduler's policy."""
        return self.policy.knows(name)

    def member_statistics(self, member: str) -> ProviderStatistics:
        """One member's snapshot now, as ``statistics()`` is the provider's."""
        self._tick_if_due()
        return policy_statistics(member, self.policy, self._clock(), member=member)

    def pool_statistics(self) -> dict[str, PoolStatistics]:
        """Each pool's snapshot now, by name."""
        self._tick_if_due()
        return self.policy.pool_statistics()

    def _tick_if_due(self) -> None:
        """Send the tick the policy waits for, once its ``wake_at`` has come.

        Not during a handling (it ends with the tick itself), nor once
        closed (a crash closes the actor too).
        """
        wake_at = self.policy.wake_at
        if (
            wake_at is not None
            and self._clock() >= wake_at
            and not self._handling
            and not self._inbox.closed
        ):
            self.send(_TICK)

    # KeyboardInterrupt waits for the next checkpoint: between two, the actor
    # may tick the policy and tell the requesters, which must go together.
    @trio.lowlevel.enable_ki_protection
    async def run(self, *, stop_when_idle: bool = False) -> bool:
        """Keep the policy's time until the actor is closed or the task cancelled.

        Args:
            stop_when_idle: Also stop as soon as the provider is unlimited
                and idle: no slot held, none waiting. Then nobody can have
                a ticket to release or cancel here, so no message can be
                lost; the actor stays open, and ``run`` may be called again
                (the dispatcher does, on the next request).

        Returns:
            ``True`` if it stopped because it was idle.

        Raises:
            BaseException: The error a handling met (a bug), after the actor
                failed every waiter.
        """
        inbox = self._inbox
        policy = self.policy
        stopped_idle = False
        try:
            while True:
                if self._crash is not None:
                    raise self._crash
                if inbox.closed:
                    return False
                if stop_when_idle and self._idle():
                    # Nothing to fail, and the actor stays open.
                    stopped_idle = True
                    return True
                wake_at = self._sleeping_until = policy.wake_at
                if wake_at is None:
                    await inbox.wait()
                elif self._clock() < wake_at:
                    with trio.move_on_at(wake_at):
                        await inbox.wait()
                else:
                    await trio.lowlevel.checkpoint()
                self._sleeping_until = None
                self._tick_if_due()
        finally:
            self._sleeping_until = None
            if not stopped_idle:
                self._shutdown()

    def _listen(self) -> None:
        """Check, once per handling, whether anything listens to the events."""
        if self._hub.sinks:
            self._listening = True
        elif self._listening:
            self._listening = False
            # Tickets that change while nothing listens would be misdated;
            # none is remembered while nothing listens.
            self._events.forget()

    def _idle(self) -> bool:
        """Unlimited, no slot held or waiting, not closed: may stop."""
        policy = self.policy
        return (
            policy.limit is None
            and not policy.in_flight
            and not policy.waiting
            and not self._inbox.closed
            and not self._handling
        )

    def _tick(self, now: float) -> None:
        """Tell the paused policy the time: a pause that ran out ends."""
        policy = self.policy
        if self._limits:
            # Pooled: each member's pause is its own.
            pauses = policy.member_pauses()
            grants = policy.tick(now)
            for member, until in policy.member_pauses().items():
                if until is None and pauses.get(member) is not None:
                    self._events.resumed(now, "expired", member)
        else:
            paused = policy.paused_until is not None
            grants = policy.tick(now)
            if paused and policy.paused_until is None:
                self._events.resumed(now, "expired")
        if grants:
            self._deliver(grants, now)

    def _handle(
        self,
        message: SchedulerMessage | _Own,
        now: float,
        member: str | None = None,
    ) -> None:
        """Apply one message to the policy, and tell whoever it concerns.

        The one handler of every message: its outcomes go to the
        translator's events while anything listens (``_listening``, set
        per handling), and to its log lines always. ``member``: the member
        or pool a ``ForMember`` named (``None``: the provider's own).
        """
        policy = self.policy
        # Ordered by how often each message comes; most free nothing, so
        # delivery is skipped when there is nothing to deliver. The policy's
        # refusals are caught per message: a misuse fails its own request,
        # never the actor (and a try costs nothing until it raises).
        if isinstance(message, (Release, Failed)):
            self._on_release(message.ticket, now, failed=type(message) is Failed)
            return
        if isinstance(message, Acquire):
            self._on_acquire(message, now, member)
            return
        if isinstance(message, Cancel):
            self._on_cancel(message.ticket, now)
            return
        if isinstance(message, SetLimit):
            previous = (
                policy.limit if member is None else policy.member_limits().get(member)
            )
            try:
                grants = policy.set_limit(message.limit, member=member)
            except (TypeError, ValueError) as exc:
                self._drop(message, exc)
                return
            self._events.limit_changed(previous, message.limit, now, member=member)
        elif isinstance(message, Pause):
            self._pause(message, now, member)
            return
        elif isinstance(message, (_Tick, ForMember)):
            if isinstance(message, ForMember):
                self._for_member(message, now)
            # A tick: the handling's end tells the policy the time (send).
            return
        elif isinstance(message, (SetPool, RemovePool)):
            grants = self._set_pool(message, now)
        elif isinstance(message, (_Join, _Merge)):
            grants = self._join(message, now)
        else:
            grants = self._rarely(message, now, member)
        if grants:
            self._deliver(grants, now)

    def _on_release(self, ticket: Ticket, now: float, *, failed: bool = False) -> None:
        """``ticket`` gives its slot back; ``failed``: its call failed before its answer."""
        policy = self.policy
        listening = self._listening
        before = (policy.in_flight, policy.waiting) if listening else None
        try:
            grants = policy.fail(ticket, now) if failed else policy.release(ticket)
        except RuntimeError as exc:
            self._withdraw(ticket, exc, now)
            if listening:
                self._events.withdrawn(ticket, now, policy.in_flight, policy.waiting)
            self._ended(ticket)
            return
        if before is not None:
            self._events.left(
                ticket, now, before, policy.in_flight, policy.waiting, len(grants)
            )
        self._ended(ticket)
        if grants:
            self._deliver(grants, now)

    def _on_cancel(self, ticket: Ticket, now: float) -> None:
        policy = self.policy
        self._replies.pop(ticket, None)
        before = (policy.in_flight, policy.waiting) if self._listening else None
        grants = policy.cancel(ticket)
        if before is not None:
            self._events.left(
                ticket, now, before, policy.in_flight, policy.waiting, len(grants)
            )
        self._ended(ticket)
        if grants:
            self._deliver(grants, now)

    def _for_member(self, message: ForMember, now: float) -> None:
        """A message for one member or pool: handled as itself, for it."""
        member = message.member
        inner = message.message
        policy = self.policy
        if not policy.knows(member):
            error = ValueError(f"no member or pool {member!r} in this scheduler")
            if isinstance(inner, Acquire):
                self._acquire_refused(inner, error, now)
            else:
                _logger.error(
                    "the scheduler of %r ignored %r: %s", self.provider, message, error
                )
            return
        self._handle(inner, now, member)

    def _join(self, message: _Join | _Merge, now: float) -> list[Ticket]:
        """A provider joins: a member made, what its own scheduler handed on taken over.

        Or a group joins whole (``_Merge``).
        """
        if isinstance(message, _Merge):
            return self._merge(message)
        handover = message.handover
        waiting: list[tuple[Ticket, int]] = []
        if handover is not None:
            member = handover.member
            self._names.update(
                (ticket, (member, None))
                for ticket in [
                    *handover.state.holders,
                    *(a.ticket for a in handover.waiting),
                ]
            )
            self._take_waiting(handover.waiting, handover.seen)
            waiting = [(acquire.ticket, acquire.tokens) for acquire in handover.waiting]
        if message.setup is not None:
            return message.setup.join(self.policy, now, waiting)
        assert handover is not None  # one or the other
        return self.policy.requeue(waiting, member=handover.member)

    def _merge(self, message: _Merge) -> list[Ticket]:
        """A group joins whole: its members, pools and requests, in their place."""
        handover = message.handover
        self._names.update(handover.names)
        self._take_waiting(handover.waiting, handover.seen)
        latest = self._latest
        for conversation, member in handover.latest.items():
            # This group's own latest grant to a conversation stands.
            latest.setdefault(conversation, member)
        while len(latest) > MAX_CONVERSATIONS:
            del latest[next(iter(latest))]
        return self.policy.merge(handover.state, message.limits)

    def _take_waiting(
        self,
        waiting: tuple[Acquire, ...],
        seen: Mapping[Ticket, tuple[str | None, float]],
    ) -> None:
        """The requests another scheduler handed on wait here: their replies, conversations and events' times."""
        for acquire in waiting:
            ticket = acquire.ticket
            self._replies[ticket] = acquire.reply
            if acquire.conversation_id is not None:
                self._conversations[ticket] = acquire.conversation_id
        self._events.take_over(seen)

    def _set_pool(self, message: SetPool | RemovePool, now: float) -> list[Ticket]:
        """A pool made, changed or removed; those waiting for a removed one are refused."""
        policy = self.policy
        try:
            if isinstance(message, SetPool):
                return policy.set_pool(message.pool, message.members)
            grants, orphans = policy.remove_pool(message.pool)
        except ValueError as exc:
            _logger.error(
                "the scheduler of %r ignored %r: %s", self.provider, message, exc
            )
            return []
        for ticket in orphans:
            self._replies.pop(ticket).refused(
                PoolRemoved(
                    f"pool {message.pool!r} was removed while the request waited",
                    pool=message.pool,
                )
            )
            if self._listening:
                self._events.withdrawn(ticket, now, policy.in_flight, policy.waiting)
            self._ended(ticket)
        return grants

    def _on_acquire(
        self, message: Acquire, now: float, member: str | None = None
    ) -> None:
        policy = self.policy
        ticket = message.ticket
        conversation = message.conversation_id
        if member is not None:
            self._names[ticket] = (member, member if member in policy.pools else None)
        try:
            if member is None:
                grants = policy.acquire(ticket, message.tokens)
            else:
                grants = policy.acquire(
                    ticket,
                    message.tokens,
                    member=member,
                    prefer=None
                    if conversation is None
                    else self._latest.get(conversation),
                    avoid=message.avoid,
                )
        except (QueueFull, ValueError, TypeError) as exc:
            self._acquire_refused(message, exc, now)
            return
        if len(grants) == 1 and grants[0] is ticket:
            if member is not None:
                self._granted_on(ticket, conversation)
            message.reply.granted(ticket, now)
            if self._listening:
                self._events.granted_at_once(
                    ticket,
                    message.conversation_id,
                    now,
                    policy.in_flight,
                    policy.waiting,
                )
            return
        # It waits, or its arrival let others through too (a held-back head
        # whose budget is back, another model's ticket): it queues like
        # any waiter, and every grant goes to its own reply.
        self._replies[ticket] = message.reply
        if member is not None and conversation is not None:
            self._conversations[ticket] = conversation
        if self._listening:
            self._events.queued(
                ticket, message.conversation_id, now, policy.in_flight, policy.waiting
            )
        if grants:
            self._deliver(grants, now)

    def _acquire_refused(
        self, message: Acquire, exc: QueueFull | ValueError | TypeError, now: float
    ) -> None:
        """The policy refused an acquire: fail its requester, and say so."""
        policy = self.policy
        ticket = message.ticket
        reply = message.reply
        if self._replies.get(ticket) is reply:
            # The requester that waits on this ticket asked again: failing
            # it ends its wait, so its ticket must not be granted later to
            # a requester that is gone.
            self._withdraw(ticket, exc, now)
            if self._listening:
                self._events.withdrawn(ticket, now, policy.in_flight, policy.waiting)
        else:
            reply.refused(exc)
        if isinstance(exc, QueueFull):
            self._events.refused(
                ticket,
                message.conversation_id,
                now,
                exc,
                policy.in_flight,
                policy.waiting,
            )
        self._ended(ticket)

    def _rarely(
        self,
        message: Resume
        | ReportUsage
        | Answered
        | ObserveLatency
        | ObserveServerLoad
        | ObserveRateLimits
        | Adapt
        | SetTenant
        | SetModelBudget,
        now: float,
        member: str | None = None,
    ) -> list[Ticket]:
        """The messages that come least often: resume, budgets, limits, tenants."""
        policy = self.policy
        previous = policy.limit
        members = policy.member_limits() if self._limits else None
        if isinstance(message, ReportUsage):
            grants = policy.report_usage(message.ticket, message.tokens)
        elif isinstance(message, ObserveRateLimits):
            grants = policy.observe_rate_limits(
                message.observed_at, message.info, message.model, member=member
            )
        elif isinstance(message, SetTenant):
            grants = policy.set_tenant(message.tenant, message.settings)
        elif isinstance(message, SetModelBudget):
            grants = policy.set_model_budget(
                message.model, message.budget, member=member
            )
        elif isinstance(message, Answered):
            policy.answered(message.ticket)
            return []
        elif isinstance(message, ObserveServerLoad):
            grants = policy.observe_server_load(message.load, member=member)
        elif isinstance(message, ObserveLatency):
            grants = policy.observe_latency(
                message.ticket,
                message.first_token,
                message.between_tokens,
                message.duration,
                message.prompt_tokens,
            )
        elif isinstance(message, Adapt):
            grants = policy.set_limit(message.limit, member=member)
        else:
            paused = policy.paused_until is not None
            if member is not None:
                paused = policy.member_pauses()[member] is not None
            grants = policy.resume(member=member)
            if paused:
                self._events.resumed(now, "resumed", member)
        self._limits_moved(previous, members, now)
        return grants

    def _limits_moved(
        self, previous: int | None, members: dict[str, int | None] | None, now: float
    ) -> None:
        """Events for the limits an adaptive limit moved: each member's, when pooled.

        ``previous`` is the limit before, ``members`` each member's (``None``
        for a provider alone). Its own moves have no log line.
        """
        policy = self.policy
        if members is None:
            self._events.limit_changed(previous, policy.limit, now, log=False)
            return
        for name, limit in policy.member_limits().items():
            self._events.limit_changed(
                members.get(name), limit, now, log=False, member=name
            )

    def _pause(self, message: Pause, now: float, member: str | None = None) -> None:
        """Apply a rate-limit report, or drop it as a misuse."""
        policy = self.policy
        try:
            grants = policy.report_rate_limit(
                message.reported_at, message.retry_after, member=member
            )
        except (TypeError, ValueError) as exc:
            self._drop(message, exc)
            return
        if member is None:
            until = policy.paused_until if policy.limit is not None else None
        else:
            until = policy.member_pauses()[member]
        self._events.paused(now, until, message.retry_after, member)
        if grants:
            self._deliver(grants, now)

    def _withdraw(self, ticket: Ticket, error: Exception, now: float) -> None:
        reply = self._replies.pop(ticket)
        # It may have been the head a budget held back: the others it lets
        # through are granted now, and must be told.
        grants = self.policy.cancel(ticket)
        reply.refused(error)
        if grants:
            self._deliver(grants, now)

    def _drop(self, message: SetLimit | Pause, error: Exception) -> None:
        _logger.error(
            "the scheduler of %r ignored %r: %s", self.provider, message, error
        )

    def _deliver(self, grants: list[Ticket], now: float) -> None:
        replies = self._replies
        names = self._names
        for ticket in grants:
            if names:
                self._granted_on(ticket, self._conversations.pop(ticket, None))
            replies.pop(ticket).granted(ticket, now)
        if self._listening:
            policy = self.policy
            self._events.granted(grants, now, policy.in_flight, policy.waiting)

    def _ended(self, ticket: Ticket) -> None:
        """Pooled ``ticket`` ended, its last event told: what was kept for it goes.

        Its events' names, and its conversation while it waited (kept only
        for a pooled ticket, so both are empty otherwise).
        """
        if self._names:
            self._names.pop(ticket, None)
            self._conversations.pop(ticket, None)

    def _granted_on(self, ticket: Ticket, conversation: str | None) -> None:
        """Pooled ``ticket`` was granted: its events name its member, its conversation's next request prefers it."""
        member = self.policy.member_of(ticket)
        assert member is not None  # granted: it holds
        granted_on(self._names, self._latest, ticket, member, conversation)

    def _crashed(
        self, error: BaseException, unhandled: list[SchedulerMessage | _Own]
    ) -> None:
        """A handling met a bug: stop now, fail everyone, and have run raise it."""
        self._crash = error
        self._shutdown(unhandled)

    def _shutdown(self, unhandled: list[SchedulerMessage | _Own] | None = None) -> None:
        """Close, and fail every waiter and every request not handled yet."""
        inbox = self._inbox
        inbox.close()
        pending = [] if unhandled is None else unhandled
        pending.extend(inbox.take_all())
        replies = self._replies
        for message in pending:
            if isinstance(message, Acquire) and message.ticket not in replies:
                message.reply.refused(self._closed_error())
        waiting = list(replies.values())
        replies.clear()
        self._conversations.clear()
        self._names.clear()
        for reply in waiting:
            reply.refused(self._closed_error())

    def _closed_error(self) -> DispatcherClosed:
        return DispatcherClosed(
            f"the dispatcher closed while waiting for {self.provider!r}"
        )


def granted_on(
    names: dict[Ticket, tuple[str, str | None]],
    latest: dict[str, str],
    ticket: Ticket,
    member: str,
    conversation: str | None,
) -> None:
    """A pool's ``ticket`` was granted on ``member``: what every pooled scheduler keeps of it.

    Its events name the member (``names``, beside its pool), and its
    conversation's next request prefers the member (``latest``, kept for
    the ``MAX_CONVERSATIONS`` conversations seen last).
    """
    names[ticket] = (member, names.get(ticket, (member, None))[1])
    if conversation is not None:
        latest.pop(conversation, None)
        latest[conversation] = member
        if len(latest) > MAX_CONVERSATIONS:
            del latest[next(iter(latest))]  # the one seen least lately


def _conversation_of(reply: Reply) -> str | None:
    """The conversation a waiting request belongs to, if its reply says (a dispatcher's slot does)."""
    conversation = getattr(reply, "conversation_id", None)
    return conversation if isinstance(conversation, str) else None
