"""The latency signal of an adaptive limit: the pure core.

A server that queues instead of refusing (vLLM, llama.cpp's
``llama-server``, SGLang, TGI) never answers 429 when it is full: it runs
its batch over a fixed number of slots and keeps every other request in a
first-come-first-served queue of its own. Two things change then, and
neither depends on how long an answer is:

* the time to the first token grows by the time a request waited in the
  server's queue (its *excess* over what the prompt's size explains);
* the time between tokens grows with the batch: each extra sequence slows
  every other one's steps, by less than a whole step while batching still
  pays.

From the first, Little's law gives the server's queue as our requests
fill it: the calls in flight times the share of the calls' time spent
queued, ``in_flight * sum(excess) / sum(duration)`` over a round of calls
(one per slot of the limit). A call's excess counts at most as much as
the rest of its time, so that one answer delayed by anything else than
the queue (a stall, a hiccup) weighs at most about a slot. From the
second, the growth of the steps per extra sequence,
``(slowdown - 1) / (in_flight - 1)`` with ``slowdown`` the time between
tokens over its floor: near 0 a bigger batch is almost free,
near 1 it only spreads the same throughput over more requests.

The rule, at the end of each round:

* a queue of more than ``QUEUED`` requests on average: down by that many
  (at least 1), as a queue means the limit is above the server's slots;
* steps that grow by ``FLAT`` or more per extra sequence: down by 1, the
  throughput stopped growing a slot ago;
* no queue to speak of (under ``IDLE_QUEUE``), steps that still pay (under
  ``GROWING``) and the limit in use (calls in flight at least
  ``IN_USE`` of it): up, by the whole limit in the slow start (until the
  first decrease), by 1 after it, once such rounds have come
  ``patience`` times in a row: 1 at first, doubled (up to
  ``MAX_PATIENCE``) each time a rise is followed by a round with a queue,
  back to 1 when a rise holds. So at the server's knee, where each probe
  past it queues, the probes grow rarer, and the queue they cost with them;
* else it holds.

So it settles where the server's throughput stops growing and before its
queue starts, moving by a slot or two around it. One slow answer is one
call of a round: it weighs at most a slot's worth of queue. A round counts
only the calls granted since the limit last moved (a call's grant is its
end less its duration): the calls granted under the old limit would judge
the new one by what the old one did.

The floors (the fastest first token seen for a prompt of about that size,
in buckets of powers of two; the shortest time between tokens) are
minima over a sliding window of ``window`` seconds (two half-windows,
the older dropped as a new one starts), so that they follow a server that
got faster at once and one that got slower within a window.
"""

from __future__ import annotations

import math
from typing import Final, final

QUEUED: Final = 0.5
"""A mean server queue (in requests) above which the limit comes down."""

IDLE_QUEUE: Final = 0.2
"""A mean server queue below which the limit may go up."""

FLAT: Final = 0.9
"""Step growth per extra sequence at or above which the batch stopped paying."""

GROWING: Final = 0.75
"""Step growth per extra sequence below which a bigger batch still pays."""

MAX_PATIENCE: Final = 16
"""The most rounds of room a rise waits for, after rises that found a queue."""

IN_USE: Final = 0.75
"""The share of the limit the calls of a round must hold for it to grow."""

WINDOW: Final = 60.0
"""Seconds a floor is remembered: one that rises is learned within this."""


@final
class _WindowMin:
    """The least value seen over the last one to two half-windows."""

    __slots__ = ("current", "previous", "started")

    def __init__(self) -> None:
        self.current = math.inf
        self.previous = math.inf
        self.started = -math.inf

    def add(self, value: float, now: float, half: float) -> None:
        if now - self.started >= half:
            # A new half-window: the oldest is dropped.
            self.previous = self.current if now - self.started < 2 * half else math.inf
            self.current = value
            self.started = now
        elif value < self.current:
            self.current = value

    @property
    def value(self) -> float:
        return min(self.current, self.previous)


