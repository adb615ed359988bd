"""A provider whose every stream holds a dispatcher slot.

``wrap_provider`` puts the dispatcher between a conversation and a provider:
the slot is taken before any byte is sent and given back after the last
event, on error, on cancellation, and when the consumer leaves the block
early, because both are async context managers and trio always runs their
exits. A rate-limit answer (``RateLimited``, ``Overloaded``) is reported to
the dispatcher, so the provider is paused for every conversation, not just
the one that hit it.

Each stream is charged to the provider's token budget: the slot carries the
request's estimate (its prompt, about 4 characters a token, plus
``max_tokens``), and the ``Usage`` event at the end of the answer corrects
it to what the request really used.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, final

import trio

from .._exceptions import Overloaded, RateLimited
from .._validation import check_instant
from ..messages._stream import Usage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager
    from contextvars import Token

    from .._provider import Provider
    from ..messages import ChatRequest, StreamEvent
    from ._dispatcher import Dispatcher, Slot


@final
class _LimitedProvider:
    """A ``Provider`` whose streams each hold a slot of its dispatcher.

    Attributes:
        provider: The provider wrapped.
        conversation_id: Who asks: the ``conversation_id`` of every slot,
            or ``None`` for the current turn's.
        started_at: The priority of every stream (when the turn began), or
            ``None`` for the current turn's start, or the time each stream
            is opened outside any turn.
    """

    __slots__ = ("_dispatcher", "conversation_id", "provider", "started_at")

    def __init__(
        self,
        provider: Provider,
        dispatcher: Dispatcher,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
    ) -> None:
        self.provider = provider
        self._dispatcher = dispatcher
        self.conversation_id = conversation_id
        self.started_at = (
            None if started_at is None else check_instant(started_at, "started_at")
        )

    def __repr__(self) -> str:
        return (
            f"<wrap_provider {self.provider!r} conversation_id="
            f"{self.conversation_id!r} started_at={self.started_at}>"
        )

    @property
    def id(self) -> str:
        """The wrapped provider's id, which names its limit."""
        return self.provider.id

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        """Take a slot, then open the provider's stream; give both back on exit."""
        return self._stream(request)

    @asynccontextmanager
    async def _stream(
        self, request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        dispatcher = self._dispatcher
        provider_id = self.provider.id
        async with dispatcher.slot(
            provider_id,
            conversation_id=self.conversation_id,
            started_at=self.started_at,
            tokens=dispatcher._estimate(provider_id, request),
        ) as slot:
            # Cancelled while the grant was on its way: send nothing, whatever
            # the transport below would have checked before its first byte.
            await trio.lowlevel.checkpoint_if_cancelled()
            # Timed for the metrics, if any observe the calls.
            watch = dispatcher._watch_call(self.provider)
            # While the stream opens, the figures its headers carry
            # (``on_rate_limits``) count this request: it is answered.
            opening: Token[Slot | None] | None = OPENING.set(slot)
            try:
                async with self.provider.stream(request) as events:
                    if opening is not None:
                        OPENING.reset(opening)
                        opening = None
                    slot._answered()
                    metered = _Metered(events, slot)
                    yield metered if watch is None else watch.events(metered)
            except BaseException as exc:
                if opening is not None:
                    OPENING.reset(opening)
                    opening = None
                if isinstance(exc, RateLimited | Overloaded):
                    dispatcher.report_rate_limit(self.provider.id, exc.retry_after)
                if watch is not None:
                    watch.end(exc)
                raise
            if watch is not None:
                watch.end(None)


OPENING: Final[ContextVar[Slot | None]] = ContextVar(
    "trio_dispatch_opening", default=None
)
"""The slot whose provider stream the current task is opening, if any."""


@final
class _Metered:
    """A stream's events, passed on; its ``Usage`` corrects the slot's estimate."""

    __slots__ = ("_events", "_slot")

    def __init__(self, events: AsyncIterator[StreamEvent], slot: Slot) -> None:
        self._events = events
        self._slot = slot

    def __aiter__(self) -> _Metered:
        return self

    async def __anext__(self) -> StreamEvent:
        event = await self._events.__anext__()
        if type(event) is Usage and self._slot.held:
            self._slot.report_usage(event.prompt_tokens + event.output_tokens)
        return event


def wrap_provider(
    provider: Provider,
    dispatcher: Dispatcher,
    *,
    conversation_id: str | None = None,
    started_at: float | None = None,
) -> Provider:
    """Limit ``provider`` through ``dispatcher``.

    Args:
        provider: Any ``Provider``; its ``id`` names the limit.
        dispatcher: The dispatcher whose slots the streams take.
        conversation_id: Who asks: the ``conversation_id`` of every slot.
            ``None`` uses the current ``Dispatcher.turn()``'s when a stream
            is opened.
        started_at: When the turn began, on the trio clock: the priority
            of every stream opened through the result. ``None`` uses the
            start of the turn current when each stream is opened (its
            priority class too), or the time it is opened outside any
            turn.

    Returns:
        A provider whose ``stream`` takes a slot before any byte is sent and
        gives it back after the last event or however the block is left.
        A provider with no limit takes a slot too (granted at once, and
        counted, so that a limit set later counts the streams running).
    """
    return _LimitedProvider(
        provider, dispatcher, conversation_id=conversation_id, started_at=started_at
    )
