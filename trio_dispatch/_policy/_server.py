"""The server's own load as a gate: the pure core of ``server_load``.

A self-hosted server that queues (vLLM, llama.cpp's ``llama-server``,
SGLang, TGI) may say how many requests it runs and how many wait
(``ServerLoad``, read from its metrics by the dispatcher). The gate keeps
our requests out of its queue, where the server, not the dispatcher, would
decide who goes next:

* while the latest reading says requests wait on the server, no grant
  (ours would wait behind them, in the server's order);
* the server's slots are learned from a reading with a queue: it runs all
  it can then, so ``running`` is its slots. Once they are known, a grant
  needs a free one: the others' requests at the latest reading (its
  ``running`` less the slots we held then, at least 0) plus the slots we
  hold now must be below them. The others' count is taken at the reading,
  ours now: a reading that comes between the end of our request on the
  server and our giving its slot back counts it neither as running nor,
  then, as ours, and one that comes before our request reaches the server
  counts it as ours;
* no reading (none yet, or the latest failed): the gate holds nothing, and
  the provider's limit alone applies.

Between two readings the count is ours alone, so another client's requests
started meanwhile show only at the next reading; that is what the interval
between readings costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from .._server_load._load import ServerLoad


@final
class ServerGate:
    """What the latest reading of the server's load lets through."""

    __slots__ = ("held", "load", "slots")

    def __init__(self) -> None:
        # The latest reading, or None: none yet, or the latest failed.
        self.load: ServerLoad | None = None
        # The server's slots, learned from a reading with a queue.
        self.slots: int | None = None
        # The slots we held at the reading.
        self.held = 0

    def __repr__(self) -> str:
        return f"<ServerGate load={self.load!r} slots={self.slots} held={self.held}>"

    def observe(self, load: ServerLoad | None, held: int) -> None:
        """A new reading (``None``: it failed), taken while we held ``held`` slots."""
        self.load = load
        self.held = held
        if load is not None and load.waiting:
            self.slots = load.running

    def holds(self, held: int) -> bool:
        """Whether a grant now, with ``held`` slots held, keeps our request out of the server's queue."""
        load = self.load
        if load is None:
            return True
        if load.waiting:
            return False
        slots = self.slots
        return slots is None or max(0, load.running - self.held) + held < slots
