"""Reading exception groups: the one walker the package uses.

A nursery wraps what its tasks raise in a ``BaseExceptionGroup``, maybe
nested; the dispatcher, the conversation actor and the command line each
need to look inside: at the leaves, whether they are all of one kind, or at
the first of a kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterator

E = TypeVar("E", bound=BaseException)


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions in ``exc`` that are not groups, depth first, in order."""
    stack = [exc]
    while stack:
        current = stack.pop()
        if isinstance(current, BaseExceptionGroup):
            stack.extend(reversed(current.exceptions))
        else:
            yield current


def only(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether every leaf of ``exc`` is a ``kind``."""
    return all(isinstance(leaf, kind) for leaf in leaves(exc))


def first(exc: BaseException, kind: type[E]) -> E | None:
    """The first leaf of ``exc`` that is a ``kind``, or ``None``."""
    return next((leaf for leaf in leaves(exc) if isinstance(leaf, kind)), None)