@final
class LatencySignal:
    """What a latency-signal adaptive limit learned, and its verdict per round.

    Feed it one call at a time (``observe``); at the end of each round it
    returns the change of the limit it finds (``0`` to hold), else ``None``.
    """

    __slots__ = (
        "_between",
        "_calls",
        "_changed_at",
        "_excess",
        "_first_token",
        "_growth",
        "_growth_calls",
        "_in_flight",
        "_patience",
        "_quiet",
        "_rose",
        "_time",
        "_window",
    )

    def __init__(self, window: float = WINDOW) -> None:
        self._window = window
        # Floors: the first token by prompt size (log2 buckets), and the
        # time between tokens.
        self._first_token: dict[int, _WindowMin] = {}
        self._between = _WindowMin()
        # When the latest verdict moved the limit: calls granted before it
        # teach the floors, not the round.
        self._changed_at = -math.inf
        # Rounds of room in a row, and how many a rise waits for: 1, doubled
        # each time a rise finds the server's queue, back to 1 when one holds.
        self._quiet = 0
        self._patience = 1
        self._rose = False
        # This round's sums.
        self._calls = 0
        self._excess = 0.0  # seconds past the first-token floors (see observe)
        self._time = 0.0  # seconds of the calls, so counted
        self._in_flight = 0
        self._growth = 0.0
        self._growth_calls = 0

    def __repr__(self) -> str:
        return f"<LatencySignal calls={self._calls} between_floor={self.between_floor}>"

    @property
    def between_floor(self) -> float | None:
        """The shortest time between tokens seen lately, or ``None``."""
        value = self._between.value
        return None if math.isinf(value) else value

    def first_token_floor(self, prompt_tokens: int) -> float | None:
        """The fastest first token seen lately for a prompt of about that size."""
        floor = self._first_token.get(_bucket(prompt_tokens))
        if floor is None or math.isinf(floor.value):
            return None
        return floor.value

    def observe(  # noqa: PLR0917  # one call's figures, all positional in the core
        self,
        now: float,
        first_token: float,
        between_tokens: float | None,
        duration: float,
        prompt_tokens: int,
        in_flight: int,
        limit: int,
    ) -> int | None:
        """One call ended: its figures, and the calls in flight with it.

        Args:
            now: When it ended.
            first_token: Seconds from its grant to its first token.
            between_tokens: Its mean seconds between two tokens, or
                ``None`` (fewer than two tokens).
            duration: Seconds from its grant to its end.
            prompt_tokens: Its prompt's size, estimated.
            in_flight: Calls in flight as it ended, itself included.
            limit: The limit now.

        Returns:
            The change of the limit at the end of a round (``0``: hold),
            or ``None`` within one.
        """
        half = self._window / 2
        floor = self._first_token.setdefault(_bucket(prompt_tokens), _WindowMin())
        floor.add(first_token, now, half)
        # At least 0: the floor is a minimum over this call's figure too.
        excess = first_token - floor.value
        # None too for no positive time between tokens (every token at once).
        between = (
            between_tokens
            if between_tokens is not None and between_tokens > 0
            else None
        )
        if between is not None:
            self._between.add(between, now, half)
        if now - duration < self._changed_at:
            return None  # granted under the limit before the latest move
        counted = min(excess, max(0.0, duration - excess))
        self._excess += counted
        self._time += duration - excess + counted
        if between is not None and in_flight > 1:
            slowdown = between / self._between.value
            self._growth += (slowdown - 1) / (in_flight - 1)
            self._growth_calls += 1
        self._calls += 1
        self._in_flight += in_flight
        if self._calls < max(limit, 2):
            return None
        verdict = self._verdict(limit)
        if verdict:
            self._changed_at = now
        return verdict

    def _verdict(self, limit: int) -> int:
        """The end of a round: the change of the limit (see the module notes)."""
        calls = self._calls
        in_flight = self._in_flight / calls
        queue = in_flight * self._excess / self._time if self._time > 0 else 0.0
        growth = self._growth / self._growth_calls if self._growth_calls else None
        self._calls = self._in_flight = self._growth_calls = 0
        self._excess = self._time = self._growth = 0.0
        if queue > QUEUED:
            if self._rose:
                # The latest rise found the server's queue: probe past the
                # limit it came from less often from now on.
                self._patience = min(2 * self._patience, MAX_PATIENCE)
            self._rose = False
            self._quiet = 0
            return -max(1, math.floor(queue))
        if growth is not None and growth >= FLAT:
            self._rose = False
            self._quiet = 0
            return -1
        if (
            queue < IDLE_QUEUE
            and (growth is None or growth < GROWING)
            and in_flight >= IN_USE * limit
        ):
            if self._rose:
                self._patience = 1  # the latest rise held: rise at once again
            self._quiet += 1
            if self._quiet >= self._patience:
                self._rose = True
                self._quiet = 0
                return 1
            return 0
        self._rose = False
        return 0


def _bucket(prompt_tokens: int) -> int:
    """Prompts of about the same size: powers of two."""
    return max(0, prompt_tokens).bit_length()
