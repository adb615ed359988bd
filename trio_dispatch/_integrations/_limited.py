"""A provider whose every stream holds a dispatcher slot.

``wrap_provider`` puts the dispatcher between a conversation and a provider:
the slot is taken before any byte is sent and given back after the last
event, on error, on cancellation, and when the consumer leaves the block
early, because both are async context managers and trio always runs their
exits. A rate-limit answer (``RateLimited``, ``Overloaded``) is reported to
the dispatcher, so the provider is paused for every conversation, not just
the one that hit it.

What an answer says of the account's rate limits travels with it: the
opened stream's ``rate_limits``, or the status error's. The wrapper reads
them there and tells the dispatcher (``observe_rate_limits``), so learned
budgets need no wiring. A provider's own callbacks
(``on_rate_limits=``, ``on_rate_limit=``) are for its calls made without
a slot: the answers the wrapper meters call none of them
(``Meter.metered``), so a provider also given the dispatcher's methods is
counted once. The metering is the transport's too (``_metering``).

A provider that names its ``model`` asks for that model's slot (see
``wrap_provider``). Each stream is charged to the provider's token budget:
the slot carries the request's estimate (``estimate_tokens``), and the
``Usage`` event at the end of the answer corrects it to what was used.

A provider whose ``server_priority`` is true (``OpenAIProvider(...,
server_priority=True)``, for a self-hosted server that queues by
priority) has each request sent with its slot's place in line, in its
``extra`` (``_priority``), unless the request gives a ``priority`` itself.
"""

from __future__ import annotations

import contextlib
import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, final

import trio

from .._exceptions import (
    Overloaded,
    ProviderConnectionError,
    ProviderError,
    RateLimited,
    ServerError,
)
from .._pool_provider import PoolProvider
from .._provider import STREAM_USAGE
from .._util import AsyncWithOnly
from .._validation import check_instant
from ._metering import (
    Meter,
    MeteredEvents,
    TokenTimes,
    estimate_prompt_tokens,
    estimate_tokens,
    figures_of,
    model_of_provider,
)
from ._priority import place_in_line, wants_place, with_place

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

    from .._dispatch._plumbing import Plumbing
    from .._dispatch._slot import Slot
    from .._provider import Provider
    from ..messages import ChatRequest, StreamEvent


