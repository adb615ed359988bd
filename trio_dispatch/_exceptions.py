"""The exceptions trio-dispatch raises.

One small tree; catch ``DispatchError`` for anything the dispatcher itself
refuses::

    DispatchError
    ├── DispatcherClosed     the dispatcher has shut down; nothing was acquired
    ├── QueueFull            too many requests already wait for this provider
    ├── SlotHoldTimeout      a slot was held longer than max_hold; the body was
    │                        cancelled and the slot given back
    ├── ConversationClosed   the conversation was closed, or its actor stopped,
    │                        before the answer
    └── ProviderError        talking to an LLM API went wrong (the tree under it
                             is drawn in trio_dispatch.providers)

Bad arguments raise ``TypeError`` or ``ValueError`` at the call, before
anything changes; misuse (entering a slot twice) raises ``RuntimeError``.
"""

from __future__ import annotations

from typing import final


class DispatchError(Exception):
    """Base class of every error trio-dispatch raises on its own account."""


@final
class DispatcherClosed(DispatchError):
    """The dispatcher has shut down, or did while the caller waited.

    A caller that sees this holds no slot.
    """


@final
class QueueFull(DispatchError):
    """More callers already wait for this provider than ``max_waiting`` allows.

    Raised at once, without waiting; the caller holds no slot.
    """


@final
class SlotHoldTimeout(DispatchError):
    """A slot was held past ``max_hold``.

    The body of the ``async with`` was cancelled when the time ran out, and
    the slot went back to the scheduler as the body unwound.
    """


@final
class ConversationClosed(DispatchError):
    """The conversation was closed, or its actor stopped, before the answer.

    Raised by ``ask`` and ``warm`` after ``Conversation.close()``, and to
    every caller still waiting when it is called. (When the dispatcher
    closes instead, they get ``DispatcherClosed``.)
    """
