"""Regression tests: hostile wire input, key redaction, and a turn's priority.

Each guards a bug found in review: JSON nested deep enough to overflow the
parser's recursion, API keys cut in half by an excerpt before redaction saw
them, a dispatcher closing while tools run, and a compaction call queued
behind its own turn.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import (
    Conversation,
    ConversationOptions,
    DispatcherClosed,
    ProviderError,
    Tool,
    open_dispatcher,
)
from trio_dispatch._wire._anthropic import AnthropicDecoder
from trio_dispatch._wire._openai import OpenAIDecoder
from trio_dispatch._wire._sse import ServerSentEvent
from trio_dispatch.lowlevel import Plumbing
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    StreamEvent,
    ToolCall,
)
from trio_dispatch.providers import (
    AnthropicProvider,
    MalformedStream,
    OpenAIProvider,
    ProviderConnectionError,
    StreamInterrupted,
)
from trio_dispatch.testing import FakeReply, FakeScript, FakeToolCall, ScriptedProvider

from .._helpers import chain

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

KEY = "sk-ant-api03-SECRETSECRETSECRETSECRET0123456789"
DEEP = "[" * 100_000
HI = ChatRequest([ChatMessage("user", "hi")])


def sse(payload: object) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def openai_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=body
    )


# ------------------------------------------------------------------ deep JSON


@pytest.mark.parametrize(
    "decoder",
    [OpenAIDecoder("openai"), AnthropicDecoder("anthropic")],
    ids=["openai", "anthropic"],
)
def test_deeply_nested_event_data_is_a_malformed_stream(
    decoder: OpenAIDecoder | AnthropicDecoder,
) -> None:
    with pytest.raises(MalformedStream):
        decoder.feed(ServerSentEvent(event="ping", data=DEEP))


async def test_deeply_nested_tool_arguments_go_back_to_the_model_as_an_error() -> None:
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    call = {"index": 0, "id": "call_1", "type": "function"}
    first = b"".join(
        [
            openai_chunk({"role": "assistant", "content": ""}),
            openai_chunk(
                {"tool_calls": [{**call, "function": {"name": "t", "arguments": deep}}]}
            ),
            openai_chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    )
    second = (
        openai_chunk({"content": "done"})
        + openai_chunk({}, "stop")
        + b"data: [DONE]\n\n"
    )
    bodies = iter([first, second])

    async def run(arguments: dict[str, Any]) -> str:
        return "ran"  # pragma: no cover (the arguments never parse)

    tool = Tool(name="t", description="", parameters={"type": "object"}, run=run)
    transport = httpx2.MockTransport(lambda request: sse_response(next(bodies)))
    async with httpx2.AsyncClient(transport=transport) as client:
        provider = OpenAIProvider(
            base_url="http://x/v1", api_key="k", model="m", client=client
        )
        async with open_dispatcher({"openai": 1}) as dispatcher:
            conversation = dispatcher.start_conversation(provider, tools=[tool])
            result = await conversation.ask("go")
    assert result.text == "done"
    assert conversation.history[2].role == "tool"
    assert conversation.history[2].content.startswith("error: ")


# ------------------------------------------------------------------ redaction


async def test_a_status_error_never_holds_part_of_the_key() -> None:
    message = "x" * (497 - len(KEY) + 4) + KEY  # the key straddles a 500-character cut

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = {"error": {"message": message, "type": "invalid_request_error"}}
        return httpx2.Response(400, json=body)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=KEY, model="m", client=client
        )
        with pytest.raises(ProviderError) as info:
            async with provider.stream(HI):
                pass  # pragma: no cover
    assert KEY[:12] not in str(info.value)


async def test_a_malformed_event_excerpt_never_holds_part_of_the_key() -> None:
    body = b"data: " + ("x" * 40 + KEY + "y" * 30).encode() + b"\n\n"
    transport = httpx2.MockTransport(lambda request: sse_response(body))
    async with httpx2.AsyncClient(transport=transport) as client:
        provider = OpenAIProvider(
            base_url="http://x/v1", api_key=KEY, model="m", client=client
        )
        with pytest.raises(MalformedStream) as info:
            async with provider.stream(HI) as events:
                async for _ in events:
                    pass  # pragma: no cover
    assert KEY[:12] not in str(info.value)


class BreaksMidStream(httpx2.AsyncByteStream):
    """A body that sends one event, then loses the connection."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'event: ping\ndata: {"type": "ping"}\n\n'
        raise httpx2.ReadError("connection reset")


