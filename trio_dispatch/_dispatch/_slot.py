"""Slots: the requester's side of the scheduling protocol, and its parking.

``Dispatcher.slot`` makes a ``Slot``: an async context manager that sends
``Acquire`` to the provider's backend, parks its task until the backend
answers, and sends ``Release`` on the way out, whatever way that is.
Sending never blocks, so giving a slot back needs no shield.

The requester parks with ``wait_task_rescheduled`` rather than on an
``Event``: the reply is the ``Slot`` itself, which holds its task, so a
waiting request costs one small object and nothing else. Its abort function
(run by trio when the waiting task is cancelled) marks it abandoned and
sends ``Cancel``; a grant that reaches an abandoned slot is ignored, and
that ``Cancel`` gives it back.

A slot reads what it needs of its dispatcher through a ``SlotHost``: the
one object that owns that state (the backends whose task runs, the
limits, whether the dispatcher closed), which the dispatcher's plumbing
keeps current. This module imports nothing of the dispatcher's.
"""

from __future__ import annotations

import contextlib
import enum
import math
from typing import TYPE_CHECKING, Any, Final, Self, final

import trio

from .._exceptions import DispatcherClosed, lease_lost, slot_hold_timeout
from .._util import NoPublicConstructor, wrong_with
from .._validation import check_count, check_instant
from ..messages._protocol import (
    Acquire,
    Answered,
    Cancel,
    Failed,
    ObserveLatency,
    Release,
    ReportUsage,
)
from ._pools import MemberView

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from types import TracebackType

    from ..messages._protocol import Ticket
    from ._backend import Backend


# trio's lowlevel functions of every hand-off, bound once: a name here is
# one lookup, ``trio.lowlevel.x`` three.
_checkpoint: Final = trio.lowlevel.checkpoint
_checkpoint_if_cancelled: Final = trio.lowlevel.checkpoint_if_cancelled
_current_task: Final = trio.lowlevel.current_task
_reschedule: Final = trio.lowlevel.reschedule
_wait_task_rescheduled: Final = trio.lowlevel.wait_task_rescheduled


@final
class SlotHost:
    """What a dispatcher's slots read of it: the state it owns for them.

    The dispatcher's plumbing makes one and keeps it current: it starts
    and stops backends in ``actors``, sets and removes ``limits``, sets
    ``closed`` when it closes; ``scheduler(provider)`` starts the backend of
    a provider not running.

    Attributes:
        actors: The backends whose task runs, by provider.
        limits: The limits of the limited providers.
        scheduler: The backend of a provider, started if need be.
        check_run: Raises ``RuntimeError`` outside the dispatcher's trio
            run (``Dispatcher.check_run``).
        priority_aging: Seconds of turn age one priority class is worth.
        lease: The lease of a slot shared through Redis, in seconds.
        closed: Whether the dispatcher has shut down.
        now: The trio clock's ``current_time``, read by every slot made
            outside a turn: ``trio.current_time()`` is two Python calls more.
    """

    __slots__ = (
        "actors",
        "check_run",
        "closed",
        "lease",
        "limits",
        "now",
        "priority_aging",
        "scheduler",
    )

    def __init__(
        self,
        scheduler: Callable[[str], Backend],
        priority_aging: float,
        lease: float,
        *,
        check_run: Callable[[], None],
    ) -> None:
        self.actors: dict[str, Backend] = {}
        self.limits: dict[str, int] = {}
        self.scheduler = scheduler
        self.check_run = check_run
        self.priority_aging = priority_aging
        self.lease = lease
        self.closed = False
        # Made outside a run (a test), the same as trio.current_time.
        try:
            self.now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        except RuntimeError:
            self.now = trio.current_time

    def __repr__(self) -> str:
        return f"<SlotHost closed={self.closed} limits={self.limits!r}>"


