"""The scheduler actor: one trio task per limited provider.

Design note. The actor owns a ``SlotPolicy`` and is the only code that
touches it. Everything reaches it as a message on one unbounded FIFO memory
channel, so senders never block (``send_nowait`` works in a ``finally``
under cancellation, without shielding) and a ``Cancel`` can never overtake
its ``Acquire``.

Each time it wakes, the actor drains its inbox with ``receive_nowait``
before it parks again: under contention one wake-up handles a whole batch
of releases and acquires, and the grants they free are delivered to each
waiter's own ``Reply`` right away. A grant is marked in the policy the
moment it is delivered; a grant that reaches a requester who has just given
up is ignored by its reply, and the requester's ``Cancel``, already behind
in the inbox, releases it. So slots never leak through that race.

While the provider is paused, the actor waits for its inbox with the pause's
end as deadline, and ticks the policy whenever it wakes. When the actor
stops, for whatever reason, it closes its inbox and fails every waiter,
including those whose ``Acquire`` was still unread, with
``DispatcherClosed``.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, final

import trio

from .._exceptions import DispatcherClosed, QueueFull
from ..messages import (
    Acquire,
    Cancel,
    Grant,
    Release,
    SchedulerMessage,
    SetLimit,
    Ticket,
)

if TYPE_CHECKING:
    from .._policy import SlotPolicy
    from ..messages import Reply


@final
class SchedulerActor:
    """The scheduler of one provider.

    Construct it with its policy, start ``run`` in a nursery, and talk to it
    only with ``send``. ``policy`` may be read between checkpoints for
    statistics; it reflects every message the actor has handled so far.
    """

    __slots__ = ("_receive", "_replies", "_send", "_seq", "policy", "provider")

    def __init__(self, provider: str, policy: SlotPolicy) -> None:
        self.provider = provider
        self.policy = policy
        self._send, self._receive = trio.open_memory_channel[SchedulerMessage](math.inf)
        self._replies: dict[Ticket, Reply] = {}
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return f"<SchedulerActor provider={self.provider!r} {self.policy!r}>"

    def ticket(self, started_at: float) -> Ticket:
        """A fresh ticket; its ``seq`` matches the order of the inbox."""
        return Ticket(started_at, next(self._seq))

    def send(self, message: SchedulerMessage) -> None:
        """Put a message in the inbox; never blocks.

        Raises:
            trio.ClosedResourceError: The actor has stopped.
        """
        self._send.send_nowait(message)

    def close(self) -> None:
        """Refuse further messages; the actor fails what is left when it stops."""
        self._send.close()

    async def run(self) -> None:
        """Serve the inbox until cancelled or closed."""
        receive = self._receive
        policy = self.policy
        handle = self._handle
        try:
            while True:
                paused_until = policy.paused_until
                if paused_until is None:
                    message: SchedulerMessage | None = await receive.receive()
                else:
                    message = None
                    with trio.move_on_at(paused_until):
                        message = await receive.receive()
                now = trio.current_time()
                if message is not None:
                    handle(message, now)
                while True:
                    try:
                        message = receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                    handle(message, now)
                if policy.paused_until is not None:
                    self._deliver(policy.tick(now), now)
        except trio.EndOfChannel:
            pass
        finally:
            self._shutdown()

    def _handle(self, message: SchedulerMessage, now: float) -> None:
        policy = self.policy
        # Ordered by how often each message comes.
        if isinstance(message, Release):
            self._deliver(policy.release(message.ticket), now)
        elif isinstance(message, Acquire):
            try:
                grants = policy.acquire(message.ticket)
            except QueueFull as exc:
                message.reply.fail(exc)
                return
            self._replies[message.ticket] = message.reply
            self._deliver(grants, now)
        elif isinstance(message, Cancel):
            self._replies.pop(message.ticket, None)
            self._deliver(policy.cancel(message.ticket), now)
        elif isinstance(message, SetLimit):
            self._deliver(policy.set_limit(message.limit), now)
        else:
            policy.pause(message.until)

    def _deliver(self, grants: list[Ticket], now: float) -> None:
        replies = self._replies
        for ticket in grants:
            replies.pop(ticket).grant(Grant(ticket, now))

    def _shutdown(self) -> None:
        self._send.close()
        while True:
            try:
                message = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if isinstance(message, Acquire):
                message.reply.fail(self._closed_error())
        replies = list(self._replies.values())
        self._replies.clear()
        for reply in replies:
            reply.fail(self._closed_error())
        self._receive.close()

    def _closed_error(self) -> DispatcherClosed:
        return DispatcherClosed(
            f"the dispatcher closed while waiting for {self.provider!r}"
        )
