"""The chat model and the stream events, as frozen attrs values.

What a conversation sends a provider (``ChatRequest`` of ``ChatMessage``,
with ``ToolSpec``) and what a provider streams back (``TextDelta``,
``ReasoningDelta``, ``ToolCall``, ``Finish``, ``Usage``: together
``StreamEvent``). The scheduling protocol between requesters and a
provider's scheduler is in ``trio_dispatch.lowlevel``.
"""

from .._util import fixup_module_metadata
from ._chat import ChatMessage as ChatMessage
from ._chat import ChatRequest as ChatRequest
from ._chat import Role as Role
from ._chat import ToolSpec as ToolSpec
from ._stream import Finish as Finish
from ._stream import ReasoningDelta as ReasoningDelta
from ._stream import StreamEvent as StreamEvent
from ._stream import TextDelta as TextDelta
from ._stream import ToolCall as ToolCall
from ._stream import Usage as Usage

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "Finish",
    "ReasoningDelta",
    "Role",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