class _State(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    HOLDING = "holding"
    ABANDONED = "abandoned"
    DONE = "done"


# Typed _State, not each its own Literal: a state set before a park may have
# changed after it, and mypy would take it for unchanged.
_NEW: Final[_State] = _State.NEW
_WAITING: Final[_State] = _State.WAITING
_HOLDING: Final[_State] = _State.HOLDING
_ABANDONED: Final[_State] = _State.ABANDONED
_DONE: Final[_State] = _State.DONE


@final
class _Timer:
    """What only a slot with a timer needs: its ``max_hold``, or a lease.

    Made for a slot given a ``max_hold``, or told of a lease (Redis) or
    followed (``follow_lease``); the plain slot has none, and its ``__init__``
    four attributes fewer to set.

    Attributes:
        max_hold: The slot's ``max_hold``, or ``None``.
        hold: The cancel scope that enforces the deadline, while entered.
        lease_deadline: Until when the lease is sure to live, or ``None``.
        on_lease: Called with each new lease deadline, or ``None``.
    """

    __slots__ = ("hold", "lease_deadline", "max_hold", "on_lease")

    def __init__(self, max_hold: float | None) -> None:
        self.max_hold = max_hold
        self.hold: trio.CancelScope | None = None
        self.lease_deadline: float | None = None
        self.on_lease: Callable[[float], None] | None = None


@final
class Slot(metaclass=NoPublicConstructor):
    """One request for a provider slot: ``async with dispatcher.slot(...)``.

    Entering waits for the provider's scheduler to grant a slot (oldest
    ``started_at`` first); leaving gives it back, on success, error,
    cancellation or ``SlotHoldTimeout`` alike. If entering raises, nothing
    is held. A slot is entered once.

    A slot is left by the task that entered it. Its ``max_hold`` timer is a
    cancel scope of that task, which trio lets only that task close, so a
    slot cannot move to another task, with ``max_hold`` or without (both
    behave the same): leaving it from another task gives the slot back
    there and then, and raises ``RuntimeError``. The entering task's timer
    is disarmed then, and is closed when that task leaves the slot too.

    A slot is also the ``Reply`` its scheduler answers on (``granted``,
    ``refused``, ``lease_until``): those three are called by the backend
    only.

    Attributes:
        provider: The provider asked for.
        conversation_id: Who asked: the conversation's id, or what the caller
            passed; it travels with the request to the scheduler.
        started_at: When the request's turn began: its place in line within
            its priority class.
        priority: The request's priority class; higher goes first (see
            ``open_dispatcher``'s ``priority_aging``).
        tokens: The request's estimated tokens, charged to the provider's
            token budget when the slot is granted (0: none).
        tenant: The tenant the request is made for, or ``None``.
        model: The model the request asks for, or ``None``: its budget
            must hold the request too.
        avoid: The members of a pool it must not be granted on (see
            ``Dispatcher.slot``).
        ticket: The scheduler's ticket, once entered.
        granted_at: When the slot was granted (trio clock), once entered.
    """

    __slots__ = (
        "_actor",
        "_host",
        "_member",
        "_state",
        "_task",
        "_timer",
        "avoid",
        "conversation_id",
        "granted_at",
        "model",
        "priority",
        "provider",
        "started_at",
        "tenant",
        "ticket",
        "tokens",
    )

    def __init__(  # noqa: PLR0917  # made only by slot(), positionally: the hot path
        self,
        host: SlotHost,
        provider: str,
        conversation_id: str | None,
        started_at: float,
        priority: int,
        max_hold: float | None,
        tokens: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> None:
        self._host = host
        self.tokens = tokens
        self.tenant = tenant
        self.model = model
        self.provider = provider
        self.conversation_id = conversation_id
        self.started_at = started_at
        self.priority = priority
        self._timer = None if max_hold is None else _Timer(max_hold)
        # A _State, or the refusal (an Exception) the waiting task raises:
        # one attribute for both.
        self._state: _State | Exception = _NEW
        self._actor: Backend | None = None
        self._task: trio.lowlevel.Task | None = None
        self.ticket: Ticket | None = None
        self.granted_at: float | None = None
        self._member: str | None = None
        # A pool's members not to grant it on (a fallback's: see slot()).
        self.avoid: tuple[str, ...] = ()

    def __repr__(self) -> str:
        tenant = "" if self.tenant is None else f" tenant={self.tenant!r}"
        model = "" if self.model is None else f" model={self.model!r}"
        state = self._state
        shown = state.value if isinstance(state, _State) else _DONE.value
        return (
            f"<Slot provider={self.provider!r} conversation_id={self.conversation_id!r}"
            f" started_at={self.started_at} priority={self.priority}{tenant}{model}"
            f" state={shown}>"
        )

    @property
    def held(self) -> bool:
        """Whether this request holds its slot now."""
        return self._state is _HOLDING

    @property
    def member(self) -> str | None:
        """The provider the slot was granted on, or ``None`` until it is granted.

        For a pool (``open_dispatcher``'s ``pools``), the member granted:
        send the request with that member's key, to its server. For a
        provider, the provider itself.
        """
        member = self._member
        if member is None and self.granted_at is not None:
            member = self._member = self._granted_on()
        return member

    def _granted_on(self) -> str:
        """The member the scheduler granted the slot on: a pool's, or the provider."""
        actor = self._actor
        if type(actor) is MemberView:
            found = actor.member_of(self.ticket)  # type: ignore[arg-type]  # set with _actor
            if found is not None:
                return found
        return self.provider

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(
            "slot() is an async context manager: use `async with dispatcher.slot(...)`"
        )

    # KeyboardInterrupt is held back to the park point in the methods that
    # change the slot's state and message the scheduler together, as in
    # trio's own primitives: a KI between an Acquire and the state that
    # expects its answer would leak the slot.

    def __aenter__(self) -> Coroutine[Any, Any, Self]:
        # Not a coroutine of its own: _acquire is awaited directly, one
        # coroutine frame per hand-off, not two.
        return self._acquire(scoped=True)

    @trio.lowlevel.enable_ki_protection
    async def _acquire(self, *, scoped: bool) -> Self:
        """Wait for the grant; ``scoped``: arm the timer and bind the task.

        Unscoped (``acquire_unscoped``), no timer is armed and no task is
        bound to leave the slot.
        """
        if self._state is not _NEW:
            raise RuntimeError("a slot can be entered only once")
        host = self._host
        if host.closed:
            self._state = _DONE
            raise DispatcherClosed("the dispatcher is closed")
        # From another trio run, before anything reaches this one's
        # scheduler: its grant would wake a task of the other run.
        host.check_run()
        # An already cancelled caller sends nothing, not an Acquire and a
        # Cancel: a grant that nobody uses would still show in statistics.
        await _checkpoint_if_cancelled()
        # The running backend, without a call in the common case.
        actor = host.actors.get(self.provider) or host.scheduler(self.provider)
        priority = self.priority
        # The rank of Ticket: the turn's start less the class's credit. In
        # class 0, the common case, the start itself: no float to make.
        rank = (
            self.started_at - priority * host.priority_aging
            if priority
            else self.started_at
        )
        # Without a tenant or a model, the common case, two arguments fewer.
        # No locals for them: every parked request keeps this frame.
        ticket = (
            actor.ticket(rank, priority)
            if self.tenant is None and self.model is None
            else actor.ticket(rank, priority, self.tenant, self.model)
        )
        self._actor = actor
        self.ticket = ticket
        self._state = _WAITING
        try:
            # The backend may answer before this returns, in this task
            # (granted or refused find no task parked then).
            actor.send(
                Acquire(ticket, self, self.conversation_id, self.tokens, self.avoid)
            )
        except trio.ClosedResourceError:
            self._state = _DONE
            self._actor = None
            raise DispatcherClosed("the dispatcher is closed") from None
        # _task stays set when scoped: the task that must leave the slot.
        self._task = _current_task()
        if self._state is _WAITING:
            await _wait_task_rescheduled(self._abort)
            if self._state is _HOLDING:
                # Granted, but cancelled before it could run: the grant
                # goes back unused, as if the cancellation had come first.
                try:
                    await _checkpoint_if_cancelled()
                except BaseException:
                    self._give_back()
                    raise
        else:
            # Answered at once: still a checkpoint, as if it had waited. A
            # cancellation (or KeyboardInterrupt) met there gives the grant
            # back, as it would have while waiting.
            try:
                await _checkpoint()
            except BaseException:
                self._give_back()
                raise
        state = self._state
        if state is not _HOLDING and isinstance(state, Exception):
            # Refused: nothing is held.
            self._state = _DONE
            self._task = None
            raise state
        if not scoped:
            self._task = None
            return self
        timer = self._timer
        if timer is not None and (
            timer.lease_deadline is not None
            or (timer.max_hold is not None and self._limited())
        ):
            hold = trio.CancelScope(deadline=self._deadline(timer))
            hold.__enter__()
            timer.hold = hold
        return self

    def _limited(self) -> bool:
        """Whether the provider granted (a pool's member, once granted) has a limit."""
        limits = self._host.limits
        return self.provider in limits or self.member in limits

    def _max_hold_deadline(self, timer: _Timer) -> float:
        if timer.max_hold is None or not self._limited():
            return math.inf
        assert self.granted_at is not None
        return self.granted_at + timer.max_hold

    def _deadline(self, timer: _Timer) -> float:
        lease = math.inf if timer.lease_deadline is None else timer.lease_deadline
        return min(self._max_hold_deadline(timer), lease)

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        timer = self._timer
        task = self._task
        if (timer is None or timer.hold is None) and (
            task is None or task is _current_task()
        ):
            # Without a timer, in the task that entered: every hand-off's
            # path, with _give_back inline.
            self._task = None
            if self._state is _HOLDING:
                self._state = _DONE
                try:
                    self._actor.send(Release(self.ticket))  # type: ignore[union-attr, arg-type]  # set with _HOLDING
                except trio.ClosedResourceError:
                    # Closed: the scheduler is gone, so there is nothing
                    # to give back to.
                    return None
            return None
        return await self._exit(exc_type, exc, tb)

    @trio.lowlevel.enable_ki_protection
    async def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """``__aexit__`` with a timer armed, or from another task."""
        timer = self._timer
        hold = None if timer is None else timer.hold
        task = self._task
        if task is not None and task is not _current_task():
            # Only the entering task may close its timer's cancel scope:
            # closing it here would corrupt trio's state in both tasks.
            # Disarmed, it can no longer cancel what that task does next.
            if hold is not None:
                hold.deadline = math.inf
            self._give_back()
            raise RuntimeError("a slot must be left by the task that entered it")
        self._task = None
        try:
            if hold is None:
                return None
            assert timer is not None  # hold is the timer's
            timer.hold = None
            swallowed = hold.__exit__(exc_type, exc, tb)
            lease = timer.lease_deadline
            if (
                hold.cancelled_caught
                and lease is not None
                and lease <= self._max_hold_deadline(timer)
            ):
                raise lease_lost(self.provider, self._host.lease)
            if hold.cancelled_caught:
                # Not the lease's end, so the max_hold deadline's.
                assert timer.max_hold is not None
                raise slot_hold_timeout(self.provider, timer.max_hold)
            return swallowed
        finally:
            self._give_back()

    def report_usage(self, tokens: int) -> None:
        """Tell the scheduler how many tokens the request used, prompt and answer.

        Its charge against the provider's token budget becomes ``tokens``:
        what the estimate took too much is given back, what it took too
        little is taken now. The latest report counts. Never blocks.

        Raises:
            RuntimeError: The slot is not held.
        """
        check_count(tokens, "tokens")
        if self._state is not _HOLDING:
            raise RuntimeError("usage can be reported only while the slot is held")
        actor = self._actor
        if actor is not None:
            with contextlib.suppress(trio.ClosedResourceError):
                # Closed: the scheduler is gone, with its budgets.
                actor.send(ReportUsage(self.ticket, tokens))  # type: ignore[arg-type]  # set with _actor

    def answered(self) -> None:
        """The request's answer started: the provider has counted it.

        Learned budgets count the requests whose answer has not started as
        not yet seen by the provider (see ``observe_rate_limits``).
        ``wrap_provider``, conversations and ``transport()`` say it by
        themselves; an integration of one's own says it when the answer's
        headers are in. Never blocks; nothing once the slot is given back.
        """
        actor = self._actor
        if self._state is _HOLDING and actor is not None:
            with contextlib.suppress(trio.ClosedResourceError):
                # Closed: the scheduler is gone, with its budgets.
                actor.send(Answered(self.ticket))  # type: ignore[arg-type]  # set with _actor

    def report_timing(
        self,
        *,
        first_token_at: float,
        last_token_at: float,
        output_tokens: int,
        prompt_tokens: int,
    ) -> None:
        """Tell the scheduler how fast the answer's tokens came.

        For an ``AdaptiveLimit(signal="latency")``, which learns from each
        call's time to first token and time between tokens (other limits
        ignore it). ``first_token_at`` and ``last_token_at`` are instants
        on trio's clock (``trio.current_time()``); ``output_tokens`` the
        tokens (or stream chunks) between them, both included;
        ``prompt_tokens`` the prompt's size, an estimate will do.
        ``wrap_provider``, conversations and ``transport()`` report it by
        themselves at the end of each answer; an integration of one's own
        reports it once, before leaving the slot. Never blocks; nothing
        once the slot is given back.

        Raises:
            TypeError: A value is not a number (the counts: not an int).
            ValueError: An instant is not finite, ``last_token_at`` is
                before ``first_token_at`` or ``first_token_at`` before the
                grant, ``output_tokens`` is below 1 or ``prompt_tokens``
                below 0.
        """
        first = check_instant(first_token_at, "first_token_at")
        last = check_instant(last_token_at, "last_token_at")
        check_count(prompt_tokens, "prompt_tokens")
        if check_count(output_tokens, "output_tokens") < 1:
            raise ValueError(f"output_tokens must be at least 1, got {output_tokens!r}")
        if last < first:
            raise ValueError(
                f"last_token_at must not be before first_token_at={first!r},"
                f" got {last!r}"
            )
        actor = self._actor
        granted_at = self.granted_at
        if self._state is not _HOLDING or actor is None or granted_at is None:
            return
        if first < granted_at:
            raise ValueError(
                f"first_token_at must not be before the grant at {granted_at!r},"
                f" got {first!r}"
            )
        between = (last - first) / (output_tokens - 1) if output_tokens > 1 else None
        with contextlib.suppress(trio.ClosedResourceError):
            # Closed: the scheduler is gone, with its limit.
            actor.send(
                ObserveLatency(
                    self.ticket,  # type: ignore[arg-type]  # set with _actor
                    first - granted_at,
                    between,
                    last - granted_at,
                    prompt_tokens,
                )
            )

    def release(self, *, used: bool = True) -> None:
        """Give the slot back now, from any task; nothing if it is not held.

        Plumbing for a slot taken with ``Plumbing.hold()``: one entered
        with ``async with`` is given back on leaving the block. Synchronous
        and idempotent; never blocks. ``used=False`` for a slot that sent
        nothing: it goes back as a grant withdrawn, which is no success (a
        rate-limit backoff streak goes on, an adaptive limit does not rise).
        """
        self._give_back(used=used)

    def failed(self) -> None:
        """Give the slot back now: its call failed before its answer started.

        A connection refused or reset, no first byte in time, a server
        error (5xx but 503), from any task; nothing if it is not held. No
        success, as ``release(used=False)``; and for a pool's member one
        failure more in a row: at ``open_dispatcher``'s
        ``failure_threshold`` it is out of service for ``failure_cooldown``.
        Send the call again elsewhere with ``dispatcher.slot(pool,
        avoid=...)`` (``transport()`` and conversations over a pool do it
        themselves). A rate-limit answer is no failure: report it
        (``Dispatcher.report_rate_limit``) and ``release()``.
        """
        self._give_back(failed=True)

    @property
    def lease_deadline(self) -> float | None:
        """Until when the slot's lease is sure to live (trio clock), with Redis.

        ``None`` for a slot of a local dispatcher, which has no lease.
        """
        timer = self._timer
        return None if timer is None else timer.lease_deadline

    def follow_lease(self, callback: Callable[[float], None] | None) -> None:
        """Call ``callback(deadline)`` at each renewal of the slot's lease.

        Plumbing for a hold that enforces the lease without the slot's
        cancel scope (``Plumbing.hold()``); ``None`` stops it.
        """
        timer = self._timer
        if timer is None:
            if callback is None:
                return
            timer = self._timer = _Timer(None)
        timer.on_lease = callback

    @trio.lowlevel.enable_ki_protection
    def _give_back(self, *, used: bool = True, failed: bool = False) -> None:
        if self._state is not _HOLDING:
            return
        self._state = _DONE
        actor = self._actor
        if type(actor) is MemberView and self._member is None:
            self._member = self._granted_on()  # while the scheduler knows
        if actor is not None:
            # try/except, not contextlib.suppress: this runs once per slot,
            # and the context manager would cost as much as the send.
            try:
                if failed:
                    actor.send(Failed(self.ticket))  # type: ignore[arg-type]  # set with _actor
                elif used:
                    actor.send(Release(self.ticket))  # type: ignore[arg-type]  # set with _actor
                else:
                    # A grant never used: withdrawn, as if cancelled first.
                    actor.send(Cancel(self.ticket))  # type: ignore[arg-type]  # set with _actor
            except trio.ClosedResourceError:
                # Closed: the scheduler is gone, so there is nothing to give back to.
                return

    # The Reply protocol: called by the slot's backend only, from its task
    # or from this slot's own call to it, and never blocking.

    @trio.lowlevel.enable_ki_protection
    def granted(self, ticket: Ticket, granted_at: float) -> None:
        """The backend granted ``ticket`` at ``granted_at``: take it, wake the task.

        Called by the backend only (``Reply``). Ignored once the waiting
        task gave up: its ``Cancel`` gives the slot back.
        """
        if self._state is _WAITING:
            self._state = _HOLDING
            self.granted_at = granted_at
            task = self._task
            if task is not None:  # None: granted inside acquire, not parked
                _reschedule(task)

    def lease_until(self, deadline: float) -> None:
        """The slot's lease is sure to live until ``deadline`` (trio clock).

        Called by a shared backend only, before the grant and at each
        renewal: once it passes, the body is cancelled and ``LeaseLost``
        raised.
        """
        timer = self._timer
        if timer is None:
            timer = self._timer = _Timer(None)
        timer.lease_deadline = deadline
        hold = timer.hold
        # Not once given back: a timer disarmed by a leave from another
        # task stays disarmed.
        if hold is not None and self._state is _HOLDING:
            hold.deadline = self._deadline(timer)
        on_lease = timer.on_lease
        if on_lease is not None:
            on_lease(deadline)

    @trio.lowlevel.enable_ki_protection
    def refused(self, error: Exception) -> None:
        """The backend refused the request with ``error``: wake the task with it.

        Called by the backend only (``Reply``); the requester holds nothing.
        Ignored once the waiting task gave up.
        """
        if self._state is _WAITING:
            self._state = error
            task = self._task
            if task is not None:  # None: refused inside acquire, not parked
                _reschedule(task)

    @trio.lowlevel.enable_ki_protection
    def _abort(self, _raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        # The waiting task is being cancelled: give up our place. A grant
        # already on its way is ignored by granted() and released by Cancel.
        self._state = _ABANDONED
        self._task = None
        with contextlib.suppress(trio.ClosedResourceError):
            # Closed: the scheduler is gone and holds nothing for us.
            self._actor.send(Cancel(self.ticket))  # type: ignore[union-attr, arg-type]  # set before parking
        return trio.lowlevel.Abort.SUCCEEDED


async def acquire_unscoped(slot: Slot) -> None:
    """Wait for ``slot``'s grant, with no timer, for a hold any task gives back.

    What ``Plumbing.hold()`` takes: the slot is granted without the
    cancel scope of ``async with``, which only the entering task could
    close, and no task is bound to leave it (``Slot.release()`` from any).
    """
    await slot._acquire(scoped=False)
