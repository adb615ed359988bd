"""The scheduler actor: one trio task per limited provider.

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

While the provider is paused, the actor waits for its inbox with the pause's
end as deadline, and ticks the policy whenever it wakes. Once its inbox is
closed, the actor handles nothing more: it stops and fails every waiter,
including those whose ``Acquire`` was still unread, with
``DispatcherClosed``. It does the same if it is cancelled.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, final

import trio

from .._exceptions import DispatcherClosed, QueueFull
from ..messages import (
    Acquire,
    Cancel,
    Grant,
    Pause,
    Release,
    SchedulerMessage,
    SetLimit,
    Ticket,
)
from ._mailbox import Mailbox

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

    __slots__ = ("_batch", "_inbox", "_replies", "_seq", "policy", "provider")

    def __init__(self, provider: str, policy: SlotPolicy) -> None:
        self.provider = provider
        self.policy = policy
        self._inbox: Mailbox[SchedulerMessage] = Mailbox()
        # The messages taken from the inbox and not handled yet: if handling
        # one crashes the actor, those behind it are failed, not lost.
        self._batch: collections.deque[SchedulerMessage] = collections.deque()
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
        self._inbox.send_nowait(message)

    def close(self) -> None:
        """Refuse further messages; the actor stops and fails the waiters."""
        self._inbox.close()

    # KeyboardInterrupt waits for the next checkpoint: between two, the actor
    # changes the policy and tells the requesters, which must go together.
    @trio.lowlevel.enable_ki_protection
    async def run(self) -> None:
        """Serve the inbox until it is closed or the task is cancelled."""
        inbox = self._inbox
        policy = self.policy
        handle = self._handle
        try:
            while True:
                paused_until = policy.paused_until
                if paused_until is None:
                    await inbox.wait()
                else:
                    with trio.move_on_at(paused_until):
                        await inbox.wait()
                if inbox.closed:
                    return
                now = trio.current_time()
                batch = self._batch = inbox.take_all()
                while batch:
                    handle(batch[0], now)
                    batch.popleft()
                if policy.paused_until is not None:
                    self._deliver(policy.tick(now), now)
        finally:
            self._shutdown()

    def _handle(self, message: SchedulerMessage, now: float) -> None:
        policy = self.policy
        # Ordered by how often each message comes; most free nothing, so
        # delivery is skipped when there is nothing to deliver.
        if isinstance(message, Release):
            grants = policy.release(message.ticket)
        elif isinstance(message, Acquire):
            try:
                grants = policy.acquire(message.ticket)
            except QueueFull as exc:
                message.reply.fail(exc)
                return
            if not grants:
                self._replies[message.ticket] = message.reply
                return
            message.reply.grant(Grant(message.ticket, now))
            return
        elif isinstance(message, Cancel):
            self._replies.pop(message.ticket, None)
            grants = policy.cancel(message.ticket)
        elif isinstance(message, SetLimit):
            grants = policy.set_limit(message.limit)
        elif isinstance(message, Pause):
            policy.report_rate_limit(message.reported_at, message.retry_after)
            return
        else:
            grants = policy.resume()
        if grants:
            self._deliver(grants, now)

    def _deliver(self, grants: list[Ticket], now: float) -> None:
        replies = self._replies
        for ticket in grants:
            replies.pop(ticket).grant(Grant(ticket, now))

    def _shutdown(self) -> None:
        self._inbox.close()
        pending = self._batch
        self._batch = collections.deque()
        pending.extend(self._inbox.take_all())
        for message in pending:
            if isinstance(message, Acquire):
                message.reply.fail(self._closed_error())
        replies = list(self._replies.values())
        self._replies.clear()
        for reply in replies:
            reply.fail(self._closed_error())

    def _closed_error(self) -> DispatcherClosed:
        return DispatcherClosed(
            f"the dispatcher closed while waiting for {self.provider!r}"
        )
