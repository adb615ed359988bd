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
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, final

import attrs

from ._util import wrong_with

if TYPE_CHECKING:
    from contextvars import Token
    from types import TracebackType

CURRENT_TURN: Final[ContextVar[Turn | None]] = ContextVar(
    "trio_dispatch.turn", default=None
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


@final
class TurnScope:
    """``with dispatcher.turn(...) as turn:``: makes ``turn`` the current one.

    Entered once, and left in the task (the context) that entered it.
    """

    __slots__ = ("_entered", "_token", "turn")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self._token: Token[Turn | None] | None = None
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
        CURRENT_TURN.reset(token)
