"""The fake LLM API as an ASGI app: it checks, records, counts and streams.

``FakeLLMServer`` is a plain ASGI 3 application answering
``POST /v1/chat/completions`` in OpenAI's streaming format and
``POST /v1/messages`` in Anthropic's, from a ``FakeScript``;
``open_fake_llm_server`` serves it on loopback with hypercorn (the
``testing`` extra, imported only when a server starts). Given a
``FakeBatching`` it queues as a self-hosted server does, over a few batch
slots (``_batching``), and answers ``GET /metrics`` with its running and
waiting counts.

It refuses what a real API would: a missing or wrong key (401), a missing
``anthropic-version``, a body that is not JSON or lacks ``model``,
``messages`` (and Anthropic's ``max_tokens``), or that does not ask to
stream (400). It watches for the client's disconnect, so an abandoned
stream stops at once, even a stalled one. It keeps a prompt cache per API
key (``_cache``) and, given ``FakeQuotas``, each key's rate limits
(``_quotas``) on trio's clock; Anthropic's RFC 3339 resets are that clock
mapped onto the wall clock when the server first needed it.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .._observe._asgi import lifespan
from .._policy._ratelimits import RateLimitInfo
from .._util import AsyncWithOnly
from .._wire import FORMATS
from ..messages import Usage
from ._batching import EXPOSITION_TYPE, BatchQueue, FakeBatching, exposition
from ._cache import PromptCache
from ._encoders import (
    MALFORMED,
    encode_reply,
    error_body,
    error_event,
    status_fault_answer,
)
from ._quotas import (
    FakeQuotas,
    QuotaBook,
    quota_headers,
    refusal_headers,
)
from ._script import (
    ROUTES,
    FakeReply,
    FakeRequest,
    FakeScript,
    Playlist,
    strike_index,
    token_delay,
)
from ._tally import FakeServerStatistics, Tally

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    from .._observe._asgi import Receive, Send
    from .._wire._encode import WireEvent
    from ._script import WireFormat

_SECRET_HEADERS = frozenset(
    name.lower() for wire in FORMATS.values() for name, _ in wire.key_headers
)
_logger = logging.getLogger("trio_dispatch.testing.fake_server")


class _Rejected(Exception):
    """Raised inside the handler to answer ``(status, error type, message)``."""


@attrs.define
class _Progress:
    """One request's answer as the server keeps it.

    ``finished``: the stream was sent to its scripted end; ``tokens``: what
    it uses; ``settle``: gives its admission back to the quotas, once
    admitted; ``over``: the server no longer counts it in flight.
    """

    finished: bool = False
    tokens: int = 0
    settle: Callable[[int], None] | None = None
    over: bool = False


@final
class FakeLLMServer:
    """The fake LLM API: an ASGI app with a script, a log and statistics.

    Get one from ``open_fake_llm_server``, which serves it.
    """

    def __init__(
        self,
        script: FakeScript,
        *,
        api_key: str | None = None,
        quotas: FakeQuotas | None = None,
        batching: FakeBatching | None = None,
    ) -> None:
        self._playlist = Playlist(script)
        check_api_key(api_key)
        if quotas is not None and not isinstance(quotas, FakeQuotas):
            raise TypeError(f"quotas must be a FakeQuotas or None, got {quotas!r}")
        if batching is not None and not isinstance(batching, FakeBatching):
            raise TypeError(
                f"batching must be a FakeBatching or None, got {batching!r}"
            )
        self._book = None if quotas is None else QuotaBook(quotas)
        self._wall_offset: float | None = None
        self._api_key = api_key
        self._base_url: str | None = None
        self._requests: list[FakeRequest] = []
        self._tally = Tally(self._changed_now)
        self._ids = itertools.count(1)
        self._changed = trio.Event()
        self._cache = PromptCache()
        self._batch = None if batching is None else BatchQueue(batching, self._batched)

    def __repr__(self) -> str:
        where = self._base_url or "not serving"
        return f"<FakeLLMServer {where}>"

    def serving_at(self, base_url: str) -> None:
        """Plumbing for ``open_fake_llm_server``: the server answers at ``base_url`` now."""
        self._base_url = base_url

    @property
    def base_url(self) -> str:
        """The server's root, like ``http://127.0.0.1:54321``."""
        if self._base_url is None:
            raise RuntimeError("the fake server is not serving yet")
        return self._base_url

    @property
    def openai_base_url(self) -> str:
        """The ``base_url`` for ``OpenAIProvider`` (with ``/v1``)."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The ``base_url`` for ``AnthropicProvider`` (without ``/v1``)."""
        return self.base_url

    @property
    def requests(self) -> list[FakeRequest]:
        """Every LLM request received so far, oldest first (a copy)."""
        return list(self._requests)

    @property
    def script(self) -> FakeScript:
        """The script in use."""
        return self._playlist.script

    def set_script(self, script: FakeScript) -> None:
        """Answer later requests from ``script``; those being answered keep theirs."""
        self._playlist = Playlist(script)

    def statistics(self) -> FakeServerStatistics:
        """A snapshot of the counters (the batch's integrals up to now)."""
        if self._batch is None:
            return self._tally.snapshot()
        try:
            now = trio.current_time()
        except RuntimeError:  # outside a trio run: up to the last change
            return self._tally.snapshot()
        return self._tally.snapshot(now)

    @property
    def quotas(self) -> FakeQuotas | None:
        """The per-key rate limits it keeps, if any."""
        return None if self._book is None else self._book.quotas

    @property
    def batching(self) -> FakeBatching | None:
        """The continuous batching it plays, if any."""
        return None if self._batch is None else self._batch.batching

    def rate_limits(self, api_key: str, model: str | None = None) -> RateLimitInfo:
        """What an answer to ``api_key`` for ``model`` would say of its limits now.

        The figures of its rate-limit headers, times rounded up to the
        millisecond; empty without quotas. ``None``: the key's shared buckets.
        """
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a string or None, got {model!r}")
        if self._book is None:
            return _NO_LIMITS
        return self._book.rate_limits(api_key, trio.current_time(), model)

    def wall_time(self, when: float) -> float:
        """The Unix time of ``when`` on the trio clock, as the headers tell it."""
        if self._wall_offset is None:
            # Whole milliseconds, as the headers tell times: a reset then
            # reads back exactly against this clock.
            self._wall_offset = round(time.time() - trio.current_time(), 3)
        return self._wall_offset + when

    async def wait_until(
        self, predicate: Callable[[FakeServerStatistics], bool]
    ) -> FakeServerStatistics:
        """Wait until ``predicate(statistics())`` holds; return that snapshot."""
        while True:
            changed = self._changed
            snapshot = self.statistics()
            if predicate(snapshot):
                await trio.lowlevel.checkpoint()
                return snapshot
            await changed.wait()

    async def wait_idle(self) -> FakeServerStatistics:
        """Wait until no request is being answered."""
        return await self.wait_until(lambda stats: stats.in_flight == 0)

    async def __call__(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        """The ASGI 3 entry point."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    def _batched(self, running: int, waiting: int) -> None:
        self._tally.batch_changed(running, waiting, trio.current_time())

    def _changed_now(self) -> None:
        # A fresh Event per change: waiters hold the one they saw.
        self._changed.set()
        self._changed = trio.Event()

    async def _start(
        self, send: Send, status: int, headers: list[tuple[bytes, bytes]]
    ) -> None:
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        self._tally.answered(status)

    async def _send_json(
        self,
        send: Send,
        status: int,
        payload: object,
        headers: list[tuple[bytes, bytes]] | None = None,
        progress: _Progress | None = None,
    ) -> None:
        body = json.dumps(payload).encode()
        await self._start(
            send,
            status,
            [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        )
        if progress is not None:
            self._over(progress)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _http(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        path = scope["path"]
        if path == METRICS_PATH and self._batch is not None:
            await self._metrics(scope["method"], send)
            return
        wire = ROUTES.get(path)
        if wire is None or scope["method"] != "POST":
            status = 404 if wire is None else 405
            await self._send_json(
                send,
                status,
                {"error": {"type": "not_found_error", "message": f"no route: {path}"}},
            )
            return
        body_bytes = await _read_body(receive)
        if body_bytes is None:
            return  # the client left before the request was complete
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        try:
            body = json.loads(body_bytes)
        except ValueError:
            body = None
        client = scope.get("client")
        request = FakeRequest(
            format=wire,
            path=path,
            body=body,
            headers={k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
            authenticated=self._authenticated(wire, headers),
            arrived_at=trio.current_time(),
            client=None if client is None else (str(client[0]), int(client[1])),
        )
        self._requests.append(request)
        self._tally.arrived(request.model)
        progress = _Progress()
        try:
            await self._answer(request, headers, receive, send, progress)
        finally:
            self._over(progress)

    def _over(self, progress: _Progress) -> None:
        """The request is no longer in flight here: its quota settled, once.

        Called before an answer's last bytes are sent, and after the
        handler, whichever comes first: a client that has read the whole
        answer (and may send its next request at once) always finds it
        over, however late this task runs again.
        """
        if progress.over:
            return
        progress.over = True
        if progress.settle is not None:
            progress.settle(progress.tokens)
        self._tally.departed()

    async def _metrics(self, method: str, send: Send) -> None:
        """``GET /metrics``: the batch's counts; like the real servers', keyless."""
        batch = self._batch
        assert batch is not None
        if method == "GET":
            status, headers = 200, [(b"content-type", EXPOSITION_TYPE)]
            text = exposition(batch.batching, batch.running, batch.waiting)
        else:
            status = 405
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"allow", b"GET"),
            ]
            text = f"{METRICS_PATH} answers GET only\n"
        body = text.encode()
        headers.append((b"content-length", str(len(body)).encode()))
        # Not counted: polling the metrics is no LLM traffic.
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _authenticated(self, wire: WireFormat, headers: Mapping[str, str]) -> bool:
        key = _key_in(wire, headers)
        return bool(key) and (self._api_key is None or key == self._api_key)

    async def _answer(
        self,
        request: FakeRequest,
        headers: Mapping[str, str],
        receive: Receive,
        send: Send,
        progress: _Progress,
    ) -> None:
        # Only a key that passed the check has buckets.
        wire = request.format
        key = _key_in(wire, headers) if request.authenticated else ""
        model = request.model
        try:
            _check_request(request, headers)
            reply = self._playlist.pick(request)
        except _Rejected as rejected:
            status, error_type, message = rejected.args
            await self._send_json(
                send,
                status,
                error_body(wire, error_type, message),
                self._limit_headers(wire, key, model),
                progress,
            )
            return
        book = self._book
        if book is not None:
            body = request.body
            assert isinstance(body, dict)
            cost = book.estimate(
                _estimated_input_tokens(body), _max_tokens(body), model
            )
            refusal = book.admit(key, cost, trio.current_time(), model)
            if refusal is not None:
                self._tally.refused(model)
                error_type, message = FORMATS[wire].refusal_error
                reason = message.format(reason=_REASONS[refusal.reason])
                await self._send_json(
                    send,
                    429,
                    error_body(wire, error_type, reason),
                    [
                        *self._limit_headers(wire, key, model),
                        *refusal_headers(wire, refusal.retry_after),
                    ],
                    progress,
                )
                return

            def settle(used: int) -> None:
                book.settle(key, cost, used, trio.current_time(), model)

            progress.settle = settle
        await self._reply(request, reply, key, receive, send, progress=progress)

    def _limit_headers(
        self, wire: WireFormat, key: str, model: str | None
    ) -> list[tuple[bytes, bytes]]:
        """The rate-limit headers of an answer to ``key`` for ``model``, now."""
        if self._book is None or not key:
            return []
        now = trio.current_time()
        info = self._book.rate_limits(key, now, model)
        return quota_headers(wire, info, self.wall_time(now))

    async def _reply(
        self,
        request: FakeRequest,
        reply: FakeReply,
        key: str,
        receive: Receive,
        send: Send,
        *,
        progress: _Progress,
    ) -> None:
        """Answer an admitted request of ``key`` with ``reply``."""
        limits = self._limit_headers(request.format, key, request.model)
        if reply.latency:
            await trio.sleep(reply.latency)
        fault = reply.fault
        if fault is not None and fault.status is not None:
            status, retry_headers, body = status_fault_answer(request.format, fault)
            await self._send_json(
                send, status, body, [*limits, *retry_headers], progress
            )
            return

        async def watch_for_disconnect(cancel_scope: trio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            # hypercorn also reports the end of a response we finished.
            if not progress.finished:
                self._tally.abandoned()
                cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_disconnect, nursery.cancel_scope)
            events, progress.tokens = self._events(request, reply, key)
            # Charged as used, even if the client leaves before the end.
            self._tally.served(progress.tokens)
            await self._start(
                send,
                200,
                [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    *limits,
                ],
            )
            async with self._paced(request, reply) as pace:
                await self._stream(
                    request.format, reply, events, send, progress=progress, pace=pace
                )
            nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def _paced(
        self, request: FakeRequest, reply: FakeReply
    ) -> AsyncIterator[Callable[[int], float]]:
        """The seconds before each token, given the tokens sent before it.

        The reply's own pace, or, with batching, the batch's: its slot held
        (waited for in line, its prompt prefilled) for the whole stream.
        """
        if self._batch is None:
            yield lambda tokens_sent: token_delay(reply, tokens_sent)
            return
        async with self._batch.sequence(_estimated_input_tokens(request.body)) as step:
            yield lambda tokens_sent: step() if tokens_sent else 0.0

    async def _stream(
        self,
        wire: WireFormat,
        reply: FakeReply,
        events: list[WireEvent],
        send: Send,
        *,
        progress: _Progress,
        pace: Callable[[int], float],
    ) -> None:
        *body, terminator = events
        fault = reply.fault
        strike_at = strike_index(reply, len(body))
        tokens_sent = 0

        async def send_body(data: bytes = b"", *, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        for index, event in enumerate([*body, None]):
            if fault is not None and index == strike_at:
                if fault.kind == "disconnect":
                    self._finish(progress)
                    return  # without the end of the body: the connection drops
                if fault.kind == "truncate":
                    self._finish(progress)
                    await send_body(more=False)
                    return
                if fault.kind == "stall":
                    await trio.sleep_forever()
                if fault.kind == "stream_error":
                    await send_body(error_event(wire, fault))
                    self._finish(progress)
                    await send_body(more=False)
                    return
                if fault.kind == "malformed":
                    await send_body(MALFORMED[wire])
            if event is None:
                break
            if event.token:
                delay = pace(tokens_sent)
                if delay > 0:
                    await trio.sleep(delay)
                tokens_sent += 1
            await send_body(event.data)
        self._finish(progress)
        await send_body(terminator.data, more=False)

    def _finish(self, progress: _Progress) -> None:
        # Before the last send: from then on a disconnect is ours, not theirs.
        progress.finished = True
        self._tally.finished()
        self._over(progress)

    def _events(
        self, request: FakeRequest, reply: FakeReply, api_key: str
    ) -> tuple[list[WireEvent], int]:
        """The stream's events, and the tokens (prompt and output) it uses."""
        body = request.body
        assert isinstance(body, dict)
        if (
            reply.input_tokens is None
            and reply.cache_read_tokens == 0
            and reply.cache_write_tokens == 0
        ):
            # Only when the script leaves the prompt's usage to the server.
            cached = self._cache.use(request.format, api_key, body)
            if cached is not None:
                reply = attrs.evolve(
                    reply,
                    input_tokens=cached.input_tokens,
                    cache_read_tokens=cached.read_tokens,
                    cache_write_tokens=cached.write_tokens,
                )
        options = body.get("stream_options")
        include_usage = not FORMATS[request.format].usage_on_request or (
            isinstance(options, dict) and bool(options.get("include_usage"))
        )
        # Encoded with the usage always, so the server knows what it served;
        # OpenAI's usage chunk goes out only to a request that asked for it.
        events = encode_reply(
            reply,
            request.format,
            model=str(body.get("model")),
            estimated_input_tokens=_estimated_input_tokens(body),
            include_usage=True,
            ids=self._ids,
        )
        usage = [u for e in events for u in e.events if isinstance(u, Usage)]
        if not include_usage:
            events = [
                e for e in events if not any(isinstance(x, Usage) for x in e.events)
            ]
        return events, sum(u.prompt_tokens + u.output_tokens for u in usage)


_NO_LIMITS: Final = RateLimitInfo()

#: Where a server with ``FakeBatching`` answers its running and waiting counts.
METRICS_PATH: Final = "/metrics"

_REASONS: Final = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "too_large": "tokens per minute (the request alone is larger)",
    "concurrency": "concurrent requests",
}


