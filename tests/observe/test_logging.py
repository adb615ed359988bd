"""What the ``trio_dispatch`` logger says: provider-level news, never a secret."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import ConversationOptions, QueueFull, open_dispatcher
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    FakeToolCall,
    ScriptedProvider,
)

from .._rigs import tool

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher

FIXTURES = Path(__file__).parent.parent / "fixtures"
KEY = "sk-live-0123456789abcdef"
PROMPT = "the launch code is PROMPT-7f3a"


def answers(request: httpx2.Request) -> httpx2.Response:
    answers.calls += 1  # type: ignore[attr-defined]  # a counter on the function
    if answers.calls == 1:  # type: ignore[attr-defined]
        body = {"error": {"type": "rate_limit_exceeded", "message": "slow down"}}
        return httpx2.Response(
            429, headers={"retry-after": "2"}, content=json.dumps(body).encode()
        )
    return httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=(FIXTURES / "openai_text.sse").read_bytes(),
    )


async def wait_for_slot(dispatcher: Dispatcher) -> None:
    async with dispatcher.slot("openai"):
        pass


async def test_pauses_limits_and_refusals_are_logged_grants_never_above_debug(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    answers.calls = 0  # type: ignore[attr-defined]
    caplog.set_level(logging.DEBUG)
    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(answers)) as client,
        open_dispatcher({"openai": 2}, max_waiting=1) as dispatcher,
    ):
        provider = OpenAIProvider(
            base_url="https://api.test/v1", api_key=KEY, model="m", client=client
        )
        conversation = dispatcher.start_conversation(
            provider, options=ConversationOptions(retry_backoff=0.01)
        )
        result = await conversation.ask(PROMPT)
        dispatcher.set_limit("openai", 1)
        async with trio.open_nursery() as nursery, dispatcher.slot("openai"):
            nursery.start_soon(wait_for_slot, dispatcher)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(QueueFull):
                async with dispatcher.slot("openai"):
                    pass
        dispatcher.report_rate_limit("openai", 30)
        await trio.testing.wait_all_tasks_blocked()
        dispatcher.resume("openai")
        await trio.testing.wait_all_tasks_blocked()
    assert result.retries == 1
    ours = [r for r in caplog.records if r.name.startswith("trio_dispatch")]
    said = [(r.levelname, r.getMessage()) for r in ours]
    assert said == [
        ("INFO", "provider 'openai': limit 2 (was none)"),
        ("INFO", "provider 'openai' rate-limited: granting nothing for 2 s"),
        ("INFO", "provider 'openai': pause over, granting again"),
        ("INFO", "provider 'openai': limit 1 (was 2)"),
        (
            "INFO",
            "provider 'openai' refused a request:"
            " 1 request already waits for 'openai' (max_waiting=1)",
        ),
        ("INFO", "provider 'openai' rate-limited: granting nothing for 30 s"),
        ("INFO", "provider 'openai' resumed: granting again"),
    ]
    for record in caplog.records:
        text = record.getMessage()
        assert KEY not in text
        assert "PROMPT-7f3a" not in text


async def test_a_limit_set_before_any_request_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trio_dispatch")
    async with open_dispatcher() as dispatcher:
        dispatcher.set_limit("p", 4)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "provider 'p': limit 4 (was none)")
    ]


async def lookup(arguments: dict[str, Any]) -> str:
    await trio.lowlevel.checkpoint()
    raise RuntimeError("db down")


def calls_then_answers(name: str) -> ScriptedProvider:
    """A model that calls the tool ``name`` once, then answers ``done``."""
    call = FakeReply(text="", tool_calls=(FakeToolCall(name, {}, id="t"),))
    script = FakeScript(default=FakeReply(text="done"), replies=(call,))
    return ScriptedProvider(script, id="memory")


async def test_a_failing_tool_is_logged_with_its_traceback_and_the_model_reads_it(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.DEBUG, logger="trio_dispatch")
    provider = calls_then_answers("lookup")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, conversation_id="c-1", tools=[tool("lookup", lookup)]
        )
        await conversation.ask("go")
    assert conversation.history[2].content == "error: db down"
    [record] = [r for r in caplog.records if "tool" in r.getMessage()]
    assert (record.name, record.levelno, record.getMessage()) == (
        "trio_dispatch",
        logging.WARNING,
        "conversation 'c-1': tool 'lookup' failed; the model reads 'error: db down'",
    )
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert 'raise RuntimeError("db down")' in caplog.text  # the tool's own frame


async def test_a_tool_cancelled_with_its_turn_is_not_logged_as_a_failure(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    started = trio.Event()

    async def wait(arguments: dict[str, Any]) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    caplog.set_level(logging.DEBUG, logger="trio_dispatch")
    provider = calls_then_answers("wait")
    async with open_dispatcher({"memory": 1}) as dispatcher:
        conversation = dispatcher.start_conversation(
            provider, tools=[tool("wait", wait)]
        )
        with trio.move_on_after(5) as scope:
            await conversation.ask("go")
    assert scope.cancelled_caught
    assert started.is_set()
    assert [r.getMessage() for r in caplog.records] == [
        "provider 'memory': limit 1 (was none)"
    ]
