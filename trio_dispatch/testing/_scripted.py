"""A provider in memory, answering from the fake server's script.

It plays a reply event for event as the server would send it in the
provider's wire format (``_encoders`` says what each event means to our
decoders, ``_playback`` when it goes out and where a fault strikes), so
switching a test between sockets and memory changes neither the events nor
the errors the HTTP providers raise.
"""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING, Literal, Self, final

import trio

from .._exceptions import (
    MalformedStream,
    ProviderConnectionError,
    ProviderError,
    RequestFailed,
    StreamInterrupted,
)
from .._integrations._hooks import RateLimitHooks
from .._policy._ratelimits import RateLimitInfo
from .._provider import PROVIDER_USAGE, STREAM_USAGE
from .._util import wrong_with
from .._validation import check_seconds, check_text
from .._wire import error_for_status, error_for_type
from ..messages._chat import check_chat_request
from ._encoders import STREAM_ERROR_MESSAGE, encode_reply, status_fault_answer
from ._script import (
    ROUTES,
    FakeRequest,
    FakeScript,
    Playlist,
    strike_index,
    token_delay,
)
from ._tally import FakeServerStatistics, Tally

if TYPE_CHECKING:
    from types import TracebackType

    from .._provider import RateLimitObserver, RateLimitReporter
    from ..messages import ChatRequest, StreamEvent
    from ._encoders import WireEvent
    from ._script import FakeReply, Fault, WireFormat

_PATHS: dict[WireFormat, str] = {wire: path for path, wire in ROUTES.items()}
_TERMINATORS: dict[WireFormat, str] = {
    "openai": "[DONE]",
    "anthropic": "message_stop",
}


