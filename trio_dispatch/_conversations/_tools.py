"""Tools a conversation offers its model, and the check of their arguments.

A ``Tool`` is a value: a name, a description, a JSON schema for its
arguments and an async function that runs it. The conversation checks the
arguments the model wrote against the schema before it runs the tool, with
``check_arguments``: a small validator for the part of JSON Schema that tool
definitions use in practice::

    type                  "string", "number", "integer", "boolean",
                          "object", "array", "null", or a list of these
    enum                  the value must equal one of these
    properties            a schema per key of an object
    required              keys an object must have
    additionalProperties  false: no keys beyond ``properties``
                          (a schema: every other key must match it)
    items                 a schema every element of an array must match

Anything else in a schema (``description``, ``format``, ``minimum``,
``$ref``...) is ignored, so a call it lets through may still be refused by
the tool itself; the tool's own error then goes back to the model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._json import json_kind
from .._util import is_async_callable
from ..messages import ToolSpec

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["Tool", "check_arguments"]

# What OpenAI and Anthropic both accept as a tool's name.
_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TYPES: Final = frozenset(
    {"string", "number", "integer", "boolean", "object", "array", "null"}
)


def _check_name(_tool: object, _attribute: object, value: Any) -> None:  # noqa: ANN401 (a validator checks anything)
    rule = "tool name must be 1 to 64 letters, digits, '_' or '-'"
    if not isinstance(value, str):
        raise TypeError(f"{rule}, got {value!r}")
    if not _NAME.match(value):
        raise ValueError(f"{rule}, got {value!r}")


def _check_description(_tool: object, _attribute: object, value: Any) -> None:  # noqa: ANN401 (a validator checks anything)
    if not isinstance(value, str):
        raise TypeError(f"tool description must be a string, got {value!r}")


def _check_parameters(_tool: object, _attribute: object, value: Any) -> None:  # noqa: ANN401 (a validator checks anything)
    if not isinstance(value, dict):
        raise TypeError(f"tool parameters must be a JSON schema dict, got {value!r}")
    if value.get("type", "object") != "object":
        raise ValueError(
            f"tool parameters must be an object schema, got type {value['type']!r}"
        )
    try:
        json.dumps(value, allow_nan=False)  # as ToolSpec: no NaN or infinity
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool parameters must be JSON: {exc}") from None
    problem = _schema_problem(value, "$")
    if problem is not None:
        raise ValueError(f"tool parameters: {problem}")


def _schema_problem(schema: object, path: str) -> str | None:  # noqa: PLR0911 (one check per keyword)
    """What makes ``schema`` unusable by ``check_arguments``, or ``None``.

    Checked when the tool is made, so that a bad schema fails there, at
    once, and not in the middle of a turn when the model calls the tool.
    """
    if not isinstance(schema, Mapping):
        return None if isinstance(schema, bool) else f"{path} must be a schema object"
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    if kind is not None and not (
        isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)
    ):
        return f"{path}.type must be a type name or a list of them, got {kind!r}"
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(k, str) for k in required)
    ):
        return f"{path}.required must be a list of names, got {required!r}"
    enum = schema.get("enum")
    if enum is not None and not isinstance(enum, list):
        return f"{path}.enum must be a list, got {enum!r}"
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return f"{path}.properties must be an object, got {properties!r}"
    nested = [(f"{path}.properties.{name}", sub) for name, sub in properties.items()]
    for keyword in ("items", "additionalProperties"):
        if keyword in schema:
            nested.append((f"{path}.{keyword}", schema[keyword]))
    for where, sub in nested:
        problem = _schema_problem(sub, where)
        if problem is not None:
            return problem
    return None


def _check_run(_tool: object, _attribute: object, value: Any) -> None:  # noqa: ANN401 (a validator checks anything)
    # Refused here, not when the model calls it: a plain function's result
    # cannot be awaited, and the turn would go on with that error as the
    # tool's answer.
    if not is_async_callable(value):
        raise TypeError(f"tool run must be an async callable, got {value!r}")


@final
@attrs.frozen
class Tool:
    """A tool the model may call during a conversation's turns.

    Example::

        async def weather(arguments: dict[str, Any]) -> str:
            return f"sunny in {arguments['city']}"

        tool = Tool(
            name="weather",
            description="Today's weather in a city.",
            parameters={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
            run=weather,
        )

    Attributes:
        name: The name the model calls it by (1 to 64 letters, digits,
            ``_`` or ``-``, as both OpenAI and Anthropic require).
        description: What it does, for the model.
        parameters: A JSON schema for its arguments, an ``"object"`` schema.
            The conversation checks the model's arguments against it (see
            ``check_arguments``) before calling ``run``.
        run: An async function taking the arguments (a ``dict``) and
            returning the result text for the model; a bound async method,
            an object with an ``async def __call__`` or a
            ``functools.partial`` of one of these will do, a plain function
            is refused with ``TypeError``. An exception it raises goes back
            to the model as an error result; it does not end the turn, and
            is logged at WARNING on the ``trio_dispatch`` logger with its
            traceback.
    """

    name: str = attrs.field(validator=_check_name)
    description: str = attrs.field(validator=_check_description)
    parameters: dict[str, Any] = attrs.field(validator=_check_parameters)
    run: Callable[[dict[str, Any]], Awaitable[str]] = attrs.field(
        validator=_check_run, repr=False
    )

    def spec(self) -> ToolSpec:
        """The tool as a ``ChatRequest`` declares it to the model."""
        return ToolSpec(self.name, self.description, self.parameters)


def check_arguments(arguments: object, schema: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not match ``schema``, or ``None`` if they do.

    Checks the subset of JSON Schema described in the module notes and
    reports the first mismatch with its path, such as
    ``$.city: expected string, got number``.
    """
    return _check(arguments, schema, "$")


def _check(value: object, schema: object, path: str) -> str | None:  # noqa: PLR0911, PLR0912 (one branch per keyword reads best)
    if not isinstance(schema, Mapping):
        return None  # true, {} and anything unknown accept everything
    expected = schema.get("type")
    if expected is not None:
        kinds = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_kind(value, kind) for kind in kinds):
            wanted = " or ".join(str(kind) for kind in kinds)
            return f"{path}: expected {wanted}, got {json_kind(value)}"
    enum = schema.get("enum")
    if isinstance(enum, list) and not any(_same(value, option) for option in enum):
        options = ", ".join(_show(option) for option in enum)
        return f"{path}: expected one of {options}, got {_show(value)}"
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = schema.get("required")
        for key in required if isinstance(required, list) else ():
            if key not in value:
                return f"{path}: missing required property {key!r}"
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            where = f"{path}.{key}"
            if key in properties:
                problem = _check(item, properties[key], where)
            elif extra is False:
                return f"{path}: unexpected property {key!r}"
            else:
                problem = _check(item, extra, where)
            if problem is not None:
                return problem
    elif isinstance(value, list):
        items = schema.get("items")
        for index, item in enumerate(value):
            problem = _check(item, items, f"{path}[{index}]")
            if problem is not None:
                return problem
    return None


def _is_kind(value: object, kind: object) -> bool:  # noqa: PLR0911 (one line per JSON type)
    if kind not in _TYPES:
        return True  # a type this validator does not know: not ours to refuse
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        if isinstance(value, float):
            return math.isfinite(value) and value.is_integer()
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, Mapping)


def _same(value: object, option: object) -> bool:
    # JSON equality: true is not 1, and 1 is 1.0.
    if isinstance(value, bool) or isinstance(option, bool):
        return isinstance(value, bool) and isinstance(option, bool) and value == option
    return value == option


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
