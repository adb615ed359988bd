"""Conversation actors: one trio task per conversation, one turn at a time.

Design note. ``Dispatcher.start_conversation`` starts a ``Conversation``'s
actor in the dispatcher's nursery and hands back the object, which is also
the caller's handle. The actor owns the history and the counters, and is
the only code that changes them; callers talk to it through an unbounded
FIFO inbox of jobs (a turn, or a warm-up), so ``ask`` never blocks to
queue, and turns run in the order they were asked.

Each job carries its own ``trio.CancelScope``. The actor runs the job
inside it; a caller cancelled while it waits cancels that scope (a
synchronous call, safe from any task) and leaves. A job abandoned before
the actor reached it is skipped, so nothing is sent for it; one abandoned
while it runs unwinds where it is: a slot still awaited is withdrawn, a
stream is closed and its slot given back, tools are cancelled.

A turn works on its own copy of the history: the question, a compaction's
summary, each assistant message that calls tools together with every
result, and the final answer go there, and the copy replaces the history
in one synchronous step once the answer is complete. So whatever else ends
a turn (a provider error, a cancellation, the dispatcher closing), at
whatever point (waiting for a slot, streaming, running tools, compacting),
the history is exactly what it was before the turn, and asking again sends
the question once.

A turn asked with ``stream`` sends its events (deltas, tool calls and
results, retries) to the reader's task through a small bounded channel:
the actor waits while the reader is behind, so nothing piles up, and a
reader that leaves cancels the job before it closes its end, so the actor
never waits for a reader that is gone. ``ask`` is ``stream`` read to its
end. A turn runs at most ``max_tool_rounds`` rounds of tools.

Every job runs inside a ``Dispatcher.turn()`` of the conversation's id,
class and the turn's start, so every LLM call of a turn, retries and
tool-loop steps alike, and every slot its tools take (their tasks start
inside it), asks the dispatcher for a slot with the turn's ``started_at``
and ``priority``: a turn in progress goes before turns that started later;
the slot is held only while the answer streams, never while tools run.
When to retry and how long to back off is decided in ``_retry``; when and
where to compact, and what to ask for the summary, in ``_compaction``:
both pure, both fed the conversation's ``ConversationOptions``.

Errors: a ``ProviderError`` that outlives its retries, and any other
``DispatchError`` of the dispatcher's (``QueueFull``, ``SlotHoldTimeout``),
fails the turn and reaches the caller of ``ask``; the actor goes on with
the next job. Anything else is a bug and stops the actor, which stops the
dispatcher. When the actor stops, every job still queued or running fails
with ``DispatcherClosed`` (the dispatcher closed) or ``ConversationClosed``
(``close()`` was called, or the actor failed).
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import math
import random
import uuid
from typing import TYPE_CHECKING, Final, Literal, Self, final

import attrs
import trio

from .._dispatch._turn import current_turn
from .._exceptions import (
    ConversationClosed,
    DispatcherClosed,
    DispatchError,
    ProviderError,
    TooManyToolRounds,
)
from .._groups import leaves, only
from .._integrations._limited import LimitedProvider, NotGrantedInTime
from .._util import NoPublicConstructor, wrong_with
from .._validation import (
    check_optional_tenant,
    check_priority,
    check_provider,
    check_text,
)
from ..messages import (
    ChatMessage,
    ChatRequest,
    ToolCall,
    Usage,
)
from ..messages._chat import RequestOptions, merge_options
from ._compaction import compaction_cut, summary_message, summary_request
from ._history import check_history, dump_history
from ._options import ConversationOptions, check_request_options
from ._results import Retrying, ToolResult, TurnEvent, TurnFinished, TurnResult
from ._retry import backoff, should_retry, waits_out
from ._turn_parts import (
    NO_USAGE,
    Answer,
    ConversationStatistics,
    Counters,
    Job,
    Totals,
    add_usage,
    check_tools,
    collect_answer,
    refusal_of,
    unique_ids,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

    from .._dispatch._plumbing import Plumbing
    from .._provider import Provider
    from ._tools import Tool

_logger = logging.getLogger("trio_dispatch")
_WARM_UP_TEXT: Final = "Hello."
# Events a streamed turn may hold before the actor waits for its reader: a
# few, so a reader that keeps up never makes it wait, and one that stops
# reading holds back the turn (and the stream under it), not memory.
_EVENT_BUFFER: Final = 16


_Stop = Literal["closed", "dispatcher", "failed"]


@final
class Conversation(metaclass=NoPublicConstructor):
    """A conversation with one provider, run by its own actor.

    Made by ``Dispatcher.start_conversation``; it lives until ``close()``
    or until the dispatcher closes. Ask with ``ask``; questions asked while
    a turn runs wait their turn, in order.

    A conversation can start from a history (``start_conversation``'s
    ``history``), and its history can be saved as JSON with
    ``export_history`` and read back with ``load_history``, to resume it
    after a restart.

    The system prompt is sent as ``ChatRequest.system`` with every request
    and is not part of ``history``. The history holds ``user``,
    ``assistant`` and ``tool`` messages, and, after a compaction, one
    ``system`` message with the summary of what it replaced (see
    ``ConversationOptions.context_budget``).
    """

    __slots__ = (
        "_current",
        "_dispatcher",
        "_history",
        "_options",
        "_priority",
        "_provider",
        "_receive",
        "_rng",
        "_scope",
        "_send",
        "_specs",
        "_stop",
        "_system_prompt",
        "_task",
        "_tenant",
        "_tools",
        "_totals",
        "id",
    )

    def __init__(
        self,
        dispatcher: Plumbing,
        provider: Provider,
        *,
        conversation_id: str,
        tools: tuple[Tool, ...],
        system_prompt: str | None,
        options: ConversationOptions,
        history: tuple[ChatMessage, ...],
        priority: int = 0,
        tenant: str | None = None,
    ) -> None:
        self.id = conversation_id
        self._priority = priority
        self._tenant = tenant
        self._dispatcher = dispatcher
        self._provider = provider
        self._tools = {tool.name: tool for tool in tools}
        self._specs = tuple(tool.spec() for tool in tools)
        self._system_prompt = system_prompt
        self._options = options
        self._rng = random.Random(options.seed)
        self._send, self._receive = trio.open_memory_channel[Job](math.inf)
        self._scope = trio.CancelScope()
        self._history = list(history)
        self._current: Job | None = None
        self._task: trio.lowlevel.Task | None = None
        self._stop: _Stop | None = None
        self._totals = Totals()

    def __repr__(self) -> str:
        state = "closed" if self._stop is not None else "open"
        return (
            f"<Conversation {self.id!r} {state} provider={self._provider.id!r}"
            f" messages={len(self._history)}>"
        )

    # -- the caller's side ---------------------------------------------------

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        """The messages so far, oldest first (the system prompt is not one).

        A running turn's messages join it all at once, when it completes.
        """
        return tuple(self._history)

    def export_history(self) -> str:
        """The history as JSON text, to save and resume after a restart.

        Give the text to ``load_history``, and its result to
        ``Dispatcher.start_conversation(..., history=...)``. Only complete
        turns are in it (see ``history``), so it can be taken at any time,
        even while a turn runs. The system prompt, the tools and the
        options are not part of it: pass them again.
        """
        return dump_history(self._history)

    @property
    def priority(self) -> int:
        """The priority class of its turns (``start_conversation``'s ``priority``)."""
        return self._priority

    @property
    def tenant(self) -> str | None:
        """The tenant of its turns (``start_conversation``'s ``tenant``), or ``None``."""
        return self._tenant

    @property
    def closed(self) -> bool:
        """Whether the conversation has stopped taking questions."""
        return self._stop is not None

    async def ask(
        self, text: str, *, options: RequestOptions | None = None
    ) -> TurnResult:
        """Ask ``text`` and wait for the answer, running tools as the model asks.

        The question waits behind any turn already queued. Cancelling the
        caller cancels its turn: one still queued never starts and sends
        nothing; one running is unwound (see the module notes). A turn that
        does not complete, cancelled or failed, leaves the history exactly
        as it was before it. The same as reading ``stream(text, options=...)``
        to its end.

        Args:
            text: The question.
            options: How this turn's answers are sampled; its fields that
                are set win over ``ConversationOptions.request_options``,
                field by field (``extra`` key by key). ``None`` for the
                conversation's.

        Raises:
            ProviderError: The provider failed and retries did not help
                (or the error was not retryable). The history is left as it
                was before the turn; the conversation stays usable.
            TooManyToolRounds: The model kept calling tools past
                ``ConversationOptions.max_tool_rounds``; the history is left
                as it was before the turn.
            QueueFull: The dispatcher refused to queue one more request.
            SlotHoldTimeout: A slot was held past the dispatcher's
                ``max_hold``.
            DispatcherClosed: The dispatcher has closed, or did meanwhile.
            ConversationClosed: ``close()`` was called, before or meanwhile.
            RuntimeError: Called from inside the conversation's own actor
                (from a tool), which would wait for itself forever.
            TypeError: ``text`` is not a string, or ``options`` not a
                ``RequestOptions``.
        """
        async with self.stream(text, options=options) as turn:
            async for _event in turn:
                pass
        return turn.result

    def stream(self, text: str, *, options: RequestOptions | None = None) -> TurnStream:
        """Ask ``text`` and read the turn as it happens.

        An async context manager; its value is an async iterator of
        ``TurnEvent`` values (see ``trio_dispatch.TurnEvent``) that ends
        with ``TurnFinished``, whose ``result`` is what ``ask`` would have
        returned (also ``TurnStream.result`` once read)::

            async with conversation.stream("What is 2 + 3?") as turn:
                async for event in turn:
                    if isinstance(event, TextDelta):
                        print(event.text, end="")
            print(turn.result.usage)

        The question is queued when the block is entered and runs in the
        conversation's actor, like ``ask``'s. Events wait in a small buffer
        for the reader; a reader that falls behind holds back the turn (and
        keeps its slot while an answer streams: the dispatcher's
        ``max_hold`` still bounds that). Leaving the block before
        ``TurnFinished``, by ``break``, an error or a cancellation, cancels
        the turn as a cancelled ``ask`` is: the history stays as it was
        before the turn. Errors are raised from the iterator, as ``ask``
        raises them. ``options`` are as ``ask`` takes them.

        Raises:
            TypeError: ``text`` is not a string, or ``options`` not a
                ``RequestOptions``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {text!r}")
        if options is not None:
            check_request_options(options, "options")
        merged = merge_options(self._options.request_options, options)
        return TurnStream._create(self, text, merged)

    async def warm(self) -> Usage:
        """Prime the provider's prompt cache with this conversation's prefix.

        Sends the system prompt, the tools and the history as they are
        (a short stand-in question if the history is empty, since the APIs
        refuse an empty one) asking for at most one token, through the
        dispatcher like any call (its priority is the time it is sent) and
        in order with the turns. The answer is dropped: the history does not
        change. Retried like a turn's calls; raises like ``ask``.

        Returns:
            The tokens the provider reported for it (cache writes and reads
            included); all zero if it reported none.
        """
        result = await self._submit(Job(None))
        assert isinstance(result, Usage)
        return result

    def close(self) -> None:
        """Stop the conversation now; idempotent.

        The running job is cancelled (its caller gets ``ConversationClosed``;
        the history is left as it was before that turn), queued jobs fail with
        ``ConversationClosed``, and so does every later ``ask``.
        """
        self._dispatcher.check_run()
        if self._stop is None:
            self._stop = "closed"
        self._scope.cancel()

    def statistics(self) -> ConversationStatistics:
        """A snapshot of the conversation's counters."""
        return ConversationStatistics(
            conversation_id=self.id,
            **attrs.asdict(self._totals, recurse=False),
            queued=self._send.statistics().current_buffer_used,
            running=self._current is not None,
            history_length=len(self._history),
            closed=self._stop is not None,
        )

    def _enqueue(self, job: Job) -> None:
        self._dispatcher.check_run()
        if self._inside_actor():
            raise RuntimeError("a conversation cannot wait for itself (from a tool)")
        if self._stop is None and self._dispatcher.closed:
            raise DispatcherClosed("the dispatcher is closed")
        if self._stop is not None:
            raise self._closed_error()
        try:
            self._send.send_nowait(job)
        except trio.ClosedResourceError:  # pragma: no cover (_stop is set first)
            raise self._closed_error() from None

    async def _submit(self, job: Job) -> TurnResult | Usage | None:
        self._enqueue(job)
        try:
            await job.done.wait()
        except BaseException:
            # Cancelled while waiting: give the job up. The actor skips it if
            # it has not started, or unwinds it; either way nobody waits.
            job.scope.cancel()
            raise
        return job.outcome()

    def _inside_actor(self) -> bool:
        """Whether the current task is the actor or one of its tools."""
        task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        while task is not None:
            if task is self._task:
                return True
            nursery = task.parent_nursery
            task = None if nursery is None else nursery.parent_task
        return False

    def _closed_error(self) -> DispatchError:
        if self._stop == "dispatcher":
            return DispatcherClosed("the dispatcher is closed")
        if self._stop == "failed":
            return ConversationClosed(
                f"conversation {self.id!r} stopped: its actor failed"
            )
        return ConversationClosed(f"conversation {self.id!r} is closed")

    # -- the actor -----------------------------------------------------------

    async def _run(self) -> None:
        """The actor's task: serve the inbox until closed or cancelled."""
        self._task = trio.lowlevel.current_task()
        try:
            with self._scope:
                await self._serve()
        except BaseException as exc:
            if self._stop is None:
                cancelled = only(exc, trio.Cancelled)
                self._stop = "dispatcher" if cancelled else "failed"
            raise
        finally:
            self._stop = self._stop or "closed"  # close() set it if nothing did
            self._shut_down()

    async def _serve(self) -> None:
        async for job in self._receive:
            if job.scope.cancel_called:
                continue  # abandoned while queued: it never starts
            self._current = job
            result: TurnResult | Usage | None = None
            # Every slot the job takes, by its LLM calls or by its tools
            # (their tasks start inside it), reads its start and class here.
            turn = self._dispatcher.turn(
                conversation_id=self.id, priority=self._priority, tenant=self._tenant
            )
            try:
                with job.scope, turn as started:
                    if job.text is None:
                        result = await self._warm()
                    else:
                        result = await self._run_turn(job, started.started_at)
            except DispatchError as error:
                self._current = None
                if job.text is not None:
                    self._totals.turns_failed += 1
                job.fail(error)
                continue
            # Anything else that escaped the job stops the actor, and
            # _shut_down fails the job it finds in _current.
            self._current = None
            if result is None and job.text is not None:
                # The caller gave up: job.scope caught it.
                self._totals.turns_cancelled += 1
            job.finish(result)

    def _shut_down(self) -> None:
        # Runs in the actor's finally: no awaits, so nothing slips in between.
        self._send.close()
        pending = [] if self._current is None else [self._current]
        self._current = None
        while True:
            try:
                pending.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        self._receive.close()
        for job in pending:
            if not job.done.is_set():
                job.fail(self._closed_error())

    async def _run_turn(self, job: Job, started_at: float) -> TurnResult:
        assert job.text is not None
        counters = Counters()
        # The turn's own copies, committed only when the answer is complete
        # (see the module notes): what came before it, whose older part a
        # compaction may replace, and the turn so far.
        earlier = list(self._history)
        turn = [ChatMessage("user", job.text)]
        compacted = summarised = False
        rounds = 0
        provider = LimitedProvider(self._provider, self._dispatcher)
        while True:
            # Before every call, not only the first: tool results can take
            # the turn over the budget. One summary call per turn at most, so
            # one that failed is not sent again and again.
            if not summarised:
                outcome = await self._compact_if_needed(earlier, turn, counters)
                summarised = outcome is not None
                compacted = outcome is True
            options = job.options
            request = ChatRequest(
                messages=[*earlier, *turn],
                tools=self._specs,
                max_tokens=(
                    self._options.max_tokens
                    if options.max_tokens is None
                    else options.max_tokens
                ),
                temperature=options.temperature,
                system=self._system_prompt,
                top_p=options.top_p,
                stop=options.stop,
                extra=options.extra,
                # What came before the turn is sent again on the next call.
                stable_prefix=len(earlier),
                cache_key=self.id,
            )
            reply = await self._call(provider, request, counters, job)
            calls = unique_ids(reply.tool_calls, [*earlier, *turn])
            answer = ChatMessage("assistant", reply.text, tool_calls=calls)
            if not calls:
                finished_at = trio.current_time()
                # A last schedule point before the commit: a caller whose
                # deadline fell at this same instant has been woken but not
                # run yet. Running it first lets it cancel the job, so a
                # caller that got Cancelled never finds its turn committed.
                await trio.lowlevel.checkpoint()
                self._history = [*earlier, *turn, answer]
                if compacted:
                    self._totals.compactions += 1
                self._totals.turns_completed += 1
                return TurnResult(
                    text=reply.text,
                    **attrs.asdict(counters, recurse=False),
                    started_at=started_at,
                    finished_at=finished_at,
                    finish_reason=reply.finish,
                )
            if rounds == self._options.max_tool_rounds:
                raise TooManyToolRounds(
                    f"the model asked for tools after {rounds} rounds"
                    f" (max_tool_rounds is {rounds})",
                    rounds=rounds,
                )
            rounds += 1
            self._count(counters, tool_calls=len(calls))
            for call in calls:
                await job.emit(call)
            results = await self._run_tools(calls, job)
            turn.append(answer)
            turn.extend(results)

    async def _warm(self) -> Usage:
        messages = self._history or [ChatMessage("user", _WARM_UP_TEXT)]
        request = ChatRequest(
            messages=messages,
            tools=self._specs,
            max_tokens=1,
            system=self._system_prompt,
            # The history, not the stand-in question: what the turns resend.
            stable_prefix=len(self._history),
            cache_key=self.id,
        )
        provider = LimitedProvider(self._provider, self._dispatcher)
        reply = await self._call(provider, request, Counters())
        self._totals.warmups += 1
        return NO_USAGE if reply.usage is None else reply.usage

    # -- LLM calls -----------------------------------------------------------

    async def _call(
        self,
        provider: LimitedProvider,
        request: ChatRequest,
        counters: Counters,
        job: Job | None = None,
    ) -> Answer:
        """One LLM call, sent again after a retryable error, with backoff.

        A rate limit of a limited provider is waited out in its queue, for
        ``rate_limit_patience`` from the first one, and uses up no attempt
        (see ``waits_out``). With a streamed turn's ``job``, its deltas and
        retries go to the reader as they happen.
        """
        attempt = 1  # this send's number, for ``Retrying``
        failures = 0  # the failed attempts ``max_attempts`` bounds
        waits = 0  # the rate limits waited out
        # When the patience runs out: set by the first rate limit waited out.
        deadline = math.inf
        # The latest error, if a rate limit waited out: the next attempt's
        # wait for a slot is cut at the deadline.
        waited: ProviderError | None = None
        while True:
            try:
                reply = await collect_answer(
                    provider.stream_granted_by(
                        request,
                        math.inf if waited is None else deadline,
                        # Counted as it is sent: once granted.
                        functools.partial(self._count_call, counters, attempt > 1),
                    ),
                    job,
                )
            except NotGrantedInTime:
                # The patience ran out in the queue: this retry was not sent.
                assert waited is not None
                raise waited from None
            except ProviderError as error:
                waited = None
                if waits_out(error, self._limited()):
                    now = trio.current_time()
                    if waits == 0:
                        patience = self._options.rate_limit_patience
                        deadline = math.inf if patience is None else now + patience
                    if now >= deadline:
                        raise
                    waits += 1
                    waited = error
                    # The dispatcher's pause is the wait: the next attempt
                    # queues at once, keeping its turn's place. A rate
                    # limit it does not pause for (a Retry-After of 0)
                    # backs off first, so that nothing spins.
                    delay = (
                        0.0
                        if self._paused()
                        else backoff(waits, error, self._options, self._rng, None)
                    )
                else:
                    failures += 1
                    if not should_retry(error, failures, self._options):
                        raise
                    delay = backoff(
                        failures, error, self._options, self._rng, self._pause_cap()
                    )
                retrying = Retrying(attempt=attempt, error=error, delay=delay)
            else:
                self._count(counters, usage=reply.usage)
                return reply
            if job is not None:
                await job.emit(retrying)
            attempt += 1
            wake = trio.current_time() + delay
            # Not past the patience: then the next attempt ends the call.
            await trio.sleep_until(wake if waited is None else min(wake, deadline))

    def _count_call(self, counters: Counters, retry: bool) -> None:
        """An LLM call is sent (``retry``: again, after a retryable error)."""
        self._count(counters, llm_calls=1, retries=1 if retry else 0)

    def _count(
        self,
        counters: Counters,
        *,
        llm_calls: int = 0,
        retries: int = 0,
        tool_calls: int = 0,
        usage: Usage | None = None,
    ) -> None:
        """Count for the job (its ``counters``) and the conversation alike."""
        for counted in (counters, self._totals):
            counted.llm_calls += llm_calls
            counted.retries += retries
            counted.tool_calls += tool_calls
            counted.usage = add_usage(counted.usage, usage)

    def _paused(self) -> bool:
        """Whether the provider is paused now: its next grant waits for that."""
        stats = self._dispatcher.provider_statistics(self._provider.id)
        return (
            stats is not None
            and stats.paused_until is not None
            and stats.paused_until > trio.current_time()
        )

    def _limited(self) -> bool:
        """Whether the dispatcher limits the provider (or a pool's members), and so pauses it."""
        provider = self._provider.id
        return (
            provider in self._dispatcher.limits()
            or self._dispatcher.members(provider) is not None
        )

    def _pause_cap(self) -> float | None:
        """The longest ``Retry-After`` a backoff honours: none if a pause does."""
        return None if self._limited() else self._dispatcher.max_pause

    # -- tools ---------------------------------------------------------------

    async def _run_tools(
        self, calls: tuple[ToolCall, ...], job: Job
    ) -> list[ChatMessage]:
        """Run every call at once; their results, in the order of the calls.

        Each result goes to a streamed turn's reader as its tool finishes.
        """
        results = [""] * len(calls)

        async def run(index: int, call: ToolCall) -> None:
            results[index] = await self._run_tool(call)
            await job.emit(ToolResult(call=call, content=results[index]))

        async with trio.open_nursery() as nursery:
            for index, call in enumerate(calls):
                nursery.start_soon(run, index, call, name=f"tool {call.name!r}")
        return [
            ChatMessage("tool", result, tool_call_id=call.id)
            for call, result in zip(calls, results, strict=True)
        ]

    async def _run_tool(self, call: ToolCall) -> str:
        tool = self._tools.get(call.name)
        refusal = refusal_of(call, tool, self._tools)
        if refusal is not None or tool is None:
            await trio.lowlevel.checkpoint()
            return f"error: {refusal}"
        failures: list[BaseException] = []
        try:
            # A copy: the call's own dict is part of the history.
            output: object = await tool.run(copy.deepcopy(call.arguments))
        except* Exception as group:
            # The model reads a tool's failure. except*, not except: a tool
            # with a nursery of its own, cancelled with its turn, may raise
            # its errors and Cancelled in one group; the Cancelled part goes
            # on (the turn is being cancelled), the rest is the failure.
            failures = list(leaves(group))
            shown: BaseException = failures[0] if len(failures) == 1 else group
        if failures:
            text = str(failures[0])
            text = f"error: {text}" if text else f"error: {type(failures[0]).__name__}"
            # The model reads one line; whoever runs the tool needs its traceback.
            _logger.warning(
                "conversation %r: tool %r failed; the model reads %r",
                self.id,
                call.name,
                text,
                exc_info=shown,
            )
            return text
        if not isinstance(output, str):
            return f"error: tool {call.name!r} returned {type(output).__name__}, not a string"
        return output

    # -- compaction ----------------------------------------------------------

    async def _compact_if_needed(
        self,
        earlier: list[ChatMessage],
        turn: list[ChatMessage],
        counters: Counters,
    ) -> bool | None:
        """Summarise ``earlier``'s older messages if the ``turn`` is too long.

        ``None`` if no compaction was due (see ``compaction_cut``); else
        whether it succeeded.
        """
        cut = compaction_cut(
            earlier,
            turn,
            system_prompt=self._system_prompt,
            tools=self._specs,
            options=self._options,
        )
        if cut is None:
            return None
        request = summary_request(
            earlier[:cut],
            tools=self._specs,
            system_prompt=self._system_prompt,
            max_tokens=self._options.max_tokens,
        )
        provider = LimitedProvider(self._provider, self._dispatcher)
        try:
            reply = await self._call(provider, request, counters)
        except ProviderError:
            self._totals.compactions_failed += 1
            return False  # the turn goes on with the whole history
        summary = summary_message(reply.text)
        if summary is None:
            self._totals.compactions_failed += 1
            return False
        earlier[:cut] = [summary]
        return True


@final
class TurnStream(metaclass=NoPublicConstructor):
    """One streamed turn: what ``Conversation.stream`` returns.

    Enter it (``async with``) to queue the question, then iterate it for
    the turn's ``TurnEvent`` values; ``TurnFinished`` comes last. Leaving
    the block before it cancels the turn. Single use.
    """

    __slots__ = (
        "_conversation",
        "_job",
        "_options",
        "_receive",
        "_result",
        "_state",
        "_text",
    )

    def __init__(
        self, conversation: Conversation, text: str, options: RequestOptions
    ) -> None:
        self._conversation = conversation
        self._text = text
        self._options = options
        self._job: Job | None = None
        self._receive: trio.MemoryReceiveChannel[TurnEvent] | None = None
        self._result: TurnResult | None = None
        self._state: Literal["new", "open", "ended", "left"] = "new"

    def __repr__(self) -> str:
        return f"<TurnStream of {self._conversation.id!r} {self._state}>"

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(
            "stream() is an async context manager:"
            " use `async with conversation.stream(...) as turn`"
        )

    @property
    def result(self) -> TurnResult:
        """The turn's result, once ``TurnFinished`` has been read.

        Raises:
            RuntimeError: The turn has not finished (or did not complete).
        """
        if self._result is None:
            raise RuntimeError("the turn has not finished")
        return self._result

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("a turn stream can be entered only once")
        send, receive = trio.open_memory_channel[TurnEvent](_EVENT_BUFFER)
        job = Job(self._text, events=send, options=self._options)
        self._conversation._enqueue(job)
        self._job, self._receive, self._state = job, receive, "open"
        try:
            await trio.lowlevel.checkpoint()
        except BaseException:
            # Cancelled on the way in: no __aexit__ follows, so give the
            # job up here (the actor skips it).
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: leaving must work under cancellation. The
        # job is cancelled before the channel is closed, so the actor unwinds
        # the turn as a cancelled one (a no-op if it has ended).
        assert self._job is not None
        assert self._receive is not None
        self._state = "left"
        self._job.scope.cancel()
        self._receive.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TurnEvent:
        if self._state == "new":
            raise RuntimeError("enter the turn stream (async with) before reading it")
        if self._state == "left":
            raise RuntimeError("the turn stream was left")
        if self._state == "ended":
            raise StopAsyncIteration
        assert self._receive is not None
        assert self._job is not None
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            pass
        # The actor closes the channel only once the job is done.
        self._state = "ended"
        result = self._job.outcome()
        assert isinstance(result, TurnResult)
        self._result = result
        return TurnFinished(result)


# -- construction, for Dispatcher.start_conversation ------------------------

_ids = itertools.count(1)


def start_conversation(
    dispatcher: Plumbing,
    provider: Provider,
    *,
    conversation_id: str | None,
    tools: Iterable[Tool],
    system_prompt: str | None,
    options: ConversationOptions | None,
    history: Iterable[ChatMessage] = (),
    priority: int = 0,
    tenant: str | None = None,
) -> Conversation:
    """``Dispatcher.start_conversation``: a checked conversation, its actor started.

    The annotations say what callers should pass; the checks assume nothing.
    ``options`` checked its own fields when it was made. The actor runs in
    the dispatcher's nursery, until it is closed or the dispatcher closes.
    """
    if not hasattr(provider, "id") or not callable(getattr(provider, "stream", None)):
        raise TypeError(
            f"provider must have an id and a stream method, got {provider!r}"
        )
    check_provider(provider.id)
    if conversation_id is None:
        conversation_id = f"conversation-{uuid.uuid4().hex[:12]}-{next(_ids)}"
    else:
        check_text(conversation_id, "conversation_id")
    checked_tools = check_tools(tools)
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(
            f"system_prompt must be a string or None, got {system_prompt!r}"
        )
    if options is None:
        options = ConversationOptions()
    elif not isinstance(options, ConversationOptions):
        raise TypeError(
            f"options must be a ConversationOptions or None, got {options!r}"
        )
    checked_history = check_history(history)
    checked_priority = check_priority(priority)
    if tenant is None:
        # The turn current at the call's: the actor's turns replace it whole.
        turn = current_turn()
        tenant = None if turn is None else turn.tenant
    conversation = Conversation._create(
        dispatcher,
        provider,
        conversation_id=conversation_id,
        tools=checked_tools,
        system_prompt=system_prompt,
        options=options,
        history=checked_history,
        priority=checked_priority,
        tenant=check_optional_tenant(tenant),
    )
    dispatcher.check_known(provider.id)
    dispatcher.check_pool_provider(provider)
    if dispatcher.closed:
        raise DispatcherClosed("the dispatcher is closed")
    dispatcher.start_soon(
        conversation._run, name=f"trio_dispatch conversation {conversation.id!r}"
    )
    return conversation
