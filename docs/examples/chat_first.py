"""Chat turns first: an application's priority classes, for the simulator.

``trio-dispatch simulate --trace mixed.jsonl --config docs/examples/chat_first.py:CHAT_FIRST``
"""

from trio_dispatch.testing import DispatcherConfig, TurnSpec


def chat_first(turn: TurnSpec) -> int:
    """Class 1 for the chat tenant's turns, as the application would mark them."""
    return 1 if turn.tenant == "chat" else 0


CHAT_FIRST = DispatcherConfig({"priority_aging": 60.0}, priority=chat_first)