@final
class LimitedProvider:
    """A ``Provider`` whose streams each hold a slot of its dispatcher.

    Made by ``wrap_provider``: ``provider`` is the one wrapped, and
    ``conversation_id`` and ``started_at`` are as ``wrap_provider`` takes them.
    """

    __slots__ = ("_dispatcher", "conversation_id", "provider", "started_at")

    def __init__(
        self,
        provider: Provider,
        dispatcher: Plumbing,
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
        return AsyncWithOnly(self._stream(request, math.inf), STREAM_USAGE)

    def stream_granted_by(
        self, request: ChatRequest, deadline: float, sending: Callable[[], None]
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        """``stream(request)``, if its slot is granted by ``deadline`` (trio clock).

        Raises ``NotGrantedInTime`` on entry, having sent nothing, if the
        slot is not granted by then; once granted, nothing is cut, and
        ``sending()`` is called just before the request is sent.
        """
        return self._stream(request, deadline, sending)

    @asynccontextmanager
    async def _stream(
        self,
        request: ChatRequest,
        deadline: float,
        sending: Callable[[], None] | None = None,
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        dispatcher = self._dispatcher
        provider_id = self.provider.id
        model = model_of_provider(self.provider)
        # Once: the charge's part and the timings' (TokenTimes).
        prompt_tokens = estimate_prompt_tokens(request)
        tokens = estimate_tokens(
            request, dispatcher.default_max_tokens(provider_id, model), prompt_tokens
        )
        # Over a pool, the slot of a call that failed before its answer and
        # the members it failed on: it goes again on another (see _fallback).
        failed: Slot | None = None
        tried: tuple[str, ...] = ()
        while True:
            # The wait for the grant is cut at the deadline; the call is not.
            # No scope at all without one: it would cost as much as the rest.
            waiting = (
                None if math.isinf(deadline) else trio.CancelScope(deadline=deadline)
            )
            with contextlib.nullcontext() if waiting is None else waiting:
                async with (
                    dispatcher.slot(
                        provider_id,
                        conversation_id=self.conversation_id,
                        started_at=self.started_at,
                        tokens=tokens,
                        model=model,
                        avoid=self._unroutable() or None,
                    )
                    if failed is None
                    else dispatcher.slot_again(failed, (*tried, *self._unroutable()))
                ) as slot:
                    if waiting is not None:
                        waiting.deadline = math.inf
                    provider = self._provider_of(slot)
                    if provider is None:
                        # Its member joined the pool after the call asked:
                        # no provider for it here. Given back unused, and
                        # asked again in the same place.
                        slot.release(used=False)
                        failed = slot
                        continue
                    # Cancelled while the grant was on its way: send nothing,
                    # whatever the transport below would have checked before
                    # its first byte.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    if sending is not None:
                        sending()
                    if wants_place(provider):
                        # A server that queues by priority gets the slot's place.
                        request = with_place(request, place_in_line(dispatcher, slot))
                    # Timed for the metrics, if any observe the calls.
                    watch = dispatcher.watch_call(provider)
                    meter = Meter(dispatcher, slot)
                    opened = False
                    try:
                        async with meter.metered(provider.stream(request)) as events:
                            opened = True
                            meter.answered(figures_of(events))
                            yield MeteredEvents(
                                events,
                                slot,
                                watch,
                                TokenTimes(prompt_tokens),
                            )
                    except BaseException as exc:
                        if isinstance(exc, ProviderError):
                            # A status answer: its figures count this request.
                            info = figures_of(exc)
                            busy = isinstance(exc, RateLimited | Overloaded)
                            meter.answered(
                                info,
                                started=info is not None,
                                pause=busy,
                                retry_after=getattr(exc, "retry_after", None),
                            )
                        if watch is not None:
                            watch.end(exc)
                        moved = None if opened else self._fallback(slot, tried, exc)
                        if moved is None:
                            raise
                        # Sent again at once on another member of the pool.
                        failed, tried = slot, moved
                    else:
                        if watch is not None:
                            watch.end(None)
                        return
            if waiting is not None and waiting.cancelled_caught:
                raise NotGrantedInTime

    def _fallback(
        self, slot: Slot, tried: tuple[str, ...], error: BaseException
    ) -> tuple[str, ...] | None:
        """The members tried, if the call of ``slot`` goes again on another; else ``None``.

        Over a pool, a call that failed before its answer started (a
        connection error, a server error, a rate limit) goes again at once
        on a member it has not failed on, while there is one. A failure
        (not a rate limit, which pauses its member) counts against its
        member: its slot goes back as failed (``Slot.failed``).
        """
        if not isinstance(error, _BEFORE_THE_ANSWER) or type(self.provider) is not (
            PoolProvider
        ):
            return None
        if not isinstance(error, RateLimited | Overloaded):
            slot.failed()
        member = slot.member
        assert member is not None  # granted
        tried = (*tried, member)
        if not self._dispatcher.members_left(
            self.provider.id, (*tried, *self._unroutable())
        ):
            return None
        return tried

    def _provider_of(self, slot: Slot) -> Provider | None:
        """The provider granted ``slot``'s call goes through: a pool's, its member's.

        ``None`` for a member the ``PoolProvider`` has no provider for
        (one that joined the pool after the call asked).
        """
        provider = self.provider
        if type(provider) is not PoolProvider:
            return provider
        member = slot.member
        assert member is not None  # granted
        return provider.members.get(member)

    def _unroutable(self) -> tuple[str, ...]:
        """A pool's members its ``PoolProvider`` has no provider for, now: its calls avoid them.

        ``()`` for a provider that is no pool.

        Raises:
            PoolUnreachable: The ``PoolProvider`` has a provider for no
                member of the pool.
        """
        provider = self.provider
        if type(provider) is not PoolProvider:
            return ()
        return self._dispatcher.unroutable(provider.id, provider.members)


# A provider's errors of a call that got no answer: it may go elsewhere.
_BEFORE_THE_ANSWER: Final = (
    ServerError,
    ProviderConnectionError,
    RateLimited,
    Overloaded,
)


@final
class NotGrantedInTime(Exception):
    """``LimitedProvider.stream_granted_by``: no slot by the deadline; nothing sent."""
