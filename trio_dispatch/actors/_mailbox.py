"""An actor's inbox: an unbounded FIFO for many senders and one reader.

The contract of ``trio.open_memory_channel(math.inf)`` with a single
receiving task: ``send_nowait`` never blocks (so it works in a ``finally``
under cancellation, without a shield), messages come out in the order they
went in, and after ``close`` every send raises ``trio.ClosedResourceError``.

It is built the way trio builds its own channel, on
``wait_task_rescheduled`` and ``reschedule``, but hands the reader its whole
backlog at once instead of one message per call, and can wake a parked
task without a message (``nudge``): a scheduler keeps in it the messages
sent while a task handles others, and its own task parks on it until what
it sleeps for changes.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar, final

import trio

T = TypeVar("T")


@final
class Mailbox(Generic[T]):
    """An unbounded FIFO of messages for one reading task.

    Attributes:
        queue: The messages queued, oldest first: read it (its truth is
            whether any is), change it only through the methods.
        closed: Whether ``close`` was called; queued messages may remain.
    """

    __slots__ = ("_reader", "closed", "queue")

    def __init__(self) -> None:
        self.queue: collections.deque[T] = collections.deque()
        self._reader: trio.lowlevel.Task | None = None
        self.closed = False

    def __len__(self) -> int:
        return len(self.queue)

    def send_nowait(self, message: T) -> None:
        """Queue ``message`` and wake the reader; never blocks.

        Raises:
            trio.ClosedResourceError: The mailbox is closed.
        """
        if self.closed:
            raise trio.ClosedResourceError("the mailbox is closed")
        self.queue.append(message)
        self._wake()

    def nudge(self) -> None:
        """Wake the reader without a message, so it looks at its state again."""
        self._wake()

    def close(self) -> None:
        """Refuse further messages and wake the reader. Idempotent."""
        self.closed = True
        self._wake()

    async def wait(self) -> None:
        """Park until a message is queued or the mailbox closes.

        Always a checkpoint. One task reads a mailbox.
        """
        if self.queue or self.closed:
            await trio.lowlevel.checkpoint()
            return
        if self._reader is not None:
            raise RuntimeError("another task is already waiting on this mailbox")
        self._reader = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def take_all(self) -> collections.deque[T]:
        """Everything queued, oldest first; the mailbox is left empty."""
        queue = self.queue
        self.queue = collections.deque()
        return queue

    def _wake(self) -> None:
        reader = self._reader
        if reader is not None:
            self._reader = None
            trio.lowlevel.reschedule(reader)

    def _abort(self, _raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self._reader = None
        return trio.lowlevel.Abort.SUCCEEDED
