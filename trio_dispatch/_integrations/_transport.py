"""An HTTP transport whose model calls hold dispatcher slots: ``Dispatcher.transport``.

The official SDKs (``openai``, ``anthropic``) send every request through an
``httpx2.AsyncClient``, whose transport is the one place that sees both the
request before its first byte and the response until it is closed. So the
slot is taken in ``handle_async_request`` and given back when the response
body is closed, after its last byte or earlier, whoever closes it.

That hold does not nest: it begins in the task that sends the request and
ends wherever the response is closed, later, maybe in another task. So it
is taken with ``Plumbing.hold`` (no cancel scope, given back by any
task) and ``max_hold`` is enforced here, without a scope that would outlive
the call that entered it:

* until the response headers, and during each read of the body, the
  reading task's own ``move_on_at(deadline)``, entered and left inside the
  one call, so trio's scopes stay nested;
* between reads, a timer task in the dispatcher's nursery: at the deadline,
  if no read is under way, it closes the body itself (a read under way has
  its own deadline), so a consumer that stopped reading cannot hold the
  slot, nor the server's stream, past ``max_hold``.

Either way the body's connection is closed before the slot goes back, so
the provider never sees more streams than the limit. A later read raises
``SlotHoldTimeout``.

The body's bytes go to the SDK as they come, unchanged. httpx's read
timeout restarts with every byte, so a server that sends comments alone
(``: keepalive``), never an event, would hold the slot until ``max_hold``.
So for a ``text/event-stream`` answer the bytes also go through the
wire formats' ``SSEDecoder``, and the request's read timeout counts the time
reads wait without an event dispatched, as our providers count theirs
(``Hold.stall_on_silence``): a third deadline of each read, beside
``max_hold``'s and the lease's, the earliest cutting it. Past it the body
is closed, the slot goes back, and the read raises the read timeout of the
request's httpx, which the SDKs treat as their own.

With ``redis_url``, the slot's lease is a deadline too: the same scopes
and timer end at the earlier of the two, and the lease's moves with every
renewal (the shared scheduler tells the slot, which tells its hold). A
call whose lease ran out (its process could not reach Redis for a whole
``lease``) has its body closed before the fleet may grant its slot again,
and its read raises ``LeaseLost``.

Which requests take a slot: a ``POST`` whose path ends in a model call's
endpoint (see ``takes_slot``). Everything else an SDK sends (listing
models, files, batches, token counts) passes straight through.

What a model call tells the budgets, as ``wrap_provider`` does for our own
providers:

* its model: the ``model`` of a JSON body, if it names one. The slot is
  for that model: a ``"provider/model"`` budget must hold it too, and the
  figures of its answer teach that model's;
* its estimate (``estimate_json_tokens``): a chat completions or messages
  body is charged its prompt and ``n`` times its ``max_tokens``, any other
  body nothing. It is never corrected from the answer's usage, which is in
  the body the SDK parses, not the transport: as OpenAI's cookbook charges
  ``max_tokens`` and never corrects, a token budget paced through the
  transport errs on the safe side, and the figures of later answers only
  ever lower the budget, never raise it;
* its answer started when its headers arrive (``Slot.answered``);
* the rate-limit figures of those headers, OpenAI's ``x-ratelimit-*`` or
  Anthropic's ``anthropic-ratelimit-*``, whichever are there, go to
  ``Dispatcher.observe_rate_limits``, success or error; a malformed
  header is logged once per transport and header name, and ignored.

A call made inside a ``Dispatcher.turn()`` and answered 429, 503 or 529
keeps its turn's place in line for the SDK's own retry (``_kept``): once
the rate limit is reported, ``answered`` queues a kept place with the
turn's rank, and the retry's ``Hold.take`` takes it over instead of
queueing behind the younger turns that waited through the pause.

A response dropped unclosed (an SDK stream nobody reads or closes, then
garbage-collected) would keep its slot for ever: its body's finalizer asks
the trio run to give the slot back (``run_sync_soon``, safe from any thread
the collector runs in; never awaiting) and warns with a ``ResourceWarning``.

With ``server_priority``, a model call's place in line goes to the server
too (``_priority``): once the slot is granted, a chat completion's or a
completion's JSON body (an object with ``messages`` or ``prompt``) gets
``"priority": <place in line>`` spliced in first, its other bytes as the
SDK wrote them, and the request is sent anew with the same method, URL,
headers (``Content-Length`` set to the new length) and extensions. A body
that has a ``priority`` of its own, is not such an object, was not read
yet (a streamed upload), or goes to any other path (Anthropic's
``/messages`` among them) is sent untouched: the transport knows its
provider by name only, not which format it speaks, so the path decides.

Over a pool with ``endpoints``, a model call goes to its member: once the
slot is granted, the request is sent anew to the granted member's
``Endpoint``: its base URL followed by the call's endpoint (the tail of the
path that makes it a model call: ``/chat/completions``, ``/messages``...)
and the request's query, with the member's key in its wire format's key
header (the client's own key headers dropped), the same method, other
headers, body and extensions. Anything else the SDK sends (listing
models, files) goes where its client points. What the answer says of
limits (its figures, a 429's pause) concerns that member.

``_transport_legacy`` holds the same transport for the legacy ``httpx``.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, Self, TypeVar, final

import httpx2
import trio

from .._endpoint import Endpoint
from .._exceptions import LeaseLost, SlotHoldTimeout, lease_lost, slot_hold_timeout
from .._validation import check_provider
from .._wire._openai import takes_priority, with_priority
from .._wire._retry_after import parse_retry_after
from .._wire._sse import EventTooLarge, SSEDecoder
from ._kept import adopt_kept_place, keep_place
from ._metering import (
    Meter,
    RateLimitReader,
    TokenTimes,
    estimate_json_prompt_tokens,
    estimate_json_tokens,
    format_of_path,
    json_body,
    model_of_body,
)
from ._priority import place_in_line

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Collection,
        Iterator,
        Mapping,
    )
    from types import ModuleType, TracebackType

    from .._dispatch._plumbing import Plumbing
    from .._dispatch._slot import Slot

#: Answers that say "slow down" for the whole account: they pause the provider.
RATE_LIMITED: Final = frozenset({429, 503, 529})

#: The last path segments of the endpoints that run a model: OpenAI's chat
#: completions, completions, responses and embeddings, Anthropic's messages
#: and legacy completions. Matched at the end of the path, so a base URL
#: with a prefix (``/v1``, ``/openai/deployments/x``) still matches.
MODEL_CALLS: Final = (
    "/completions",
    "/responses",
    "/messages",
    "/complete",
    "/embeddings",
)


def takes_slot(method: str, path: str) -> bool:
    """Whether a request runs a model, and so takes a slot: a ``POST`` to a model call."""
    return method == "POST" and path.rstrip("/").endswith(MODEL_CALLS)


def model_call_of(path: str) -> str:
    """The endpoint a model call's ``path`` ends with, under its SDK's base URL.

    ``/chat/completions`` for ``/v1/chat/completions`` (OpenAI's SDK takes
    a base URL ending in ``/v1``), ``/v1/messages`` for Anthropic's (its
    SDK takes the API's root).
    """
    path = path.rstrip("/")
    for call in _MODEL_CALL_PATHS:
        if path.endswith(call):
            return call
    raise ValueError(f"{path!r} is not a model call")  # takes_slot said it is


# The endpoints as the SDKs add them to their base URL, the first that
# matches taken: Anthropic's under its root, OpenAI's under ``/v1``.
_MODEL_CALL_PATHS: Final = (
    "/v1/messages",
    "/v1/complete",
    "/chat/completions",
    "/completions",
    "/responses",
    "/messages",
    "/complete",
    "/embeddings",
)


def wrong_client(provider: str, request: object, *, legacy: bool) -> TypeError:
    """The error of a request from the other httpx's client than the transport's.

    An ``httpx.AsyncClient`` given an httpx2 transport (and the reverse)
    hands it requests of its own kind, which the inner transport fails on
    with an empty ``AssertionError`` deep inside, after the slot was taken.
    So the request's kind is checked first, by its class (httpx itself need
    not be imported to tell).
    """
    kind = f"{type(request).__module__.partition('.')[0]}.{type(request).__qualname__}"
    if legacy:
        return TypeError(
            f"dispatcher.transport({provider!r}, inner=<an httpx transport>) serves"
            f" an httpx.AsyncClient, got {kind}: give it to an httpx.AsyncClient,"
            " or make it without inner= for an httpx2.AsyncClient"
        )
    return TypeError(
        f"dispatcher.transport({provider!r}) serves an httpx2.AsyncClient, got"
        f" {kind}: use httpx2.AsyncClient, or for an httpx.AsyncClient make it with"
        " inner=httpx.AsyncHTTPTransport()"
    )


@final
class Hold:
    """One model call's slot, from its request until its response is closed.

    Shared by both transports, whatever their httpx. ``give_back`` is
    synchronous and idempotent; ``close`` closes the body, then gives back.
    """

    __slots__ = (
        "_closing",
        "_deadline",
        "_dispatcher",
        "_events",
        "_expired",
        "_fails",
        "_lease",
        "_max_hold",
        "_quiet",
        "_read_timeout",
        "_reader",
        "_reading",
        "_routes",
        "_scopes",
        "_slot",
        "_stall_at",
        "_stall_error",
        "_stalled",
        "_timer",
        "_times",
        "_token",
    )

    def __init__(
        self,
        dispatcher: Plumbing,
        slot: Slot,
        deadline: float,
        reader: RateLimitReader,
        times: TokenTimes | None = None,
        *,
        routes: Collection[str] | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._slot = slot
        # The members the call can be sent to (its transport's endpoints;
        # None: any): the place kept for its retry avoids the others.
        self._routes = routes
        self._max_hold = deadline
        # The lease's deadline, with Redis (set before the grant, moved by
        # every renewal); the hold ends at the earlier of the two.
        lease = slot.lease_deadline
        self._lease = math.inf if lease is None else lease
        self._deadline = min(deadline, self._lease)
        self._reader = reader
        self._reading = False
        self._expired = False
        self._closing = False
        self._timer: trio.CancelScope | None = None
        # Where a response dropped unclosed gives its slot back from.
        self._token = trio.lowlevel.current_trio_token()
        # The scopes cut at the deadline now: a read's, the request's.
        self._scopes: list[trio.CancelScope] = []
        # An event stream's stall rule (``stall_on_silence``): its decoder,
        # the read timeout, and how long reads may still wait without an
        # event (inf: no rule). During a read, when it stalls (else inf).
        self._events: SSEDecoder | None = None
        self._read_timeout = math.inf
        self._quiet = math.inf
        self._stall_at = math.inf
        self._stall_error: Callable[[], Exception] | None = None
        self._stalled = False
        # An event stream's tokens: its events, timed (see _metering).
        self._times = TokenTimes(0) if times is None else times
        # Whether the call failed before its answer (a server error passed
        # on): its slot goes back as failed (Slot.failed), not released.
        self._fails = False
        slot.follow_lease(self._lease_moved)

    def _lease_moved(self, lease: float) -> None:
        """A renewal moved the lease: every scope cut at the deadline follows."""
        self._lease = lease
        deadline = self._deadline = min(self._max_hold, lease)
        for scope in self._scopes:
            scope.deadline = min(deadline, self._stall_at)
        if self._timer is not None:
            self._timer.deadline = deadline

    @classmethod
    async def take(
        cls,
        dispatcher: Plumbing,
        provider: str,
        reader: RateLimitReader,
        body: Mapping[str, object] | None,
        path: str = "",
        *,
        fallback: tuple[Slot, tuple[str, ...]] | None = None,
        routes: Collection[str] | None = None,
    ) -> Hold:
        """Wait for a slot of ``provider`` for a call whose JSON body is ``body``.

        The slot is for the body's ``model`` and charged its estimate
        (neither if ``body`` is ``None``: not a JSON object, or not read
        yet); or it is the place the current turn keeps for this provider
        and model, taken over. With ``fallback``, ``(slot, tried)``: the
        same call again after ``slot``'s failed, on a member of the pool
        not ``tried``, in the same place in line. With ``routes``, the
        members the call can be sent to: never granted on another (one
        that joined the pool while it waited is given back unused, and
        the call asks again in its place). If this raises, nothing is held.

        Raises:
            PoolUnreachable: No member of the pool is in ``routes``.
        """
        model = model_of_body(body)
        wire = format_of_path(path)
        # Once: the timings' part and the charge's.
        prompt = estimate_json_prompt_tokens(body)
        times = TokenTimes(
            prompt, None if wire is None else wire.decoder(provider, str)
        )
        tried: tuple[str, ...] = ()

        def elsewhere(failed: Slot) -> Awaitable[tuple[Slot, float]]:
            """The same request again, on a member not tried that it can reach."""
            avoid = (*tried, *unroutable(dispatcher, provider, routes))
            return dispatcher.hold_elsewhere(failed, avoid)

        if fallback is not None:
            failed, tried = fallback
            slot, deadline = await elsewhere(failed)
        else:
            kept = await adopt_kept_place(dispatcher, provider, model)
            if kept is not None:
                # The retry of a call answered "slow down": its turn's place.
                slot, deadline = kept, dispatcher.hold_deadline(kept)
            else:
                tokens = estimate_json_tokens(
                    body, dispatcher.default_max_tokens(provider, model), prompt
                )
                slot, deadline = await dispatcher.hold(
                    provider, tokens, model, unroutable(dispatcher, provider, routes)
                )
        while routes is not None and slot.member not in routes:
            # A member that joined after the call asked: no route to it here.
            slot.release(used=False)
            slot, deadline = await elsewhere(slot)
        return cls(dispatcher, slot, deadline, reader, times, routes=routes)

    @property
    def routes(self) -> Collection[str] | None:
        """The members the call can be sent to, or ``None``: any (see ``take``)."""
        return self._routes

    @property
    def slot(self) -> Slot:
        """The call's slot."""
        return self._slot

    def give_back(self) -> None:
        """Give the slot back now (again: nothing), and stop the timer.

        How fast the answer's events came is told first, if any came. A
        call that failed before its answer (``fails``) gives it back as
        failed.
        """
        if self._timer is not None:
            self._timer.cancel()
        slot = self._slot
        slot.follow_lease(None)
        if self._fails:
            slot.failed()
            return
        self._times.report(slot)
        slot.release()

    def fails(self) -> None:
        """The call failed before its answer: its slot goes back as failed (``Slot.failed``)."""
        self._fails = True

    def dropped(self) -> None:
        """The response was collected unclosed: warn, and give the slot back.

        Called by the garbage collector, so anywhere: in another thread, or
        between any two lines of the trio run. It only asks the run to give
        the slot back (``give_back`` is synchronous and never waits), and
        does nothing once the slot is back or the run has ended.
        """
        if not self._slot.held:
            return
        try:
            self._token.run_sync_soon(self.give_back)
        except trio.RunFinishedError:
            return
        warnings.warn(
            f"a model call to {self._slot.provider!r} was never closed: its"
            " response was dropped unclosed, and its slot is given back now;"
            " close responses (async with, or aclose())",
            ResourceWarning,
            stacklevel=1,
        )

    def stall_on_silence(
        self,
        headers: Mapping[str, str],
        read_timeout: object,
        error: Callable[[str], Exception],
    ) -> None:
        """End an event stream that sends no event for ``read_timeout`` seconds.

        Only if the answer is ``text/event-stream`` and ``read_timeout`` (the
        request's) is a number; any event stream's events are timed
        (``TokenTimes``), for a latency-signal adaptive limit. The bytes the
        body passes on go through the server-sent events decoder; reads
        wait at most ``read_timeout`` in
        all without an event dispatched, comments or not, and each event
        starts that time over. Past it, the body is closed, the slot goes
        back, and the read raises ``error(message)``: the read timeout of
        the request's httpx, which the SDKs treat as one. Time the reader
        spends between reads does not count, as it does not for httpx's
        own read timeout.
        """
        media = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != "text/event-stream":
            return
        self._events = SSEDecoder()
        if not isinstance(read_timeout, int | float):
            return
        provider = self._slot.provider
        self._read_timeout = self._quiet = float(read_timeout)
        self._stall_error = lambda: error(
            f"{provider}: the stream stalled: no event for {read_timeout:g} s"
        )

    def _heard(self, chunk: bytes, waited: float) -> None:
        """A read returned ``chunk`` after ``waited`` seconds: the stall rule counts it."""
        events = self._events
        if events is None:
            return
        try:
            dispatched = events.feed(chunk)
        except EventTooLarge:
            # Its events can no longer be told apart: the rule ends here,
            # and the SDK meets the event as it would without the transport.
            self._events = None
            self._quiet = math.inf
            return
        if dispatched:
            self._quiet = self._read_timeout
            self._times.heard_events(dispatched)
        else:
            self._quiet -= waited

    def timeout(self) -> SlotHoldTimeout | LeaseLost | Exception:
        """The error of this call held past its deadline: which one ran out."""
        if self._stalled:
            assert self._stall_error is not None  # only the stall rule sets it
            return self._stall_error()
        dispatcher = self._dispatcher
        if self._lease <= self._max_hold:
            return lease_lost(self._slot.provider, dispatcher.lease)
        max_hold = dispatcher.max_hold
        assert max_hold is not None  # only a deadline's end calls this
        return slot_hold_timeout(self._slot.provider, max_hold)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """The reading task's own block, cut at the deadline: then ``timeout()``."""
        scope = trio.CancelScope(deadline=self._deadline)
        self._scopes.append(scope)
        try:
            with scope:
                yield
        finally:
            self._scopes.remove(scope)
        if scope.cancelled_caught:
            raise self.timeout()

    def answered(
        self, status: int, headers: Mapping[str, str], *, keep: bool = True
    ) -> None:
        """The answer's headers are in: tell the dispatcher what they say.

        The answer started (the provider has counted the call), its
        rate-limit figures are observed, and a rate-limit answer pauses the
        provider, then keeps the turn's place for the SDK's retry (unless
        not ``keep``: the transport sends it again itself). The answer is
        not touched.
        """
        retry_after = None
        pause = status in RATE_LIMITED
        if pause:
            retry_after = parse_retry_after(headers, time.time())
        slot = self._slot
        Meter(self._dispatcher, slot).answered(
            self._reader.read(headers), pause=pause, retry_after=retry_after
        )
        if pause and keep:
            # The SDK will retry after its own sleep: the turn keeps its
            # place in line for that retry meanwhile.
            # Any member it can be sent to: a retry may go where it failed.
            keep_place(
                self._dispatcher,
                slot.provider,
                slot.model,
                slot.tokens,
                unroutable(self._dispatcher, slot.provider, self._routes),
            )

    def watch(self, close: weakref.WeakMethod[Callable[[], Awaitable[None]]]) -> None:
        """Close the body with ``close`` at the deadline, unless a read is under way.

        Held weakly: the timer must not keep a dropped body alive.
        """
        if math.isinf(self._deadline) or self._dispatcher.closed:
            return
        self._timer = trio.CancelScope(deadline=self._deadline)
        self._dispatcher.start_soon(
            self._expire, close, self._timer, name="trio_dispatch transport max_hold"
        )

    async def _expire(
        self,
        close: weakref.WeakMethod[Callable[[], Awaitable[None]]],
        timer: trio.CancelScope,
    ) -> None:
        with timer:
            await trio.sleep_forever()
        # Cancelled by give_back (done) or by its deadline; a read under way
        # has the same deadline in its own task, and stops itself.
        if not self._slot.held or self._closing or self._reading:
            return
        body_close = close()
        if body_close is None:  # pragma: no cover (collected: dropped() gives back)
            return
        self._expired = True
        await body_close()

    async def read(
        self, chunks: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]
    ) -> bytes | None:
        """The next chunk of the body, or ``None`` after the last one.

        After the last one the slot goes back; past the deadline the body is
        closed with ``close`` first.

        Raises:
            SlotHoldTimeout: ``max_hold`` passed.
            LeaseLost: The lease ran out first.
            Exception: An event stream stalled (``stall_on_silence``): the
                error given there, the read timeout of the request's httpx.
        """
        if self._expired:
            raise self.timeout()
        if math.isinf(self._deadline) and math.isinf(self._quiet):
            # No deadline to cut the read at: no scope.
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                self.give_back()
                return None
            self._heard(chunk, 0.0)
            return chunk
        self._reading = True
        started = trio.current_time()
        # The earliest of the deadlines: max_hold's, the lease's, the stall's.
        stall_at = self._stall_at = started + self._quiet
        scope = trio.CancelScope(deadline=min(self._deadline, stall_at))
        self._scopes.append(scope)
        try:
            with scope:
                chunk = await anext(chunks)
        except StopAsyncIteration:
            self.give_back()
            return None
        finally:
            self._reading = False
            self._stall_at = math.inf
            self._scopes.remove(scope)
        if not scope.cancelled_caught:
            self._heard(chunk, trio.current_time() - started)
            return chunk
        self._stalled = stall_at < self._deadline
        self._expired = True
        await close()
        raise self.timeout()

    async def close(self, close_inner: Callable[[], Awaitable[None]]) -> None:
        """Close the body with ``close_inner`` (once), then give the slot back."""
        if self._closing:
            return
        self._closing = True
        try:
            await close_inner()
        finally:
            self.give_back()


