"""Prompt caching: breakpoints and cache keys on the wire, reads after a warm.

Over loopback HTTP against the fake server, whose usage reflects its own
prompt cache (see ``trio_dispatch.testing._cache``): Anthropic caches the
prefixes a request marks with ``cache_control``, OpenAI every prefix of a
request with a ``prompt_cache_key``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from trio_dispatch._wire._anthropic import request_body as anthropic_body
from trio_dispatch._wire._openai import request_body as openai_body
from trio_dispatch.messages import ChatMessage, ChatRequest, ToolSpec, Usage
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider
from trio_dispatch.testing import FakeReply, FakeScript, open_fake_llm_server

from .._rigs import echo, open_rig, tool

EPHEMERAL = {"type": "ephemeral"}
HISTORY = (
    ChatMessage("user", "Tell me about the fjords of western Norway, briefly."),
    ChatMessage("assistant", "They are long, deep, steep-sided inlets carved by ice."),
)


async def look(arguments: dict[str, Any]) -> str:
    return str(arguments)


LOOK = tool("look", look)
FIND = tool("find", look)


def breakpoints(value: object) -> int:
    """How many ``cache_control`` markers ``value`` holds, at any depth."""
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(breakpoints(item) for item in value)
    return 0


# -- on the wire ----------------------------------------------------------------


async def test_anthropic_turn_marks_the_tools_the_system_and_the_history_end() -> None:
    async with open_rig(echo(), wire="anthropic") as rig:
        conversation = rig.start(
            tools=[LOOK, FIND], system_prompt="Be brief.", history=HISTORY
        )
        await conversation.ask("And the glaciers?")
    (request,) = rig.server.requests
    body = request.body
    assert [tool.get("cache_control") for tool in body["tools"]] == [None, EPHEMERAL]
    assert body["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}
    ]
    user, assistant, question = body["messages"]
    assert "cache_control" not in user["content"][-1]
    # The end of what came before the turn: the next call sends it again.
    assert assistant["content"][-1]["cache_control"] == EPHEMERAL
    assert question == {
        "role": "user",
        "content": [{"type": "text", "text": "And the glaciers?"}],
    }
    assert breakpoints(body) == 3


async def test_openai_turn_sends_the_conversations_prompt_cache_key() -> None:
    async with open_rig(echo(), wire="openai") as rig:
        first = rig.start(conversation_id="fjords", system_prompt="Be brief.")
        other = rig.start(conversation_id="glaciers")
        await first.ask("one")
        await first.ask("two")
        await other.ask("three")
    keys = [request.body["prompt_cache_key"] for request in rig.server.requests]
    assert keys == ["fjords", "fjords", "glaciers"]
    assert breakpoints([request.body for request in rig.server.requests]) == 0


async def test_openai_prompt_cache_key_in_extra_wins() -> None:
    request = ChatRequest(
        [ChatMessage("user", "hi")], cache_key="mine", extra={"prompt_cache_key": "x"}
    )
    assert openai_body("m", request)["prompt_cache_key"] == "x"
    assert "prompt_cache_key" not in openai_body(
        "m", ChatRequest([ChatMessage("user", "hi")])
    )


# -- warm, then read ------------------------------------------------------------


@pytest.mark.parametrize("history", [HISTORY, ()], ids=["history", "empty"])
async def test_anthropic_warm_writes_the_cache_and_the_next_turn_reads_it(
    history: tuple[ChatMessage, ...],
) -> None:
    async with open_rig(echo(), wire="anthropic") as rig:
        conversation = rig.start(
            tools=[LOOK], system_prompt="Be brief.", history=history
        )
        warmed = await conversation.warm()
        result = await conversation.ask("And the glaciers?")
        again = await conversation.ask("And the rain?")
    assert warmed.cache_write_tokens > 0
    assert warmed.cache_read_tokens == 0
    # The turn reads exactly what the warm wrote, and writes nothing new
    # (its breakpoints end where the warm's did).
    assert result.usage.cache_read_tokens == warmed.cache_write_tokens
    assert result.usage.cache_write_tokens == 0
    # The next turn reads that prefix and writes the first turn onto it.
    assert again.usage.cache_read_tokens == warmed.cache_write_tokens
    assert again.usage.cache_write_tokens > 0
    stats = conversation.statistics()
    assert stats.usage.cache_read_tokens == 2 * warmed.cache_write_tokens


@pytest.mark.parametrize("history", [HISTORY, ()], ids=["history", "empty"])
async def test_openai_warm_fills_the_cache_and_the_next_turn_reads_it(
    history: tuple[ChatMessage, ...],
) -> None:
    async with open_rig(echo(), wire="openai") as rig:
        conversation = rig.start(
            tools=[LOOK], system_prompt="Be brief.", history=history
        )
        warmed = await conversation.warm()
        result = await conversation.ask("And the glaciers?")
    assert (warmed.cache_read_tokens, warmed.cache_write_tokens) == (0, 0)
    assert result.usage.cache_read_tokens > 0
    assert result.usage.cache_write_tokens == 0  # OpenAI reports no writes
    if history:
        # Everything the warm sent is the turn's prefix.
        assert result.usage.cache_read_tokens == warmed.prompt_tokens
    else:
        # Not the stand-in question: only the tools and the system prompt.
        assert 0 < result.usage.cache_read_tokens < warmed.prompt_tokens


async def test_without_a_warm_the_first_turn_reads_nothing() -> None:
    for wire in ("anthropic", "openai"):
        async with open_rig(echo(), wire=wire) as rig:
            conversation = rig.start(system_prompt="Be brief.", history=HISTORY)
            result = await conversation.ask("And the glaciers?")
        assert result.usage.cache_read_tokens == 0, wire


async def test_the_cache_is_per_api_key() -> None:
    script = echo()
    async with open_fake_llm_server(script) as server:
        usages = []
        for key in ("key-a", "key-b", "key-a"):
            async with AnthropicProvider(
                base_url=server.anthropic_base_url, api_key=key, model="fake"
            ) as provider:
                request = ChatRequest(
                    list(HISTORY), stable_prefix=2, system="Be brief."
                )
                async with provider.stream(request) as stream:
                    usages.extend(
                        [event async for event in stream if isinstance(event, Usage)]
                    )
    written = usages[0].cache_write_tokens
    assert written > 0
    assert [(u.cache_read_tokens, u.cache_write_tokens) for u in usages] == [
        (0, written),
        (0, written),
        (written, 0),
    ]


async def test_a_scripted_usage_is_reported_as_scripted() -> None:
    script = FakeScript(default=FakeReply(text="ok", cache_read_tokens=7))
    async with open_rig(script, wire="anthropic") as rig:
        conversation = rig.start(system_prompt="Be brief.", history=HISTORY)
        await conversation.warm()
        result = await conversation.ask("And the glaciers?")
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (7, 0)


async def test_an_openai_provider_sends_the_key_over_http() -> None:
    async with (
        open_fake_llm_server(echo()) as server,
        OpenAIProvider(
            base_url=server.openai_base_url, api_key="k", model="fake"
        ) as provider,
    ):
        request = ChatRequest(list(HISTORY), cache_key="fjords")
        for _ in range(2):
            async with provider.stream(request) as stream:
                (usage,) = [event async for event in stream if isinstance(event, Usage)]
    assert [r.body["prompt_cache_key"] for r in server.requests] == ["fjords"] * 2
    assert usage.cache_read_tokens > 0
    assert usage.input_tokens == 0  # the same prompt again: all of it cached


# -- the breakpoints' bounds ----------------------------------------------------


def test_no_breakpoint_when_nothing_is_stable() -> None:
    question = ChatRequest([*HISTORY, ChatMessage("user", "And the glaciers?")])
    assert breakpoints(anthropic_body("m", 100, question)) == 0
    # A system message in the history is no stable block of the messages.
    only_system = ChatRequest(
        [ChatMessage("system", "Be kind."), ChatMessage("user", "hi")],
        stable_prefix=1,
    )
    body = anthropic_body("m", 100, only_system)
    assert breakpoints(body["messages"]) == 0
    assert breakpoints(body["system"]) == 1


async def test_no_breakpoint_on_the_wire_for_a_bare_first_turn() -> None:
    async with open_rig(echo(), wire="anthropic") as rig:
        conversation = rig.start()
        result = await conversation.ask("hello")
    (request,) = rig.server.requests
    assert breakpoints(request.body) == 0
    assert (result.usage.cache_read_tokens, result.usage.cache_write_tokens) == (0, 0)


def test_breakpoints_never_exceed_four() -> None:
    messages = [
        ChatMessage("system", "Be kind."),
        ChatMessage("user", "a"),
        ChatMessage("user", "b"),
        ChatMessage("assistant", ""),
        ChatMessage("assistant", "c"),
        ChatMessage("user", "d"),
    ]
    tools = [
        ToolSpec("t", "", {"type": "object"}),
        ToolSpec("u", "", {"type": "object"}),
    ]
    seen = set()
    for length, system, tool_count in itertools.product(
        range(len(messages) + 1), (None, "Be brief."), (0, 1, 2)
    ):
        for stable in range(length + 1):
            request = ChatRequest(
                messages[:length],
                tools=tools[:tool_count],
                system=system,
                stable_prefix=stable,
            )
            count = breakpoints(anthropic_body("m", 100, request))
            assert count <= 4
            seen.add(count)
    assert seen == {0, 1, 2, 3}


def test_chat_request_refuses_a_bad_stable_prefix_or_cache_key() -> None:
    one = [ChatMessage("user", "hi")]
    with pytest.raises(
        ValueError,
        match=r"^stable_prefix must be at most the number of messages \(1\), got 2$",
    ):
        ChatRequest(one, stable_prefix=2)
    with pytest.raises(
        ValueError, match=r"^stable_prefix must be a non-negative integer, got -1$"
    ):
        ChatRequest(one, stable_prefix=-1)
    with pytest.raises(
        ValueError, match=r"^cache_key must be a non-empty string, got ''$"
    ):
        ChatRequest(one, cache_key="")
    with pytest.raises(
        TypeError, match=r"^cache_key must be a non-empty string, got 5$"
    ):
        ChatRequest(one, cache_key=5)  # type: ignore[arg-type]  # wrong on purpose
