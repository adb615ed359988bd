"""The counters the fake server and ``ScriptedProvider`` keep alike."""

from __future__ import annotations

from collections.abc import Mapping  # noqa: TC003 (attrs resolves the annotations)
from typing import TYPE_CHECKING, TypeVar, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

_K = TypeVar("_K")


@final
@attrs.frozen
class FakeServerStatistics:
    """A snapshot of what the fake server (or a ``ScriptedProvider``) has seen.

    Attributes:
        requests_total: LLM requests received (rejected ones included).
        peak_in_flight: The most LLM requests ever answered at once.
        responses_by_status: Responses started, by HTTP status.
        completed: Streams sent to their end as scripted (faults included).
        client_disconnects: Streams the client left before their end.
        quota_refusals: Requests answered 429 because a key's quota
            (``FakeQuotas``) was spent, not scripted 429s.
        tokens_served: Prompt and output tokens of the streams started.
        requests_by_model: LLM requests received, by the model their body
            named, as ``quota_refusals_by_model`` (a ``ScriptedProvider``
            leaves both empty).
        running: Requests holding a batch slot now (``FakeBatching``; 0
            without it, as the four below).
        waiting: Requests waiting in line for a batch slot now.
        peak_waiting: The longest the line has been.
        waiting_seconds: The time integral of ``waiting``, up to the
            snapshot: over a run of ``elapsed`` seconds, the mean line is
            ``waiting_seconds / elapsed``.
        running_seconds: The time integral of ``running``: the mean batch
            is ``running_seconds / elapsed``, the slots' use that over
            ``slots``.

    The integrals grow between changes of the counts, so ``wait_until`` sees
    them only when something else changes.
    """

    requests_total: int
    in_flight: int
    peak_in_flight: int
    responses_by_status: Mapping[int, int]
    completed: int
    client_disconnects: int
    quota_refusals: int = 0
    tokens_served: int = 0
    requests_by_model: Mapping[str, int] = attrs.field(factory=dict)
    quota_refusals_by_model: Mapping[str, int] = attrs.field(factory=dict)
    running: int = 0
    waiting: int = 0
    peak_waiting: int = 0
    waiting_seconds: float = 0.0
    running_seconds: float = 0.0


@attrs.define(eq=False)
class Tally:
    """The counters behind ``FakeServerStatistics``; ``on_change`` after each."""

    on_change: Callable[[], None] = lambda: None
    requests_total: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    responses_by_status: dict[int, int] = attrs.Factory(dict)
    completed: int = 0
    client_disconnects: int = 0
    quota_refusals: int = 0
    tokens_served: int = 0
    requests_by_model: dict[str, int] = attrs.Factory(dict)
    quota_refusals_by_model: dict[str, int] = attrs.Factory(dict)
    running: int = 0
    waiting: int = 0
    peak_waiting: int = 0
    waiting_seconds: float = 0.0
    running_seconds: float = 0.0
    # The instant up to which the two integrals are counted.
    counted_until: float = 0.0

    def arrived(self, model: str | None = None) -> None:
        """A request (for ``model``, if it named one) came in and is being answered."""
        self.requests_total += 1
        _bump(self.requests_by_model, model)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.on_change()

    def answered(self, status: int) -> None:
        """A response started with ``status``."""
        _bump(self.responses_by_status, status)
        self.on_change()

    def finished(self) -> None:
        """A stream reached its scripted end."""
        self.completed += 1
        self.on_change()

    def abandoned(self) -> None:
        """The client left a stream before its end."""
        self.client_disconnects += 1
        self.on_change()

    def refused(self, model: str | None = None) -> None:
        """A request (for ``model``, if it named one) was refused for a spent quota."""
        self.quota_refusals += 1
        _bump(self.quota_refusals_by_model, model)
        self.on_change()

    def served(self, tokens: int) -> None:
        """A stream of ``tokens`` tokens (prompt and output) started."""
        self.tokens_served += tokens
        self.on_change()

    def departed(self) -> None:
        """A request is no longer being answered."""
        self.in_flight -= 1
        self.on_change()

    def batch_changed(self, running: int, waiting: int, now: float) -> None:
        """The batch runs ``running`` requests with ``waiting`` in line from ``now`` on."""
        self._count_until(now)
        self.running = running
        self.waiting = waiting
        self.peak_waiting = max(self.peak_waiting, waiting)
        self.on_change()

    def snapshot(self, now: float | None = None) -> FakeServerStatistics:
        """The counters, frozen (the mappings copied), the integrals up to ``now``.

        ``None``: up to the last change.
        """
        if now is not None:
            self._count_until(now)
        counts = attrs.asdict(self, filter=lambda field, _: field.name not in _PLUMBING)
        return FakeServerStatistics(**counts)

    def _count_until(self, now: float) -> None:
        elapsed = now - self.counted_until
        if elapsed > 0:
            self.waiting_seconds += self.waiting * elapsed
            self.running_seconds += self.running * elapsed
            self.counted_until = now


_PLUMBING = frozenset({"on_change", "counted_until"})


def _bump(counts: dict[_K, int], key: _K | None) -> None:
    if key is not None:
        counts[key] = counts.get(key, 0) + 1
