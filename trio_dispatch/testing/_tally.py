"""The counters the fake server and ``ScriptedProvider`` keep alike."""

from __future__ import annotations

from collections.abc import Mapping  # noqa: TC003 (attrs resolves the annotations)
from typing import TYPE_CHECKING, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable


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


@attrs.define(eq=False)
class Tally:
    """The counters behind ``FakeServerStatistics``; ``on_change`` after each."""

    on_change: Callable[[], None] = lambda: None
    requests_total: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    by_status: dict[int, int] = attrs.Factory(dict)
    completed: int = 0
    left_early: int = 0
    refusals: int = 0
    tokens: int = 0
    by_model: dict[str, int] = attrs.Factory(dict)
    refusals_by_model: dict[str, int] = attrs.Factory(dict)

    def arrived(self, model: str | None = None) -> None:
        """A request (for ``model``, if it named one) came in and is being answered."""
        self.requests_total += 1
        if model is not None:
            self.by_model[model] = self.by_model.get(model, 0) + 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.on_change()

    def answered(self, status: int) -> None:
        """A response started with ``status``."""
        self.by_status[status] = self.by_status.get(status, 0) + 1
        self.on_change()

    def finished(self) -> None:
        """A stream reached its scripted end."""
        self.completed += 1
        self.on_change()

    def abandoned(self) -> None:
        """The client left a stream before its end."""
        self.left_early += 1
        self.on_change()

    def refused(self, model: str | None = None) -> None:
        """A request (for ``model``, if it named one) was refused for a spent quota."""
        self.refusals += 1
        if model is not None:
            self.refusals_by_model[model] = self.refusals_by_model.get(model, 0) + 1
        self.on_change()

    def served(self, tokens: int) -> None:
        """A stream of ``tokens`` tokens (prompt and output) started."""
        self.tokens += tokens
        self.on_change()

    def departed(self) -> None:
        """A request is no longer being answered."""
        self.in_flight -= 1
        self.on_change()

    def snapshot(self) -> FakeServerStatistics:
        """The counters, frozen."""
        return FakeServerStatistics(
            requests_total=self.requests_total,
            in_flight=self.in_flight,
            peak_in_flight=self.peak_in_flight,
            responses_by_status=dict(self.by_status),
            completed=self.completed,
            client_disconnects=self.left_early,
            quota_refusals=self.refusals,
            tokens_served=self.tokens,
            requests_by_model=dict(self.by_model),
            quota_refusals_by_model=dict(self.refusals_by_model),
        )
