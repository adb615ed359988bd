"""``DispatcherStatistics``: a dispatcher's snapshot, one entry per provider."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._backend import ProviderStatistics


@final
@attrs.frozen
class DispatcherStatistics:
    """A snapshot of a dispatcher: one entry per provider limited or used."""

    providers: Mapping[str, ProviderStatistics]
    closed: bool
