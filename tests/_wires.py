"""The two wire formats side by side, for the provider tests.

``test_providers.py`` runs every behaviour the two HTTP providers share
once per format, through the table here: ``OPENAI`` and ``ANTHROPIC`` say
how each format names its provider, its path, its key header and its
terminator, and build small streams of each kind in its shape. What is
truly one format's (its chunk shapes, tool-call fragments, thinking
blocks, stop reasons) is tested in ``test_providers_openai.py`` and
``test_providers_anthropic.py``, with the stream builders below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, final

import httpx2

from trio_dispatch.messages import ChatMessage, ChatRequest, StreamEvent, Usage
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Provider
    from trio_dispatch.testing import FakeLLMServer

HTTPProvider: TypeAlias = OpenAIProvider | AnthropicProvider

FIXTURES = Path(__file__).parent / "fixtures"
HELLO = ChatRequest([ChatMessage("user", "Hello")])
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


async def collect(
    provider: Provider, request: ChatRequest = HELLO
) -> list[StreamEvent]:
    async with provider.stream(request) as events:
        return [event async for event in events]


# -- OpenAI's stream -------------------------------------------------------------


def openai_sse(*chunks: object) -> str:
    """An OpenAI stream body: each chunk as JSON, or a raw string as it is."""
    lines = [c if isinstance(c, str) else json.dumps(c) for c in chunks]
    return "".join(f"data: {line}\n\n" for line in lines)


def openai_delta(
    content: str | None = None, finish: str | None = None, **fields: object
) -> dict[str, Any]:
    d: dict[str, object] = dict(fields)
    if content is not None:
        d["content"] = content
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


# -- Anthropic's stream ----------------------------------------------------------


def anthropic_sse(*events: dict[str, Any] | str) -> str:
    """An Anthropic stream body; a raw string is sent as the data as it is."""
    out = []
    for event in events:
        if isinstance(event, str):
            out.append(f"event: unknown\ndata: {event}\n\n")
        else:
            out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n")
    return "".join(out)


START = {
    "type": "message_start",
    "message": {"usage": {"input_tokens": 7, "output_tokens": 1}},
}
STOP = {"type": "message_stop"}


def block_start(index: int, **block: object) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, **delta: object) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str | None, output_tokens: int = 3) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


def anthropic_text_stream(*texts: str, stop_reason: str = "end_turn") -> str:
    return anthropic_sse(
        START,
        block_start(0, type="text", text=""),
        *[block_delta(0, type="text_delta", text=t) for t in texts],
        block_stop(0),
        message_delta(stop_reason),
        STOP,
    )


# -- the table -------------------------------------------------------------------


class Wire:
    """One wire format, as the shared provider tests see it."""

    #: The provider's default id, and the fake server's name for the format.
    name: ClassVar[str]
    provider_class: ClassVar[type[OpenAIProvider] | type[AnthropicProvider]]
    #: The key the fake server and every provider of these tests use.
    key: ClassVar[str]
    #: The model the fake server is asked for.
    model: ClassVar[str]
    #: The base URL of an in-memory provider (``replaying``, ``raising``).
    replay_base_url: ClassVar[str]
    #: The request's path on the wire.
    path: ClassVar[str]
    #: The header that carries the key.
    key_header: ClassVar[str]
    #: What ends a stream, as its error messages name it.
    terminator: ClassVar[str]
    #: How many events the fake server sends before the first text.
    preamble: ClassVar[int]
    #: What the streams built below send after ``Finish``.
    usage: ClassVar[tuple[StreamEvent, ...]]

    def __repr__(self) -> str:
        return self.name

    def base_url(self, server: FakeLLMServer) -> str:
        """The fake server's base URL for this format."""
        raise NotImplementedError

    def text_stream(
        self, *texts: str, finish: bool = True, terminator: bool = True
    ) -> str:
        """A stream of text deltas; without its finish, or its terminator."""
        raise NotImplementedError

    def tool_stream(self, call_id: str, name: str, arguments: str) -> str:
        """A whole stream of one tool call, its arguments in one piece."""
        raise NotImplementedError

    def error_event_stream(self, error_type: str, message: str) -> str:
        """A stream that starts, then sends an error event."""
        raise NotImplementedError

    def provider(self, **kwargs: Any) -> HTTPProvider:  # noqa: ANN401 (the constructor's keywords)
        """A provider of this format, ``kwargs`` over in-memory defaults."""
        options: dict[str, Any] = {
            "base_url": self.replay_base_url,
            "api_key": self.key,
            "model": "m",
        }
        options.update(kwargs)
        return self.provider_class(**options)

    def over(self, server: FakeLLMServer, **kwargs: Any) -> HTTPProvider:  # noqa: ANN401 (the constructor's keywords)
        """A provider that talks to ``server``."""
        options: dict[str, Any] = {
            "base_url": self.base_url(server),
            "model": self.model,
        }
        options.update(kwargs)
        return self.provider(**options)

    def replaying(
        self,
        body: bytes | str,
        status: int = 200,
        headers: dict[str, str] | None = None,
        on_rate_limit: Callable[[str, float | None], None] | None = None,
    ) -> HTTPProvider:
        """A provider whose every request is answered with ``body``, in memory."""
        content = body.encode() if isinstance(body, str) else body

        def handler(request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(
                status, headers=headers or SSE_HEADERS, content=content
            )

        return self.provider(
            client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
            on_rate_limit=on_rate_limit,
        )


@final
class _OpenAI(Wire):
    name = "openai"
    provider_class = OpenAIProvider
    key = "sk-test-KEY-7f3a9c1e5b-DO-NOT-LEAK"
    model = "gpt-test"
    replay_base_url = "https://api.test/v1"
    path = "/v1/chat/completions"
    key_header = "authorization"
    terminator = "[DONE]"
    preamble = 1  # the role chunk
    usage = ()

    def base_url(self, server: FakeLLMServer) -> str:
        return server.openai_base_url

    def text_stream(
        self, *texts: str, finish: bool = True, terminator: bool = True
    ) -> str:
        chunks: list[object] = [openai_delta(text) for text in texts]
        if finish:
            chunks.append(openai_delta(finish="stop"))
        if terminator:
            chunks.append("[DONE]")
        return openai_sse(*chunks)

    def tool_stream(self, call_id: str, name: str, arguments: str) -> str:
        call = {
            "index": 0,
            "id": call_id,
            "function": {"name": name, "arguments": arguments},
        }
        return openai_sse(
            openai_delta(tool_calls=[call]), openai_delta(finish="tool_calls"), "[DONE]"
        )

    def error_event_stream(self, error_type: str, message: str) -> str:
        return openai_sse({"error": {"message": message, "type": error_type}})


@final
class _Anthropic(Wire):
    name = "anthropic"
    provider_class = AnthropicProvider
    key = "sk-ant-test-KEY-0c4e8b2d6f-DO-NOT-LEAK"
    model = "claude-test"
    replay_base_url = "https://api.test"
    path = "/v1/messages"
    key_header = "x-api-key"
    terminator = "message_stop"
    preamble = 3  # message_start, ping, content_block_start
    usage = (Usage(7, 3),)

    def base_url(self, server: FakeLLMServer) -> str:
        return server.anthropic_base_url

    def text_stream(
        self, *texts: str, finish: bool = True, terminator: bool = True
    ) -> str:
        events = [
            START,
            block_start(0, type="text", text=""),
            *[block_delta(0, type="text_delta", text=text) for text in texts],
        ]
        if finish:
            events += [block_stop(0), message_delta("end_turn")]
        if terminator:
            events.append(STOP)
        return anthropic_sse(*events)

    def tool_stream(self, call_id: str, name: str, arguments: str) -> str:
        # A tool without parameters gets no input_json_delta at all.
        pieces = [block_delta(0, type="input_json_delta", partial_json=arguments)]
        return anthropic_sse(
            START,
            block_start(0, type="tool_use", id=call_id, name=name, input={}),
            *(pieces if arguments else []),
            block_stop(0),
            message_delta("tool_use"),
            STOP,
        )

    def error_event_stream(self, error_type: str, message: str) -> str:
        error = {"type": "error", "error": {"type": error_type, "message": message}}
        return anthropic_sse(START, error)


OPENAI: Wire = _OpenAI()
ANTHROPIC: Wire = _Anthropic()
WIRES = (OPENAI, ANTHROPIC)
