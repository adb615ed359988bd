"""A fake LLM HTTP server speaking both wire formats, for tests and demos.

``FakeLLMServer`` is a plain ASGI 3 application (no framework) answering
``POST /v1/chat/completions`` in OpenAI's streaming format and
``POST /v1/messages`` in Anthropic's, from a ``FakeScript``.
``open_fake_llm_server`` serves it with hypercorn, on trio, on an ephemeral
loopback port, so clients talk to it through real sockets.

It checks what a real API would refuse: a missing key (401), a wrong one
when the server was given one (401), a missing ``anthropic-version``, a
body that is not JSON or lacks ``model``, ``messages`` (and Anthropic's
``max_tokens``), or a request that does not ask to stream (400). It records
every request it is sent (without the key) and keeps statistics, including
the peak number of requests in flight at once and how many streams the
client abandoned before their end (it watches for the disconnect, so an
abandoned stream stops at once, even a stalled one).

All timing is ``trio.sleep``; with real sockets, tests run in real time, so
keep latencies small.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, final

import attrs
import trio

from ._script import FakeReply, FakeScript, FakeToolCall, Fault

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    Message = dict[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]

WireFormat = Literal["openai", "anthropic"]

_ROUTES: dict[str, WireFormat] = {
    "/v1/chat/completions": "openai",
    "/v1/messages": "anthropic",
}
_SECRET_HEADERS = frozenset({"authorization", "x-api-key"})
_logger = logging.getLogger("trio_dispatch.testing.fake_server")


@final
@attrs.frozen
class FakeRequest:
    """One request the fake server received, as it arrived (minus the key).

    Attributes:
        format: ``"openai"`` or ``"anthropic"``, from the path.
        path: The request path.
        body: The parsed JSON body, or ``None`` if it was not JSON.
        headers: The request headers, names lowercased, without
            ``authorization`` and ``x-api-key``.
        authenticated: Whether it passed the server's key check.
        arrived_at: When it arrived, on the trio clock.
        client: The client's ``(host, port)``; requests over one kept-alive
            connection share it.
    """

    format: WireFormat
    path: str
    body: Any
    headers: Mapping[str, str]
    authenticated: bool
    arrived_at: float
    client: tuple[str, int] | None = None


@final
@attrs.frozen
class FakeServerStatistics:
    """A snapshot of what the fake server has seen.

    Attributes:
        requests_total: LLM requests received (rejected ones included).
        in_flight: LLM requests being answered now.
        peak_in_flight: The most LLM requests ever answered at once.
        responses_by_status: Responses started, by HTTP status.
        completed: Streams sent to their end as scripted (faults included).
        client_disconnects: Streams the client left before their end.
    """

    requests_total: int
    in_flight: int
    peak_in_flight: int
    responses_by_status: Mapping[int, int]
    completed: int
    client_disconnects: int


class _Rejected(Exception):
    """Raised inside the handler to answer with an error status."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message


@attrs.define
class _Progress:
    """Whether a stream has been sent to its scripted end."""

    finished: bool = False


@attrs.define
class _Event:
    """One SSE event ready to send; ``token`` events are paced."""

    data: bytes
    token: bool = False


