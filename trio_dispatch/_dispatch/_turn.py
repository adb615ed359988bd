"""The current turn: a context variable that every slot taken inside it reads.

A turn is what an agent does between a question and its answer: several
LLM calls (tool-loop steps, retries) and the tools between them. Every call
of one turn should keep the place in line that the turn's start gave it,
so ``Dispatcher.turn()`` puts the turn in a context variable and
``Dispatcher.slot()`` takes the start, the conversation id and the priority
it is not given from there. Whatever takes a slot without naming them (our
providers through ``wrap_provider``, conversations, an HTTP transport in
front of an SDK) follows the turn with no argument passed down.

Rules:

* trio copies the context when it starts a task, so tasks started inside a
  turn (in a nursery opened inside it, or in one opened earlier) belong to
  it; tasks started before it do not;
* a turn entered inside another replaces it until it is left, whole: a
  field it does not set is not taken from the outer one;
* a turn is plain data, tied to no dispatcher: slots of every dispatcher
  taken inside it carry it (each ranks it with its own
  ``priority_aging``);
* outside any turn, every request is a turn of its own: it starts when the
  slot is asked for, with priority 0.

A turn's block also owns the places in line its calls keep for their
retries (``KeptPlaces``, in ``CURRENT_PLACES``): the transport keeps one for
a call answered "slow down", until the call's retry takes it, and the
block's end drops every one still kept, at once.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, Protocol, final

import attrs

from .._util import wrong_with

if TYPE_CHECKING:
    from collections.abc import Hashable
    from contextvars import Token
    from types import TracebackType

CURRENT_TURN: Final[ContextVar[Turn | None]] = ContextVar(
    "trio_dispatch.turn", default=None
)
CURRENT_PLACES: Final[ContextVar[KeptPlaces | None]] = ContextVar(
    "trio_dispatch.kept_places", default=None
)


@final
@attrs.frozen
class Turn:
    """One agent turn: the place in line of every call made inside it.

    Made by ``Dispatcher.turn()``; ``current_turn()`` gives the one in force.

    Attributes:
        conversation_id: Who asks, for every slot of the turn, or ``None``.
        started_at: When the turn began (trio clock): the priority, within
            its class, of every call of the turn.
        priority: The turn's priority class; higher goes first.
        tenant: The tenant every slot of the turn is taken for, or ``None``.
    """

    conversation_id: str | None
    started_at: float
    priority: int
    tenant: str | None = None


def current_turn() -> Turn | None:
    """The turn the calling task is in, or ``None`` outside any turn."""
    return CURRENT_TURN.get()


class Place(Protocol):
    """A place in line kept for a turn: ``drop()`` gives it up, at once."""

    def drop(self) -> None: ...


@final
class KeptPlaces:
    """The places in line one turn's block keeps for its calls' retries.

    Keyed by what a retry must match to take one (its dispatcher, provider
    and model); several under one key go oldest first. Closed when the
    block ends: every place still kept is dropped, and none is kept after.
    """

    __slots__ = ("_places", "closed")

    def __init__(self) -> None:
        self._places: dict[Hashable, list[Place]] = {}
        self.closed = False

    def __repr__(self) -> str:
        kept = sum(len(places) for places in self._places.values())
        return f"<KeptPlaces kept={kept} closed={self.closed}>"

    def keep(self, key: Hashable, place: Place) -> bool:
        """Keep ``place`` under ``key``; ``False`` (not kept) once closed."""
        if self.closed:
            return False
        self._places.setdefault(key, []).append(place)
        return True

    def take(self, key: Hashable) -> Place | None:
        """The oldest place kept under ``key``, no longer kept; ``None`` if none."""
        places = self._places.get(key)
        if not places:
            return None
        place = places.pop(0)
        if not places:
            del self._places[key]
        return place

    def forget(self, key: Hashable, place: Place) -> None:
        """Stop keeping ``place`` (dropped by itself); nothing if it is not kept."""
        places = self._places.get(key)
        if places is not None and place in places:
            places.remove(place)
            if not places:
                del self._places[key]

    def close(self) -> None:
        """The block ended: drop every place kept, and keep none from now on."""
        self.closed = True
        places, self._places = self._places, {}
        for kept in places.values():
            for place in kept:
                place.drop()


def current_places() -> KeptPlaces | None:
    """The places the current turn's block keeps, or ``None`` outside any turn."""
    return CURRENT_PLACES.get()


@final
class TurnScope:
    """``with dispatcher.turn(...) as turn:``: makes ``turn`` the current one.

    Entered once, and left in the task (the context) that entered it.
    """

    __slots__ = ("_entered", "_kept", "_places", "_token", "turn")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self._token: Token[Turn | None] | None = None
        self._places: Token[KeptPlaces | None] | None = None
        self._kept: KeptPlaces | None = None
        self._entered = False

    def __repr__(self) -> str:
        return f"<TurnScope {self.turn!r}>"

    if not TYPE_CHECKING:
        __aenter__ = __aexit__ = wrong_with(
            "turn() is a plain context manager: use `with dispatcher.turn(...)`"
        )

    def __enter__(self) -> Turn:
        if self._entered:
            raise RuntimeError("a turn can be entered only once")
        self._entered = True
        self._token = CURRENT_TURN.set(self.turn)
        kept = self._kept = KeptPlaces()
        self._places = CURRENT_PLACES.set(kept)
        return self.turn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        if token is None:
            raise RuntimeError("a turn must be entered before it is left")
        places, self._places = self._places, None
        kept, self._kept = self._kept, None
        assert places is not None  # set with the turn's
        assert kept is not None
        # Dropped first: whatever the resets say, no place outlives its turn.
        kept.close()
        CURRENT_PLACES.reset(places)
        CURRENT_TURN.reset(token)
