"""The one private ``cattrs.Converter`` that turns JSON into domain objects.

Trace files, saved histories and configuration become attrs values here,
at the edge, and nowhere else; the global ``cattrs`` converter is never
used, so nobody else's hooks can change what we accept. The wire formats'
stream decoders read their JSON by hand, for speed (``_wire/_decoder.py``
says how much), and name a wrong field in this converter's words.

The converter is strict where cattrs is lenient by default: a string field
takes only a ``str`` (not ``5`` turned into ``"5"``), an integer field only
an ``int`` (not ``True``, not ``"5"``), a float field only an ``int`` or a
``float``, an attrs class only a JSON object and a tuple only a JSON array.
A value that fails raises ``cattrs``' ``ClassValidationError``;
``describe_error`` turns it into one line naming every path that was wrong,
such as ``expected a string, got int @ $.choices[0].delta.content``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.gen import make_dict_structure_fn
from cattrs.strategies import configure_tagged_union
from cattrs.v import format_exception

from ._json import json_kind
from .messages._stream import (
    Finish,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
)

if TYPE_CHECKING:
    from cattrs.dispatch import StructureHook

_T = TypeVar("_T")


class _WrongType(TypeError):
    """A JSON value of the wrong kind; the message says which."""


def _structure_str(value: object, _type: object) -> str:
    if not isinstance(value, str):
        raise _WrongType(f"expected a string, got {json_kind(value)}")
    return value


def _structure_int(value: object, _type: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _WrongType(f"expected an integer, got {json_kind(value)}")
    return value


def _structure_float(value: object, _type: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _WrongType(f"expected a number, got {json_kind(value)}")
    return float(value)


def _structure_bool(value: object, _type: object) -> bool:
    if not isinstance(value, bool):
        raise _WrongType(f"expected a boolean, got {json_kind(value)}")
    return value


def _attrs_hook_factory(cls: type[Any], converter: cattrs.Converter) -> StructureHook:
    inner = make_dict_structure_fn(cls, converter)

    def structure_object(value: object, type_: Any) -> Any:  # noqa: ANN401 (cattrs hooks are untyped at this level)
        if not isinstance(value, Mapping):
            raise _WrongType(f"expected an object, got {json_kind(value)}")
        return inner(value, type_)

    return structure_object


def _is_homogenous_tuple(type_: Any) -> bool:  # noqa: ANN401 (any type form)
    args = typing.get_args(type_)
    return typing.get_origin(type_) is tuple and len(args) == 2 and args[1] is Ellipsis


def _tuple_hook_factory(type_: Any, converter: cattrs.Converter) -> StructureHook:  # noqa: ANN401 (any type form)
    inner = homogenous_tuple_structure_factory(type_, converter)

    def structure_array(value: object, type_: Any) -> Any:  # noqa: ANN401 (cattrs hooks are untyped at this level)
        if not isinstance(value, list | tuple):
            raise _WrongType(f"expected an array, got {json_kind(value)}")
        return inner(value, type_)

    return structure_array


_EVENT_TAGS: dict[str, type[Any]] = {
    "text_delta": TextDelta,
    "reasoning_delta": ReasoningDelta,
    "tool_call": ToolCall,
    "usage": Usage,
    "finish": Finish,
}
_TAG_OF_EVENT = {cls: tag for tag, cls in _EVENT_TAGS.items()}


def _event_tag(cls: type[Any]) -> str:
    return _TAG_OF_EVENT[cls]


def _structure_event(value: object, _type: object) -> Any:  # noqa: ANN401 (one of the union)
    """A ``StreamEvent`` from JSON tagged with its ``"type"``."""
    if not isinstance(value, Mapping):
        raise _WrongType(f"expected an object, got {json_kind(value)}")
    tag = value.get("type")
    cls = _EVENT_TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise _WrongType(f"unknown stream event type {tag!r}")
    fields = {key: item for key, item in value.items() if key != "type"}
    return _converter.structure(fields, cls)


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=False)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_factory(attrs.has, _attrs_hook_factory)
    converter.register_structure_hook_factory(_is_homogenous_tuple, _tuple_hook_factory)
    # A stream event is tagged with its kind, as the wire formats do: the
    # unstructure side is cattrs' tagged-union strategy, the structure side
    # ours, so an unknown tag says so instead of "required field missing".
    configure_tagged_union(
        StreamEvent, converter, tag_generator=_event_tag, tag_name="type"
    )
    converter.register_structure_hook(StreamEvent, _structure_event)
    return converter


_converter = _make_converter()


def structure(data: object, cls: type[_T]) -> _T:
    """Turn decoded JSON into ``cls``, or raise ``cattrs``' validation error."""
    return _converter.structure(data, cls)


def structure_as(data: object, type_form: Any) -> Any:  # noqa: ANN401 (union aliases are not ``type[T]``)
    """Like ``structure``, for a type form mypy cannot spell as ``type[T]``."""
    return _converter.structure(data, type_form)


def unstructure(value: object) -> Any:  # noqa: ANN401 (JSON-shaped, whatever it is)
    """Turn an attrs value (or a union member) into JSON-ready Python."""
    return _converter.unstructure(value)


def unstructure_as(value: object, type_form: Any) -> Any:  # noqa: ANN401 (as above)
    """Unstructure ``value`` as ``type_form``, so unions get their tag."""
    return _converter.unstructure(value, unstructure_as=type_form)


def _format(exc: BaseException, type_: type[Any] | None) -> str:
    if isinstance(exc, _WrongType):
        return str(exc)
    return format_exception(exc, type_)


def describe_error(exc: BaseException) -> str:
    """One line naming everything a structuring error found wrong."""
    return "; ".join(cattrs.transform_error(exc, format_exception=_format))
