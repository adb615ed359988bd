"""Kept places: a rate-limited model call keeps its turn's place for its retry.

An SDK retries a 429 by itself, after a sleep of its own, outside the slot:
the transport gives the slot back when the error's body is closed, and the
retry asks for a new one later. The pause ends on the dispatcher's clock,
the SDK's sleep on its own, a little later (a busy loop, the SDK's own
work), and in between the younger turns waiting for the provider would
take the slot: the oldest turn would lose its place to the 429.

So a call made inside a ``Dispatcher.turn()`` and answered 429, 503 or 529
keeps its place: right after the rate limit is reported, the transport
queues a request for the same provider and model, with the same turn's
rank, owned by the turn's block rather than by a request (``KeptPlace``).
It is an ordinary request of the backend: it waits through the pause like
any waiter, is granted in ticket order (so first, being the oldest), and
holds the provider fleet-wide with Redis as in one process. The call's
retry, made in the same turn for the same provider and model, takes it
over (``adopt``), granted or still waiting, instead of queueing anew.

A kept place ends exactly once:

* adopted: its slot is the retry's from then on, held until the retry's
  response is closed; its ``max_hold`` counts from the place's grant;
* granted and not adopted within ``retry_grace`` of its grant (nor by its
  ``max_hold`` deadline, if sooner): given back, as a grant withdrawn (it sent nothing: no success for the backoff streak
  or an adaptive limit);
* dropped: the turn's block ended, the retry waiting for it was
  cancelled, or the dispatcher closed. Dropping is synchronous: a waiting
  place's cancel, a granted place's release are sent before ``drop``
  returns, so the statistics show them at once.

One task in the dispatcher's nursery waits for each place's grant, then
for its adoption, no longer than ``retry_grace``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, final

import trio

from .._dispatch._turn import current_places
from .._exceptions import DispatchError

if TYPE_CHECKING:
    from .._dispatch._plumbing import Plumbing
    from .._dispatch._slot import Slot
    from .._dispatch._turn import KeptPlaces


class _State(enum.Enum):
    WAITING = "waiting"
    GRANTED = "granted"
    ADOPTED = "adopted"
    DROPPED = "dropped"


_WAITING: Final[_State] = _State.WAITING
_GRANTED: Final[_State] = _State.GRANTED
_ADOPTED: Final[_State] = _State.ADOPTED
_DROPPED: Final[_State] = _State.DROPPED


@final
class KeptPlace:
    """One rate-limited call's place in line, kept for its retry (see above)."""

    __slots__ = (
        "_avoid",
        "_dispatcher",
        "_key",
        "_model",
        "_places",
        "_provider",
        "_ready",
        "_scope",
        "_slot",
        "_state",
        "_tokens",
    )

    def __init__(
        self,
        dispatcher: Plumbing,
        provider: str,
        model: str | None,
        tokens: int,
        places: KeptPlaces,
        *,
        avoid: tuple[str, ...] = (),
    ) -> None:
        self._dispatcher = dispatcher
        self._provider = provider
        self._model = model
        self._tokens = tokens
        # A pool's members the call cannot be sent to (see Plumbing.unroutable).
        self._avoid = avoid
        self._places = places
        self._key = (dispatcher, provider, model)
        self._state = _WAITING
        self._slot: Slot | None = None
        # Cancelled by drop and adoption; its deadline is the grace's end.
        self._scope = trio.CancelScope()
        # Set when the place is granted or dropped: an adopter waits on it.
        self._ready = trio.Event()

    def __repr__(self) -> str:
        return (
            f"<KeptPlace provider={self._provider!r} model={self._model!r}"
            f" state={self._state.value}>"
        )

    def start(self) -> None:
        """Queue the place's request, in a task of the dispatcher's nursery.

        Called in the task of the call that met the rate limit: the new
        task copies its context, so its request is the turn's.
        """
        self._dispatcher.start_soon(
            self._wait, name=f"trio_dispatch kept place {self._provider!r}"
        )

    async def _wait(self) -> None:
        """Wait for the grant, then for the retry, at most ``retry_grace``."""
        try:
            with self._scope:
                try:
                    slot, max_hold = await self._dispatcher.hold(
                        self._provider, self._tokens, self._model, self._avoid
                    )
                except (DispatchError, ValueError):
                    # Refused (the queue is full) or closed: nothing kept;
                    # the retry will queue by itself.
                    return
                # Not dropped: a drop cancels the acquire, which gives
                # back a grant that raced it.
                assert self._state is _WAITING
                self._slot = slot
                self._state = _GRANTED
                assert slot.granted_at is not None
                # Kept no longer than the grace, nor than max_hold allows.
                self._scope.deadline = min(
                    slot.granted_at + self._dispatcher.retry_grace, max_hold
                )
                self._ready.set()
                await trio.sleep_forever()
        finally:
            # The grace ran out, the dispatcher closed or the grant was
            # refused; once adopted or dropped, nothing is left to do.
            self.drop()

    def drop(self) -> None:
        """Give the place up now: withdrawn if waiting, given back if granted.

        Synchronous and idempotent; nothing once adopted.
        """
        state = self._state
        if state is _ADOPTED or state is _DROPPED:
            return
        self._state = _DROPPED
        self._places.forget(self._key, self)
        if state is _GRANTED:
            assert self._slot is not None  # set with _GRANTED
            self._slot.release(used=False)
        # A waiting place's task is parked in its acquire: cancelling it
        # sends the scheduler its Cancel before this returns.
        self._scope.cancel()
        self._ready.set()

    async def adopt(self) -> Slot | None:
        """Take the place over: its slot, once granted; ``None`` if it was dropped.

        For the retry only, which took the place out of its turn's
        (``adopt_kept_place``). Cancelled while it waits, the place is
        dropped: nothing is held.
        """
        try:
            await self._ready.wait()
        except BaseException:
            self.drop()
            raise
        if self._state is not _GRANTED:
            return None
        self._state = _ADOPTED
        self._scope.cancel()
        return self._slot


def keep_place(
    dispatcher: Plumbing,
    provider: str,
    model: str | None,
    tokens: int,
    avoid: tuple[str, ...] = (),
) -> None:
    """Keep the current turn's place for the retry of a call answered "slow down".

    Called by the transport once the rate limit is reported, in the task
    that made the call. Nothing outside a turn, with ``retry_grace`` 0,
    for an unlimited provider or a pool of unlimited members (nothing is
    paused there) or once the dispatcher has closed. Over a pool, the
    place is the pool's (its members in ``avoid`` aside): the retry goes
    to whichever member frees first.
    """
    places = current_places()
    if (
        places is None
        or places.closed
        or not dispatcher.retry_grace
        or dispatcher.closed
        or not dispatcher.limited(provider)
    ):
        return
    place = KeptPlace(dispatcher, provider, model, tokens, places, avoid=avoid)
    places.keep((dispatcher, provider, model), place)
    place.start()


async def adopt_kept_place(
    dispatcher: Plumbing, provider: str, model: str | None
) -> Slot | None:
    """The slot of a place the current turn keeps for this call, or ``None``.

    A call of the transport asks before it queues: a place kept for the
    same dispatcher, provider and model is taken over, and its grant
    waited for; ``None`` if the turn keeps none (or it was dropped
    meanwhile), and the call queues as any other.
    """
    places = current_places()
    if places is None:
        return None
    place = places.take((dispatcher, provider, model))
    if place is None:
        return None
    assert isinstance(place, KeptPlace)
    return await place.adopt()
