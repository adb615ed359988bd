"""Oldest-agent-first concurrency limits for LLM providers, as trio actors."""

from ._exceptions import ConversationClosed as ConversationClosed
from ._exceptions import DispatcherClosed as DispatcherClosed
from ._exceptions import DispatchError as DispatchError
from ._exceptions import QueueFull as QueueFull
from ._exceptions import SlotHoldTimeout as SlotHoldTimeout
from ._policy import PolicyStatistics as PolicyStatistics
from ._policy import SlotPolicy as SlotPolicy
from .actors import Conversation as Conversation
from .actors import ConversationOptions as ConversationOptions
from .actors import ConversationStatistics as ConversationStatistics
from .actors import Dispatcher as Dispatcher
from .actors import DispatcherStatistics as DispatcherStatistics
from .actors import ProviderStatistics as ProviderStatistics
from .actors import Slot as Slot
from .actors import Tool as Tool
from .actors import TurnResult as TurnResult
from .actors import open_dispatcher as open_dispatcher
from .messages import Ticket as Ticket
from .providers import LimitedProvider as LimitedProvider
from .providers import Provider as Provider
from .providers import ProviderError as ProviderError
from .providers import wrap_provider as wrap_provider

__version__ = "0.1.0.dev0"

__all__ = [
    "Conversation",
    "ConversationClosed",
    "ConversationOptions",
    "ConversationStatistics",
    "DispatchError",
    "Dispatcher",
    "DispatcherClosed",
    "DispatcherStatistics",
    "LimitedProvider",
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
