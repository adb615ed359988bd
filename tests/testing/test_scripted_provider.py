"""ScriptedProvider: the fake server's script, played in memory.

First the promise that lets a test switch between sockets and memory: the
same scripts, through ``ScriptedProvider`` and through our HTTP providers
against the fake server, give the same events and the same errors. Then
what only memory can do: exact times under ``autojump_clock``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING, Any, get_args

import attrs
import pytest
import trio
import trio.testing

from trio_dispatch import ProviderError, Tool, open_dispatcher
from trio_dispatch.messages import (
    ChatMessage,
    ChatRequest,
    Finish,
    TextDelta,
    ToolCall,
    Usage,
)
from trio_dispatch.providers import (
    AnthropicProvider,
    MalformedStream,
    OpenAIProvider,
    Overloaded,
    ProviderConnectionError,
    RateLimited,
    RequestFailed,
    StreamInterrupted,
)
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    Fault,
    FaultKind,
    ScriptedProvider,
    open_fake_llm_server,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Provider
    from trio_dispatch.messages import StreamEvent
    from trio_dispatch.testing import FakeRequest, WireFormat

HELLO = ChatRequest([ChatMessage("user", "Hello")])
READ_TIMEOUT = 0.3


async def play(
    provider: Provider, request: ChatRequest = HELLO
) -> tuple[list[StreamEvent], ProviderError | None]:
    """Every event of one answer, and the error that ended it, if any."""
    events: list[StreamEvent] = []
    try:
        async with provider.stream(request) as stream:
            async for event in stream:
                events.append(event)
    except ProviderError as error:
        return events, error
    return events, None


def described(error: ProviderError | None) -> tuple[object, ...] | None:
    """What must match between two errors, their messages aside."""
    if error is None:
        return None
    return (
        type(error),
        error.provider,
        error.status_code,
        getattr(error, "retry_after", None),
    )


# -- the same as over the wire ------------------------------------------------

CALLS = (
    FakeToolCall("f", {"x": 1, "y": ["z"]}, id="c1"),
    FakeToolCall("g"),
    FakeToolCall("h", raw_arguments='{"broken": '),
)
WORDS = FakeReply(text="one two three four", input_tokens=5)
SCRIPTS = {
    "text": FakeReply(text="Hello there", input_tokens=3),
    "reasoning and tools": FakeReply(
        text="let me see",
        reasoning="hmm, tools",
        tool_calls=CALLS,
        input_tokens=9,
        cache_read_tokens=4,
        cache_write_tokens=2,
    ),
    "length": FakeReply(text="cut short", finish="length", input_tokens=1),
    "429": FakeReply(fault=Fault("rate_limit", retry_after=2.5)),
    "429 in ms": FakeReply(fault=Fault("rate_limit", retry_after_ms=1234.5678)),
    "500": FakeReply(fault=Fault("server_error", message="it broke")),
    "503": FakeReply(fault=Fault("unavailable", retry_after=1)),
    "529": FakeReply(fault=Fault("overloaded")),
    "disconnect": attrs.evolve(WORDS, fault=Fault("disconnect", after_events=3)),
    "truncate": attrs.evolve(WORDS, fault=Fault("truncate")),
    "truncate early": attrs.evolve(WORDS, fault=Fault("truncate", after_events=2)),
    "malformed": attrs.evolve(WORDS, fault=Fault("malformed", after_events=2)),
    "stall": attrs.evolve(WORDS, fault=Fault("stall", after_events=3)),
    "rate limit event": attrs.evolve(
        WORDS,
        fault=Fault("stream_error", after_events=2, error_type="rate_limit_error"),
    ),
    "error event": attrs.evolve(
        WORDS, fault=Fault("stream_error", error_type="api_error", message="oops")
    ),
    "call without an id": FakeReply(
        text="a", tool_calls=(FakeToolCall("f", id=""),), input_tokens=1
    ),
}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("reply", SCRIPTS.values(), ids=SCRIPTS.keys())
async def test_the_same_script_gives_the_same_events_and_errors_as_the_wire(
    wire: WireFormat, reply: FakeReply
) -> None:
    # Two requests each: the second shows the made-up ids go on the same way.
    script = FakeScript(default=reply)
    reports: dict[str, list[tuple[str, float | None]]] = {"http": [], "memory": []}
    async with open_fake_llm_server(script) as server:
        http: OpenAIProvider | AnthropicProvider
        options: dict[str, Any] = {
            "api_key": "sk-scripted-test",
            "model": "m",
            "read_timeout": READ_TIMEOUT,
            "on_rate_limit": lambda *report: reports["http"].append(report),
        }
        if wire == "openai":
            http = OpenAIProvider("p", base_url=server.openai_base_url, **options)
        else:
            http = AnthropicProvider("p", base_url=server.anthropic_base_url, **options)
        async with http:
            over_the_wire = [await play(http), await play(http)]
    memory = ScriptedProvider(
        script,
        id="p",
        wire=wire,
        read_timeout=READ_TIMEOUT,
        on_rate_limit=lambda *report: reports["memory"].append(report),
    )
    in_memory = [await play(memory), await play(memory)]

    for (wire_events, wire_error), (events, error) in zip(
        over_the_wire, in_memory, strict=True
    ):
        assert events == wire_events
        assert described(error) == described(wire_error)
        if error is not None:
            assert wire_error is not None
            # The same words, except what only the wire can say (a JSON
            # parser's complaint, the host).
            assert str(wire_error).startswith(str(error))
    assert reports["memory"] == reports["http"]
    assert len(memory.requests) == 2


def test_every_fault_kind_is_compared_with_the_wire() -> None:
    compared = {reply.fault.kind for reply in SCRIPTS.values() if reply.fault}
    assert compared == set(get_args(FaultKind))


# -- exact, in virtual time ---------------------------------------------------------


async def timed(provider: ScriptedProvider) -> list[tuple[float, StreamEvent]]:
    """Each event of one answer, with when it came."""
    async with provider.stream(HELLO) as events:
        return [(trio.current_time(), event) async for event in events]


async def test_latency_and_pace_are_exact_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(
        text="one two three",
        latency=2.0,
        time_to_first_token=0.5,
        tokens_per_second=4,
        input_tokens=1,
    )
    provider = ScriptedProvider(FakeScript(default=reply))
    assert await timed(provider) == [
        (2.5, TextDelta("one")),
        (2.75, TextDelta(" two")),
        (3.0, TextDelta(" three")),
        (3.0, Finish("stop")),
        (3.0, Usage(1, 3)),
    ]


async def test_a_status_fault_is_raised_on_entry_after_the_latency(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(latency=1.5, fault=Fault("overloaded", retry_after=4))
    reports: list[tuple[str, float | None]] = []
    provider = ScriptedProvider(
        FakeScript(default=reply),
        wire="anthropic",
        on_rate_limit=lambda *report: reports.append(report),
    )
    stream = provider.stream(HELLO)
    with pytest.raises(
        Overloaded,
        match=r"^scripted: HTTP 529 overloaded_error: Overloaded \(retry after 4 s\)$",
    ):
        await stream.__aenter__()
    assert trio.current_time() == 1.5
    assert reports == [("scripted", 4.0)]


async def test_a_rate_limit_in_the_stream_is_reported_before_it_is_raised(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reports: list[tuple[str, float | None]] = []

    def report(provider: str, retry_after: float | None) -> None:
        reports.append((provider, retry_after))

    fault = Fault("stream_error", after_events=2, error_type="rate_limit_error")
    provider = ScriptedProvider(
        FakeScript(default=FakeReply(text="a b c", fault=fault)),
        id="memory",
        on_rate_limit=report,
    )
    events, error = await play(provider)
    assert events == [TextDelta("a")]
    assert isinstance(error, RateLimited)
    assert str(error) == (
        "memory: rate_limit_error in the stream: the fake server failed mid-stream"
    )
    assert reports == [("memory", None)]


@pytest.mark.parametrize(
    ("reply", "message", "at"),
    [
        pytest.param(
            FakeReply(latency=7.0),
            r"^scripted: no response within 5 s$",
            5.0,
            id="latency",
        ),
        pytest.param(
            FakeReply(text="a b", time_to_first_token=6.0),
            r"^scripted: the stream stalled: no data for 5 s$",
            5.0,
            id="first token",
        ),
        pytest.param(
            FakeReply(text="a b", tokens_per_second=0.1),
            r"^scripted: the stream stalled: no data for 5 s$",
            5.0,
            id="pace",
        ),
        pytest.param(
            FakeReply(text="a b", latency=1, fault=Fault("stall", after_events=2)),
            r"^scripted: the stream stalled: no data for 5 s$",
            6.0,
            id="stall",
        ),
    ],
)
async def test_silence_past_the_read_timeout_fails_when_it_would_over_http(
    reply: FakeReply,
    message: str,
    at: float,
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(FakeScript(default=reply), read_timeout=5)
    with pytest.raises(ProviderConnectionError, match=message):
        async with provider.stream(HELLO) as events:
            async for _ in events:
                pass
    assert trio.current_time() == at
    stats = provider.statistics()
    assert (stats.in_flight, stats.completed, stats.client_disconnects) == (0, 0, 1)


async def test_each_fault_ends_the_stream_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    expected: dict[str, tuple[type[ProviderError], str]] = {
        "disconnect": (
            StreamInterrupted,
            "scripted: the connection dropped in the middle of the stream",
        ),
        "truncate": (StreamInterrupted, "scripted: the stream ended without [DONE]"),
        "malformed": (MalformedStream, "scripted: an event's data is not valid JSON"),
        "stream_error": (
            Overloaded,
            "scripted: overloaded_error in the stream: the fake server failed"
            " mid-stream",
        ),
    }
    for kind, (error_type, message) in expected.items():
        fault = Fault(kind, after_events=1)  # type: ignore[arg-type]  # a FaultKind
        provider = ScriptedProvider(FakeScript(default=FakeReply(fault=fault)))
        events, error = await play(provider)
        assert events == [], kind
        assert type(error) is error_type, kind
        assert str(error) == message, kind
        assert provider.statistics().completed == 1, kind


async def test_requests_peak_concurrency_and_statistics_are_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        default=FakeReply(text="slow", latency=1),
        replies=(FakeReply(fault=Fault("rate_limit")),),
    )
    provider = ScriptedProvider(script)
    requests = [ChatRequest([ChatMessage("user", str(n))]) for n in range(4)]
    async with trio.open_nursery() as nursery:
        for request in requests:
            nursery.start_soon(play, provider, request)
        await trio.testing.wait_all_tasks_blocked()
        assert provider.statistics().in_flight == 3  # the 429 is answered at once

    async with provider.stream(HELLO) as events:
        await events.__anext__()  # leaves before the end

    # trio starts the four in an order of its own.
    *together, last = provider.requests
    assert sorted(together, key=lambda r: r.messages[0].content) == requests
    assert last == HELLO
    stats = provider.statistics()
    assert stats.requests_total == 5
    assert (stats.in_flight, stats.peak_in_flight) == (0, 3)
    assert stats.responses_by_status == {429: 1, 200: 4}
    assert (stats.completed, stats.client_disconnects) == (3, 1)


async def test_choose_sees_the_chat_request_then_replies_then_the_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[FakeRequest] = []

    def choose(request: FakeRequest) -> FakeReply | None:
        seen.append(request)
        assert request.chat is not None
        if request.chat.messages[-1].content == "special":
            return FakeReply(text="chosen")
        return None

    script = FakeScript(
        choose=choose,
        replies=(FakeReply(text="first"), FakeReply(text="second")),
        default=FakeReply(text="default"),
    )
    provider = ScriptedProvider(script, wire="anthropic")
    texts = []
    for content in ["a", "special", "b", "c"]:
        request = ChatRequest([ChatMessage("user", content)])
        events, _ = await play(provider, request)
        texts.append("".join(e.text for e in events if isinstance(e, TextDelta)))
    assert texts == ["first", "chosen", "second", "default"]
    assert [request.chat for request in seen] == provider.requests
    assert {(r.format, r.path, r.body, r.authenticated) for r in seen} == {
        ("anthropic", "/v1/messages", None, True)
    }

    provider.set_script(FakeScript(replies=(FakeReply(text="again"),)))
    events, _ = await play(provider)
    assert events[0] == TextDelta("again")


async def test_nothing_is_asked_before_the_stream_is_entered() -> None:
    provider = ScriptedProvider()
    provider.stream(HELLO)
    await trio.lowlevel.checkpoint()
    assert provider.requests == []
    assert provider.statistics().requests_total == 0


async def test_a_stream_cancelled_in_its_latency_gives_its_place_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(FakeScript(default=FakeReply(latency=10)))
    with trio.move_on_after(3):
        await play(provider)
    assert trio.current_time() == 3
    stats = provider.statistics()
    assert (stats.requests_total, stats.in_flight, stats.client_disconnects) == (
        1,
        0,
        1,
    )
    assert stats.responses_by_status == {}


# -- misuse and bad arguments ----------------------------------------------------------


async def test_a_stream_is_entered_once_and_iterated_inside_its_block() -> None:
    provider = ScriptedProvider()
    stream = provider.stream(HELLO)
    async with stream as events:
        pass
    with pytest.raises(
        RuntimeError, match=r"^iterate a provider stream inside its async with block$"
    ):
        await events.__anext__()
    with pytest.raises(
        RuntimeError, match=r"^a provider stream can be entered only once$"
    ):
        await stream.__aenter__()


async def test_a_closed_provider_refuses_streams_as_a_closed_client_does() -> None:
    async with ScriptedProvider(id="memory") as provider:
        await play(provider)
    with pytest.raises(RequestFailed, match=r"^memory: the provider is closed$"):
        async with provider.stream(HELLO):
            pass  # pragma: no cover (refused on entry)
    assert len(provider.requests) == 1


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ScriptedProvider(FakeReply()),  # type: ignore[arg-type]
            TypeError,
            r"^script must be a FakeScript, got FakeReply\(",
        ),
        (
            lambda: ScriptedProvider(id=7),  # type: ignore[arg-type]
            TypeError,
            r"^id must be a non-empty string, got 7$",
        ),
        (
            lambda: ScriptedProvider(id=""),
            ValueError,
            r"^id must be a non-empty string, got ''$",
        ),
        (
            lambda: ScriptedProvider(wire="grpc"),  # type: ignore[arg-type]
            ValueError,
            r"^wire must be 'openai' or 'anthropic', got 'grpc'$",
        ),
        (
            lambda: ScriptedProvider(read_timeout=0),
            ValueError,
            r"^read_timeout must be a positive number of seconds, got 0$",
        ),
        (
            lambda: ScriptedProvider(read_timeout="5"),  # type: ignore[arg-type]
            TypeError,
            r"^read_timeout must be a positive number of seconds, got '5'$",
        ),
        (
            lambda: ScriptedProvider(on_rate_limit=3),  # type: ignore[arg-type]
            TypeError,
            r"^on_rate_limit must be callable$",
        ),
        (
            lambda: ScriptedProvider().stream("hello"),  # type: ignore[arg-type]
            TypeError,
            r"^request must be a ChatRequest, got 'hello'$",
        ),
        (
            lambda: ScriptedProvider().set_script(None),  # type: ignore[arg-type]
            TypeError,
            r"^script must be a FakeScript, got None$",
        ),
    ],
)
def test_bad_arguments_are_refused_at_once(
    make: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


def test_repr_shows_the_id_and_the_wire() -> None:
    provider = ScriptedProvider(id="memory", wire="anthropic")
    assert repr(provider) == "ScriptedProvider(id='memory', wire='anthropic')"
    assert (provider.id, provider.wire) == ("memory", "anthropic")
    assert provider.script == FakeScript()


def test_playing_a_script_loads_no_http_library() -> None:
    code = (
        "import sys, trio\n"
        "from trio_dispatch.messages import ChatMessage, ChatRequest\n"
        "from trio_dispatch.testing import FakeReply, FakeScript, ScriptedProvider\n"
        "async def main():\n"
        "    provider = ScriptedProvider(FakeScript(default=FakeReply(text='hi')))\n"
        "    request = ChatRequest([ChatMessage('user', 'hello')])\n"
        "    async with provider.stream(request) as events:\n"
        "        assert [event async for event in events]\n"
        "trio.run(main)\n"
        "heavy = {'httpx', 'httpx2', 'httpx_sse', 'httpcore', 'httpcore2', 'hypercorn', 'h11', 'anyio'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout == "[]\n"


# -- a conversation, in virtual time ---------------------------------------------------------


async def add(arguments: dict[str, Any]) -> str:
    """A tool that takes two seconds."""
    await trio.sleep(2)
    return str(arguments["a"] + arguments["b"])


ADD = Tool(
    name="add",
    description="adds",
    parameters={"type": "object", "properties": {}},
    run=add,
)


async def test_a_conversation_with_tools_and_a_rate_limit_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def model(request: FakeRequest) -> FakeReply | None:
        assert request.chat is not None
        last = request.chat.messages[-1]
        if last.role == "tool":
            return FakeReply(
                text=f"it is {last.content}",
                latency=1,
                time_to_first_token=0.5,
                input_tokens=20,
                output_tokens=3,
            )
        return None  # the replies decide: a 429 first, then the tool call

    call = FakeToolCall("add", {"a": 2, "b": 3}, id="c1")
    script = FakeScript(
        choose=model,
        replies=(
            FakeReply(fault=Fault("rate_limit", retry_after=4), latency=0.25),
            FakeReply(
                text="", tool_calls=(call,), latency=1, input_tokens=10, output_tokens=2
            ),
        ),
    )
    async with open_dispatcher({"memory": 1}) as dispatcher:
        provider = ScriptedProvider(
            script, id="memory", on_rate_limit=dispatcher.report_rate_limit
        )
        conversation = dispatcher.start_conversation(provider, tools=[ADD])
        result = await conversation.ask("what is 2 + 3?")

    # 0.25 to the 429, which pauses the provider 4 s; 1 to the tool call,
    # 2 in the tool, 1 + 0.5 to the answer.
    assert result.text == "it is 5"
    assert (result.started_at, result.finished_at) == (0.0, 8.75)
    assert (result.llm_calls, result.retries, result.tool_calls) == (3, 1, 1)
    assert result.usage == Usage(30, 5)
    assert [m.role for m in conversation.history] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert conversation.history[1].tool_calls == (
        ToolCall("c1", "add", {"a": 2, "b": 3}, '{"a": 2, "b": 3}'),
    )
    assert [len(r.messages) for r in provider.requests] == [1, 1, 3]
    assert provider.statistics().peak_in_flight == 1