async def test_a_failed_connection_carries_no_httpx_error_holding_the_key() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=request)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=KEY, model="m", client=client
        )
        with pytest.raises(ProviderConnectionError) as info:
            async with provider.stream(HI):
                pass  # pragma: no cover
    # httpx2's exceptions hold the request, whose x-api-key header is the key.
    assert not [e for e in chain(info.value) if isinstance(e, httpx2.HTTPError)]


async def test_a_dropped_stream_carries_no_httpx_error_holding_the_key() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, stream=BreaksMidStream())

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as client:
        provider = AnthropicProvider(
            base_url="http://x", api_key=KEY, model="m", client=client
        )
        with pytest.raises(StreamInterrupted) as info:
            async with provider.stream(HI) as events:
                async for _ in events:
                    pass  # pragma: no cover
    assert not [e for e in chain(info.value) if isinstance(e, httpx2.HTTPError)]


# ------------------------------------------------------------------ conversations


@pytest.mark.parametrize("tools", [1, 2])
async def test_closing_the_dispatcher_while_tools_run_gives_dispatcher_closed(
    tools: int,
) -> None:
    calls = tuple(FakeToolCall("slow", {}, id=f"c{i}") for i in range(tools))

    async def slow(arguments: dict[str, Any]) -> str:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    tool = Tool(name="slow", description="", parameters={"type": "object"}, run=slow)
    caught: list[BaseException] = []

    async def ask(conversation: Conversation) -> None:
        try:
            await conversation.ask("hi")
        except DispatcherClosed as exc:
            caught.append(exc)

    async with (
        trio.open_nursery() as outside,
        open_dispatcher({"memory": 1}) as dispatcher,
    ):
        reply = FakeReply(text="", tool_calls=calls)
        provider = ScriptedProvider(FakeScript(default=reply), id="memory")
        conversation = dispatcher.start_conversation(provider, tools=[tool])
        outside.start_soon(ask, conversation)
        await trio.testing.wait_all_tasks_blocked()
        assert conversation.statistics().tool_calls == tools
    assert [type(exc) for exc in caught] == [DispatcherClosed]


class TickingClock(trio.abc.Clock):
    """Moves a microsecond at every reading, as a real clock does between two."""

    def __init__(self) -> None:
        self.now = 0.0

    def start_clock(self) -> None:
        """Nothing to start."""

    def current_time(self) -> float:
        self.now += 1e-6
        return self.now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return max(0.0, deadline - self.now)


@pytest.fixture
def ticking_clock() -> TickingClock:
    """pytest-trio runs the test on any Clock a fixture gives it."""
    return TickingClock()


@pytest.mark.usefixtures("ticking_clock")
async def test_a_compaction_call_carries_its_turns_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float | None] = []
    slot = Plumbing.slot

    def recording(self: Plumbing, provider: str, **options: Any) -> Any:  # noqa: ANN401 (passes through)
        # What the slot takes, given or from the current turn: a
        # conversation takes its slots through the dispatcher's plumbing.
        taken = slot(self, provider, **options)
        seen.append(taken.started_at)
        return taken

    monkeypatch.setattr(Plumbing, "slot", recording)
    provider = ScriptedProvider(
        FakeScript(default=FakeReply(text="some words")), id="memory"
    )
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, options=ConversationOptions(context_budget=1, keep_recent=0)
        )
        await conversation.ask("first question")
        seen.clear()
        result = await conversation.ask("second question")
    assert conversation.statistics().compactions == 1
    # The summary call, then the answer: both with the turn's start.
    assert seen == [result.started_at, result.started_at]


