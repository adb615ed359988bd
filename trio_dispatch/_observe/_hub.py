"""What happens to slots and providers, as typed events: ``dispatcher.events()``.

The schedulers describe each thing that happens to a slot (queued,
granted, released, withdrawn, refused) or to a provider (paused, resumed,
its limit changed, its rate-limit figures received) as one frozen value,
and hand it to the dispatcher's ``EventHub``. The hub passes it on, at
once and in the scheduler's task, to every sink: an ``EventSubscription``
(what ``dispatcher.events()`` gives) or the metrics' accumulator.

A sink never blocks and never awaits. A subscription keeps the events in a
bounded buffer for its reader; when the buffer is full the event is
counted in ``dropped`` and forgotten, so a slow reader costs the
schedulers nothing. While no sink is attached, the schedulers build no
event at all: they check the hub once per batch of messages, not once per
message.

Times are on the trio clock (``trio.current_time()``). Every slot event
(``Queued``, ``Granted``, ``Released``, ``Withdrawn``, ``Refused``) has
these attributes, and the one its class names:

* ``provider``: the provider asked for; ``at``: when it happened;
* ``conversation_id``: who asked, if it said; ``started_at``: when its
  turn began, its place in the queue;
* ``in_flight``, ``waiting``: slots held and requests waiting after the
  event (in this process);
* ``tenant``, ``model``: what the request was made for and asked for, or
  ``None``;
* ``pool``: for a request of a pool (``open_dispatcher``'s ``pools``),
  the pool, else ``None``. Then ``provider`` is the member the slot was
  granted on (``Granted``, ``Released``), or the pool while it has none
  (``Queued``, ``Withdrawn``, ``Refused``); ``Paused``, ``Resumed`` and
  ``LimitChanged`` name the member they concern.

A request queued (or granted) while nothing listened has ``None`` for its
``conversation_id`` and for the seconds it waited (or held) in the events
that follow.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Final, Protocol, Self, TypeAlias, TypeVar, final

import attrs
import trio

from .._exceptions import DispatcherClosed
from .._util import NoPublicConstructor

if TYPE_CHECKING:
    from collections.abc import Callable, Container, Mapping
    from types import TracebackType

    from .._dispatch._backend import ProviderStatistics
    from .._policy._ratelimits import RateLimitInfo
    from .._provider import Provider
    from ..messages._limits import Tenant
    from ..messages._protocol import Ticket
    from ..messages._stream import Usage

_T = TypeVar("_T")


@attrs.frozen
class SlotEvent:
    """What every slot event says first (see the module notes)."""

    provider: str
    at: float
    conversation_id: str | None
    started_at: float


@final
@attrs.frozen
class Queued(SlotEvent):
    """A request for a slot waits: no slot was free, or others wait before it."""

    in_flight: int
    waiting: int
    tenant: str | None = None
    model: str | None = None
    pool: str | None = None


@final
@attrs.frozen
class Granted(SlotEvent):
    """A request got its slot.

    Attributes:
        wait: Seconds it waited for the slot (0 when granted at once).
    """

    wait: float | None
    in_flight: int
    waiting: int
    tenant: str | None = None
    model: str | None = None
    pool: str | None = None


@final
@attrs.frozen
class Released(SlotEvent):
    """A slot was given back.

    Attributes:
        held: Seconds it was held.
    """

    held: float | None
    in_flight: int
    waiting: int
    tenant: str | None = None
    model: str | None = None
    pool: str | None = None


@final
@attrs.frozen
class Withdrawn(SlotEvent):
    """A waiting request gave up (it was cancelled) before it got a slot.

    Attributes:
        waited: Seconds it waited.
    """

    waited: float | None
    in_flight: int
    waiting: int
    tenant: str | None = None
    model: str | None = None
    pool: str | None = None


@final
@attrs.frozen
class Refused(SlotEvent):
    """A request was refused with ``QueueFull``: too many already wait.

    Attributes:
        reason: The error's message.
    """

    reason: str
    in_flight: int
    waiting: int
    tenant: str | None = None
    model: str | None = None
    pool: str | None = None


@final
@attrs.frozen
class Paused:
    """A rate-limit report paused (or extended the pause of) a provider.

    One event per report, including a report that does not lengthen the
    pause running.

    Attributes:
        provider: The provider.
        at: When the report was handled (trio clock).
        until: When grants resume (trio clock), or ``None`` if the provider
            is unlimited, which a pause does not hold back.
        why: Why it paused: ``"rate_limited"``.
        retry_after: The delay the server asked for, in seconds, if any.
    """

    provider: str
    at: float
    until: float | None
    why: str
    retry_after: float | None


@final
@attrs.frozen
class Resumed:
    """A provider's pause ended.

    Attributes:
        provider: The provider.
        at: When it ended (trio clock).
        why: ``"expired"`` when its time ran out, ``"resumed"`` when
            ``Dispatcher.resume`` ended it early.
    """

    provider: str
    at: float
    why: str


@final
@attrs.frozen
class LimitChanged:
    """A provider's limit changed.

    Attributes:
        provider: The provider.
        at: When the scheduler applied it (trio clock).
        limit: The new limit, ``None`` for unlimited.
        previous: The limit before, ``None`` for unlimited.
    """

    provider: str
    at: float
    limit: int | None
    previous: int | None


@final
@attrs.frozen
class ServiceChanged:
    """A pool's member went out of service, half-open, or back in service.

    A member whose calls failed ``failure_threshold`` times in a row, before
    their answer, is out of service for ``failure_cooldown``; then it is
    half-open (one request probes it), and back in service once that
    request got its answer (see ``open_dispatcher``'s ``failure_threshold``).

    Attributes:
        provider: The member.
        at: When it changed (trio clock).
        state: ``"out"``, ``"half_open"`` or ``"in"``.
        until: Out of service: when its cooldown ends (trio clock); else
            ``None``.
    """

    provider: str
    at: float
    state: str
    until: float | None


@final
@attrs.frozen
class RateLimitsReceived:
    """A provider's answer reported its rate-limit figures.

    Attributes:
        provider: The provider that answered.
        at: When the figures reached the dispatcher (trio clock).
        info: The figures (times in seconds after the answer).
        model: The model the answer was for, or ``None``: figures of the
            provider's, over all its models.
    """

    provider: str
    at: float
    info: RateLimitInfo
    model: str | None = None


DispatchEvent: TypeAlias = (
    Queued
    | Granted
    | Released
    | Withdrawn
    | Refused
    | Paused
    | Resumed
    | LimitChanged
    | RateLimitsReceived
    | ServiceChanged
)
"""Anything ``dispatcher.events()`` yields."""


class EventSink(Protocol):
    """Where the hub hands each event; called in the scheduler's task."""

    def push(self, event: DispatchEvent) -> None:
        """Take one event; must neither block nor raise."""

    def close(self) -> None:
        """The dispatcher closed: no event follows."""


@final
class EventHub:
    """The dispatcher's sinks; the schedulers emit through it.

    ``sinks`` is a tuple, replaced on every change, so an ``emit`` never
    sees it change under it; an empty tuple means nobody listens, which is
    all a scheduler checks before it builds an event.
    """

    __slots__ = ("aging", "closed", "sinks")

    def __init__(self, aging: float = 60.0) -> None:
        self.sinks: tuple[EventSink, ...] = ()
        self.closed = False
        # The dispatcher's priority_aging: a ticket's rank less its credit.
        self.aging = aging

    def started_at(self, ticket: Ticket) -> float:
        """When the turn of ``ticket`` began: its rank plus its class's credit."""
        priority = ticket.priority
        return ticket.rank + priority * self.aging if priority else ticket.rank

    def __repr__(self) -> str:
        return f"<EventHub sinks={len(self.sinks)} closed={self.closed}>"

    def emit(self, event: DispatchEvent) -> None:
        """Hand ``event`` to every sink."""
        for sink in self.sinks:
            sink.push(event)

    def attach(self, sink: EventSink) -> None:
        """Start handing events to ``sink``; closed at once if the hub is."""
        if self.closed:
            sink.close()
            return
        self.sinks = (*self.sinks, sink)

    def detach(self, sink: EventSink) -> None:
        """Stop handing events to ``sink``; does nothing if it is not attached."""
        self.sinks = tuple(s for s in self.sinks if s is not sink)

    def close(self) -> None:
        """The dispatcher closed: close and forget every sink."""
        self.closed = True
        sinks, self.sinks = self.sinks, ()
        for sink in sinks:
            sink.close()


@final
class EventSubscription(metaclass=NoPublicConstructor):
    """The events of one dispatcher, from ``async with dispatcher.events()``.

    Inside the block, ``async for event in subscription`` yields every
    event since the block was entered, in the order the schedulers
    emitted them (a provider's events in the order they happened). The
    iteration ends once the dispatcher has closed and the buffer is read.

    The schedulers never wait for a reader: up to ``buffer`` events are kept
    until read, and an event that finds the buffer full is dropped and
    counted in ``dropped``.

    Attributes:
        buffer: The most events kept until read.
        dropped: Events lost because the buffer was full.
    """

    __slots__ = ("_entered", "_events", "_hub", "_lot", "_open", "buffer", "dropped")

    def __init__(self, hub: EventHub, buffer: int) -> None:
        self._hub = hub
        self.buffer = buffer
        self.dropped = 0
        self._events: collections.deque[DispatchEvent] = collections.deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._entered = False
        self._open = False

    def __repr__(self) -> str:
        return (
            f"<EventSubscription pending={len(self._events)}/{self.buffer}"
            f" dropped={self.dropped} open={self._open}>"
        )

    @property
    def pending(self) -> int:
        """Events received and not read yet."""
        return len(self._events)

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RuntimeError("an event subscription can be entered only once")
        await trio.lowlevel.checkpoint()
        if self._hub.closed:
            raise DispatcherClosed("the dispatcher is closed")
        self._entered = True
        self._open = True
        self._hub.attach(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hub.detach(self)
        self.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> DispatchEvent:
        if not self._entered:
            raise RuntimeError("read events inside 'async with dispatcher.events()'")
        events = self._events
        if events:
            await trio.lowlevel.checkpoint()
        while not events:
            if not self._open:
                raise StopAsyncIteration
            await self._lot.park()
        return events.popleft()

    # EventSink, called by the hub in the scheduler's task.

    def push(self, event: DispatchEvent) -> None:
        """Keep ``event`` for the reader, or count it dropped if the buffer is full."""
        events = self._events
        if len(events) >= self.buffer:
            self.dropped += 1
            return
        events.append(event)
        if self._lot:
            self._lot.unpark_all()

    def close(self) -> None:
        """No event follows: the reader ends once it has read the buffer."""
        self._open = False
        self._lot.unpark_all()


OTHER_TENANT: Final = "other"
"""The metrics' label of every tenant not configured, and of no tenant at all."""


def tenant_label(tenant: str | None, configured: Container[str]) -> str:
    """The label value the metrics give ``tenant``: bounded by the configuration.

    A configured tenant (``Dispatcher.tenants()``) is labelled by its name;
    any other, and a request made for no tenant, is ``OTHER_TENANT``. Tenant
    names come from the application's traffic (a user, a workspace), so
    labelling each by its own would let traffic grow the metrics without
    bound; the configured ones are few and chosen by the operator.
    """
    return tenant if tenant is not None and tenant in configured else OTHER_TENANT


def tenant_figures(
    stats: ProviderStatistics, configured: Mapping[str, Tenant]
) -> dict[str, tuple[int, int, float | None]]:
    """Held, waiting and the service counter of a provider, by tenant label.

    Every configured tenant (but one named ``OTHER_TENANT``), and
    ``OTHER_TENANT``: what the provider holds and queues beyond the
    configured tenants, so for the tenants not configured and the requests
    made for none. The configured figures and ``OTHER_TENANT``'s add up to
    the provider's. ``OTHER_TENANT`` has no service counter: the scheduler
    compares the counters of tenants, never a sum of them.
    """
    figures: dict[str, tuple[int, int, float | None]] = {}
    held = waiting = 0
    for tenant in configured:
        if tenant == OTHER_TENANT:
            continue
        seen = stats.tenants.get(tenant)
        if seen is None:
            figures[tenant] = (0, 0, None)
            continue
        figures[tenant] = (seen.in_flight, seen.waiting, seen.service)
        held += seen.in_flight
        waiting += seen.waiting
    figures[OTHER_TENANT] = (
        max(0, stats.in_flight - held),
        max(0, stats.waiting - waiting),
        None,
    )
    return figures


def read_in_trio(read: Callable[[], _T], token: trio.lowlevel.TrioToken) -> _T | None:
    """``read()`` in the trio thread of ``token``, from that thread or another.

    Metrics are scraped from wherever the exporter runs (``prometheus_client``
    and OpenTelemetry's periodic reader use threads of their own), but a
    dispatcher may be read only in its trio thread. ``None`` once that run
    is over.
    """
    if trio.lowlevel.in_trio_run():
        return read()
    try:
        return trio.from_thread.run_sync(read, trio_token=token)
    except trio.RunFinishedError:
        return None


# -- LLM calls -----------------------------------------------------------


class CallObserver(Protocol):
    """Told of every LLM call made through ``wrap_provider`` (conversations too)."""

    def call_ended(
        self,
        provider: Provider,
        duration: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        """A call ended, after ``duration`` seconds from its first byte sent.

        ``usage`` is the last ``Usage`` the stream reported, if any; ``error``
        what ended it, if it did not end normally. Called in the caller's
        task; must neither block nor raise.
        """


@final
class CallWatch:
    """One LLM call, timed and watched for its usage, for the call observers."""

    __slots__ = ("_observers", "provider", "started", "usage")

    def __init__(self, provider: Provider, observers: tuple[CallObserver, ...]) -> None:
        self.provider = provider
        self._observers = observers
        self.started = trio.current_time()
        self.usage: Usage | None = None

    def end(self, error: BaseException | None) -> None:
        """The call ended: tell the observers."""
        duration = trio.current_time() - self.started
        for observer in self._observers:
            observer.call_ended(self.provider, duration, self.usage, error)