class _Stream(Protocol):
    """A response body of either httpx: chunks, and a close."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class HeldBodyBase:
    """A response body that holds its call's slot until it is closed.

    Mixed into each httpx's ``AsyncByteStream``, before it.
    """

    def __init__(self, inner: _Stream, hold: Hold) -> None:
        self._inner = inner
        self._hold = hold
        self._chunks: HeldChunks | None = None
        hold.watch(weakref.WeakMethod(self.aclose))
        # A body dropped unclosed (an SDK stream left unread, then
        # collected) would hold its slot for ever: collected, it gives it
        # back, with a ResourceWarning, as unclosed files and sockets warn.
        # Not at exit: the run, and its slots, are gone by then.
        weakref.finalize(self, hold.dropped).atexit = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        # One inner iterator for the body's life: iterated again (the openai
        # SDK drains a stream's body after [DONE]), the body goes on where
        # it stopped, and the one iterator is closed with it.
        if self._chunks is None:
            self._chunks = HeldChunks(self._inner.__aiter__(), self._hold, self.aclose)
        return self._chunks

    async def aclose(self) -> None:
        await self._hold.close(self._inner.aclose)
        if self._chunks is not None:
            # Closed before its end: the inner iterator is closed too.
            await self._chunks.close_inner()


@final
class _HeldBody(HeldBodyBase, httpx2.AsyncByteStream):
    """An httpx2 response body that holds its call's slot until it is closed."""