@final
class ScriptedProvider:
    """A ``Provider`` that answers from a ``FakeScript``, in memory.

    The script is the fake LLM server's, and so are the answers: the same
    deltas, tool calls, ``Finish`` and ``Usage`` at the same moments on the
    trio clock, and the same typed ``ProviderError`` for each fault, as
    ``OpenAIProvider`` (``wire="openai"``) or ``AnthropicProvider``
    (``wire="anthropic"``) yield against the server. All timing is
    ``trio.sleep``: under ``autojump_clock`` a reply with ``latency=2`` and
    ``time_to_first_token=0.5`` gives its first delta at exactly 2.5 s.

    A script's ``choose`` gets a ``FakeRequest`` whose ``chat`` is the
    ``ChatRequest`` (there is no wire body), so a reply without
    ``input_tokens`` is estimated from the request's text (a token per four
    characters), not from its JSON as the server does. The provider keeps
    every request it was asked (``requests``) and the fake server's
    statistics.

    Example, with ``add`` a ``Tool`` that adds ``a`` and ``b``::

        call = FakeToolCall("add", {"a": 2, "b": 2})
        provider = ScriptedProvider(
            FakeScript(
                replies=(
                    FakeReply(text="", tool_calls=(call,)),
                    FakeReply(text="it is 4", time_to_first_token=0.5),
                )
            )
        )
        async with open_dispatcher({provider.id: 1}) as dispatcher:
            conversation = dispatcher.start_conversation(provider, tools=[add])
            result = await conversation.ask("what is 2 + 2?")
        assert result.text == "it is 4"
        assert len(provider.requests) == 2

    Args:
        script: What to answer; a default ``FakeScript`` if not given.
        id: The provider's id, as the dispatcher knows it.
        wire: ``"openai"`` or ``"anthropic"``: where a fault's
            ``after_events`` strikes, the error vocabulary, how usage is
            reported and the ids made up for tool calls.
        read_timeout: Seconds without data before the stream fails with
            ``ProviderConnectionError``, as the HTTP providers' read timeout.
        on_rate_limit: Called with ``(id, retry_after)`` before a
            ``RateLimited`` or ``Overloaded`` is raised (not by an answer a
            dispatcher meters, as for the HTTP providers).
        on_rate_limits: Called with ``(id, RateLimitInfo)`` for a status
            fault with ``retry_after`` or ``retry_after_ms``, before its
            error is raised; an exception it raises is logged.

    Raises:
        TypeError: ``script`` is not a ``FakeScript``, ``id`` not a string,
            ``read_timeout`` not a number, or ``on_rate_limit`` or
            ``on_rate_limits`` not callable.
        ValueError: ``id`` is empty, ``wire`` unknown, or ``read_timeout``
            not a positive number of seconds.
    """

    def __init__(
        self,
        script: FakeScript | None = None,
        *,
        id: str = "scripted",
        wire: WireFormat = "openai",
        read_timeout: float = 60.0,
        on_rate_limit: RateLimitReporter | None = None,
        on_rate_limits: RateLimitObserver | None = None,
    ) -> None:
        self._playlist = Playlist(FakeScript() if script is None else script)
        check_text(id, "id")
        if wire not in _PATHS:
            raise ValueError(f"wire must be 'openai' or 'anthropic', got {wire!r}")
        timeout = check_seconds(read_timeout, "read_timeout", positive=True)
        self._hooks = RateLimitHooks(id, on_rate_limit, on_rate_limits)
        self._id = id
        self._wire: WireFormat = wire
        self._read_timeout = timeout
        self._closed = False
        self._requests: list[ChatRequest] = []
        self._tally = Tally()
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"ScriptedProvider(id={self._id!r}, wire={self._wire!r})"

    @property
    def id(self) -> str:
        """The provider's id, as the dispatcher knows it."""
        return self._id

    @property
    def wire(self) -> WireFormat:
        """The wire format whose stream it plays."""
        return self._wire

    @property
    def script(self) -> FakeScript:
        """The script in use."""
        return self._playlist.script

    def set_script(self, script: FakeScript) -> None:
        """Answer later requests from ``script``; open streams keep their reply."""
        self._playlist = Playlist(script)

    @property
    def requests(self) -> list[ChatRequest]:
        """Every request it was asked so far, oldest first (a copy)."""
        return list(self._requests)

    def statistics(self) -> FakeServerStatistics:
        """A snapshot of the counters, as the fake server keeps them.

        A stall or a long pause ended after ``read_timeout`` counts as a
        client disconnect.
        """
        return self._tally.snapshot()

    def stream(self, request: ChatRequest) -> _ScriptedStream:
        """Play the answer to ``request`` once entered; see ``Provider.stream``."""
        return _ScriptedStream(self, check_chat_request(request))

    async def aclose(self) -> None:
        """Refuse later streams with ``RequestFailed``, as a closed client does."""
        self._closed = True
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Nothing to wait for: closing is a flag, and no checkpoint here
        # could replace the exception on its way out with a Cancelled.
        self._closed = True

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(PROVIDER_USAGE)

    def _arrive(self, request: ChatRequest) -> FakeReply:
        """Record ``request`` and pick its reply: the request is "sent"."""
        if self._closed:
            raise RequestFailed(
                f"{self._id}: the provider is closed", provider=self._id
            )
        self._requests.append(request)
        self._tally.arrived()
        fake = FakeRequest(
            format=self._wire,
            path=_PATHS[self._wire],
            body=None,
            headers={},
            authenticated=True,
            arrived_at=trio.current_time(),
            chat=request,
        )
        return self._playlist.pick(fake)

    def _status_error(self, fault: Fault) -> ProviderError:
        """What the HTTP providers raise for ``fault``'s answer.

        Its ``rate_limits`` carries its retry headers.
        """
        status, headers, body = status_fault_answer(self._wire, fault)
        # Read back as the providers read the headers: retry-after-ms first.
        found = {name: float(value) for name, value in headers}
        retry_after = found.get(b"retry-after")
        if b"retry-after-ms" in found:
            retry_after = found[b"retry-after-ms"] * 0.001
        error = error_for_status(
            self._id,
            status,
            error_type=body["error"]["type"],
            message=body["error"]["message"],
            retry_after=retry_after,
        )
        if getattr(error, "retry_after", None) is not None:
            error.rate_limits = RateLimitInfo(retry_after=retry_after)
        return error

    def _fault_error(self, fault: Fault) -> ProviderError:
        """What the HTTP providers raise when ``fault`` strikes mid-stream."""
        kind = fault.kind
        if kind == "disconnect":
            return StreamInterrupted(
                f"{self._id}: the connection dropped in the middle of the stream",
                provider=self._id,
            )
        if kind == "truncate":
            return StreamInterrupted(
                f"{self._id}: the stream ended without {_TERMINATORS[self._wire]}",
                provider=self._id,
            )
        if kind == "malformed":
            return MalformedStream(
                f"{self._id}: an event's data is not valid JSON", provider=self._id
            )
        assert kind == "stream_error", kind
        return error_for_type(
            self._id, fault.error_type, fault.message or STREAM_ERROR_MESSAGE
        )

    def _stalled(self) -> ProviderError:
        return ProviderConnectionError(
            f"{self._id}: the stream stalled: no data for {self._read_timeout:g} s",
            provider=self._id,
        )

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; ``False`` if ``read_timeout`` ran out first."""
        if seconds > self._read_timeout:
            await trio.sleep(self._read_timeout)
            return False
        if seconds > 0:
            await trio.sleep(seconds)
        return True


def _estimate(request: ChatRequest) -> int:
    """A prompt's tokens, roughly: one per four characters of its text."""
    texts = [request.system or ""]
    for message in request.messages:
        texts.append(message.content)
        texts.extend(call.raw_arguments for call in message.tool_calls)
    return max(1, sum(map(len, texts)) // 4)


@final
class _ScriptedStream:
    """One answer, played from its wire events; entered once, then iterated."""

    #: A script sends no rate-limit headers with a stream.
    rate_limits: RateLimitInfo | None = None

    def __init__(self, provider: ScriptedProvider, request: ChatRequest) -> None:
        self._provider = provider
        self._request = request
        # Told of the answer's figures and rate limit: the provider's
        # callbacks, or none once a dispatcher meters it (Meter.metered).
        self.rate_limit_hooks = provider._hooks
        self._state = "new"  # -> "open" -> "closed"
        self._arrived = False
        # How the provider counts the stream when it closes: None is "left
        # before its end", as the server counts a client that hangs up.
        self._outcome: Literal["completed", "refused"] | None = None
        self._over = False
        self._reply: FakeReply | None = None
        self._body: list[WireEvent] = []
        self._terminator: WireEvent | None = None
        self._next = 0
        self._strike: int | None = None
        self._tokens_sent = 0
        self._pending: collections.deque[StreamEvent] = collections.deque()

    def __repr__(self) -> str:
        return f"<ScriptedStream {self._provider.id!r} {self._state}>"

    if not TYPE_CHECKING:
        __enter__ = __exit__ = wrong_with(STREAM_USAGE)

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("a provider stream can be entered only once")
        self._state = "open"
        try:
            await self._open()
        except BaseException:
            self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._state != "open":
            raise RuntimeError("iterate a provider stream inside its async with block")
        await trio.lowlevel.checkpoint()
        if self._pending:
            return self._pending.popleft()
        if self._over:
            raise StopAsyncIteration
        try:
            while not self._pending:
                await self._play_next()
        except ProviderError as error:
            self._over = True
            self.rate_limit_hooks.report(error)
            raise
        return self._pending.popleft()

    async def _open(self) -> None:
        """Send the request: wait out the latency, then answer its status."""
        provider = self._provider
        await trio.lowlevel.checkpoint()
        reply = provider._arrive(self._request)
        self._arrived = True
        if not await provider._wait(reply.latency):
            raise ProviderConnectionError(
                f"{provider.id}: no response within {provider._read_timeout:g} s",
                provider=provider.id,
            )
        fault = reply.fault
        if fault is not None and fault.status is not None:
            provider._tally.answered(fault.status)
            self._outcome = "refused"
            error = provider._status_error(fault)
            hooks = self.rate_limit_hooks
            if error.rate_limits is not None:
                hooks.observe(error.rate_limits)
            hooks.report(error)
            raise error
        provider._tally.answered(200)
        *self._body, self._terminator = encode_reply(
            reply,
            provider.wire,
            model="scripted",
            estimated_input_tokens=_estimate(self._request),
            include_usage=True,  # as our HTTP providers always ask
            ids=provider._ids,
        )
        self._reply = reply
        self._strike = strike_index(reply, len(self._body))

    async def _play_next(self) -> None:
        """Play the next wire event: its fault, its pace, then what it means."""
        provider = self._provider
        reply = self._reply
        assert reply is not None
        assert self._terminator is not None
        if self._next == self._strike:
            assert reply.fault is not None
            if reply.fault.kind == "stall":
                await trio.sleep(provider._read_timeout)
                raise provider._stalled()
            self._outcome = "completed"
            raise provider._fault_error(reply.fault)
        if self._next == len(self._body):
            self._over = True
            self._outcome = "completed"
            self._pending.extend(self._terminator.events)
            if not self._pending:
                raise StopAsyncIteration
            return
        event = self._body[self._next]
        self._next += 1
        if event.token:
            if not await provider._wait(token_delay(reply, self._tokens_sent)):
                raise provider._stalled()
            self._tokens_sent += 1
        if event.malformed is not None:
            self._outcome = "completed"
            raise MalformedStream(
                f"{provider.id}: {event.malformed}", provider=provider.id
            )
        self._pending.extend(event.events)

    def _close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        if self._arrived:
            tally = self._provider._tally
            tally.departed()
            if self._outcome == "completed":
                tally.finished()
            elif self._outcome is None:
                tally.abandoned()