# ------------------------------------------------------------------ tool schemas


async def _never(arguments: dict[str, Any]) -> str:
    raise AssertionError  # pragma: no cover


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"type": "object", "properties": {"a": {"type": 5}}},
            r"^tool parameters: \$\.properties\.a\.type must be a type name or a list of them, got 5$",
        ),
        (
            {"type": "object", "properties": {"a": {"type": [["string"]]}}},
            r"^tool parameters: \$\.properties\.a\.type must be a type name or a list of them, got \[\['string'\]\]$",
        ),
        (
            {"type": "object", "required": [["a"]]},
            r"^tool parameters: \$\.required must be a list of names, got \[\['a'\]\]$",
        ),
        (
            {"type": "object", "properties": {"a": {"items": {"enum": "x"}}}},
            r"^tool parameters: \$\.properties\.a\.items\.enum must be a list, got 'x'$",
        ),
        (
            {"type": "object", "properties": {"a": {"enum": {1, 2}}}},
            r"^tool parameters must be JSON: Object of type set is not JSON serializable$",
        ),
        (
            {"type": "object", "properties": {"a": {"maximum": math.nan}}},
            r"^tool parameters must be JSON: Out of range float values are not JSON compliant(: nan)?$",
        ),
    ],
)
def test_a_tool_schema_the_checker_cannot_use_is_refused_when_the_tool_is_made(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Tool(name="t", description="", parameters=parameters, run=_never)


# ------------------------------------------------------------------ anthropic blocks


def _anthropic_events(*events: tuple[str, dict[str, Any]]) -> list[ServerSentEvent]:
    return [ServerSentEvent(event=name, data=json.dumps(data)) for name, data in events]


TOOL_BLOCK = (
    "content_block_start",
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "t",
            "input": {},
        },
    },
)
STOP_BLOCK = ("content_block_stop", {"type": "content_block_stop", "index": 0})


def test_a_content_block_stopped_twice_is_malformed_not_two_tool_calls() -> None:
    decoder = AnthropicDecoder("anthropic")
    events: list[StreamEvent] = []
    with pytest.raises(MalformedStream, match=r"content block 0 stopped twice"):
        for event in _anthropic_events(TOOL_BLOCK, STOP_BLOCK, STOP_BLOCK):
            events.extend(decoder.feed(event))
    assert [type(e) for e in events] == [ToolCall]


def test_a_delta_after_its_blocks_stop_is_malformed() -> None:
    decoder = AnthropicDecoder("anthropic")
    late = (
        "content_block_delta",
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
    )
    with pytest.raises(
        MalformedStream, match=r"a content_block_delta for block 0 after its stop"
    ):
        for event in _anthropic_events(TOOL_BLOCK, STOP_BLOCK, late):
            decoder.feed(event)


# ------------------------------------------------------------------ tools cancelled


async def test_a_tool_whose_cleanup_fails_as_its_turn_is_cancelled_leaves_the_conversation_usable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fragile(arguments: dict[str, Any]) -> str:
        async def cleanup_fails() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cleanup_fails)
            await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    tool = Tool(
        name="fragile", description="", parameters={"type": "object"}, run=fragile
    )
    call = FakeToolCall("fragile", {}, id="c1")
    script = FakeScript(
        replies=(FakeReply(text="", tool_calls=(call,)),),
        default=FakeReply(text="fine"),
    )
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider, tools=[tool])
        with trio.move_on_after(1) as scope:
            await conversation.ask("first")
        assert scope.cancelled_caught
        # The group of ValueError and Cancelled did not stop the actor.
        result = await conversation.ask("second")
        assert not conversation.closed
    assert result.text == "fine"