@final
class HeldChunks:
    """The chunks of a held body, read under the hold's deadline.

    An iterator object, not an async generator: one that its reader drops
    unfinished (an SDK that stops at ``[DONE]``, a client that closes the
    response instead) leaves nothing for the garbage collector to finalise.
    The inner iterator is closed when the chunks end or a read fails, as
    httpx closes a body's iterator.
    """

    __slots__ = ("_chunks", "_close", "_ended", "_hold", "_inner_closed")

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        hold: Hold,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._chunks = chunks
        self._hold = hold
        self._close = close
        self._ended = False
        self._inner_closed = False

    def __aiter__(self) -> HeldChunks:
        return self

    async def __anext__(self) -> bytes:
        if self._ended:
            raise StopAsyncIteration
        try:
            chunk = await self._hold.read(self._chunks, self._close)
        except BaseException:
            self._ended = True
            await self.close_inner()
            raise
        if chunk is None:
            self._ended = True
            await self.close_inner()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """End the iteration, and close the inner iterator."""
        self._ended = True
        await self.close_inner()

    async def close_inner(self) -> None:
        """Close the inner iterator, once; a later read still says why.

        Called when the body is closed under the reader (``max_hold``):
        the next read raises ``SlotHoldTimeout``, not the end of the body.
        """
        if self._inner_closed:
            return
        self._inner_closed = True
        aclose = getattr(self._chunks, "aclose", None)
        if aclose is not None:
            await aclose()


