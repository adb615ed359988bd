"""``DispatcherStatistics``: a dispatcher's snapshot, one entry per provider."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._policy._slots import PoolStatistics
    from ._backend import ProviderStatistics


@final
@attrs.frozen
class DispatcherStatistics:
    """A snapshot of a dispatcher: one entry per provider limited or used.

    Attributes:
        providers: Each provider's, by name: a pool's members too, each
            with its own limit, slots, pause and budgets.
        closed: Whether the dispatcher is closed.
        pools: Each pool's, by name (``open_dispatcher``'s ``pools``):
            its members, and the requests waiting for it.
    """

    providers: Mapping[str, ProviderStatistics]
    closed: bool
    pools: Mapping[str, PoolStatistics] = attrs.field(factory=dict)
