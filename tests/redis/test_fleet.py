"""A fleet of conversations with tools shares one limited provider.

Twenty conversations, each asking two questions that need a tool, against
the fake server on loopback with a limit of three: the server itself must
never see more than three requests at once, every turn must complete, and
the dispatcher must end with no slot held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from trio_dispatch.testing import FakeReply, FakeScript, FakeToolCall

from .._rigs import answers_tools, eventually, last_text, open_rig, tool

if TYPE_CHECKING:
    from trio_dispatch._conversations._conversation import Conversation
    from trio_dispatch._conversations._results import TurnResult
    from trio_dispatch.testing import FakeRequest

CONVERSATIONS = 20
LIMIT = 3
QUESTIONS = 2


def model(request: FakeRequest) -> FakeReply:
    """Looks the question up with the tool, then answers with the result."""
    if answers_tools(request):
        return FakeReply(text=f"the answer is {last_text(request)}", latency=0.002)
    call = FakeToolCall("lookup", {"key": last_text(request)})
    return FakeReply(text="", tool_calls=(call,), latency=0.002)


async def lookup(arguments: dict[str, Any]) -> str:
    """A tool that takes a moment."""
    await trio.sleep(0.002)
    return str(arguments["key"]).upper()


async def test_a_fleet_never_exceeds_the_limit_and_every_turn_completes() -> None:
    results: dict[tuple[int, int], TurnResult] = {}
    async with open_rig(FakeScript(choose=model), limit=LIMIT) as rig:
        conversations = [
            rig.start(conversation_id=f"agent-{n}", tools=[tool("lookup", lookup)])
            for n in range(CONVERSATIONS)
        ]

        async def agent(n: int, conversation: Conversation) -> None:
            for q in range(QUESTIONS):
                results[n, q] = await conversation.ask(f"q{n}-{q}")

        async with trio.open_nursery() as nursery:
            for n, conversation in enumerate(conversations):
                nursery.start_soon(agent, n, conversation)

        await eventually(lambda: rig.in_flight() == 0)
        server = rig.server.statistics()
        stats = rig.dispatcher.statistics().providers["openai"]

    assert server.peak_in_flight <= LIMIT
    assert stats.peak_in_flight == LIMIT  # contended: every slot was used
    assert stats.in_flight == 0
    assert stats.waiting == 0
    calls = CONVERSATIONS * QUESTIONS * 2
    assert server.requests_total == stats.granted_total == stats.released_total == calls
    assert server.client_disconnects == 0
    assert len(results) == CONVERSATIONS * QUESTIONS
    for (n, q), result in results.items():
        assert result.text == f"the answer is Q{n}-{q}"
        assert (result.llm_calls, result.tool_calls, result.retries) == (2, 1, 0)
    for conversation in conversations:
        roles = [message.role for message in conversation.history]
        assert roles == ["user", "assistant", "tool", "assistant"] * QUESTIONS
        assert conversation.statistics().turns_completed == QUESTIONS
