"""Oldest-agent-first concurrency limits for LLM providers, as trio actors."""

from ._exceptions import DispatcherClosed as DispatcherClosed
from ._exceptions import DispatchError as DispatchError
from ._exceptions import QueueFull as QueueFull
from ._exceptions import SlotHoldTimeout as SlotHoldTimeout
from ._policy import PolicyStatistics as PolicyStatistics
from ._policy import SlotPolicy as SlotPolicy
from .actors import Dispatcher as Dispatcher
from .actors import DispatcherStatistics as DispatcherStatistics
from .actors import ProviderStatistics as ProviderStatistics
from .actors import Slot as Slot
from .actors import open_dispatcher as open_dispatcher
from .messages import Ticket as Ticket

__version__ = "0.1.0.dev0"

__all__ = [
    "DispatchError",
    "Dispatcher",
    "DispatcherClosed",
    "DispatcherStatistics",
    "PolicyStatistics",
    "ProviderStatistics",
    "QueueFull",
    "Slot",
    "SlotHoldTimeout",
    "SlotPolicy",
    "Ticket",
    "open_dispatcher",
]

# Show the public names where users import them from, as httpx and trio do.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
