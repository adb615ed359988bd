"""The outcome of each scheduling step, as events and log lines: one translator.

Both backends (the local ``SchedulerActor`` and the Redis-shared
scheduler) tell a ``Translator`` what their policy step did: a ticket
queued, granted, released, withdrawn or refused; the provider paused,
resumed, its limit changed. The translator writes the log line, if the
outcome has one, and hands the event to the dispatcher's ``EventHub`` if
anything listens. So every event and log line is made here, once, for
both backends.

The outcomes of every request (queued, granted, left) have no log line:
a backend calls them only while ``listening``, checked once per batch, so
nobody listening costs nothing per message. The provider's outcomes
(refused, paused, resumed, limit changed) are rare and always called,
for their log lines.

The translator remembers who holds or waits since when, to tell the wait
and the hold time; ``forget`` drops that while nobody listens (a ticket
that changes then would be misdated).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Literal, final

from ._hub import (
    Granted,
    LimitChanged,
    Paused,
    Queued,
    Refused,
    Released,
    Resumed,
    ServiceChanged,
    Withdrawn,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ..messages._protocol import Ticket
    from ._hub import DispatchEvent, EventHub

_logger = logging.getLogger("trio_dispatch")

LOCAL_PAUSE: Final = "provider %r rate-limited: granting nothing for %.3g s"
FLEET_PAUSE: Final = "provider %r paused for the fleet: granting nothing for %.3g s"


@final
class Translator:
    """Turns one provider's scheduling outcomes into events and log lines.

    Args:
        provider: The provider's name.
        hub: Where the events go.
        pause_log: The log line of a pause (``LOCAL_PAUSE`` or
            ``FLEET_PAUSE``), formatted with the provider and the seconds.
    """

    __slots__ = ("_pause_log", "_seen", "hub", "names", "provider")

    def __init__(
        self, provider: str, hub: EventHub, pause_log: str = LOCAL_PAUSE
    ) -> None:
        self.provider = provider
        self.hub = hub
        self._pause_log = pause_log
        # Who asked, and since when, of each ticket seen waiting or granted
        # while listening (queued at, then granted at).
        self._seen: dict[Ticket, tuple[str | None, float]] = {}
        # A pooled scheduler's: the provider each ticket's events name (the
        # member granted, or what it asked for) and its pool, if any.
        self.names: dict[Ticket, tuple[str, str | None]] | None = None

    @property
    def listening(self) -> bool:
        """Whether anything listens to the events."""
        return bool(self.hub.sinks)

    def hand_over(
        self, tickets: Iterable[Ticket]
    ) -> dict[Ticket, tuple[str | None, float]]:
        """Who asked for each of ``tickets`` and since when, forgotten here: another takes them over."""
        seen = self._seen
        return {ticket: seen.pop(ticket) for ticket in tickets if ticket in seen}

    def take_over(self, seen: Mapping[Ticket, tuple[str | None, float]]) -> None:
        """Know the tickets ``seen`` as another translator knew them (``hand_over``).

        Their next events say how long they waited or held since they first
        asked, not since they moved. Forgotten at once while nothing listens.
        """
        if self.hub.sinks:
            self._seen.update(seen)

    def forget(self) -> None:
        """Nobody listens: forget who waits or holds since when."""
        if self._seen:
            self._seen.clear()

    def _emit(  # noqa: PLR0917  # the fields every slot event has
        self,
        event: Callable[..., DispatchEvent],
        ticket: Ticket,
        who: str | None,
        now: float,
        in_flight: int,
        waiting: int,
        **own: object,
    ) -> None:
        """Emit ``event``, a slot event of ``ticket``, with its ``own`` fields."""
        hub = self.hub
        names = self.names
        if names is not None:
            own["provider"], own["pool"] = names.get(ticket, (self.provider, None))
        else:
            own["provider"] = self.provider
        hub.emit(
            event(
                at=now,
                conversation_id=who,
                started_at=hub.started_at(ticket),
                in_flight=in_flight,
                waiting=waiting,
                tenant=ticket.tenant,
                model=ticket.model,
                **own,
            )
        )

    # Each request's outcomes: called only while listening.

    def queued(
        self, ticket: Ticket, who: str | None, now: float, in_flight: int, waiting: int
    ) -> None:
        """``ticket`` waits; ``in_flight`` and ``waiting`` count it."""
        self._seen[ticket] = (who, now)
        self._emit(Queued, ticket, who, now, in_flight, waiting)

    def granted_at_once(
        self, ticket: Ticket, who: str | None, now: float, in_flight: int, waiting: int
    ) -> None:
        """``ticket`` was granted as it asked, without waiting."""
        self._seen[ticket] = (who, now)
        self._emit(Granted, ticket, who, now, in_flight, waiting, wait=0.0)

    def granted(
        self, grants: Sequence[Ticket], now: float, in_flight: int, waiting: int
    ) -> None:
        """``grants`` were granted together; ``in_flight``, ``waiting`` after all.

        Each event tells the state just after its own grant.
        """
        seen = self._seen
        in_flight -= len(grants)
        waiting += len(grants)
        for ticket in grants:
            who, since = seen.get(ticket, (None, None))
            if since is not None:
                seen[ticket] = (who, now)
            in_flight += 1
            waiting -= 1
            wait = None if since is None else now - since
            self._emit(Granted, ticket, who, now, in_flight, waiting, wait=wait)

    def left(  # noqa: PLR0917  # one step's counts, before and after
        self,
        ticket: Ticket,
        now: float,
        before: tuple[int, int],
        in_flight: int,
        waiting: int,
        granted: int = 0,
    ) -> None:
        """``ticket`` was released or cancelled, which freed ``granted`` grants.

        ``before`` is ``(in_flight, waiting)`` before the step, ``in_flight``
        and ``waiting`` after it, its grants included. Only a drop beyond
        those grants is the ticket's own: a withdrawal if it waited, a
        release if it held; nothing if the ticket was unknown.
        """
        if waiting + granted < before[1]:
            self.withdrawn(ticket, now, in_flight, waiting)
        elif in_flight - granted < before[0]:
            who, since = self._seen.pop(ticket, (None, None))
            held = None if since is None else now - since
            counts = (in_flight - granted, waiting + granted)
            self._emit(Released, ticket, who, now, *counts, held=held)

    def withdrawn(
        self, ticket: Ticket, now: float, in_flight: int, waiting: int
    ) -> None:
        """``ticket`` left the queue without a slot."""
        who, since = self._seen.pop(ticket, (None, None))
        waited = None if since is None else now - since
        self._emit(Withdrawn, ticket, who, now, in_flight, waiting, waited=waited)

    # The provider's outcomes: always called, for their log lines.

    def refused(  # noqa: PLR0917  # the refusal and the counts it met
        self,
        ticket: Ticket,
        who: str | None,
        now: float,
        error: Exception,
        in_flight: int,
        waiting: int,
    ) -> None:
        """A request was refused with ``QueueFull``."""
        tenant = ticket.tenant
        if tenant is None:
            _logger.info("provider %r refused a request: %s", self.provider, error)
        else:
            _logger.info(
                "provider %r refused a request of tenant %r: %s",
                self.provider,
                tenant,
                error,
            )
        if self.hub.sinks:
            self._emit(Refused, ticket, who, now, in_flight, waiting, reason=str(error))

    def limit_changed(
        self,
        previous: int | None,
        limit: int | None,
        now: float,
        *,
        log: bool = True,
        member: str | None = None,
    ) -> None:
        """The limit moved from ``previous`` to ``limit`` (nothing if equal).

        ``log=False`` for a move of the adaptive limit's own, too frequent
        for a log line. ``member``: the pooled provider it concerns.
        """
        if previous == limit:
            return
        provider = self.provider if member is None else member
        if log:
            _logger.info(
                "provider %r: limit %s (was %s)",
                provider,
                "none" if limit is None else limit,
                "none" if previous is None else previous,
            )
        hub = self.hub
        if hub.sinks:
            hub.emit(LimitChanged(provider, now, limit, previous))

    def paused(
        self,
        now: float,
        until: float | None,
        retry_after: float | None,
        member: str | None = None,
    ) -> None:
        """A rate-limit report paused the grants until ``until`` (``None``: unlimited)."""
        provider = self.provider if member is None else member
        if until is not None:
            _logger.info(self._pause_log, provider, until - now)
        hub = self.hub
        if hub.sinks:
            hub.emit(Paused(provider, now, until, "rate_limited", retry_after))

    def resumed(
        self,
        now: float,
        reason: Literal["expired", "resumed"],
        member: str | None = None,
    ) -> None:
        """The pause ended: it ran out, or ``resume`` ended it."""
        provider = self.provider if member is None else member
        if reason == "expired":
            _logger.info("provider %r: pause over, granting again", provider)
        else:
            _logger.info("provider %r resumed: granting again", provider)
        hub = self.hub
        if hub.sinks:
            hub.emit(Resumed(provider, now, reason))

    def service_changed(
        self, now: float, member: str, state: str, until: float | None
    ) -> None:
        """A member went out of service (until ``until``), half-open, or back in."""
        if state == "out":
            assert until is not None  # a cooldown ends
            _logger.warning(
                "member %r: calls failed before their answer, out of service"
                " for %.3g s",
                member,
                until - now,
            )
        elif state == "half_open":
            _logger.info("member %r: cooldown over, one request probes it", member)
        else:
            _logger.info("member %r back in service", member)
        hub = self.hub
        if hub.sinks:
            hub.emit(ServiceChanged(member, now, state, until))