def _estimated_input_tokens(body: Mapping[str, Any]) -> int:
    """A prompt's tokens, roughly: one per four characters of its messages."""
    return max(1, len(json.dumps(body.get("messages"))) // 4)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The output a request asks for at most, if it says."""
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _key_in(wire: WireFormat, headers: Mapping[str, str]) -> str:
    """The API key the request presents in ``wire``'s key headers, or ``""``."""
    return FORMATS[wire].key_in(headers)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _check_request(request: FakeRequest, headers: Mapping[str, str]) -> None:
    wire = FORMATS[request.format]
    if not request.authenticated:
        what = wire.key_headers[0][0]
        raise _Rejected(401, "authentication_error", f"missing or invalid {what}")
    version = wire.version_header
    if version is not None and not headers.get(version):
        raise _Rejected(400, "invalid_request_error", f"{version}: header is required")
    body = request.body
    if not isinstance(body, dict):
        raise _Rejected(400, "invalid_request_error", "the body is not a JSON object")
    for field in wire.required_fields:
        if field not in body:
            raise _Rejected(400, "invalid_request_error", f"{field}: Field required")
    if not isinstance(body["messages"], list):
        raise _Rejected(400, "invalid_request_error", "messages: must be an array")
    if body.get("stream") is not True:
        raise _Rejected(
            400, "invalid_request_error", "the fake server only streams: set stream"
        )


def check_api_key(api_key: str | None) -> None:
    """Refuse a key no client could present (presented keys are stripped)."""
    if api_key is None:
        return
    if not isinstance(api_key, str):
        raise TypeError(
            f"api_key must be a string or None, got {type(api_key).__name__}"
        )
    if not api_key:
        raise ValueError("api_key must not be empty; pass None to accept any key")
    if api_key != api_key.strip():
        raise ValueError("api_key must not begin or end with whitespace")


def open_fake_llm_server(
    script: FakeScript | None = None,
    *,
    api_key: str | None = None,
    quotas: FakeQuotas | None = None,
    batching: FakeBatching | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AbstractAsyncContextManager[FakeLLMServer]:
    """Serve a ``FakeLLMServer`` on loopback for the ``async with`` block.

    The arguments are checked at the call, before anything is bound. On exit
    the server stops at once, cancelling the requests being answered.

    Args:
        script: What to answer; a default ``FakeScript`` if not given.
        api_key: If given, the only key accepted (non-empty, without
            surrounding whitespace); ``None`` accepts any non-empty key.
        quotas: Rate limits to keep for each API key; none if not given.
        batching: Queue as a self-hosted server does, over batch slots,
            and answer ``GET /metrics``; if not given, every request is
            answered at once at its reply's own pace (and ``/metrics`` is
            404).
        host: The address to bind.
        port: The port to bind; ``0`` picks a free one.

    Raises:
        TypeError: An argument of the wrong type.
        ValueError: ``api_key`` is empty or has surrounding whitespace.
    """
    server = FakeLLMServer(
        FakeScript() if script is None else script,
        api_key=api_key,
        quotas=quotas,
        batching=batching,
    )
    return AsyncWithOnly(
        _serve(server, host=host, port=port),
        "open_fake_llm_server() is an async context manager:"
        " use `async with open_fake_llm_server(...) as server`",
    )


@asynccontextmanager
async def _serve(
    server: FakeLLMServer, *, host: str, port: int
) -> AsyncIterator[FakeLLMServer]:
    try:
        from hypercorn.config import Config  # noqa: PLC0415 (an optional dependency)
        from hypercorn.trio import serve  # noqa: PLC0415 (an optional dependency)
    except ModuleNotFoundError as exc:  # pragma: no cover (installed for tests)
        raise ModuleNotFoundError(
            "the fake LLM server needs hypercorn: pip install 'trio-dispatch[testing]'"
        ) from exc
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = _logger
    async with trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[list[str]]) -> None:
            await serve(server, config, mode="asgi", task_status=task_status)  # type: ignore[arg-type]  # FakeLLMServer is an ASGI app; hypercorn's TypedDicts are stricter than its Mapping
            # hypercorn returns only when told to shut down, which nothing
            # here does but a KeyboardInterrupt landing in one of its tasks,
            # which it swallows. Raise it again: Ctrl+C meant to stop, and
            # the block must not go on against a server that is gone.
            if not nursery.cancel_scope.cancel_called:
                raise KeyboardInterrupt

        binds = await nursery.start(run)
        server.serving_at(binds[0])
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
