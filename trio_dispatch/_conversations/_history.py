"""Histories that outlive a process: the rules a history keeps, and its JSON.

A conversation's history can be saved with ``Conversation.export_history``
(or ``dump_history``) and given back to ``Dispatcher.start_conversation``
after ``load_history``. The JSON is an object with a ``version`` (1) and
the ``messages``, each as the private converter writes a ``ChatMessage``::

    {"version": 1, "messages": [{"role": "user", "content": "hi", ...}, ...]}

A history sent to an LLM API must pair every tool call with its result, or
the API refuses every later request of the conversation, so a history is
checked where it enters (``check_history``): each assistant message that
calls tools is followed, before any other message, by exactly one result
for each of its calls, and every result answers a call of that message;
call ids are unique and not empty. A history that breaks a rule is refused
with a ``ValueError`` naming the message's index and the rule.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Final, get_args

from .._json import json_kind
from ..messages import ChatMessage, Role

HISTORY_VERSION: Final = 1
"""The version of the history JSON ``dump_history`` writes and ``load_history`` reads."""

_ROLES: Final = get_args(Role)


def check_history(history: object) -> tuple[ChatMessage, ...]:
    """``history`` as a tuple, once it is known to keep the rules (see above).

    Raises:
        TypeError: ``history`` is not an iterable of ``ChatMessage`` values.
        ValueError: A message breaks a rule; the message names it and its
            index.
    """
    messages = _as_messages(history)
    seen: set[str] = set()
    # The last assistant message that called tools, and its unanswered calls
    # in the order it made them: a dict, so that each result costs the same
    # however many calls the message made (a list's `in` and `remove` made
    # a message of n calls cost n * n).
    caller: int | None = None
    pending: dict[str | None, None] = {}
    for index, message in enumerate(messages):
        if message.role == "tool":
            call_id = message.tool_call_id
            if call_id in pending:
                del pending[call_id]
                continue
            if call_id in seen:
                rule = "a second result for tool call"
            else:
                rule = "a tool result without its call: none right before it has id"
            raise ValueError(f"history message {index}: {rule} {call_id!r}")
        if pending:
            raise ValueError(_unanswered(caller, pending))
        caller = None
        for call in message.tool_calls:
            if not call.id:
                raise ValueError(f"history message {index}: a tool call needs an id")
            if call.id in seen:
                raise ValueError(
                    f"history message {index}: tool call id {call.id!r} is used twice"
                )
            seen.add(call.id)
            caller = index
            pending[call.id] = None
    if pending:
        raise ValueError(_unanswered(caller, pending))
    return messages


def _as_messages(history: object) -> tuple[ChatMessage, ...]:
    if isinstance(history, str | bytes | Mapping) or not isinstance(history, Iterable):
        raise TypeError(
            f"history must be an iterable of ChatMessage values, got {history!r}"
        )
    messages = tuple(history)
    for index, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise TypeError(
                f"history message {index} must be a ChatMessage, got {message!r}"
            )
    return messages


def _unanswered(caller: int | None, pending: Collection[str | None]) -> str:
    ids = ", ".join(repr(call_id) for call_id in pending)
    calls = "tool call" if len(pending) == 1 else "tool calls"
    have = "has" if len(pending) == 1 else "have"
    return f"history message {caller}: {calls} {ids} {have} no result right after it"


def dump_history(history: Iterable[ChatMessage]) -> str:
    """``history`` as JSON text, for ``load_history`` to read back.

    Raises:
        TypeError: As ``check_history``.
        ValueError: As ``check_history``; or a tool call's arguments hold a
            value JSON cannot carry (NaN, a set...) or are nested too deeply
            to write.
    """
    from .._converter import unstructure  # noqa: PLC0415 (importing the package loads no cattrs)

    messages = check_history(history)
    parts: list[str] = []
    for index, message in enumerate(messages):
        try:
            parts.append(
                json.dumps(unstructure(message), ensure_ascii=False, allow_nan=False)
            )
        except (TypeError, ValueError):
            raise ValueError(
                f"history message {index}: its tool call arguments hold a value"
                " JSON cannot carry"
            ) from None
        except RecursionError:
            raise ValueError(
                f"history message {index}: its tool call arguments are nested too deeply"
            ) from None
    return f'{{"version": {HISTORY_VERSION}, "messages": [{", ".join(parts)}]}}'


def load_history(text: str | bytes) -> tuple[ChatMessage, ...]:
    """The history ``dump_history`` (or ``Conversation.export_history``) wrote.

    Give it to ``Dispatcher.start_conversation(..., history=...)`` to go on
    with the conversation.

    Raises:
        TypeError: ``text`` is not a string or bytes.
        ValueError: The text is not a history of version 1 (or is JSON
            nested too deeply to read), or a message in it is malformed or
            breaks a rule of ``check_history``; the message says which, and
            where.
    """
    if not isinstance(text, str | bytes):
        raise TypeError(f"text must be a string or bytes, got {text!r}")
    try:
        document = json.loads(text)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"history is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError("history is nested too deeply to read") from None
    if not isinstance(document, Mapping):
        raise ValueError(
            f"history must be a JSON object with a version and messages,"
            f" got {json_kind(document)}"
        )
    if "version" not in document:
        raise ValueError("history has no version")
    version = document["version"]
    if version != HISTORY_VERSION or isinstance(version, bool):
        raise ValueError(f"history version must be {HISTORY_VERSION}, got {version!r}")
    raw = document.get("messages")
    if not isinstance(raw, list):
        raise ValueError(f"history messages must be an array, got {json_kind(raw)}")
    return check_history(_message(index, item) for index, item in enumerate(raw))


def _message(index: int, item: object) -> ChatMessage:
    """Message ``index`` of a history's JSON, or a ``ValueError`` saying why not."""
    if not isinstance(item, Mapping):
        raise ValueError(
            f"history message {index} must be an object, got {json_kind(item)}"
        )
    import cattrs  # noqa: PLC0415 (importing the package loads no cattrs)

    from .._converter import describe_error, structure  # noqa: PLC0415 (as above)

    role = item.get("role")
    if role not in _ROLES:
        raise ValueError(
            f"history message {index}: unknown role {role!r}"
            f" (the roles are {', '.join(_ROLES)})"
        )
    try:
        return structure(item, ChatMessage)
    except cattrs.BaseValidationError as error:
        # A rule of ChatMessage itself says more than "invalid value".
        inner = error.exceptions
        if len(inner) == 1 and type(inner[0]) is ValueError:
            problem = str(inner[0])
        else:
            problem = describe_error(error)
        raise ValueError(f"history message {index}: {problem}") from None
