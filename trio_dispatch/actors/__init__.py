"""The actors: one scheduler per provider, supervised by the dispatcher."""

from ._dispatcher import Dispatcher as Dispatcher
from ._dispatcher import DispatcherStatistics as DispatcherStatistics
from ._dispatcher import ProviderStatistics as ProviderStatistics
from ._dispatcher import Slot as Slot
from ._dispatcher import open_dispatcher as open_dispatcher
from ._scheduler import SchedulerActor as SchedulerActor

__all__ = [
    "Dispatcher",
    "DispatcherStatistics",
    "ProviderStatistics",
    "SchedulerActor",
    "Slot",
    "open_dispatcher",
]
