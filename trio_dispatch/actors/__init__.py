"""The actors: one scheduler per provider and one per conversation, supervised
by the dispatcher."""

from ._compaction import SUMMARY_PREFIX as SUMMARY_PREFIX
from ._conversation import Conversation as Conversation
from ._conversation import ConversationStatistics as ConversationStatistics
from ._conversation import TurnResult as TurnResult
from ._dispatcher import Dispatcher as Dispatcher
from ._dispatcher import DispatcherStatistics as DispatcherStatistics
from ._dispatcher import ProviderStatistics as ProviderStatistics
from ._dispatcher import Slot as Slot
from ._dispatcher import open_dispatcher as open_dispatcher
from ._options import ConversationOptions as ConversationOptions
from ._scheduler import SchedulerActor as SchedulerActor
from ._tools import Tool as Tool
from ._tools import check_arguments as check_arguments

__all__ = [
    "SUMMARY_PREFIX",
    "Conversation",
    "ConversationOptions",
    "ConversationStatistics",
    "Dispatcher",
    "DispatcherStatistics",
    "ProviderStatistics",
    "SchedulerActor",
    "Slot",
    "Tool",
    "TurnResult",
    "check_arguments",
    "open_dispatcher",
]
