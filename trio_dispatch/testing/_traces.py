"""The trace format: agent turns as JSON Lines, one turn a line.

```
{"started_at": 12.5, "calls": [{"duration": 1.8, "tool_after": 0.4, "tokens": 900}], "tenant": "acme", "priority": 0, "model": "gpt-4o"}
```

- ``started_at``: seconds from the trace's start (a number >= 0);
- ``calls``: the turn's LLM calls in order, at least one: ``duration`` the
  seconds the call holds its slot, ``tool_after`` the tool time before the
  next call (default 0; the last call's is not played), ``tokens`` its
  tokens, prompt and answer (optional; give it on every call or none);
- ``tenant``, ``priority`` (an integer class, default 0), ``model``:
  optional, ``null`` is the same as absent.

Every record is checked before anything runs, and a bad one is refused
with a ``ValueError`` naming the file, its line and the field; fields not
named here are refused too, so that a misspelt one is not silently lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._validation import (
    check_count,
    check_optional_model,
    check_optional_tenant,
    check_priority,
    check_seconds,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_TURN_FIELDS = ("started_at", "calls", "tenant", "priority", "model")
_CALL_FIELDS = ("duration", "tool_after", "tokens")


class _Bad(ValueError):
    """One field of one record is wrong; the message names the field."""


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Every turn of the trace at ``path``, as ``TurnSpec``'s keywords, checked.

    Each has no ``provider`` yet: ``Workload.from_trace`` picks it.
    """
    path = Path(path)
    turns = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                turns.append(_turn(line))
            except _Bad as exc:
                raise ValueError(f"{path}, line {number}: {exc}") from None
    if not turns:
        raise ValueError(f"{path}: the trace holds no turn")
    return turns


def _turn(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _Bad(f"not a JSON object ({exc.msg})") from None
    if not isinstance(record, dict):
        raise _Bad(f"expected a JSON object, got {type(record).__name__}")
    _only(record, _TURN_FIELDS, "")
    if "started_at" not in record:
        raise _Bad("started_at is missing")
    started_at = _check(check_seconds, record["started_at"], "started_at")
    calls = record.get("calls")
    if not isinstance(calls, list) or not calls:
        raise _Bad(f"calls must be a non-empty list of calls, got {calls!r}")
    durations, tools, tokens = [], [], []
    for index, call in enumerate(calls):
        where = f"calls[{index}]"
        if not isinstance(call, dict):
            raise _Bad(f"{where} must be an object, got {call!r}")
        _only(call, _CALL_FIELDS, f"{where}.")
        if "duration" not in call:
            raise _Bad(f"{where}.duration is missing")
        durations.append(_check(check_seconds, call["duration"], f"{where}.duration"))
        tools.append(
            _check(check_seconds, call.get("tool_after", 0), f"{where}.tool_after")
        )
        if call.get("tokens") is not None:
            tokens.append(_check(check_count, call["tokens"], f"{where}.tokens"))
    if tokens and len(tokens) != len(calls):
        raise _Bad("tokens must be given on every call or on none")
    priority = record.get("priority")
    return {
        "arrival": started_at,
        "calls": durations,
        "tools": tools[:-1],
        "priority": 0
        if priority is None
        else _check(check_priority, priority, "priority"),
        "tenant": _check(check_optional_tenant, record.get("tenant"), "tenant"),
        "model": _check(check_optional_model, record.get("model"), "model"),
        "tokens": tokens,
    }


def _only(record: dict[str, Any], fields: tuple[str, ...], prefix: str) -> None:
    for name in record:
        if name not in fields:
            raise _Bad(
                f"{prefix}{name} is not a field of the trace format"
                f" (expected {', '.join(fields)})"
            )


def _check(check: Callable[[Any, str], Any], value: object, field: str) -> Any:  # noqa: ANN401 (what the check returns)
    """``check(value, field)``, its error as one about this record."""
    try:
        return check(value, field)
    except (TypeError, ValueError) as exc:
        raise _Bad(str(exc)) from None


def trace_line(turn: Any) -> str:  # noqa: ANN401 (a TurnSpec; its module imports this one)
    """One turn as a line of the trace format (no newline)."""
    calls: list[dict[str, Any]] = []
    for index, duration in enumerate(turn.calls):
        call: dict[str, Any] = {"duration": duration}
        if index < len(turn.tools):
            call["tool_after"] = turn.tools[index]
        if turn.tokens:
            call["tokens"] = turn.tokens[index]
        calls.append(call)
    record: dict[str, Any] = {"started_at": turn.arrival, "calls": calls}
    if turn.tenant is not None:
        record["tenant"] = turn.tenant
    if turn.priority:
        record["priority"] = turn.priority
    if turn.model is not None:
        record["model"] = turn.model
    return json.dumps(record)


def write_trace(turns: Iterable[Any], path: str | Path) -> None:
    """Write ``turns`` (``TurnSpec``), by arrival, as a trace file."""
    turns = sorted(turns, key=lambda turn: turn.arrival)
    text = "".join(trace_line(turn) + "\n" for turn in turns)
    Path(path).write_text(text, encoding="utf-8")
