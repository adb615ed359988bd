"""The typed messages trio-dispatch's actors exchange."""

from ._chat import ChatMessage as ChatMessage
from ._chat import ChatRequest as ChatRequest
from ._chat import Role as Role
from ._chat import ToolSpec as ToolSpec
from ._scheduling import Acquire as Acquire
from ._scheduling import Cancel as Cancel
from ._scheduling import Grant as Grant
from ._scheduling import Pause as Pause
from ._scheduling import Release as Release
from ._scheduling import Reply as Reply
from ._scheduling import Resume as Resume
from ._scheduling import SchedulerMessage as SchedulerMessage
from ._scheduling import SetLimit as SetLimit
from ._scheduling import Ticket as Ticket
from ._stream import Finish as Finish
from ._stream import ReasoningDelta as ReasoningDelta
from ._stream import StreamEvent as StreamEvent
from ._stream import TextDelta as TextDelta
from ._stream import ToolCall as ToolCall
from ._stream import Usage as Usage

__all__ = [
    "Acquire",
    "Cancel",
    "ChatMessage",
    "ChatRequest",
    "Finish",
    "Grant",
    "Pause",
    "ReasoningDelta",
    "Release",
    "Reply",
    "Resume",
    "Role",
    "SchedulerMessage",
    "SetLimit",
    "StreamEvent",
    "TextDelta",
    "Ticket",
    "ToolCall",
    "ToolSpec",
    "Usage",
]