class _Inner(Protocol):
    """A transport of either httpx, as the wrapper uses it."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None: ...

    async def aclose(self) -> None: ...

    async def handle_async_request(self, request: Any) -> Any: ...  # noqa: ANN401 (either httpx's)


InnerT = TypeVar("InnerT", bound=_Inner)


class TransportBase(Generic[InnerT]):
    """``Dispatcher.transport`` whatever its httpx; mixed in before its base."""

    def __init__(
        self,
        dispatcher: Plumbing,
        provider: str,
        inner: InnerT,
        *,
        server_priority: bool = False,
        endpoints: Mapping[str, Endpoint] | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._provider = provider
        self._inner = inner
        self._server_priority = server_priority
        self._reader = RateLimitReader(provider)
        # A pool's members' endpoints, by member (set_endpoint adds one);
        # none: where the client points.
        self._endpoints = None if endpoints is None else dict(endpoints)

    def __repr__(self) -> str:
        return f"<trio_dispatch transport {self._provider!r} inner={self._inner!r}>"

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_value, traceback)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _exchange(
        self,
        hold: Hold,
        request: Any,  # noqa: ANN401 (a request of the transport's httpx)
        httpx: ModuleType,
        parsed: Mapping[str, object] | None,
        content: bytes | None,
    ) -> tuple[Hold, Any]:
        """Send model call ``request`` under ``hold`` until its answer's headers are in.

        Over a pool, a call that failed before its answer (no answer at
        all, a 5xx, a 429 or 529) goes again at once on a member it has not
        failed on, while there is one and its body can be sent again, in
        the same place in line (``Hold.take``'s ``fallback``); the last
        failure is the SDK's. Returns the hold of the call answered, and its
        response. If this raises, nothing is held.
        """
        dispatcher = self._dispatcher
        path = request.url.path
        # The members of the pool this call failed on, before its answer.
        tried: tuple[str, ...] = ()
        while True:
            try:
                sent = request
                if self._server_priority and takes_priority(path, parsed):
                    assert content is not None  # parsed from it
                    place = place_in_line(dispatcher, hold.slot)
                    sent = _resent(sent, httpx, with_priority(content, place))
                if self._endpoints is not None:
                    sent = _routed(sent, httpx, self._endpoint(hold.slot), path)
                try:
                    with hold.timed():
                        response = await self._inner.handle_async_request(sent)
                except httpx.TransportError:
                    # No answer: refused, reset, no first byte in time.
                    members = dispatcher.members(self._provider)
                    if members is None:
                        raise
                    hold.fails()
                    moved = _fallback(hold, tried, content, members)
                    if not moved:
                        raise
                else:
                    status = response.status_code
                    members = (
                        dispatcher.members(self._provider)
                        if status == 429 or status >= 500
                        else None
                    )
                    if members is None:
                        hold.answered(status, response.headers)
                        return hold, response
                    if status not in RATE_LIMITED:
                        hold.fails()  # a rate limit pauses: no failure
                    moved = _fallback(hold, tried, content, members)
                    hold.answered(status, response.headers, keep=not moved)
                    if not moved:
                        return hold, response
                    # Sent again at once elsewhere: this answer goes nowhere.
                    await response.aclose()
            except BaseException:
                hold.give_back()
                raise
            hold.give_back()
            tried = moved
            hold = await Hold.take(
                dispatcher,
                self._provider,
                self._reader,
                parsed,
                path,
                fallback=(hold.slot, tried),
                routes=hold.routes,
            )

    def set_endpoint(self, member: str, endpoint: Endpoint) -> None:
        """Send the calls granted on pool member ``member`` to ``endpoint`` from now on.

        For a member that joins the pool after the transport was made
        (``Dispatcher.set_pool``): until it has an endpoint here, this
        transport's calls are never granted on it. Replaces a member's
        endpoint too (a rotated key), for the calls granted from now on.

        Raises:
            TypeError: ``member`` is not a string or ``endpoint`` not an
                ``Endpoint``.
            ValueError: ``member`` is empty or not a member of the pool
                now, or the transport was made without ``endpoints`` (its
                calls go where its client points).
        """
        check_provider(member)
        if not isinstance(endpoint, Endpoint):
            raise TypeError(
                f"endpoint must be an Endpoint, got {type(endpoint).__name__}"
            )
        if self._endpoints is None:
            raise ValueError(
                f"the transport of {self._provider!r} was made without endpoints:"
                " its calls go where its client points"
            )
        members = self._dispatcher.members(self._provider) or ()
        if member not in members:
            raise ValueError(
                f"{member!r} is not a member of pool {self._provider!r}; its members"
                f" are {', '.join(map(repr, members)) or 'none'}"
            )
        self._endpoints[member] = endpoint

    def _endpoint(self, slot: Slot) -> Endpoint:
        """The endpoint of the member ``slot`` was granted on.

        Raises:
            ValueError: The member has none here (it joined the pool after
                the transport was made).
        """
        assert self._endpoints is not None
        member = slot.member
        endpoint = None if member is None else self._endpoints.get(member)
        if endpoint is None:
            raise ValueError(
                f"pool {self._provider!r} granted a call on {member!r}, which has no"
                " endpoint in this transport: make it again with one for each member"
            )
        return endpoint

    async def _handle(
        self,
        request: Any,  # noqa: ANN401 (a request of the transport's httpx)
        httpx: ModuleType,
        body: type[HeldBodyBase],
    ) -> Any:  # noqa: ANN401 (its response)
        """Send ``request``, holding a slot first if it is a model call.

        ``httpx`` is the module of the transport's httpx, ``body`` its held
        body. The hold is given back at once when nothing more is on the
        wire (a body read already, as a mock's); otherwise the response's
        body keeps it until closed. With ``server_priority``, the request
        sent carries the slot's place in line (see the module's notes).

        Raises:
            TypeError: ``request`` is not of ``httpx`` (the client is of the
                other httpx), before any slot is taken.
        """
        if not isinstance(request, httpx.Request):
            legacy = httpx is not httpx2
            raise wrong_client(self._provider, request, legacy=legacy)
        inner = self._inner
        if not takes_slot(request.method, request.url.path):
            return await inner.handle_async_request(request)
        try:
            content: bytes | None = request.content
        except httpx.RequestNotRead:
            content = None
        path = request.url.path
        # Parsed once: the slot's model and estimate, and the priority, read it.
        parsed = None if content is None else json_body(content)
        hold = await Hold.take(
            self._dispatcher,
            self._provider,
            self._reader,
            parsed,
            path,
            routes=self._endpoints,
        )
        hold, response = await self._exchange(hold, request, httpx, parsed, content)
        if response.is_closed:
            hold.give_back()
        else:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            timeouts = request.extensions.get("timeout") or {}
            hold.stall_on_silence(
                response.headers,
                timeouts.get("read"),
                lambda message: httpx.ReadTimeout(message, request=request),
            )
            response.stream = body(response.stream, hold)
        return response


# Where a client may carry its own key: every one is dropped before a
# member's is set (OpenAI's, Anthropic's, Azure's headers; query keys).
_KEY_HEADERS: Final = ("authorization", "x-api-key", "api-key")
_KEY_PARAMS: Final = frozenset({"key", "api_key", "api-key"})


def _fallback(
    hold: Hold, tried: tuple[str, ...], content: bytes | None, members: tuple[str, ...]
) -> tuple[str, ...]:
    """The members tried once ``hold``'s has failed, if the call may go to another; else ``()``.

    It may if its body can be sent again (it was read: not a streamed
    upload) and the pool (of ``members``) has a member it has not failed
    on, and may be sent to (one in the hold's ``routes``).
    """
    member = hold.slot.member
    if content is None or member is None:
        return ()
    tried = (*tried, member)
    routes = hold.routes
    left = [m for m in members if m not in tried and (routes is None or m in routes)]
    return tried if left else ()


def unroutable(
    dispatcher: Plumbing, provider: str, routes: Collection[str] | None
) -> tuple[str, ...]:
    """The members of pool ``provider`` not in ``routes`` (``None``: none), to avoid now.

    Raises:
        PoolUnreachable: No member of the pool is in ``routes``.
    """
    return () if routes is None else dispatcher.unroutable(provider, routes)


def _routed(
    request: Any,  # noqa: ANN401 (either httpx's)
    httpx: ModuleType,
    endpoint: Endpoint,
    path: str,
) -> Any:  # noqa: ANN401 (its request)
    """Model call ``request`` (to ``path``) sent to ``endpoint`` instead, with its key.

    Its base URL, the call's endpoint and the request's query (less a key
    carried there); the same method, body and extensions; the headers less
    ``Host`` (the new URL's) and, with a key, less every header a client
    carries its key in, the key going in ``x-api-key`` for Anthropic's
    calls (``/messages``, ``/complete``), as ``Authorization: Bearer`` for
    the others.
    """
    call = model_call_of(path)
    url = httpx.URL(endpoint.base_url.rstrip("/") + call)
    # The request's query, but for a key the client may carry there.
    params = [
        (name, value)
        for name, value in request.url.params.multi_items()
        if name.lower() not in _KEY_PARAMS
    ]
    if params:
        url = url.copy_with(params=params)
    headers = request.headers.copy()
    del headers["host"]
    key = endpoint.api_key
    if key is not None:
        for name in _KEY_HEADERS:
            headers.pop(name, None)
        if call.endswith(("/messages", "/complete")):
            headers["x-api-key"] = key  # Anthropic's
        else:
            headers["Authorization"] = f"Bearer {key}"  # OpenAI's, and theirs alike
    try:
        content = request.content
    except httpx.RequestNotRead:
        # A request made with its stream gets no Host of its own: the new URL's.
        headers["Host"] = url.netloc.decode("ascii")
        return httpx.Request(
            request.method,
            url,
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
    return httpx.Request(
        request.method,
        url,
        headers=headers,
        content=content,
        extensions=request.extensions,
    )


def _resent(request: Any, httpx: ModuleType, content: bytes) -> Any:  # noqa: ANN401 (either httpx's)
    """``request`` with ``content`` for its body, as a new request of ``httpx``.

    The same method, URL, headers and extensions (the SDK's timeouts);
    ``Content-Length`` says the new length, in the header's own place.
    """
    headers = request.headers.copy()
    headers["Content-Length"] = str(len(content))
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=content,
        extensions=request.extensions,
    )


@final
class DispatchTransport(
    TransportBase[httpx2.AsyncBaseTransport], httpx2.AsyncBaseTransport
):
    """``Dispatcher.transport``: model calls hold a slot of one provider."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send ``request``, holding a slot first if it is a model call."""
        response: httpx2.Response = await self._handle(request, httpx2, _HeldBody)
        return response
