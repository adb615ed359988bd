"""A process's clock read as the Redis server's: its offset, measured NTP-style.

A fleet orders its turns by when they began, and its hosts' wall clocks
need not agree: a process whose clock is behind would see its turns as
older than they are and take every slot, and one ahead would starve. So
each process places its turns on the Redis server's clock (``TIME``, which
the leases already use), through an offset to its own clock measured on
the exchanges it makes anyway: each tells when it was sent and when its
answer came (on the local clock) and what the server's clock said in
between. A sample's offset is ``server - (sent + received) / 2``; it is
off by at most half the exchange's round trip, so the sample of the
shortest round trip is kept (as NTP does). Samples are kept by windows
of ``window`` seconds: the best of the current window and of the one
before, so that an offset that changed (the local clock stepped) is
taken within two windows, and a round trip inflated by a loaded moment
does not displace a better sample.

Pure and synchronous: no trio, no I/O. The local clock is injectable
(``local``), for tests of hosts whose clocks disagree.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from collections.abc import Callable

WINDOW: Final = 10.0


@final
class ServerClock:
    """The local clock ``local``, read as the server's.

    Args:
        local: The local clock, in seconds (the wall clock by default).
        window: Seconds of samples among which the best is chosen.
    """

    __slots__ = ("_best", "_since", "_window", "_window_best", "local")

    def __init__(
        self, local: Callable[[], float] = time.time, *, window: float = WINDOW
    ) -> None:
        self.local = local
        self._window = window
        # The best (round trip, offset) of the current window and of the
        # window before it; when the current window began.
        self._window_best: tuple[float, float] | None = None
        self._best: tuple[float, float] | None = None
        self._since = -float("inf")

    def __repr__(self) -> str:
        return f"<ServerClock offset={self.offset:+.6f}>"

    @property
    def offset(self) -> float:
        """Seconds to add to the local clock to read the server's (0 until sampled)."""
        best = self._best
        return 0.0 if best is None else best[1]

    @property
    def round_trip(self) -> float | None:
        """The round trip of the sample in use, or ``None`` before the first."""
        best = self._best
        return None if best is None else best[0]

    def now(self) -> float:
        """The server's clock now, as well as it is known here."""
        return self.local() + self.offset

    def sample(self, sent: float, received: float, server: float) -> None:
        """An exchange sent at ``sent``, answered at ``received``, saw ``server``.

        ``sent`` and ``received`` are on the local clock, ``server`` on the
        server's, read while the exchange ran there. An exchange whose
        answer seems to come before it was sent (the local clock stepped
        back meanwhile) says nothing.
        """
        round_trip = received - sent
        if round_trip < 0:
            return
        candidate = (round_trip, server - (sent + received) / 2)
        if received - self._since >= self._window:
            # A new window: the one that ends is kept beside it, unless it
            # ended long ago.
            recent = received - self._since < 2 * self._window
            previous = self._window_best if recent else None
            self._since = received
            self._window_best = candidate
        else:
            previous = self._best
            if self._window_best is None or candidate[0] <= self._window_best[0]:
                self._window_best = candidate
        current = self._window_best
        assert current is not None
        self._best = (
            current if previous is None or current[0] <= previous[0] else previous
        )
