"""How a script is played: which reply answers, when each event goes out.

The fake server and the scripted provider follow the same rules, so a
script means the same over sockets and in memory: ``choose`` first, then
the ``replies`` in order, then ``default``; the first token after
``time_to_first_token``, each later one ``1 / tokens_per_second`` after the
one before; a stream fault strikes before event ``after_events`` (or just
before the terminator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._request import FakeRequest
    from ._script import FakeReply, FakeScript


def pick_reply(
    script: FakeScript, request: FakeRequest, replies_used: int
) -> tuple[FakeReply, int]:
    """The reply to ``request``, and how many ``replies`` are used after it."""
    if script.choose is not None:
        chosen = script.choose(request)
        if chosen is not None:
            return chosen, replies_used
    if replies_used < len(script.replies):
        return script.replies[replies_used], replies_used + 1
    return script.default, replies_used


def token_delay(reply: FakeReply, tokens_sent: int) -> float:
    """Seconds to wait before the next token, after ``tokens_sent`` of them."""
    if tokens_sent == 0:
        return reply.time_to_first_token
    if reply.tokens_per_second is None:
        return 0.0
    return 1 / reply.tokens_per_second


def strike_index(reply: FakeReply, events: int) -> int | None:
    """Before which of the stream's ``events`` its stream fault strikes.

    ``events`` counts the stream's events before its terminator; striking
    at ``events`` means just before the terminator. ``None``: no fault.
    """
    fault = reply.fault
    if fault is None:
        return None
    if fault.after_events is None:
        return events
    return min(fault.after_events, events)
