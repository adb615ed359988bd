"""OpenAI-compatible chat completions, streamed (OpenAI, vLLM, DeepSeek...).

The wire format, as OpenAI documents it: ``POST {base_url}/chat/completions``
with ``"stream": true`` answers with server-sent events whose data is a
``chat.completion.chunk`` (shortened here)::

    data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}
    data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}
    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
           "id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}
    data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,
           "function":{"arguments":"{\\"a\\": 1}"}}]}}]}
    data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}
    data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,
           "prompt_tokens_details":{"cached_tokens":0}}}
    data: [DONE]

A tool call arrives in fragments keyed by ``index``: the id and name first,
then the arguments' JSON text in pieces. The last usage chunk comes only
with ``stream_options.include_usage`` and has no choices. Reasoning models
served by vLLM or DeepSeek send ``delta.reasoning_content`` (or
``delta.reasoning``). An error after the status line arrives as a chunk
holding an ``error`` object.

``_OpenAIDecoder`` turns that into stream events: text and reasoning deltas
as they come; each ``ToolCall`` once its choice's ``finish_reason`` arrives,
then ``Finish``, then ``Usage``; the stream ends at ``[DONE]``. A stream
without ``[DONE]`` (or that reaches it without a finish reason) was cut
short: ``StreamInterrupted``. Only choice 0 is read; we never ask for more.

Almost every chunk is one delta of text, reasoning or tool-call arguments,
and one process decodes every stream of a fleet, so those take a fast path:
plain dict lookups that check every field the full path would check. A
chunk it does not fully recognise (a finish reason, usage, an error, more
than one choice, a field of the wrong type) goes through the full path,
the attrs classes below structured by cattrs, whose messages name the
wrong field; both paths share the state changes, and a property test
holds them to the same events and the same errors.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, TypeAlias, final

import attrs

from .._exceptions import StreamInterrupted
from .._wire import error_for_status, error_for_type, make_tool_call
from ..messages import Finish, ReasoningDelta, TextDelta, ToolCall, Usage
from ._decode import WireDecoder, parse_json_data, structure_event
from ._errors import error_kind
from ._http import ProviderBase
from ._ratelimit_headers import openai_rate_limits

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import httpx2

    from .._provider import RateLimitObserver, RateLimitReporter
    from ..messages import ChatMessage, ChatRequest, StreamEvent
    from ._sse import ServerSentEvent


# -- the wire, as attrs values (extra fields are ignored) --------------------


@attrs.frozen
class _FunctionDelta:
    name: str | None = None
    arguments: str | None = None


@attrs.frozen
class _ToolCallDelta:
    index: int
    id: str | None = None
    function: _FunctionDelta | None = None


@attrs.frozen
class _Delta:
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: tuple[_ToolCallDelta, ...] | None = None


@attrs.frozen
class _Choice:
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


@attrs.frozen
class _PromptTokensDetails:
    cached_tokens: int | None = None


@attrs.frozen
class _Usage:
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_details: _PromptTokensDetails | None = None


@attrs.frozen
class _Chunk:
    choices: tuple[_Choice, ...]
    usage: _Usage | None = None


_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "function_call": "tool_calls",  # the deprecated spelling
}


# A tool-call fragment, flattened: (index, id, function name, arguments).
_Fragment: TypeAlias = tuple[int, str | None, str | None, str | None]


@attrs.define
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = attrs.Factory(list)


class _OpenAIDecoder(WireDecoder):
    """Chat completion chunks in, stream events out; see the module notes."""

    _terminator = "[DONE]"

    def __init__(self, provider: str, redact: Callable[[str], str] = str) -> None:
        super().__init__(provider, redact)
        self._calls: dict[int, _PartialCall] = {}
        self._finished = False
        self._usage: Usage | None = None
        self._usage_sent = False

    def _feed(self, event: ServerSentEvent) -> list[StreamEvent]:
        data = event.data.strip()
        if not data:
            return []  # a keep-alive
        if data == "[DONE]":
            return self._on_done()
        payload = parse_json_data(self._provider, event, self._redact)
        self._raise_if_error(payload, event.event)
        chunk = structure_event(self._provider, payload, _Chunk, "a chunk")
        events: list[StreamEvent] = []
        for choice in chunk.choices:
            if choice.index == 0:
                events.extend(self._on_choice(choice))
        if chunk.usage is not None:
            self._usage = _usage(chunk.usage)
        if self._finished and self._usage is not None and not self._usage_sent:
            # Held until after Finish, and sent once: some servers repeat it.
            events.append(self._usage)
            self._usage_sent = True
        return events

    def _on_done(self) -> list[StreamEvent]:
        self._done = True
        if not self._finished:
            raise StreamInterrupted(
                f"{self._provider}: the stream reached [DONE] without a finish_reason",
                provider=self._provider,
            )
        events: list[StreamEvent] = list(self._tool_calls())
        if self._usage is not None and not self._usage_sent:
            events.append(self._usage)
            self._usage_sent = True
        return events

    def _fast(
        self, payload: object, event: ServerSentEvent
    ) -> list[StreamEvent] | None:
        """The events of a plain delta chunk, or ``None`` to take the full path.

        Accepts exactly what ``_Chunk`` would, minus what the full path
        alone handles: one choice, with index 0, a delta object and no
        finish reason; no usage, no error. Nothing changes before every
        field has been checked, so a ``None`` leaves the decoder as it was.
        No finish reason and no usage here, so nothing held for later
        (``Usage`` waits for ``Finish``) can be due.
        """
        if (
            event.event == "error"
            or not isinstance(payload, dict)
            or payload.get("usage") is not None
            or payload.get("error") is not None
            or payload.get("object") == "error"
        ):
            return None
        choices = payload.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
            return None
        index = choice.get("index", 0)
        delta = choice.get("delta")
        # type(), not isinstance(): a bool is an int, and not an index.
        if type(index) is not int or index != 0 or not isinstance(delta, dict):
            return None
        content = delta.get("content")
        reasoning_content = delta.get("reasoning_content")
        reasoning = delta.get("reasoning")
        tool_calls = delta.get("tool_calls")
        fragments = () if tool_calls is None else _fast_fragments(tool_calls)
        if fragments is None or not (
            (content is None or isinstance(content, str))
            and (reasoning_content is None or isinstance(reasoning_content, str))
            and (reasoning is None or isinstance(reasoning, str))
        ):
            return None
        return self._on_delta(
            reasoning_content if reasoning_content is not None else reasoning,
            content,
            fragments,
        )

    def _on_choice(self, choice: _Choice) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        delta = choice.delta
        if delta is not None:
            events = self._on_delta(
                delta.reasoning_content
                if delta.reasoning_content is not None
                else delta.reasoning,
                delta.content,
                [_flatten(fragment) for fragment in delta.tool_calls or ()],
            )
        if choice.finish_reason is not None and not self._finished:
            self._finished = True
            events.extend(self._tool_calls())
            reason = _FINISH_REASONS.get(choice.finish_reason, choice.finish_reason)
            events.append(Finish(reason))
        return events

    def _on_delta(
        self, reasoning: str | None, content: str | None, fragments: Sequence[_Fragment]
    ) -> list[StreamEvent]:
        """What a delta yields and accumulates, whichever path decoded it."""
        events: list[StreamEvent] = []
        if reasoning:
            events.append(ReasoningDelta(reasoning))
        if content:
            events.append(TextDelta(content))
        for index, call_id, name, arguments in fragments:
            call = self._calls.setdefault(index, _PartialCall())
            if call_id:
                call.id = call_id
            # Strings accumulate, as the official SDK does: a name could be
            # split too, though OpenAI sends it whole.
            if name:
                call.name += name
            if arguments:
                call.arguments.append(arguments)
        return events

    def _tool_calls(self) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for index in sorted(self._calls):
            call = self._calls.pop(index)
            for field, value in (("id", call.id), ("function name", call.name)):
                if not value:
                    raise self._malformed(
                        f"tool call {index} arrived without its {field}"
                    )
            calls.append(make_tool_call(call.id, call.name, "".join(call.arguments)))
        return calls

    def _raise_if_error(self, payload: object, event_name: str) -> None:
        if not isinstance(payload, dict):
            return
        error: object = payload.get("error")
        if error is None and payload.get("object") == "error":
            error = payload  # vLLM's flat error object
        if error is None and event_name == "error":
            error = payload
        if error is None:
            return
        if not isinstance(error, dict):
            raise error_for_type(self._provider, "error", str(error))
        message = error.get("message")
        text = message if isinstance(message, str) else ""
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and code >= 400:
            error_type = error.get("type")
            raise error_for_status(
                self._provider,
                code,
                error_type=error_type if isinstance(error_type, str) else None,
                message=text,
                retry_after=None,
            )
        raise error_for_type(self._provider, error_kind(error) or "error", text)


def _fast_fragments(tool_calls: object) -> list[_Fragment] | None:
    """A delta's ``tool_calls`` as ``_Delta`` would take them, else ``None``."""
    if not isinstance(tool_calls, list):
        return None
    fragments: list[_Fragment] = []
    for item in tool_calls:
        if not isinstance(item, dict):
            return None
        index = item.get("index")
        call_id = item.get("id")
        function = item.get("function")
        if function is None:
            name = arguments = None
        elif isinstance(function, dict):
            name = function.get("name")
            arguments = function.get("arguments")
        else:
            return None
        if not (
            type(index) is int
            and (call_id is None or isinstance(call_id, str))
            and (name is None or isinstance(name, str))
            and (arguments is None or isinstance(arguments, str))
        ):
            return None
        fragments.append((index, call_id, name, arguments))
    return fragments


