"""The parts of a conversation's turns: its statistics, jobs, answers, tool calls.

Plain pieces the conversation actor (``_conversation``) is built from: what
one request to the actor is (``Job``), one complete answer of the model
(``Answer``, collected by ``collect_answer``), the counters a turn adds to,
and the rules of tool calls the model makes (``unique_ids``, ``refusal``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, final

import attrs
import trio

from ..messages import Finish, ReasoningDelta, TextDelta, ToolCall, Usage
from ..messages._chat import RequestOptions
from ._tools import Tool, check_arguments

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from ..messages import ChatMessage, StreamEvent
    from ._results import TurnEvent, TurnResult

NO_USAGE: Final = Usage(input_tokens=0, output_tokens=0)


@final
@attrs.frozen
class ConversationStatistics:
    """A snapshot of one conversation's counters.

    Attributes:
        conversation_id: The conversation's id.
        turns_completed: Turns answered.
        turns_failed: Turns that ended with an error.
        turns_cancelled: Turns whose caller gave up after they started.
        llm_calls: LLM requests sent, retries, summaries and warm-ups included.
        retries: LLM requests sent again after a retryable error.
        tool_calls: Tool calls the model made.
        compactions: Times older messages were replaced by a summary (by
            turns that completed: a failed or cancelled turn's summary is
            dropped with the rest of the turn).
        compactions_failed: Summary calls that failed (the turn went on).
        warmups: Warm-up requests answered.
        usage: The tokens of every successful LLM call, summed.
        queued: Jobs (turns, warm-ups) waiting in the inbox, counting those
            whose caller gave up until the actor reaches and skips them.
        running: Whether a job is running now.
        history_length: Messages in the history.
        closed: Whether the conversation has stopped.
    """

    conversation_id: str
    turns_completed: int
    turns_failed: int
    turns_cancelled: int
    llm_calls: int
    retries: int
    tool_calls: int
    compactions: int
    compactions_failed: int
    warmups: int
    usage: Usage
    queued: int
    running: bool
    history_length: int
    closed: bool


def add_usage(total: Usage, usage: Usage | None) -> Usage:
    if usage is None:
        return total
    return Usage(
        input_tokens=total.input_tokens + usage.input_tokens,
        output_tokens=total.output_tokens + usage.output_tokens,
        cache_read_tokens=total.cache_read_tokens + usage.cache_read_tokens,
        cache_write_tokens=total.cache_write_tokens + usage.cache_write_tokens,
    )


@attrs.define(eq=False)
class Job:
    """One queued request to the actor: a turn (``text``) or a warm-up.

    A turn's events go to its reader through ``events``; the channel is
    closed when the job ends, after ``done`` is set, so a reader that sees
    its end finds the outcome.
    """

    text: str | None
    events: trio.MemorySendChannel[TurnEvent] | None = None
    # The turn's options, the conversation's merged with its own.
    options: RequestOptions = attrs.Factory(RequestOptions)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    result: TurnResult | Usage | None = None
    error: BaseException | None = None

    def finish(self, result: TurnResult | Usage | None) -> None:
        self.result = result
        self.done.set()
        if self.events is not None:
            self.events.close()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finish(None)

    def outcome(self) -> TurnResult | Usage | None:
        """The result of the job, once ``done``; or its error, raised (once)."""
        error, self.error = self.error, None
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle through the traceback's frame
        return self.result

    async def emit(self, event: TurnEvent) -> None:
        """Give ``event`` to the reader, waiting while its buffer is full."""
        assert self.events is not None
        try:
            await self.events.send(event)
        except trio.BrokenResourceError:  # pragma: no cover (a safety net)
            # The reader closed its end: it left. It cancels the job before
            # it closes, so this does not happen; if it did, unwind the turn.
            self.scope.cancel()
            await trio.lowlevel.checkpoint()


@attrs.define
class Counters:
    """One job's share of the counters."""

    llm_calls: int = 0
    retries: int = 0
    tool_calls: int = 0
    usage: Usage = NO_USAGE


@final
@attrs.define
class Totals(Counters):
    """A conversation's counters, as ``ConversationStatistics`` shows them."""

    turns_completed: int = 0
    turns_failed: int = 0
    turns_cancelled: int = 0
    compactions: int = 0
    compactions_failed: int = 0
    warmups: int = 0


@attrs.frozen
class Answer:
    """One complete answer of the model."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage | None
    finish: str | None


async def collect_answer(
    opened: AbstractAsyncContextManager[AsyncIterator[StreamEvent]], job: Job | None
) -> Answer:
    """Send a request (enter ``opened``) and collect the whole answer.

    The slot is held only here. A streamed turn's ``job`` gets the text and
    reasoning deltas as they come.
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    usage: Usage | None = None
    finish: str | None = None
    async with opened as events:
        async for event in events:
            if isinstance(event, TextDelta | ReasoningDelta) and job is not None:
                await job.emit(event)
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Usage):
                usage = event
            elif isinstance(event, Finish):
                finish = event.reason
    return Answer("".join(text), tuple(calls), usage, finish)


def unique_ids(
    calls: tuple[ToolCall, ...], history: Iterable[ChatMessage]
) -> tuple[ToolCall, ...]:
    """``calls``, each with an id no other call of the history has.

    A model (or a server in front of it) may repeat a call's id, within one
    answer or across answers, or leave it empty; Anthropic then refuses every
    later request of the conversation, and a result cannot say which call
    it answers. A repeat becomes ``<id>_2`` (or ``_3``...) and an empty id
    ``call_1`` (or ``call_2``...): the first one that no call of the
    history and no call of ``calls`` has, as sent or as renamed. Each
    result answers its call by the new id, so the history stays paired.
    """
    earlier = {call.id for message in history for call in message.tool_calls}
    used = earlier | {call.id for call in calls}
    kept: set[str] = set()
    unique: list[ToolCall] = []
    for call in calls:
        if call.id and call.id not in earlier and call.id not in kept:
            kept.add(call.id)
            unique.append(call)
            continue
        base, number = (call.id, 2) if call.id else ("call", 1)
        while f"{base}_{number}" in used:
            number += 1
        new_id = f"{base}_{number}"
        used.add(new_id)
        unique.append(attrs.evolve(call, id=new_id))
    return tuple(unique)


def refusal_of(call: ToolCall, tool: Tool | None, tools: dict[str, Tool]) -> str | None:
    """Why ``call`` cannot run, for the model; ``None`` if it can."""
    if tool is None:
        known = ", ".join(repr(name) for name in tools) or "none"
        return f"unknown tool {call.name!r} (the tools are: {known})"
    if call.arguments_error is not None:
        return call.arguments_error
    problem = check_arguments(call.arguments, tool.parameters)
    if problem is not None:
        return f"invalid arguments for {call.name!r}: {problem}"
    return None


def check_tools(tools: object) -> tuple[Tool, ...]:
    """``start_conversation``'s ``tools``: ``Tool`` values of distinct names."""
    if isinstance(tools, Tool | str | Mapping) or not isinstance(tools, Iterable):
        raise TypeError(f"tools must be an iterable of Tool values, got {tools!r}")
    checked: list[Tool] = []
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(f"tools must hold Tool values, got {tool!r}")
        if any(tool.name == other.name for other in checked):
            raise ValueError(f"duplicate tool name {tool.name!r}")
        checked.append(tool)
    return tuple(checked)
