"""The dispatcher: per-provider schedulers under one nursery, and slots.

``open_dispatcher`` owns a nursery holding one ``SchedulerActor`` per
limited provider. ``Dispatcher.slot`` is the requester's side of the
protocol: an async context manager that sends ``Acquire``, parks its task
until the scheduler answers, and sends ``Release`` on the way out, whatever
way that is. Sending never blocks, so giving a slot back needs no shield.

The requester parks with ``wait_task_rescheduled`` rather than on an
``Event``: the reply is the ``Slot`` itself, which holds its task, so a
waiting request costs one small object and nothing else. Its abort function
(run by trio when the waiting task is cancelled) marks it abandoned and
sends ``Cancel``; a grant that reaches an abandoned slot is ignored, and
that ``Cancel`` gives it back.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import logging
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Self, final

import attrs
import trio

from .._budgets import (
    AdaptiveLimit,
    Throttle,
    check_budgets,
    check_limit_mapping,
    check_limit_value,
)
from .._exceptions import DispatcherClosed, SlotHoldTimeout, lease_lost
from .._groups import leaves
from .._policy import SlotPolicy
from .._ratelimits import RateLimitInfo
from .._turn import CURRENT_TURN, Turn, TurnScope
from .._util import NoPublicConstructor, raise_if_extra_missing
from .._validation import (
    check_count,
    check_instant,
    check_limit,
    check_max_waiting,
    check_namespace,
    check_optional_seconds,
    check_pauses,
    check_positive_seconds,
    check_priority,
    check_provider,
    check_redis_url,
    redact_url,
)
from ..messages._limits import DEFAULT_MAX_TOKENS
from ..messages._scheduling import (
    Grant,
    Ticket,
)
from ._observe import (
    CallObserver,
    CallWatch,
    DispatchEvent,
    EventHub,
    EventSubscription,
    RateLimitsReceived,
)
from ._scheduler import SchedulerActor

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Iterable,
        Mapping,
    )
    from types import TracebackType

    from .._backend import Backend, ProviderStatistics
    from .._budgets import Budget
    from .._provider import Provider
    from ..messages._scheduling import Grant, Ticket

_logger = logging.getLogger("trio_dispatch")

_UnknownProviders = Literal["allow", "warn", "error"]
_UNKNOWN_PROVIDERS: Final[tuple[_UnknownProviders, ...]] = ("allow", "warn", "error")


@final
@attrs.frozen
class DispatcherStatistics:
    """A snapshot of a dispatcher: one entry per provider limited or used."""

    providers: Mapping[str, ProviderStatistics]
    closed: bool


class _State(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    HOLDING = "holding"
    ABANDONED = "abandoned"
    DONE = "done"


_NEW: Final = _State.NEW
_WAITING: Final = _State.WAITING
_HOLDING: Final = _State.HOLDING
_ABANDONED: Final = _State.ABANDONED
_DONE: Final = _State.DONE


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
        ticket: The scheduler's ticket, once entered.
        granted_at: When the slot was granted (trio clock), once entered.
    """

    __slots__ = (
        "_actor",
        "_dispatcher",
        "_error",
        "_hold",
        "_lease_deadline",
        "_max_hold",
        "_on_lease",
        "_state",
        "_task",
        "conversation_id",
        "granted_at",
        "priority",
        "provider",
        "started_at",
        "ticket",
        "tokens",
    )

    def __init__(  # noqa: PLR0917  # made only by slot(), positionally: the hot path
        self,
        dispatcher: Dispatcher,
        provider: str,
        conversation_id: str | None,
        started_at: float,
        priority: int,
        max_hold: float | None,
        *,
        tokens: int = 0,
    ) -> None:
        self._dispatcher = dispatcher
        self.tokens = tokens
        self.provider = provider
        self.conversation_id = conversation_id
        self.started_at = started_at
        self.priority = priority
        self._max_hold = max_hold
        self._state = _NEW
        self._actor: Backend | None = None
        self._task: trio.lowlevel.Task | None = None
        self._error: Exception | None = None
        self._hold: trio.CancelScope | None = None
        # Set by a shared scheduler: when the slot's lease may run out; and
        # who else wants to know (a transport's hold, which has no scope).
        self._lease_deadline: float | None = None
        self._on_lease: Callable[[float], None] | None = None
        self.ticket: Ticket | None = None
        self.granted_at: float | None = None

    def __repr__(self) -> str:
        return (
            f"<Slot provider={self.provider!r} conversation_id={self.conversation_id!r}"
            f" started_at={self.started_at} priority={self.priority}"
            f" state={self._state.value}>"
        )

    @property
    def held(self) -> bool:
        """Whether this request holds its slot now."""
        return self._state is _HOLDING

    # KeyboardInterrupt is held back to the park point in the methods that
    # change the slot's state and message the scheduler together, as in
    # trio's own primitives: a KI between an Acquire and the state that
    # expects its answer would leak the slot.
    @trio.lowlevel.enable_ki_protection
    async def __aenter__(self) -> Self:
        await self._acquire()
        # _task stays set: the task that must leave the slot.
        if self._lease_deadline is not None or (
            self._max_hold is not None and self.provider in self._dispatcher._limits
        ):
            hold = trio.CancelScope(deadline=self._deadline())
            hold.__enter__()
            self._hold = hold
        return self

    @trio.lowlevel.enable_ki_protection
    async def _acquire(self) -> None:
        """Wait for the grant; no timer yet (``__aenter__`` arms it)."""
        if self._state is not _NEW:
            raise RuntimeError("a slot can be entered only once")
        dispatcher = self._dispatcher
        if dispatcher._closed:
            self._state = _DONE
            raise DispatcherClosed("the dispatcher is closed")
        # An already cancelled caller sends nothing, not an Acquire and a
        # Cancel: a grant that nobody uses would still show in statistics.
        await trio.lowlevel.checkpoint_if_cancelled()
        # The running backend, without a call in the common case.
        actor = dispatcher._actors.get(self.provider) or dispatcher._scheduler(
            self.provider
        )
        priority = self.priority
        # The rank of Ticket: the turn's start less the class's credit. In
        # class 0, the common case, the start itself: no float to make.
        ticket = actor.ticket(
            self.started_at - priority * dispatcher._settings.priority_aging
            if priority
            else self.started_at,
            priority,
        )
        self._actor = actor
        self.ticket = ticket
        self._state = _WAITING
        try:
            # The backend may answer before this returns, in this task
            # (_grant or _fail find no task parked then).
            actor.acquire(ticket, self, self.conversation_id, self.tokens)
        except trio.ClosedResourceError:
            self._state = _DONE
            self._actor = None
            raise DispatcherClosed("the dispatcher is closed") from None
        self._task = trio.lowlevel.current_task()
        if self._state is _WAITING:
            await trio.lowlevel.wait_task_rescheduled(self._abort)
            if self.held:  # the answer changed the state
                # Granted, but cancelled before it could run: the grant
                # goes back unused, as if the cancellation had come first.
                try:
                    await trio.lowlevel.checkpoint_if_cancelled()
                except BaseException:
                    self._give_back()
                    raise
        else:
            # Answered at once: still a checkpoint, as if it had waited. A
            # cancellation (or KeyboardInterrupt) met there gives the grant
            # back, as it would have while waiting.
            try:
                await trio.lowlevel.checkpoint()
            except BaseException:
                self._give_back()
                raise
        if self._error is not None:
            self._task = None
            error, self._error = self._error, None
            raise error

    def _max_hold_deadline(self) -> float:
        if self._max_hold is None or self.provider not in self._dispatcher._limits:
            return math.inf
        assert self.granted_at is not None
        return self.granted_at + self._max_hold

    def _deadline(self) -> float:
        lease = math.inf if self._lease_deadline is None else self._lease_deadline
        return min(self._max_hold_deadline(), lease)

    @trio.lowlevel.enable_ki_protection
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        hold = self._hold
        task = self._task
        if task is not None and task is not trio.lowlevel.current_task():
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
            self._hold = None
            swallowed = hold.__exit__(exc_type, exc, tb)
            lease = self._lease_deadline
            if (
                hold.cancelled_caught
                and lease is not None
                and lease <= self._max_hold_deadline()
            ):
                raise lease_lost(self.provider, self._dispatcher._settings.lease)
            if hold.cancelled_caught:
                raise SlotHoldTimeout(
                    f"slot held longer than max_hold={self._max_hold} seconds"
                )
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
                actor.report_usage(self.ticket, tokens)  # type: ignore[arg-type]  # set with _actor

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
                actor.answered(self.ticket)  # type: ignore[arg-type]  # set with _actor

    def release(self) -> None:
        """Give the slot back now, from any task; nothing if it is not held.

        Plumbing for a slot taken with ``Dispatcher.hold()``: one entered
        with ``async with`` is given back on leaving the block. Synchronous
        and idempotent; never blocks.
        """
        self._give_back()

    @property
    def lease_deadline(self) -> float | None:
        """Until when the slot's lease is sure to live (trio clock), with Redis.

        ``None`` for a slot of a local dispatcher, which has no lease.
        """
        return self._lease_deadline

    def follow_lease(self, callback: Callable[[float], None] | None) -> None:
        """Call ``callback(deadline)`` at each renewal of the slot's lease.

        Plumbing for a hold that enforces the lease without the slot's
        cancel scope (``Dispatcher.hold()``); ``None`` stops it.
        """
        self._on_lease = callback

    @trio.lowlevel.enable_ki_protection
    def _give_back(self) -> None:
        if self._state is not _HOLDING:
            return
        self._state = _DONE
        if self._actor is not None:
            # try/except, not contextlib.suppress: this runs once per slot,
            # and the context manager would cost as much as the send.
            try:
                self._actor.release(self.ticket)  # type: ignore[arg-type]  # set with _actor
            except trio.ClosedResourceError:
                # Closed: the scheduler is gone, so there is nothing to give back to.
                return

    # Reply, called by the scheduler actor's task.

    @trio.lowlevel.enable_ki_protection
    def _grant(self, grant: Grant) -> None:
        """Take the granted slot and wake the waiting task."""
        if self._state is _WAITING:
            self._state = _HOLDING
            self.granted_at = grant.granted_at
            task = self._task
            if task is not None:  # None: granted inside acquire, not parked
                trio.lowlevel.reschedule(task)

    def _lease_until(self, deadline: float) -> None:
        """The slot's lease is sure to live until ``deadline`` (trio clock).

        Called by a shared scheduler, before the grant and at each renewal:
        once it passes, the body is cancelled and ``LeaseLost`` raised.
        """
        self._lease_deadline = deadline
        hold = self._hold
        # Not once given back: a timer disarmed by a leave from another
        # task stays disarmed.
        if hold is not None and self._state is _HOLDING:
            hold.deadline = self._deadline()
        on_lease = self._on_lease
        if on_lease is not None:
            on_lease(deadline)

    @trio.lowlevel.enable_ki_protection
    def _fail(self, error: Exception) -> None:
        """Wake the waiting task with ``error``; it holds nothing."""
        if self._state is _WAITING:
            self._state = _DONE
            self._error = error
            task = self._task
            if task is not None:  # None: refused inside acquire, not parked
                trio.lowlevel.reschedule(task)

    @trio.lowlevel.enable_ki_protection
    def _abort(self, _raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        # The waiting task is being cancelled: give up our place. A grant
        # already on its way is ignored by grant() and released by Cancel.
        self._state = _ABANDONED
        self._task = None
        with contextlib.suppress(trio.ClosedResourceError):
            # Closed: the scheduler is gone and holds nothing for us.
            self._actor.cancel(self.ticket)  # type: ignore[union-attr, arg-type]  # set before parking
        return trio.lowlevel.Abort.SUCCEEDED


@final
class ModelCall(metaclass=NoPublicConstructor):
    """A model call under way: its slot, and what the provider told by itself.

    Made by ``Dispatcher.calling()``. ``observed``: the answer's rate-limit
    figures reached the dispatcher through the provider's own callback;
    ``reported``: its rate limit did. The integration tells what is not
    told yet, once.

    Attributes:
        slot: The slot the call holds.
        observed: The answer's figures were observed.
        reported: The answer's rate limit was reported.
    """

    __slots__ = (
        "_calls",
        "_outer",
        "_started",
        "_task",
        "observed",
        "reported",
        "slot",
    )

    def __init__(self, slot: Slot, calls: dict[trio.lowlevel.Task, ModelCall]) -> None:
        self.slot = slot
        self.observed = False
        self.reported = False
        self._started = False
        self._calls = calls
        self._task: trio.lowlevel.Task | None = None
        self._outer: ModelCall | None = None

    def __enter__(self) -> Self:
        task = self._task = trio.lowlevel.current_task()
        calls = self._calls
        self._outer = calls.get(task)
        calls[task] = self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = self._task
        assert task is not None
        if self._outer is None:
            del self._calls[task]
        else:
            self._calls[task] = self._outer

    def answered(self) -> None:
        """The call's answer started: its slot says so to the scheduler, once."""
        if not self._started:
            self._started = True
            self.slot.answered()


@attrs.frozen
class _Settings:
    """A dispatcher's settings, checked by ``open_dispatcher``."""

    default_pause: float
    max_pause: float
    max_hold: float | None
    max_waiting: int | None
    unknown_providers: _UnknownProviders
    # Its credentials never show in a repr.
    redis_url: str | None = attrs.field(
        default=None, repr=lambda url: repr(_shown(url))
    )
    namespace: str = "trio-dispatch"
    lease: float = 15.0
    priority_aging: float = 60.0
    budgets: Mapping[str, Budget] = attrs.field(factory=dict)
    learn_budgets: bool = True
    # A backend for each provider, instead of the local scheduler: given by
    # trio_dispatch.lowlevel.open_dispatcher_with.
    new_backend: Callable[[str], Backend] | None = attrs.field(default=None, repr=False)


_UNSET: Any = object()


class _DefaultNamespace(str):
    """The default ``namespace``: it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


class _DefaultLease(float):
    """The default ``lease``: it shows as its value, and ``is`` tells it apart."""

    __slots__ = ()


# Given explicitly, even with these very values, namespace and lease need a
# redis_url: either alone would be silently ignored.
_DEFAULT_NAMESPACE: Final = _DefaultNamespace("trio-dispatch")
_DEFAULT_LEASE: Final = _DefaultLease(15.0)
_make: Final = type.__call__


class Dispatcher(metaclass=NoPublicConstructor):
    """Per-provider concurrency limits, granted oldest turn first.

    Made by ``open_dispatcher``; valid inside its ``async with`` block. Each
    provider has its own scheduler actor, started when it is first limited or
    used. A provider without a limit is unlimited: its scheduler grants every
    request at once, but still counts the slots in use, so a limit set later
    counts them too (they finish; nothing new is granted above the limit).
    The scheduler of an unlimited provider stops when no slot is held and
    nothing waits, and starts again on the next request, so names used once
    (model ids, say) leave no task behind; its counters carry on.

    A provider is *known* once it is named in ``limits``, given a limit with
    ``set_limit``, or made unlimited on purpose with ``remove_limit`` (it
    stays known). A slot of any other provider is unlimited by accident, as
    a misspelt name would be: ``unknown_providers`` says what happens then.
    """

    # The class open_dispatcher makes: the front that adds the integrations
    # (trio_dispatch.actors._front, above them), once it is defined; this
    # core until then. The core never imports what is built on it.
    _front: ClassVar[type[Dispatcher]]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        Dispatcher._front = cls

    __slots__ = (
        "_actors",
        "_backends",
        "_call_observers",
        "_calls",
        "_cleared",
        "_closed",
        "_closing",
        "_hub",
        "_known",
        "_limits",
        "_new_backend",
        "_nursery",
        "_settings",
    )

    def __init__(self, nursery: trio.Nursery, settings: _Settings) -> None:
        self._nursery = nursery
        self._settings = settings
        # The backend of every provider seen, and those whose task runs: a
        # backend stopped when idle keeps its state for its next run.
        self._new_backend: Callable[[str], Backend] = (
            self._local_backend
            if settings.new_backend is None
            else settings.new_backend
        )
        self._backends: dict[str, Backend] = {}
        self._actors: dict[str, Backend] = {}
        self._limits: dict[str, int] = {}
        # Known providers, and the names slot() lets through without a
        # look: the known ones and the unknown ones already allowed or
        # warned about.
        self._known: set[str] = set()
        self._cleared: set[str] = set()
        # The model calls under way through integrations, by the task that
        # holds each one's slot (see calling()).
        self._calls: dict[trio.lowlevel.Task, ModelCall] = {}
        self._closed = False
        # Set when closing, for the task that holds the Redis client.
        self._closing: trio.Event | None = None
        # Where the schedulers emit their events (see events()), and who
        # is told of every LLM call (the OpenTelemetry metrics).
        self._hub = EventHub(settings.priority_aging)
        self._call_observers: tuple[CallObserver, ...] = ()

    @property
    def max_pause(self) -> float:
        """The longest pause (``open_dispatcher``'s ``max_pause``), in seconds.

        It also caps a conversation's retry wait.
        """
        return self._settings.max_pause

    @property
    def max_hold(self) -> float | None:
        """How long a slot may be held (``open_dispatcher``'s ``max_hold``), or ``None``."""
        return self._settings.max_hold

    @property
    def lease(self) -> float:
        """The lease of a slot shared through Redis, in seconds (``open_dispatcher``'s ``lease``)."""
        return self._settings.lease

    def start_soon(
        self, function: Callable[..., Awaitable[object]], *args: object, name: str
    ) -> None:
        """Run ``function(*args)`` in the dispatcher's nursery, until it closes.

        Plumbing for integrations: a task that outlives the call that
        starts it (the transport's ``max_hold`` timer).
        """
        self._nursery.start_soon(function, *args, name=name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Dispatcher {state} limits={self._limits!r}>"

    @property
    def closed(self) -> bool:
        """Whether the dispatcher has shut down."""
        return self._closed

    def turn(
        self,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
        priority: int = 0,
    ) -> contextlib.AbstractContextManager[Turn]:
        """A turn, for a plain ``with``: every slot taken inside it is its call.

        Inside the block, ``slot()`` (and so ``wrap_provider``'s streams,
        conversations and anything else that takes a slot without naming
        them) uses the turn's ``conversation_id``, ``started_at`` and
        ``priority`` where it is not given them: every LLM call of the turn
        keeps the place in line that the turn's start gave it. Tasks started
        inside the block belong to the turn too (trio copies the context at
        spawn). A turn entered inside another replaces it, whole, until its
        block ends. The turn is plain data, tied to no dispatcher: a slot of
        any dispatcher taken inside it carries it. Outside any turn, each
        request is its own turn (it starts when the slot is asked for, with
        priority 0).

        Args:
            conversation_id: Who asks, for every slot of the turn.
            started_at: When the turn began, on the trio clock; defaults to
                now.
            priority: The turn's priority class (see ``open_dispatcher``'s
                ``priority_aging``); higher goes first.

        Returns:
            A context manager, entered once, whose value is the ``Turn``.

        Raises:
            TypeError: ``conversation_id`` not a string or ``None``,
                ``started_at`` not a number, ``priority`` not an int.
            ValueError: ``started_at`` not finite, ``priority`` out of range.
        """
        if conversation_id is not None and not isinstance(conversation_id, str):
            raise TypeError(
                f"conversation_id must be a string or None, got {conversation_id!r}"
            )
        started_at = (
            trio.current_time()
            if started_at is None
            else check_instant(started_at, "started_at")
        )
        return TurnScope(Turn(conversation_id, started_at, check_priority(priority)))

    def slot(
        self,
        provider: str,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
        priority: int | None = None,
        max_hold: float | None = _UNSET,
        tokens: int | None = None,
    ) -> Slot:
        """A slot of ``provider``, to hold with ``async with``.

        Requests go in priority class first (higher first, with the aging
        of ``open_dispatcher``'s ``priority_aging``), then oldest turn, then
        arrival order. What is not given comes from the current ``turn()``,
        field by field; outside any turn the request is a turn of its own.

        Args:
            provider: The provider's name; if it has no limit, the slot is
                granted at once (it is still counted, for a limit set later).
            conversation_id: Who asks: kept on the slot and sent with the
                request to the scheduler. Defaults to the current turn's.
            started_at: When the request's turn began, on the trio clock:
                earlier goes first within a class. Defaults to the current
                turn's start, or now outside any turn.
            priority: The request's priority class, an int; higher goes
                first. Defaults to the current turn's, or 0.
            max_hold: Seconds the slot may be held before the body is
                cancelled and ``SlotHoldTimeout`` raised; defaults to the
                dispatcher's ``max_hold``. ``None`` for no bound. Applies to
                providers limited when the slot is granted.
            tokens: The request's estimated tokens (prompt and answer),
                charged to the provider's token budget when the slot is
                granted; correct it with ``Slot.report_usage``. ``None``
                charges none up front.

        Raises:
            ValueError: At once, if ``provider`` is unknown and the
                dispatcher's ``unknown_providers`` is ``"error"``.
            DispatcherClosed: On entering, if the dispatcher has closed or
                closes while waiting.
            QueueFull: On entering, if ``max_waiting`` requests already wait.
        """
        if type(provider) is not str or not provider:
            check_provider(provider)  # raises: the common case skips the call
        turn = (
            CURRENT_TURN.get()
            if conversation_id is None or started_at is None or priority is None
            else None
        )
        if conversation_id is None:
            if turn is not None:
                conversation_id = turn.conversation_id
        elif not isinstance(conversation_id, str):
            raise TypeError(
                f"conversation_id must be a string or None, got {conversation_id!r}"
            )
        if started_at is None:
            started_at = trio.current_time() if turn is None else turn.started_at
        else:
            started_at = check_instant(started_at, "started_at")
        if priority is None:
            priority = 0 if turn is None else turn.priority
        else:
            priority = check_priority(priority)
        if max_hold is _UNSET:
            max_hold = self._settings.max_hold
        else:
            max_hold = check_optional_seconds(max_hold, "max_hold", positive=True)
        if tokens is not None:
            check_count(tokens, "tokens")
        if provider not in self._cleared:
            self._unknown(provider)
        # type.__call__ is what Slot._create does, without its Python frame:
        # this is the hot path of every request.
        slot: Slot = _make(
            Slot,
            self,
            provider,
            conversation_id,
            started_at,
            priority,
            max_hold,
            tokens=tokens or 0,
        )
        return slot

    async def hold(self, provider: str, tokens: int = 0) -> tuple[Slot, float]:
        """A granted slot of ``provider`` that any task may give back.

        Plumbing for integrations (``transport()`` is built on it): for a
        hold that does not end where it began (an HTTP response is closed
        later, perhaps by another task), so it enters no cancel scope: give
        it back with ``Slot.release()``. Returns the slot and its
        ``max_hold`` deadline (trio clock; ``inf`` for none), which the
        holder enforces, as it follows the slot's lease (``Slot.lease_deadline``,
        ``Slot.follow_lease``). The turn is the current one (``slot()``
        with neither ``started_at`` nor ``conversation_id``), charged
        ``tokens``.
        """
        slot = self.slot(provider, max_hold=None, tokens=tokens)
        # Granted without the timer's cancel scope, which only the entering
        # task could close (a lease deadline from Redis would arm one).
        await slot._acquire()
        slot._task = None
        max_hold = self._settings.max_hold
        if max_hold is None or provider not in self._limits:
            return slot, math.inf
        assert slot.granted_at is not None
        return slot, slot.granted_at + max_hold

    def calling(self, slot: Slot) -> ModelCall:
        """The model call of held ``slot`` is under way in this task, in the block.

        Plumbing for integrations (``wrap_provider`` is built on it): a
        provider may tell this dispatcher of its answer by itself, through
        callbacks (``on_rate_limits=dispatcher.observe_rate_limits``,
        ``on_rate_limit=dispatcher.report_rate_limit``) called as the
        answer arrives. What those hear of ``slot``'s provider from this
        task while the block runs is this call's answer: its start is said
        first (the figures count the request), and the ``ModelCall`` notes
        it, so the integration does not tell it again. Use it in a plain
        ``with``, entered and left by the task that holds the slot.
        """
        call: ModelCall = _make(ModelCall, slot, self._calls)
        return call

    def set_limit(self, provider: str, limit: int | AdaptiveLimit) -> None:
        """Limit ``provider`` to ``limit`` concurrent slots, now.

        A higher limit grants waiting requests at once; a lower one lets the
        current holders finish and grants nothing until fewer than ``limit``
        hold a slot. An ``AdaptiveLimit`` starts at its ``initial`` value
        and moves on its own; an int replaces it by a fixed limit.

        With ``redis_url``, the limit is stored in Redis for the whole
        fleet, an ``AdaptiveLimit`` too: every process then follows its
        value, which the fleet's successes and rate limits move.
        """
        check_provider(provider)
        check_limit_value(limit)
        self._check_open()
        self._tell(provider, lambda backend: backend.set_limit(limit))
        self._limits[provider] = (
            limit.initial if isinstance(limit, AdaptiveLimit) else limit
        )
        self._known.add(provider)
        self._cleared.add(provider)

    def remove_limit(self, provider: str) -> None:
        """Lift the limit of ``provider``: waiters go through, nobody waits.

        Its scheduler keeps counting the slots in use (granting every request
        at once), so a limit set again later counts every holder and the
        provider never sees more than the new limit once they finish. The
        provider stays known (even one never limited): it is unlimited on
        purpose, so ``unknown_providers`` does not apply to it.
        """
        check_provider(provider)
        self._check_open()
        self._limits.pop(provider, None)
        self._tell(provider, lambda backend: backend.set_limit(None))
        self._known.add(provider)
        self._cleared.add(provider)

    def limits(self) -> dict[str, int]:
        """The limits, provider by provider (a copy); an adaptive one's current value."""
        limits = dict(self._limits)
        for provider in limits:
            backend = self._backends.get(provider)
            value = None if backend is None else backend.adaptive_value()
            if value is not None:
                limits[provider] = value
        return limits

    def observe_rate_limits(self, provider: str, info: RateLimitInfo) -> None:
        """Learn from the rate-limit figures of one of ``provider``'s answers.

        Every answer that carries rate-limit headers, success or error,
        comes here: by itself for the calls made through the dispatcher
        (``wrap_provider``, conversations, ``transport()``), which read
        the figures off the answer; through a provider's
        ``on_rate_limits=`` for one used without a dispatcher's slot (a
        provider given both is counted once). The figures pace the
        provider's budgets (see ``open_dispatcher``'s ``budgets`` and
        ``learn_budgets``). Synchronous, never blocks, and never raises for
        what ``info`` says. Subscribers to ``events()`` get each as a
        ``RateLimitsReceived``; the budgets ignore them with
        ``learn_budgets=False``. With ``redis_url``, the fleet's budgets in
        Redis learn them, with the scheduler's next exchange. Ignored once
        the dispatcher has closed.

        Raises:
            TypeError: ``provider`` is not a string or ``info`` not a
                ``RateLimitInfo``.
        """
        check_provider(provider)
        if not isinstance(info, RateLimitInfo):
            raise TypeError(f"info must be a RateLimitInfo, got {info!r}")
        if self._closed or info.empty:
            return
        if self._calls:
            call = self._calls.get(trio.lowlevel.current_task())
            if call is not None and call.slot.provider == provider:
                # A provider's own callback, as the answer of the call under
                # way in this task arrives: the figures count its request,
                # whose answer has started, and the call is not told again.
                call.observed = True
                call.answered()
        self._emit_rate_limits(provider, info)
        settings = self._settings
        if not settings.learn_budgets:
            return
        with contextlib.suppress(DispatcherClosed):
            # Closed: its scheduler has stopped, and nothing waits there.
            self._tell(
                provider,
                lambda backend: backend.observe_rate_limits(trio.current_time(), info),
            )

    def default_max_tokens(self, provider: str) -> int:
        """The answer charged for a request of ``provider`` without ``max_tokens``.

        Its budget's ``default_max_tokens`` (the configured budget's, or
        the default); what an integration's token estimate counts for such
        a request.
        """
        budget = self._settings.budgets.get(provider)
        return DEFAULT_MAX_TOKENS if budget is None else budget.default_max_tokens

    def report_rate_limit(
        self, provider: str, retry_after: float | None = None
    ) -> None:
        """Pause grants for ``provider`` after it answered 429, 529 or similar.

        Calls through the dispatcher (``wrap_provider``, conversations,
        ``transport()``) report their rate-limit answers by themselves; a
        provider's ``on_rate_limit=`` is for calls made without a slot (a
        provider given both reports an answer once).

        Holders are not touched; nothing is granted until the pause ends.
        With ``retry_after`` (the server's ``Retry-After``, in seconds) the
        pause lasts that long. Without, or with ``0`` (a server's
        ``Retry-After: 0`` names no delay), it backs off: the dispatcher's
        ``default_pause`` for the first report of a streak, doubling with
        each later round up to ``max_pause``. A report opens a new round
        when a slot was granted since the previous report; reports with no
        grant between them (requests that were in flight together) share a
        round. A report with ``retry_after`` counts as a round too. The
        streak ends on a success, a slot granted after the latest report
        and given back with no report while it was held, or on ``resume``.

        No pause is longer than the dispatcher's ``max_pause``, and a later
        report can only extend a pause, never shorten it. Ignored for an
        unlimited provider and after the dispatcher has closed, since
        nothing waits there.
        """
        check_provider(provider)
        seconds = check_optional_seconds(retry_after, "retry_after")
        if self._calls:
            call = self._calls.get(trio.lowlevel.current_task())
            if call is not None and call.slot.provider == provider:
                # A provider's own callback for the call under way in this
                # task: the integration does not report this answer again.
                call.reported = True
        if self._closed or provider not in self._limits:
            return
        with contextlib.suppress(DispatcherClosed):
            # Its scheduler has stopped (it crashed): there is nothing to pause.
            self._tell(
                provider, lambda backend: backend.pause(trio.current_time(), seconds)
            )

    def resume(self, provider: str) -> None:
        """End the pause of ``provider`` now, and its backoff streak.

        Waiting requests are granted at once, in ticket order, as slots
        allow. Nothing happens for a provider that is not paused or has
        never been used. With ``redis_url``, it ends the pause of the whole
        fleet, from any process (one that never used the provider too).

        Raises:
            DispatcherClosed: The dispatcher has closed.
        """
        check_provider(provider)
        self._check_open()
        self._tell(provider, lambda backend: backend.resume())

    def events(self, *, buffer: int = 1024) -> EventSubscription:
        """Every event of every provider, from now on, to read in a block.

        ``async with dispatcher.events() as events: async for event in
        events`` yields a ``trio_dispatch.events`` value for each thing that
        happens to a slot or a provider while the block runs: ``Queued``,
        ``Granted`` (with the wait), ``Released`` (with the hold time),
        ``Withdrawn``, ``Refused``, ``Paused``, ``Resumed``,
        ``LimitChanged`` and ``RateLimitsReceived``. The iteration ends
        when the dispatcher closes, once the buffer is read.

        The schedulers never wait for the reader: they keep up to
        ``buffer`` events for it, and count the events they drop when the
        buffer is full in the subscription's ``dropped``. While nothing
        subscribes, no event is made at all.

        Args:
            buffer: The most events kept until read (a positive int).

        Raises:
            DispatcherClosed: On entering, if the dispatcher has closed.
        """
        check_limit(buffer, "buffer")
        return EventSubscription._create(self._hub, buffer)

    def _emit(self, event: DispatchEvent) -> None:
        """Hand ``event`` to the subscribers, if any; never blocks."""
        hub = self._hub
        if hub.sinks:
            hub.emit(event)

    def watch_call(self, provider: Provider) -> CallWatch | None:
        """An LLM call to ``provider`` begins: a watch, if anything observes calls.

        Plumbing for integrations: the watch times the call for the
        metrics (OpenTelemetry); ``None`` when nothing observes calls.
        """
        observers = self._call_observers
        return None if not observers else CallWatch(provider, observers)

    def _emit_rate_limits(self, provider: str, info: RateLimitInfo) -> None:
        """Tell the subscribers what an answer of ``provider`` said of its limits."""
        if self._hub.sinks:
            self._hub.emit(RateLimitsReceived(provider, trio.current_time(), info))

    def statistics(self) -> DispatcherStatistics:
        """A snapshot of every provider limited or used, unlimited ones too.

        It reflects everything done before the call: a ``set_limit``, a
        slot given back or asked for a moment ago shows at once, without
        waiting for the schedulers to run (each handles its queued messages
        first, synchronously, as it would itself).
        """
        return DispatcherStatistics(
            providers={
                provider: backend.statistics()
                for provider, backend in self._backends.items()
            },
            closed=self._closed,
        )

    def _unknown(self, provider: str) -> None:
        """Apply ``unknown_providers`` to a provider first seen unknown."""
        if self._settings.unknown_providers == "error":
            raise ValueError(
                f"provider {provider!r} has no limit;"
                f" known providers: {_names(self._known)}"
                f"{_did_you_mean(provider, self._known)}"
            )
        if self._settings.unknown_providers == "warn":
            _logger.warning(
                "provider %r has no limit, so it runs unlimited; limited providers: %s%s",
                provider,
                _names(self._limits),
                _did_you_mean(provider, self._limits),
            )
        self._cleared.add(provider)

    def _scheduler(self, provider: str) -> Backend:
        """The backend of ``provider``, made if there is none, its task running.

        Unlimited providers get one too (with no limit, it grants at once):
        it counts their slots in use, so a limit set later counts them. Its
        task stops when idle (see ``_serve``); the next call starts it again
        on the same backend.
        """
        actor = self._actors.get(provider)
        if actor is None:
            actor = self._backends.get(provider)
            if actor is None:
                actor = self._backends[provider] = self._new_backend(provider)
            self._actors[provider] = actor
            self._nursery.start_soon(
                self._serve, actor, name=f"trio_dispatch scheduler {provider!r}"
            )
        return actor

    def _tell(self, provider: str, change: Callable[[Backend], None]) -> None:
        """Make ``change`` to the backend of ``provider``, started if need be.

        A backend whose task was not running handles it at once, in this
        task, through its own message handling: its task finds it done.

        Raises:
            DispatcherClosed: Its backend is closed.
        """
        started = provider not in self._actors
        backend = self._scheduler(provider)
        try:
            change(backend)
        except trio.ClosedResourceError:
            raise DispatcherClosed(
                f"the scheduler of {provider!r} has stopped"
            ) from None
        if started:
            backend.handle_backlog()

    async def _share(self, limits: Mapping[str, int | AdaptiveLimit]) -> None:
        """Connect to Redis, store ``limits`` where none is, start the schedulers.

        Raises:
            BackendUnavailable: Redis cannot be reached.
        """
        from ._shared_backend import SharedBackends, serve_ledger  # noqa: PLC0415  # coredis only when asked for

        self._closing = trio.Event()
        shared = SharedBackends(
            self._settings, self._hub, self._limits, self._learn_limit
        )
        ledger, stored = await self._nursery.start(
            serve_ledger, self._settings, limits, shared.wake, self._closing
        )
        shared.ledger = ledger
        self._new_backend = shared.new
        for provider, limit in stored.items():
            self._learn_limit(provider, limit)
            self._known.add(provider)
            self._cleared.add(provider)
            # Started now, so that a pause or a limit reaches it at once.
            self._scheduler(provider)

    def _learn_limit(self, provider: str, limit: int | None) -> None:
        """A shared scheduler learned the fleet's limit from Redis."""
        if limit is None:
            self._limits.pop(provider, None)
        else:
            self._limits[provider] = limit

    def _local_backend(self, provider: str) -> Backend:
        """The scheduler actor of ``provider`` in this process."""
        settings = self._settings
        budget = settings.budgets.get(provider)
        policy = SlotPolicy(
            None,
            max_waiting=settings.max_waiting,
            default_pause=settings.default_pause,
            max_pause=settings.max_pause,
            throttle=None
            if budget is None
            else Throttle(
                budget,
                learn=settings.learn_budgets,
                now=trio.current_time(),
            ),
        )
        return SchedulerActor(provider, policy, self._hub)

    # Protected so that no KeyboardInterrupt comes between the actor's
    # decision to stop and its removal: a request in between would find a
    # closed inbox.
    @trio.lowlevel.enable_ki_protection
    async def _serve(self, actor: Backend) -> None:
        if await actor.run(stop_when_idle=True):
            # Idle and unlimited: it stopped with nothing held, waiting or
            # queued, in this same step, so no request was sent to it since.
            del self._actors[actor.provider]

    def check_known(self, provider: str) -> None:
        """Let ``provider`` through as ``slot()`` does, or refuse it at once.

        Plumbing for integrations that take slots later (``transport()``,
        ``start_conversation()``): ``unknown_providers`` applies to a
        provider never named in ``limits``, ``set_limit`` or
        ``remove_limit`` (a warning, or ``ValueError`` with ``"error"``).

        Raises:
            TypeError: ``provider`` is not a string.
            ValueError: ``provider`` is empty, or unknown while
                ``unknown_providers`` is ``"error"``.
        """
        check_provider(provider)
        if provider not in self._cleared:
            self._unknown(provider)

    def _check_open(self) -> None:
        if self._closed:
            raise DispatcherClosed("the dispatcher is closed")

    def _close(self) -> None:
        self._closed = True
        if self._closing is not None:
            self._closing.set()
        for backend in self._backends.values():
            backend.close()
        self._hub.close()
        self._nursery.cancel_scope.cancel()


Dispatcher._front = Dispatcher


def open_dispatcher(
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    *,
    budgets: Mapping[str, Budget] | None = None,
    learn_budgets: bool = True,
    default_pause: float = 1.0,
    max_pause: float = 60.0,
    max_hold: float | None = None,
    max_waiting: int | None = None,
    unknown_providers: _UnknownProviders = "warn",
    redis_url: str | None = None,
    namespace: str = _DEFAULT_NAMESPACE,
    lease: float = _DEFAULT_LEASE,
    priority_aging: float = 60.0,
) -> contextlib.AbstractAsyncContextManager[Dispatcher]:
    """Run a dispatcher for the duration of an ``async with`` block.

    Arguments are checked here, at the call, before anything starts.

    Args:
        limits: Provider name to its concurrency limit: an int from 1 to
            100000 (the one bound of every limit, the admin API's too), or
            an ``AdaptiveLimit`` that finds its own value between its
            bounds. Providers not named are unlimited until ``set_limit``.
        budgets: Provider name to its ``Budget``: requests and tokens per
            minute. A slot is granted when a slot is free and the budget
            holds the request: 1 request and its estimated tokens (the
            prompt's estimate plus ``max_tokens``, or the budget's
            ``default_max_tokens``), charged at grant time and corrected
            by the usage the answer reports. Grants stay oldest first: a
            request waiting for its tokens holds back the younger ones
            behind it, however small. Budgets apply to unlimited providers
            too. With ``redis_url``, the budgets live in Redis for the
            whole fleet, and a process's ``Budget`` replaces the fleet's
            configured one of its kinds when it opens.
        learn_budgets: Pace every provider by the rate-limit figures its
            answers report (``Dispatcher.observe_rate_limits``), so that a
            fleet that configured no budget stays below the provider's
            limits; with a ``budgets`` entry, the figures only lower what
            is left. ``False`` ignores the figures.
        default_pause: Seconds a rate-limit report that names no
            ``retry_after`` pauses a provider, the first time: consecutive
            reports without a success between them double the pause, up to
            ``max_pause``, and a success starts again from here (see
            ``Dispatcher.report_rate_limit``). Non-negative, and at most
            ``max_pause``, else ``ValueError``.
        max_pause: The longest pause a rate-limit report causes, in seconds
            (positive): a longer ``Retry-After`` is cut to it, as the
            official OpenAI and Anthropic SDKs ignore server delays beyond
            a minute or two. A conversation's backoff for an unlimited
            provider honours ``Retry-After`` up to it as well.
        max_hold: Seconds a slot may be held before its body is cancelled
            and ``SlotHoldTimeout`` raised; ``None`` for no bound.
        max_waiting: At most this many requests wait per provider; one more
            gets ``QueueFull`` at once. ``None`` for no bound.
        unknown_providers: What a slot of an unknown provider (one never
            named in ``limits``, ``set_limit`` or ``remove_limit``, such as
            a misspelt name) does: ``"allow"`` runs it unlimited quietly,
            ``"warn"`` does too but logs one warning per name on the
            ``"trio_dispatch"`` logger, naming the limited providers, and
            ``"error"`` refuses it at once with ``ValueError`` at
            ``dispatcher.slot()`` (and ``start_conversation``).
        redis_url: Share the limits (adaptive ones too), the budgets, the
            oldest-first order and the pauses with every process that uses the same Redis and ``namespace``
            (``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
            for TLS, or ``unix://path``; a single server or any node of a
            Redis Cluster); needs the ``redis`` extra (without it,
            ``ModuleNotFoundError`` says which to install). Its credentials
            (the userinfo, and query parameters such as ``password``) never
            show in an error, a log line or a repr. A limit
            in ``limits`` is stored only if the fleet has none stored for
            that provider: a stored limit, written by ``set_limit`` or
            ``remove_limit`` in any process, wins, and survives restarts.
            ``None`` (the default) keeps everything in this process.
        namespace: The prefix of every key in Redis: processes with the same
            namespace share their limits. Not empty, and without ``:``,
            ``{`` or ``}``. Only with ``redis_url``: given without it, even
            as the default ``"trio-dispatch"``, it is a ``ValueError``.
        lease: Seconds the slots and queued requests of a process that
            vanished stay taken (positive, finite). Holders renew every
            third of it; a holder whose lease went unrenewed this long is
            stopped with ``LeaseLost`` (see below). Only with
            ``redis_url``, as ``namespace``.
        priority_aging: Seconds of turn age that make up for one priority
            class (positive, finite). Requests go by class first (higher
            first), then oldest turn, then arrival: a request of class ``p``
            ranks as if its turn had started ``p * priority_aging`` seconds
            earlier, and equal ranks go first come, first served. So a
            lower class is never starved: a waiting request is passed only
            by requests of its class or a lower one whose turns began
            before its own, and by requests of a class ``k`` higher whose
            turns began less than ``k * priority_aging`` seconds after its
            own, finitely many. A class's lead is that time credit and no
            more: when waits grow far beyond it (sustained overload) the
            classes mix, oldest turn first; set it above the waits a higher
            class should be spared.

    Raises:
        BackendUnavailable: ``redis_url`` cannot be reached (on entering).
        LeaseLost: From a slot of a limited provider (on leaving it), if its
            lease in Redis went ``lease`` seconds without renewal.

    When the block ends, the schedulers stop: every request still waiting,
    wherever its task lives, and every later ``slot`` gets
    ``DispatcherClosed``. Slots held outside the block stay usable; giving
    them back does nothing. An exception from the block comes out as itself.

    With ``redis_url``, every provider, named or not, is scheduled through
    Redis (an unknown one runs unlimited until the fleet stores a limit
    for it), and:

    * the oldest turn of the whole fleet goes first, by the same rank as
      in one process (the turn's start less its class's credit; the fleet
      should share one ``priority_aging``): ranks are compared on the wall
      clock, so across hosts the order is as good as
      their clocks agree (NTP: a few milliseconds); each process publishes
      only its own oldest waiters, at most the limit, so a younger waiter
      of another process can pass an older one that is not published yet
      for the time of one exchange with Redis;
    * a rate-limit report pauses the provider for the fleet, on the Redis
      server's clock, with the backoff of ``report_rate_limit`` kept
      fleet-wide (a round opens when any process was granted a slot since
      the previous report; a success anywhere ends the streak);
    * budgets and adaptive limits are the fleet's too: a provider has one
      request bucket and one token bucket in Redis, refilled on the Redis
      server's clock and charged by every grant of every process; a
      ``Budget`` given to any process configures them (the latest process
      to open with one wins), and the rate-limit figures any process
      observes teach them. An ``AdaptiveLimit`` is stored like any limit,
      and its value rises with successes and falls with rounds of
      rate-limit reports anywhere in the fleet;
    * while Redis cannot be reached nothing new is granted (there is no
      local fallback: the ledger alone knows what the fleet holds);
      holders keep their slots, waiters keep waiting (their own deadlines
      apply), ``statistics()`` shows ``backend_up=False``, and the
      schedulers reconnect with a growing delay (at most a second, and
      a sixth of ``lease``);
    * if Redis restarts empty, each holder registers its slot again at its
      process's next exchange with Redis (at once after a failed one, else
      within a third of ``lease``): until then the fleet may be granted up
      to one limit too many, never more;
    * a process that vanishes holds its slots and its queued requests for
      at most ``lease`` seconds;
    * a process cut off from Redis (a partition, a loop blocked) keeps its
      slots only while their leases are sure to live: once ``lease``
      seconds have passed since the start of the last exchange that
      granted or renewed a slot of a limited provider, the body holding it
      is cancelled, and leaving the slot raises ``LeaseLost`` (the slot is
      given back), so that this process stops before the fleet may grant
      that slot again. An outage that ends within half a lease costs
      holders nothing (renewals come every third of ``lease``, retries at
      least every sixth): their leases are renewed at the first exchange
      that reaches Redis.
      The bound is kept on the process's clock against the Redis server's,
      so it assumes they run at the same rate (not that they agree).
    """
    checked, settings = _checked_settings(
        limits,
        budgets=budgets,
        learn_budgets=learn_budgets,
        default_pause=default_pause,
        max_pause=max_pause,
        max_hold=max_hold,
        max_waiting=max_waiting,
        unknown_providers=unknown_providers,
        redis_url=redis_url,
        namespace=namespace,
        lease=lease,
        priority_aging=priority_aging,
    )
    return _run_dispatcher(checked, settings)


def open_dispatcher_with(
    new_backend: Callable[[str], Backend],
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    **options: Any,  # noqa: ANN401  # open_dispatcher's keywords, checked there
) -> contextlib.AbstractAsyncContextManager[Dispatcher]:
    """``open_dispatcher`` whose providers are scheduled by backends of your own.

    ``new_backend(provider)`` is called once per provider, when it is first
    limited or used, and returns its ``Backend``; the dispatcher runs the
    backend's ``run`` in its nursery and talks to it through the protocol
    only. ``options`` are ``open_dispatcher``'s keywords, checked the same
    way, but for ``redis_url``, ``namespace`` and ``lease``: what a backend
    shares is its own business.

    Raises:
        TypeError: ``new_backend`` is not callable, or an option is unknown
            or one of those three.
    """
    if not callable(new_backend):
        raise TypeError(f"new_backend must be callable, got {new_backend!r}")
    for name in ("redis_url", "namespace", "lease"):
        if name in options:
            raise TypeError(f"open_dispatcher_with() takes no {name}")
    checked, settings = _checked_settings(limits, **options)
    return _run_dispatcher(checked, attrs.evolve(settings, new_backend=new_backend))


def _checked_settings(  # open_dispatcher's keywords, once
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    *,
    budgets: Mapping[str, Budget] | None = None,
    learn_budgets: bool = True,
    default_pause: float = 1.0,
    max_pause: float = 60.0,
    max_hold: float | None = None,
    max_waiting: int | None = None,
    unknown_providers: _UnknownProviders = "warn",
    redis_url: str | None = None,
    namespace: str = _DEFAULT_NAMESPACE,
    lease: float = _DEFAULT_LEASE,
    priority_aging: float = 60.0,
) -> tuple[dict[str, int | AdaptiveLimit], _Settings]:
    """``open_dispatcher``'s arguments, checked: the limits and the settings."""
    checked = check_limit_mapping(limits)
    checked_budgets = check_budgets(budgets)
    if not isinstance(learn_budgets, bool):
        raise TypeError(f"learn_budgets must be True or False, got {learn_budgets!r}")
    pause, longest = check_pauses(default_pause, max_pause)
    hold = check_optional_seconds(max_hold, "max_hold", positive=True)
    waiting = check_max_waiting(max_waiting)
    url = check_redis_url(redis_url)
    checked_namespace = check_namespace(namespace)
    checked_lease = check_positive_seconds(lease, "lease")
    if url is None:
        if namespace is not _DEFAULT_NAMESPACE:
            raise ValueError("namespace needs redis_url")
        if lease is not _DEFAULT_LEASE:
            raise ValueError("lease needs redis_url")
    else:
        _require_redis()
    settings = _Settings(
        default_pause=pause,
        max_pause=longest,
        max_hold=hold,
        max_waiting=waiting,
        unknown_providers=_check_unknown_providers(unknown_providers),
        redis_url=url,
        namespace=str(checked_namespace),
        lease=float(checked_lease),
        priority_aging=check_positive_seconds(priority_aging, "priority_aging"),
        budgets=checked_budgets,
        learn_budgets=learn_budgets,
    )
    return checked, settings


def _require_redis() -> None:
    """Refuse ``redis_url`` at once, with a hint, if the ``redis`` extra is missing.

    Raises:
        ModuleNotFoundError: coredis is not installed.
    """
    try:
        import coredis  # noqa: F401, PLC0415  # the redis extra, only when asked for
    except ModuleNotFoundError as exc:
        raise_if_extra_missing(exc, "redis_url", "redis", "coredis")
        raise


@asynccontextmanager
async def _run_dispatcher(
    limits: dict[str, int | AdaptiveLimit], settings: _Settings
) -> AsyncIterator[Dispatcher]:
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            dispatcher = Dispatcher._front._create(nursery, settings)
            if settings.redis_url is None:
                for provider, limit in limits.items():
                    dispatcher.set_limit(provider, limit)
            else:
                try:
                    await dispatcher._share(limits)
                except BaseException as exc:
                    body_error = exc
                    dispatcher._close()
                    raise
            try:
                yield dispatcher
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                dispatcher._close()
    except BaseExceptionGroup as group:
        # A group of one made only of what the body raised is the nursery's
        # wrapping of the body's exception: let it out as itself (trio may
        # have rebuilt a group the body raised, or trimmed the Cancelled it
        # absorbed from it, so compare leaves, not the group). Anything
        # else, such as an actor's crash, comes out in the group.
        if body_error is None or len(group.exceptions) != 1:
            raise
        only = group.exceptions[0]
        if not _identities(only) <= _identities(body_error):
            raise
        context = only.__context__
        try:
            raise only
        finally:
            only.__context__ = context
            del only, context


def _check_unknown_providers(value: object) -> _UnknownProviders:
    for mode in _UNKNOWN_PROVIDERS:
        if value == mode:
            return mode
    rule = "unknown_providers must be 'allow', 'warn' or 'error'"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {value!r}")
    raise ValueError(f"{rule}, got {value!r}")


def _shown(url: str | None) -> str | None:
    """A URL as a repr shows it: without its credentials."""
    return None if url is None else redact_url(url)


def _names(providers: Iterable[str]) -> str:
    """Provider names for a message: sorted, quoted, or ``none``."""
    return ", ".join(repr(name) for name in sorted(providers)) or "none"


def _did_you_mean(provider: str, names: Iterable[str]) -> str:
    """``"; did you mean 'openai'?"`` for a name close to ``provider``, or ``""``.

    Compared case-folded, so ``"OpenAI"`` finds ``"openai"`` and
    ``"opneai"`` does too; a name merely unlike every other finds nothing.
    """
    by_folded = {name.casefold(): name for name in sorted(names, reverse=True)}
    close = difflib.get_close_matches(
        provider.casefold(), by_folded, n=1, cutoff=_CLOSE_NAME
    )
    return f"; did you mean {by_folded[close[0]]!r}?" if close else ""


# difflib's similarity above which an unknown name is taken for a slip of
# the keyboard: "opneai" (0.83) and "OpenAI" (1.0) for "openai", not "gpt-x".
_CLOSE_NAME: Final = 0.8


def _identities(exc: BaseException) -> set[int]:
    """The identities of the exceptions in ``exc``, through any groups."""
    return {id(leaf) for leaf in leaves(exc)}