def _flatten(fragment: _ToolCallDelta) -> _Fragment:
    function = fragment.function
    if function is None:
        return fragment.index, fragment.id, None, None
    return fragment.index, fragment.id, function.name, function.arguments


def _usage(usage: _Usage) -> Usage:
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Usage(
        input_tokens=max(usage.prompt_tokens - cached, 0),
        output_tokens=usage.completion_tokens,
        cache_read_tokens=cached,
    )


# -- the request -------------------------------------------------------------


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    # The model's own text when we have it, even if it did
                    # not parse: the history should say what it said.
                    "arguments": call.raw_arguments or json.dumps(call.arguments),
                },
            }
            for call in message.tool_calls
        ]
        if not message.content:
            wire["content"] = None
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def request_body(model: str, request: ChatRequest) -> dict[str, Any]:
    """The JSON body of a streaming chat completion for ``request``.

    ``request.cache_key`` goes out as ``prompt_cache_key``.
    """
    messages: list[dict[str, Any]] = []
    if request.system is not None:
        messages.append({"role": "system", "content": request.system})
    messages.extend(_wire_message(message) for message in request.messages)
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
    optional = {
        # ``max_tokens`` rather than the newer ``max_completion_tokens``:
        # every OpenAI-compatible server (vLLM, llama.cpp, DeepSeek) takes it.
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": None if request.stop is None else list(request.stop),
        # Routes the conversation's calls to one prompt cache; OpenAI caches
        # the longest prefix seen before, which the conversation keeps stable.
        "prompt_cache_key": request.cache_key,
    }
    body.update((key, value) for key, value in optional.items() if value is not None)
    if request.extra:
        # Last, and never over a field set above (ChatRequest refuses
        # those) but ``prompt_cache_key``: a key given there is meant.
        body.update(request.extra)
    return body


