"""Conversations when things go wrong: retries, typed errors, cancellation.

Through the fake server on loopback (real time, small delays), except the
exact backoff timings and a tool whose cleanup fails, which play scripts in
memory (``ScriptedProvider``) in virtual time.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
import trio.testing

from trio_dispatch import (
    ConversationClosed,
    ConversationOptions,
    ProviderError,
    Tool,
    open_dispatcher,
)
from trio_dispatch.messages import ChatMessage, Usage
from trio_dispatch.providers import (
    AuthenticationError,
    BadRequest,
    ServerError,
)
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    Fault,
    ScriptedProvider,
)

from .._helpers import unknown_provider
from .._rigs import (
    echo,
    eventually,
    last_text,
    open_rig,
    quick,
    roles,
    tool,
    tools_then,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch._conversations._results import TurnResult
    from trio_dispatch.messages import ChatRequest
    from trio_dispatch.testing import FakeRequest

FINE = FakeReply(text="fine answer")
BROKEN_TEXT = "partial words that must not stay"


def fault_then_fine(fault: Fault) -> FakeScript:
    """The first request meets ``fault``, every later one is answered."""
    return FakeScript(replies=(FakeReply(text=BROKEN_TEXT, fault=fault),), default=FINE)


# -- retries over the wire ---------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault("server_error"), id="500"),
        pytest.param(Fault("unavailable"), id="503"),
        pytest.param(Fault("overloaded"), id="529"),
        pytest.param(Fault("rate_limit"), id="429"),
        pytest.param(Fault("disconnect", after_events=2), id="disconnect"),
        pytest.param(Fault("truncate", after_events=2), id="truncate"),
        pytest.param(Fault("malformed", after_events=2), id="malformed"),
        pytest.param(Fault("stream_error", after_events=2), id="stream-error"),
        pytest.param(Fault("stall", after_events=2), id="stall"),
    ],
)
async def test_a_retryable_failure_is_retried_and_leaves_no_trace_in_the_history(
    fault: Fault,
) -> None:
    async with open_rig(fault_then_fine(fault), read_timeout=0.2) as rig:
        conversation = rig.start()
        result = await conversation.ask("hello")
        assert result.text == "fine answer"
        assert (result.llm_calls, result.retries) == (2, 1)
        assert conversation.history == (
            ChatMessage("user", "hello"),
            ChatMessage("assistant", "fine answer"),
        )
        assert len(rig.server.requests) == 2
        await eventually(lambda: rig.in_flight() == 0)
        assert conversation.statistics().retries == 1


async def test_429_retry_after_pauses_the_provider_and_the_retry_waits_for_it() -> None:
    script = fault_then_fine(Fault("rate_limit", retry_after_ms=200))
    async with open_rig(script) as rig:
        conversation = rig.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.ask, "hello")
            await eventually(lambda: len(rig.server.requests) == 1)
            await eventually(
                lambda: rig.dispatcher.statistics().providers["openai"].paused
            )
            stats = rig.dispatcher.statistics().providers["openai"]
            assert stats.paused_until is not None
            first_sent = rig.server.requests[0].arrived_at
            assert first_sent + 0.2 <= stats.paused_until <= trio.current_time() + 0.2
        first, second = rig.server.requests
        assert second.arrived_at - first.arrived_at >= 0.2
        assert conversation.history[-1].content == "fine answer"


async def test_when_attempts_run_out_the_typed_error_reaches_the_caller() -> None:
    script = FakeScript(default=FakeReply(fault=Fault("server_error")))
    async with open_rig(script) as rig:
        conversation = rig.start(options=quick(max_attempts=3))
        with pytest.raises(ServerError) as caught:
            await conversation.ask("hello")
        assert caught.value.status_code == 500
        assert conversation.history == ()
        assert len(rig.server.requests) == 3
        stats = conversation.statistics()
        assert (stats.turns_failed, stats.llm_calls, stats.retries) == (1, 3, 2)
        await eventually(lambda: rig.in_flight() == 0)

        # The conversation, and the dispatcher, carry on.
        rig.server.set_script(echo())
        result = await conversation.ask("again")
        assert result.text == "re: again"
        assert roles(conversation.history) == ["user", "assistant"]
        assert conversation.statistics().turns_completed == 1


async def test_an_authentication_error_is_not_retried() -> None:
    async with open_rig(echo(), server_key="right", api_key="wrong") as rig:
        conversation = rig.start()
        with pytest.raises(AuthenticationError):
            await conversation.ask("hello")
        assert len(rig.server.requests) == 1
        assert conversation.history == ()
        assert conversation.statistics().retries == 0


async def test_a_failure_in_a_tool_loop_leaves_the_history_as_it_was() -> None:
    calls = (FakeToolCall("ping", {}, id="p"),)

    async def ping(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        return "pong"

    script = FakeScript(
        replies=(FakeReply(text="checking", tool_calls=calls),),
        default=FakeReply(text=BROKEN_TEXT, fault=Fault("disconnect", after_events=2)),
    )
    async with open_rig(script) as rig:
        conversation = rig.start(
            tools=[tool("ping", ping)], options=quick(max_attempts=2)
        )
        with pytest.raises(ProviderError):
            await conversation.ask("go")
        assert conversation.history == ()
        assert len(rig.server.requests) == 3
        # The tool round did complete, and went out with the retried call.
        sent = rig.server.requests[2].body["messages"]
        assert [message["role"] for message in sent] == ["user", "assistant", "tool"]


async def test_a_retry_in_a_tool_loop_completes_the_turn() -> None:
    calls = (FakeToolCall("ping", {}, id="p"),)

    async def ping(arguments: dict[str, Any]) -> str:
        await trio.lowlevel.checkpoint()
        return "pong"

    script = FakeScript(
        replies=(
            FakeReply(tool_calls=calls, text=""),
            FakeReply(fault=Fault("server_error")),
        ),
        default=FINE,
    )
    async with open_rig(script) as rig:
        conversation = rig.start(tools=[tool("ping", ping)])
        result = await conversation.ask("go")
    assert (result.llm_calls, result.retries, result.tool_calls) == (3, 1, 1)
    assert roles(conversation.history) == ["user", "assistant", "tool", "assistant"]


# -- cancellation ---------------------------------------------------------------------


async def test_a_question_cancelled_while_queued_never_starts() -> None:
    async with open_rig(echo(latency=0.1)) as rig:
        conversation = rig.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.ask, "first")
            await eventually(lambda: len(rig.server.requests) == 1)
            with trio.move_on_after(0.01) as scope:
                await conversation.ask("never")
            assert scope.cancelled_caught
            assert conversation.statistics().queued == 1  # skipped when reached
        await conversation.ask("third")
    assert [last_text(r) for r in rig.server.requests] == ["first", "third"]
    assert [m.content for m in conversation.history] == [
        "first",
        "re: first",
        "third",
        "re: third",
    ]
    stats = conversation.statistics()
    assert (stats.turns_completed, stats.turns_cancelled, stats.queued) == (2, 0, 0)


async def test_a_question_cancelled_while_waiting_for_a_slot_sends_nothing() -> None:
    async with open_rig(echo()) as rig:
        conversation = rig.start()
        async with rig.dispatcher.slot(rig.provider.id):  # a plug holds the only slot
            with trio.move_on_after(0.05) as scope:
                await conversation.ask("hello")
            assert scope.cancelled_caught
            await eventually(
                lambda: rig.dispatcher.statistics().providers["openai"].waiting == 0
            )
        stats = rig.dispatcher.statistics().providers["openai"]
        assert (stats.withdrawn_total, stats.granted_total) == (1, 1)
        assert rig.server.requests == []
        assert conversation.history == ()
        await eventually(lambda: conversation.statistics().turns_cancelled == 1)
        result = await conversation.ask("again")
        assert result.text == "re: again"


async def test_a_question_cancelled_while_streaming_closes_the_stream() -> None:
    slow = FakeReply(text="word " * 200, tokens_per_second=100)
    async with open_rig(FakeScript(default=slow)) as rig:
        conversation = rig.start()
        with trio.move_on_after(0.2) as scope:
            await conversation.ask("hello")
        assert scope.cancelled_caught
        await eventually(lambda: rig.server.statistics().client_disconnects == 1)
        await eventually(lambda: rig.in_flight() == 0)
        stats = rig.dispatcher.statistics().providers["openai"]
        assert (stats.granted_total, stats.released_total) == (1, 1)
        assert conversation.history == ()


async def test_a_question_cancelled_while_tools_run_leaves_no_half_tool_call() -> None:
    started = trio.Event()

    async def forever(arguments: dict[str, Any]) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    calls = (FakeToolCall("forever", {}, id="f"),)
    async with open_rig(tools_then(calls)) as rig:
        conversation = rig.start(tools=[tool("forever", forever)])
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                with trio.CancelScope() as scope:
                    ask_scope.append(scope)
                    await conversation.ask("go")

            ask_scope: list[trio.CancelScope] = []
            nursery.start_soon(ask)
            await started.wait()
            assert rig.in_flight() == 0  # the slot is not held while tools run
            ask_scope[0].cancel()
        await eventually(lambda: conversation.statistics().turns_cancelled == 1)
        assert conversation.history == ()
        assert len(rig.server.requests) == 1


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


# -- backoff, exactly, in virtual time ------------------------------------------------


def _errors(n: int) -> tuple[FakeReply, ...]:
    return (FakeReply(fault=Fault("server_error")),) * n


def arrivals(times: list[float]) -> Callable[[FakeRequest], None]:
    """A script's ``choose`` that notes when each request arrives, in ``times``."""

    def choose(request: FakeRequest) -> None:
        times.append(request.arrived_at)  # and leaves the answer to the replies

    return choose