@final
class FakeLLMServer:
    """The fake LLM API: an ASGI app with a script, a log and statistics.

    Get one from ``open_fake_llm_server``; the URLs are known once it is
    served.
    """

    def __init__(self, script: FakeScript, *, api_key: str | None = None) -> None:
        if not isinstance(script, FakeScript):
            raise TypeError(f"script must be a FakeScript, got {script!r}")
        _check_api_key(api_key)
        self._script = script
        self._replies_used = 0
        self._api_key = api_key
        self._base_url: str | None = None
        self._requests: list[FakeRequest] = []
        self._in_flight = 0
        self._peak_in_flight = 0
        self._by_status: dict[int, int] = {}
        self._completed = 0
        self._client_disconnects = 0
        self._ids = itertools.count(1)
        self._changed = trio.Event()

    def __repr__(self) -> str:
        where = self._base_url or "not serving"
        return f"<FakeLLMServer {where}>"

    # -- the public face -----------------------------------------------------

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
        return self._script

    def set_script(self, script: FakeScript) -> None:
        """Answer later requests from ``script``, its ``replies`` from the start.

        Requests already being answered keep their reply.
        """
        if not isinstance(script, FakeScript):
            raise TypeError(f"script must be a FakeScript, got {script!r}")
        self._script = script
        self._replies_used = 0

    def statistics(self) -> FakeServerStatistics:
        """A snapshot of the counters."""
        return FakeServerStatistics(
            requests_total=len(self._requests),
            in_flight=self._in_flight,
            peak_in_flight=self._peak_in_flight,
            responses_by_status=dict(self._by_status),
            completed=self._completed,
            client_disconnects=self._client_disconnects,
        )

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

    # -- ASGI ----------------------------------------------------------------

    async def __call__(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        """The ASGI 3 entry point."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

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
        self._by_status[status] = self._by_status.get(status, 0) + 1
        self._changed_now()

    async def _send_json(
        self,
        send: Send,
        status: int,
        payload: object,
        headers: list[tuple[bytes, bytes]] | None = None,
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
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _http(
        self, scope: Mapping[str, Any], receive: Receive, send: Send
    ) -> None:
        path = scope["path"]
        wire = _ROUTES.get(path)
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
        request = FakeRequest(
            format=wire,
            path=path,
            body=body,
            headers={k: v for k, v in headers.items() if k not in _SECRET_HEADERS},
            authenticated=self._authenticated(wire, headers),
            arrived_at=trio.current_time(),
            client=_client(scope),
        )
        self._requests.append(request)
        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        self._changed_now()
        try:
            await self._answer(request, headers, receive, send)
        finally:
            self._in_flight -= 1
            self._changed_now()

    def _authenticated(self, wire: WireFormat, headers: Mapping[str, str]) -> bool:
        if wire == "openai":
            scheme, _, key = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer":
                key = ""
        else:
            key = headers.get("x-api-key", "")
        key = key.strip()
        return bool(key) and (self._api_key is None or key == self._api_key)

    async def _answer(
        self,
        request: FakeRequest,
        headers: Mapping[str, str],
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            _check_request(request, headers)
            reply = self._choose(request)
        except _Rejected as rejected:
            await self._send_json(
                send,
                rejected.status,
                _error_body(request.format, rejected.error_type, rejected.message),
            )
            return
        if reply.latency:
            await trio.sleep(reply.latency)
        fault = reply.fault
        if fault is not None and fault.status is not None:
            await self._send_status_fault(request.format, fault, send)
            return
        progress = _Progress()

        async def watch_for_disconnect(cancel_scope: trio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            # hypercorn also reports the end of a response we finished.
            if not progress.finished:
                self._client_disconnects += 1
                cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_for_disconnect, nursery.cancel_scope)
            events = self._events(request, reply)
            await self._start(
                send,
                200,
                [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            )
            await self._stream(request.format, reply, events, send, progress)
            nursery.cancel_scope.cancel()

    def _choose(self, request: FakeRequest) -> FakeReply:
        script = self._script
        if script.choose is not None:
            chosen = script.choose(request)
            if chosen is not None:
                return chosen
        if self._replies_used < len(script.replies):
            self._replies_used += 1
            return script.replies[self._replies_used - 1]
        return script.default

    async def _send_status_fault(
        self, wire: WireFormat, fault: Fault, send: Send
    ) -> None:
        status = fault.status
        assert status is not None
        error_type, message = _STATUS_ERRORS[wire][fault.kind]
        headers: list[tuple[bytes, bytes]] = []
        if fault.retry_after is not None:
            headers.append((b"retry-after", _header_number(fault.retry_after)))
        if fault.retry_after_ms is not None:
            headers.append((b"retry-after-ms", _header_number(fault.retry_after_ms)))
        body = _error_body(wire, error_type, fault.message or message)
        await self._send_json(send, status, body, headers)

    async def _stream(
        self,
        wire: WireFormat,
        reply: FakeReply,
        events: list[_Event],
        send: Send,
        progress: _Progress,
    ) -> None:
        *body, terminator = events
        fault = reply.fault
        strike_at = len(body)
        if fault is not None and fault.after_events is not None:
            strike_at = min(fault.after_events, len(body))
        tokens_sent = 0
        for index, event in enumerate([*body, None]):
            if fault is not None and index == strike_at:
                if fault.kind == "disconnect":
                    self._finish(progress)
                    return  # without the end of the body: the connection drops
                if fault.kind == "truncate":
                    self._finish(progress)
                    await send({"type": "http.response.body", "more_body": False})
                    return
                if fault.kind == "stall":
                    await trio.sleep_forever()
                if fault.kind == "stream_error":
                    error = _error_event(wire, fault)
                    await send(
                        {"type": "http.response.body", "body": error, "more_body": True}
                    )
                    self._finish(progress)
                    await send({"type": "http.response.body", "more_body": False})
                    return
                if fault.kind == "malformed":
                    await send(
                        {
                            "type": "http.response.body",
                            "body": _MALFORMED[wire],
                            "more_body": True,
                        }
                    )
            if event is None:
                break
            if event.token:
                if tokens_sent == 0:
                    await _sleep(reply.time_to_first_token)
                elif reply.tokens_per_second is not None:
                    await _sleep(1 / reply.tokens_per_second)
                tokens_sent += 1
            await send(
                {"type": "http.response.body", "body": event.data, "more_body": True}
            )
        self._finish(progress)
        await send({"type": "http.response.body", "body": terminator.data})

    def _finish(self, progress: _Progress) -> None:
        # Before the last send: from then on a disconnect is ours, not theirs.
        progress.finished = True
        self._completed += 1
        self._changed_now()

    # -- what to send --------------------------------------------------------

    def _events(self, request: FakeRequest, reply: FakeReply) -> list[_Event]:
        body = request.body
        assert isinstance(body, dict)
        reasoning = _words(reply.reasoning)
        text = _words(reply.text)
        calls = [
            (call, self._call_id(request.format, call), _pieces(call, reply))
            for call in reply.tool_calls
        ]
        chunks = len(reasoning) + len(text) + sum(len(p) for _, _, p in calls)
        input_tokens = reply.input_tokens
        if input_tokens is None:
            input_tokens = max(1, len(json.dumps(body.get("messages"))) // 4)
        output_tokens = chunks if reply.output_tokens is None else reply.output_tokens
        finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
        plan = _Plan(
            model=str(body.get("model")),
            message_id=f"fake-{next(self._ids)}",
            reasoning=reasoning,
            text=text,
            calls=calls,
            finish=finish,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read=reply.cache_read_tokens,
            cache_write=reply.cache_write_tokens,
        )
        if request.format == "openai":
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(
                options.get("include_usage")
            )
            return _openai_events(plan, include_usage=include_usage)
        return _anthropic_events(plan)

    def _call_id(self, wire: WireFormat, call: FakeToolCall) -> str:
        if call.id is not None:
            return call.id
        prefix = "call" if wire == "openai" else "toolu"
        return f"{prefix}_fake_{next(self._ids)}"


def _client(scope: Mapping[str, Any]) -> tuple[str, int] | None:
    client = scope.get("client")
    if client is None:
        return None
    host, port = client
    return (str(host), int(port))


async def _sleep(seconds: float) -> None:
    if seconds > 0:
        await trio.sleep(seconds)


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
    if not request.authenticated:
        what = "x-api-key" if request.format == "anthropic" else "Authorization"
        raise _Rejected(401, "authentication_error", f"missing or invalid {what}")
    if request.format == "anthropic" and not headers.get("anthropic-version"):
        raise _Rejected(
            400, "invalid_request_error", "anthropic-version: header is required"
        )
    body = request.body
    if not isinstance(body, dict):
        raise _Rejected(400, "invalid_request_error", "the body is not a JSON object")
    required = ["model", "messages"]
    if request.format == "anthropic":
        required.append("max_tokens")
    for field in required:
        if field not in body:
            raise _Rejected(400, "invalid_request_error", f"{field}: Field required")
    if not isinstance(body["messages"], list):
        raise _Rejected(400, "invalid_request_error", "messages: must be an array")
    if body.get("stream") is not True:
        raise _Rejected(
            400, "invalid_request_error", "the fake server only streams: set stream"
        )


def _error_body(wire: WireFormat, error_type: str, message: str) -> dict[str, Any]:
    if wire == "anthropic":
        return {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": "req_fake",
        }
    return {
        "error": {"message": message, "type": error_type, "param": None, "code": None}
    }


# Per format, the error type and default message of each status fault, in
# the vocabulary of that API.
_STATUS_ERRORS: dict[WireFormat, dict[str, tuple[str, str]]] = {
    "openai": {
        "rate_limit": ("rate_limit_exceeded", "Rate limit reached for requests."),
        "server_error": ("server_error", "The server had an error."),
        "unavailable": ("service_unavailable", "The engine is overloaded."),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
    "anthropic": {
        "rate_limit": (
            "rate_limit_error",
            "Number of requests has exceeded your rate limit.",
        ),
        "server_error": ("api_error", "Internal server error"),
        "unavailable": ("overloaded_error", "Service unavailable"),
        "overloaded": ("overloaded_error", "Overloaded"),
    },
}

_MALFORMED: dict[WireFormat, bytes] = {
    "openai": b'data: {"choices": [{"index": 0, "delta": {"content": "oops\n\n',
    "anthropic": (
        b"event: content_block_delta\n"
        b'data: {"type": "content_block_delta", "index": 0,\n\n'
    ),
}


def _error_event(wire: WireFormat, fault: Fault) -> bytes:
    message = fault.message or "the fake server failed mid-stream"
    if wire == "anthropic":
        payload = {
            "type": "error",
            "error": {"type": fault.error_type, "message": message},
        }
        return _sse(payload, "error")
    error = {"message": message, "type": fault.error_type, "param": None, "code": None}
    return _sse({"error": error})


def _sse(payload: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


_WORD = re.compile(r"\s*\S+")


def _words(text: str) -> list[str]:
    """``text`` in word-sized chunks that join back to exactly ``text``."""
    words = _WORD.findall(text)
    rest = text[sum(map(len, words)) :]
    if rest:
        if words:
            words[-1] += rest
        else:
            words = [rest]
    return words


def _pieces(call: FakeToolCall, reply: FakeReply) -> list[str]:
    text = call.raw_arguments
    if text is None:
        text = json.dumps(call.arguments)
    size = max(1, math.ceil(len(text) / reply.argument_chunks))
    return [text[i : i + size] for i in range(0, len(text), size)]


@attrs.frozen
class _Plan:
    model: str
    message_id: str
    reasoning: list[str]
    text: list[str]
    calls: list[tuple[FakeToolCall, str, list[str]]]
    finish: str
    input_tokens: int
    output_tokens: int
    cache_read: int
    cache_write: int


def _openai_events(plan: _Plan, *, include_usage: bool) -> list[_Event]:
    def chunk(
        delta: dict[str, Any], finish: str | None = None, *, token: bool = True
    ) -> _Event:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        payload = {
            "id": f"chatcmpl-{plan.message_id}",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": plan.model,
            "choices": [choice],
        }
        return _Event(_sse(payload), token=token)

    events = [chunk({"role": "assistant", "content": ""}, token=False)]
    events.extend(chunk({"reasoning_content": word}) for word in plan.reasoning)
    events.extend(chunk({"content": word}) for word in plan.text)
    for index, (call, call_id, pieces) in enumerate(plan.calls):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        events.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces
        )
    events.append(chunk({}, plan.finish, token=False))
    if include_usage:
        prompt = plan.input_tokens + plan.cache_read + plan.cache_write
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": plan.output_tokens,
            "total_tokens": prompt + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": plan.cache_read},
        }
        payload = {
            "id": f"chatcmpl-{plan.message_id}",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": plan.model,
            "choices": [],
            "usage": usage,
        }
        events.append(_Event(_sse(payload)))
    events.append(_Event(b"data: [DONE]\n\n"))
    return events


_ANTHROPIC_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


def _anthropic_events(plan: _Plan) -> list[_Event]:
    def event(name: str, *, token: bool = False, **fields: object) -> _Event:
        return _Event(_sse({"type": name, **fields}, name), token=token)

    events = [
        event(
            "message_start",
            message={
                "id": f"msg_{plan.message_id}",
                "type": "message",
                "role": "assistant",
                "model": plan.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": plan.input_tokens,
                    "cache_creation_input_tokens": plan.cache_write,
                    "cache_read_input_tokens": plan.cache_read,
                    "output_tokens": 1,
                },
            },
        ),
        event("ping"),
    ]
    index = 0
    if plan.reasoning:
        events.append(
            event(
                "content_block_start",
                index=index,
                content_block={"type": "thinking", "thinking": ""},
            )
        )
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": "thinking_delta", "thinking": word},
            )
            for word in plan.reasoning
        )
        events.append(
            event(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": "ZmFrZQ=="},
            )
        )
        events.append(event("content_block_stop", index=index))
        index += 1
    if plan.text:
        events.append(
            event(
                "content_block_start",
                index=index,
                content_block={"type": "text", "text": ""},
            )
        )
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": "text_delta", "text": word},
            )
            for word in plan.text
        )
        events.append(event("content_block_stop", index=index))
        index += 1
    for call, call_id, pieces in plan.calls:
        block = {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}
        events.append(event("content_block_start", index=index, content_block=block))
        events.extend(
            event(
                "content_block_delta",
                token=True,
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
            for piece in ["", *pieces]
        )
        events.append(event("content_block_stop", index=index))
        index += 1
    events.append(
        event(
            "message_delta",
            delta={
                "stop_reason": _ANTHROPIC_STOP.get(plan.finish, plan.finish),
                "stop_sequence": None,
            },
            usage={"output_tokens": plan.output_tokens},
        )
    )
    events.append(event("message_stop"))
    return events


def _check_api_key(api_key: str | None) -> None:
    """Refuse a key no client could ever present, so every request got 401.

    Presented keys are stripped and must be non-empty (see
    ``FakeLLMServer._authenticated``). The messages never show the key.
    """
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
    host: str = "127.0.0.1",
    port: int = 0,
) -> AbstractAsyncContextManager[FakeLLMServer]:
    """Serve a ``FakeLLMServer`` on loopback for the ``async with`` block.

    Args:
        script: What to answer; a default ``FakeScript`` if not given.
        api_key: If given, the only key accepted; otherwise (``None``) any
            non-empty key is. It must be non-empty, without leading or
            trailing whitespace, or no request could ever present it.
        host: The address to bind.
        port: The port to bind; ``0`` picks a free one.

    Returns:
        An async context manager yielding the server, serving;
        ``server.base_url`` says where.

    Raises:
        TypeError: ``script`` is not a ``FakeScript``, or ``api_key`` is
            not a string.
        ValueError: ``api_key`` is empty or has surrounding whitespace.

    The arguments are checked here, at the call, before anything is bound.
    On exit the server stops at once: requests still being answered are
    cancelled and their connections closed.
    """
    server = FakeLLMServer(FakeScript() if script is None else script, api_key=api_key)
    return _serve(server, host=host, port=port)


@asynccontextmanager
async def _serve(
    server: FakeLLMServer, *, host: str, port: int
) -> AsyncIterator[FakeLLMServer]:
    """Serve ``server`` with hypercorn for the ``async with`` block."""
    try:
        from hypercorn.config import Config  # noqa: PLC0415 (an optional dependency)
        from hypercorn.trio import serve  # noqa: PLC0415 (an optional dependency)
    except (
        ModuleNotFoundError
    ) as exc:  # pragma: no cover (hypercorn is installed for tests)
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
            # hypercorn returns only when told to shut down, and nothing here
            # tells it to (no shutdown trigger, no request limit) but a
            # KeyboardInterrupt landing in one of its tasks, which it takes
            # as that cue and swallows. Raise it again: whoever pressed
            # Ctrl+C meant to stop, and the block must not go on against a
            # server that is gone.
            if not nursery.cancel_scope.cancel_called:
                raise KeyboardInterrupt

        binds = await nursery.start(run)
        server._base_url = binds[0]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


def _header_number(value: float) -> bytes:
    """A number as a header value: plain digits, never an exponent."""
    return (f"{value:.3f}".rstrip("0").rstrip(".") or "0").encode()