@final
class OpenAIProvider(ProviderBase):
    """An OpenAI-compatible chat completions API, streamed over HTTP.

    Works with OpenAI itself and with servers that speak its format (vLLM,
    DeepSeek, llama.cpp, a proxy). Use it as an async context manager, or
    call ``aclose()``, to close the HTTP client it made; a client you lend
    it stays yours to close.

    Args:
        id: The provider's id, as the dispatcher knows it.
        base_url: The API root including its version, as the official SDK
            takes it: ``https://api.openai.com/v1``. A trailing slash is
            dropped; requests go to ``{base_url}/chat/completions``. A
            gateway's credentials in it (``https://user:password@proxy/v1``)
            are masked wherever the provider shows it (its repr, errors).
        api_key: Sent as ``Authorization: Bearer ...``. Never shown in a
            repr, a log line or an error message. It must be printable
            ASCII without spaces: a key with a trailing line break (as read
            from a file) is refused, not stripped: a key is sent exactly as
            given or not at all.
        model: The model to ask for.
        client: An ``httpx2.AsyncClient`` to share; the provider makes (and
            owns) one if not given. A legacy ``httpx.AsyncClient`` is
            refused with ``TypeError``.
        connect_timeout: Seconds to connect, or to wait for a pooled
            connection.
        read_timeout: Seconds to wait for the response to start, and then
            for each event of the stream: comments (``: keepalive``) do not
            count. A stalled stream ends as ``ProviderConnectionError``
            after this long without an event.
        extra_headers: More headers for every request (an organisation id,
            a proxy's routing header). Names must be HTTP tokens and values
            printable ASCII; a bad value is refused without being shown,
            since it may be a credential.
        on_rate_limit: A ``RateLimitReporter``, called on a 429, 503 or 529
            (and on a rate-limit or overloaded error in the stream) before
            the error is raised. Not needed through a dispatcher (the error
            carries what it needs, and an answer the dispatcher meters calls
            neither callback); else pass ``dispatcher.report_rate_limit``.
        on_rate_limits: A ``RateLimitObserver``, told the figures of every
            answer whose headers carry them, except those a dispatcher
            meters (``events()`` shows theirs). Not needed through a
            dispatcher; else pass ``dispatcher.observe_rate_limits``. Malformed headers are
            ignored, and logged once per header name. An observer that takes
            a ``model`` keyword, as ``observe_rate_limits`` does, is told
            ``model=`` too: providers count their limits per model.
    """

    def __init__(
        self,
        id: str = "openai",
        *,
        base_url: str,
        api_key: str,
        model: str,
        client: httpx2.AsyncClient | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        extra_headers: Mapping[str, str] | None = None,
        on_rate_limit: RateLimitReporter | None = None,
        on_rate_limits: RateLimitObserver | None = None,
    ) -> None:
        # Last, once every argument is known good: it may make a client.
        super().__init__(
            id,
            base_url=base_url,
            api_key=api_key,
            model=model,
            client=client,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            extra_headers=extra_headers,
            on_rate_limit=on_rate_limit,
            on_rate_limits=on_rate_limits,
            path="/chat/completions",
            key_header=("authorization", "Bearer "),
            headers={},
            body=functools.partial(request_body, model),
            decoder=_OpenAIDecoder,
            read_rate_limits=openai_rate_limits,
        )