async def _gaps(seed: int, autojump_clock: trio.testing.MockClock) -> list[float]:
    times: list[float] = []
    script = FakeScript(
        choose=arrivals(times),
        replies=_errors(5),
        default=FakeReply(text="ok", input_tokens=1, output_tokens=1),
    )
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider,
            options=ConversationOptions(
                max_attempts=6, retry_backoff=1.0, max_backoff=4.0, seed=seed
            ),
        )
        result = await conversation.ask("hello")
    assert (result.text, result.retries, result.llm_calls) == ("ok", 5, 6)
    assert result.usage == Usage(1, 1)
    return [later - earlier for earlier, later in itertools.pairwise(times)]


async def test_backoff_doubles_up_to_its_cap_with_jitter_from_the_seed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gaps = await _gaps(7, autojump_clock)
    ceilings = [1.0, 2.0, 4.0, 4.0, 4.0]
    for gap, ceiling in zip(gaps, ceilings, strict=True):
        assert ceiling / 2 <= gap <= ceiling
    assert await _gaps(7, autojump_clock) == pytest.approx(gaps)
    assert await _gaps(8, autojump_clock) != gaps


async def test_a_non_retryable_error_is_raised_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fault = Fault("stream_error", error_type="invalid_request_error", message="no")
    provider = ScriptedProvider(FakeScript(default=FakeReply(fault=fault)), id="memory")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(provider)
        with pytest.raises(
            BadRequest, match=r"^memory: invalid_request_error in the stream: no$"
        ):
            await conversation.ask("hello")
    assert len(provider.requests) == 1


