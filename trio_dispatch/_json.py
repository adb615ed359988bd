"""Small JSON helpers shared by the wire edge and the tools, without cattrs."""

from __future__ import annotations

from collections.abc import Mapping


def json_kind(value: object) -> str:
    """The JSON name of a decoded value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    kinds: tuple[tuple[type | tuple[type, ...], str], ...] = (
        ((int, float), "number"),
        (str, "string"),
        ((list, tuple), "array"),
        (Mapping, "object"),
    )
    for types, kind in kinds:
        if isinstance(value, types):
            return kind
    return type(value).__name__
