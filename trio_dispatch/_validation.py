"""Argument checks shared by the public entry points.

Each raises at once with a short lowercase message naming the argument and
the value it got, before anything has changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import attrs


def check_provider(provider: object) -> str:
    """A provider name is a non-empty string."""
    if not isinstance(provider, str):
        raise TypeError(f"provider must be a non-empty string, got {provider!r}")
    if not provider:
        raise ValueError("provider must be a non-empty string, got ''")
    return provider


def check_limit(limit: object, name: str = "limit") -> int:
    """A limit is a positive ``int`` (not a ``bool``, not a float)."""
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(f"{name} must be a positive integer, got {limit!r}")
    if limit < 1:
        raise ValueError(f"{name} must be a positive integer, got {limit!r}")
    return limit


def check_limits(limits: object) -> dict[str, int]:
    """A mapping of provider names to limits, checked whole before use."""
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise TypeError(
            f"limits must be a mapping of provider to limit, got {limits!r}"
        )
    checked: dict[str, int] = {}
    for provider, limit in limits.items():
        checked[check_provider(provider)] = check_limit(
            limit, f"limit for {provider!r}"
        )
    return checked


def check_max_waiting(max_waiting: object) -> int | None:
    """``max_waiting`` is ``None`` or a non-negative ``int``."""
    if max_waiting is None:
        return None
    if not isinstance(max_waiting, int) or isinstance(max_waiting, bool):
        raise TypeError(
            f"max_waiting must be a non-negative integer, got {max_waiting!r}"
        )
    if max_waiting < 0:
        raise ValueError(
            f"max_waiting must be a non-negative integer, got {max_waiting!r}"
        )
    return max_waiting


def as_float(value: float) -> float:
    """``float(value)``, with an ``int`` beyond any float as an infinity.

    ``float(10**400)`` raises ``OverflowError``; as an infinity, a check for
    a finite number refuses it with the same ``ValueError`` as any other.
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _shown(value: float) -> str:
    """``repr(value)``, or a short stand-in for an int too long to print."""
    try:
        return repr(value)
    except ValueError:
        # Beyond sys.get_int_max_str_digits(), an int refuses to print.
        return f"an integer of {int(value).bit_length()} bits"


def check_seconds(value: object, name: str, *, positive: bool = False) -> float:
    """A duration is a finite real number of seconds, >= 0 (or > 0)."""
    rule = "a positive" if positive else "a non-negative"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {rule} number of seconds, got {value!r}")
    seconds = as_float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(
            f"{name} must be {rule} number of seconds, got {_shown(value)}"
        )
    return seconds


def check_optional_seconds(
    value: object, name: str, *, positive: bool = False
) -> float | None:
    """Like ``check_seconds``, with ``None`` allowed."""
    return None if value is None else check_seconds(value, name, positive=positive)


def check_pauses(default_pause: object, max_pause: object) -> tuple[float, float]:
    """``0 <= default_pause <= max_pause``, and ``max_pause > 0``, in seconds."""
    first = check_seconds(default_pause, "default_pause")
    ceiling = check_seconds(max_pause, "max_pause", positive=True)
    if first > ceiling:
        raise ValueError(
            f"default_pause must be at most max_pause={max_pause!r},"
            f" got {default_pause!r}"
        )
    return first, ceiling


def check_instant(value: object, name: str) -> float:
    """An instant on the trio clock is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    instant = as_float(value)
    if not math.isfinite(instant):
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}")
    return instant


def positive_int(
    _instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """An attrs validator: a positive ``int``, not a ``bool``; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")