@pytest.mark.parametrize("limited", [True, False])
async def test_retry_after_is_honoured_once_limited_or_not(
    limited: bool, autojump_clock: trio.testing.MockClock
) -> None:
    times: list[float] = []
    limited_reply = FakeReply(fault=Fault("rate_limit", retry_after=10.0))
    script = FakeScript(choose=arrivals(times), replies=(limited_reply,))
    provider = ScriptedProvider(script, id="memory")
    async with open_dispatcher({"memory": 1} if limited else {}) as dispatcher:
        with contextlib.nullcontext() if limited else unknown_provider("memory"):
            conversation = dispatcher.start_conversation(
                provider, options=ConversationOptions(retry_backoff=0.5)
            )
        result: TurnResult = await conversation.ask("hello")
    first, second = times
    # The pause (limited) or the backoff (unlimited) waits exactly the
    # Retry-After, not the Retry-After plus a backoff.
    assert second - first == 10.0
    assert result.retries == 1


# -- bugs are not errors ----------------------------------------------------------------


@attrs.define
class BuggyProvider:
    """A provider whose code is broken: not a ProviderError, a bug."""

    id: str = "memory"

    def stream(self, request: ChatRequest) -> Any:  # noqa: ANN401 (never returns)
        raise RuntimeError("bug in the provider")


async def test_a_bug_stops_the_actor_and_the_dispatcher_and_is_not_lost() -> None:
    with pytest.raises(ExceptionGroup) as caught:
        async with open_dispatcher({"memory": 1}) as dispatcher:
            conversation = dispatcher.start_conversation(BuggyProvider())
            await conversation.ask("hello")
    assert caught.group_contains(RuntimeError, match=r"^bug in the provider$")
    assert caught.group_contains(
        ConversationClosed, match=r"^conversation '.*' stopped: its actor failed$"
    )
    assert conversation.closed


async def test_a_bug_while_the_body_waits_elsewhere_is_not_lost() -> None:
    raised: BaseException | None = None
    async with trio.open_nursery() as outside:
        try:
            async with open_dispatcher({"memory": 1}) as dispatcher:
                conversation = dispatcher.start_conversation(BuggyProvider())

                async def ask() -> None:
                    with pytest.raises(ConversationClosed):
                        await conversation.ask("hello")

                outside.start_soon(ask)
                await trio.sleep_forever()
        except BaseException as exc:  # what escapes is the point
            raised = exc
    assert isinstance(raised, BaseExceptionGroup)
    assert raised.subgroup(RuntimeError) is not None
