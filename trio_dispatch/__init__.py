"""Oldest-agent-first concurrency limits for LLM providers, as trio actors."""

from ._exceptions import ConversationClosed as ConversationClosed
from ._exceptions import DispatcherClosed as DispatcherClosed
from ._exceptions import DispatchError as DispatchError
from ._exceptions import ProviderError as ProviderError
from ._exceptions import QueueFull as QueueFull
from ._exceptions import SlotHoldTimeout as SlotHoldTimeout
from ._policy import PolicyStatistics as PolicyStatistics
from ._policy import SlotPolicy as SlotPolicy
from ._provider import Provider as Provider
from .actors import Conversation as Conversation
from .actors import ConversationStatistics as ConversationStatistics
from .actors import Dispatcher as Dispatcher
from .actors import DispatcherStatistics as DispatcherStatistics
from .actors import ProviderStatistics as ProviderStatistics
from .actors import Slot as Slot
from .actors import Tool as Tool
from .actors import TurnResult as TurnResult
from .actors import open_dispatcher as open_dispatcher
from .actors import wrap_provider as wrap_provider
from .messages import Ticket as Ticket

__version__ = "0.1.0.dev0"

__all__ = [
    "Conversation",
    "ConversationClosed",
    "ConversationStatistics",
    "DispatchError",
    "Dispatcher",
    "DispatcherClosed",
    "DispatcherStatistics",
    "PolicyStatistics",
    "Provider",
    "ProviderError",
    "ProviderStatistics",
    "QueueFull",
    "Slot",
    "SlotHoldTimeout",
    "SlotPolicy",
    "Ticket",
    "Tool",
    "TurnResult",
    "open_dispatcher",
    "wrap_provider",
]

# Show the public names where users import them from, as httpx and trio do.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
