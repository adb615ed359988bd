"""A call's place in line, told to a self-hosted server that queues.

The dispatcher grants slots oldest turn first; what a server queues anyway
(a limit above its batch, several dispatchers sharing it) it runs in its
own order, first come, first served, unless it takes a per-request
priority: vLLM's OpenAI server started with ``--scheduling-policy
priority`` runs the lowest ``priority`` first, ties by arrival (see
``_wire._openai``). So ``transport(..., server_priority=True)`` and a
provider's ``server_priority`` (``wrap_provider``, conversations, through
the request's ``extra``: ``with_place``) send, with each model call, its
slot's place in line: ``place_in_line``.

The number is the slot's ticket's rank (its turn's start, less its
priority class's credit: ``Ticket``) as whole milliseconds of Unix time,
on the dispatcher's wall clock (``Plumbing.wall_ms``): this host's, or
with ``redis_url`` the Redis server's, as the fleet's queue places its
turns. An older turn gets a lower number, every call of one turn the same
one, a higher class a number lower by ``priority_aging`` seconds a class;
and two processes sharing a server send numbers that compare, on hosts
whose clocks agree, or on any hosts with ``redis_url``. Clamped to the
range vLLM takes, a signed 64-bit integer (which Unix milliseconds never
leave).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .._wire._openai import PRIORITY_FIELD, priority_value

if TYPE_CHECKING:
    from .._dispatch._plumbing import Plumbing
    from .._dispatch._slot import Slot
    from ..messages import ChatRequest


def place_in_line(dispatcher: Plumbing, slot: Slot) -> int:
    """The ``priority`` a server is sent for a call holding ``slot`` (granted)."""
    ticket = slot.ticket
    assert ticket is not None  # a granted slot has its ticket
    return priority_value(dispatcher.wall_ms(ticket.rank))


def wants_place(provider: object) -> bool:
    """Whether a provider asks for its calls' place in line (``server_priority``)."""
    return getattr(provider, "server_priority", False) is True


def with_place(request: ChatRequest, place: int) -> ChatRequest:
    """``request`` with ``priority`` ``place`` in its ``extra``, unless it has one."""
    extra = request.extra or {}
    if PRIORITY_FIELD in extra:
        return request
    return attrs.evolve(request, extra={**extra, PRIORITY_FIELD: place})
