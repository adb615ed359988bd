"""What the conversation test modules share: a rig, and readers of requests.

A rig is a fake LLM server on loopback, a provider talking to it and a
dispatcher limiting that provider. The readers take a request the server
recorded apart, in either wire format.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from trio_dispatch import ConversationOptions, Tool, open_dispatcher
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider
from trio_dispatch.testing import FakeReply, FakeScript, open_fake_llm_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trio_dispatch import Conversation, Dispatcher, Provider
    from trio_dispatch.messages import ChatMessage
    from trio_dispatch.testing import FakeLLMServer, FakeRequest, FakeToolCall


QUICK = ConversationOptions(retry_backoff=0.001, max_backoff=0.01, seed=1)
"""Quick retries and a fixed seed: what a rig's conversations use by default."""


def quick(**changes: Any) -> ConversationOptions:  # noqa: ANN401 (ConversationOptions' fields)
    """``QUICK`` with ``changes``."""
    return attrs.evolve(QUICK, **changes)


@attrs.frozen
class Rig:
    """A fake server, a provider talking to it, and a dispatcher limiting it."""

    server: FakeLLMServer
    provider: Provider
    dispatcher: Dispatcher

    def start(
        self,
        *,
        options: ConversationOptions = QUICK,
        **arguments: Any,  # noqa: ANN401 (passed through)
    ) -> Conversation:
        """A conversation with the rig's provider; quick retries by default."""
        return self.dispatcher.start_conversation(
            self.provider, options=options, **arguments
        )

    def in_flight(self) -> int:
        """Slots of the provider held now."""
        return self.dispatcher.statistics().providers[self.provider.id].in_flight


@asynccontextmanager
async def open_rig(
    script: FakeScript | None = None,
    *,
    limit: int = 1,
    wire: str = "openai",
    server_key: str | None = None,
    api_key: str = "test-key",
    read_timeout: float = 5.0,
) -> AsyncIterator[Rig]:
    """Serve ``script``, and limit a provider of format ``wire`` to ``limit``."""
    async with open_fake_llm_server(script, api_key=server_key) as server:
        provider: OpenAIProvider | AnthropicProvider
        if wire == "openai":
            provider = OpenAIProvider(
                base_url=server.openai_base_url,
                api_key=api_key,
                model="fake",
                read_timeout=read_timeout,
            )
        else:
            provider = AnthropicProvider(
                base_url=server.anthropic_base_url,
                api_key=api_key,
                model="fake",
                read_timeout=read_timeout,
            )
        async with (
            provider,
            open_dispatcher({provider.id: limit}, default_pause=0.05) as dispatcher,
        ):
            yield Rig(server, provider, dispatcher)


async def run_agents(
    dispatcher: Dispatcher, provider: Provider, *, agents: int, turns: int
) -> tuple[int, list[BaseException]]:
    """``agents`` conversations asking ``turns`` questions each, at once.

    Returns the turns completed and the errors of those that failed (a
    failed turn is counted, not raised, so a test asserts on all of them).
    """
    failed: list[BaseException] = []
    completed = 0

    async def agent(index: int) -> None:
        nonlocal completed
        conversation = dispatcher.start_conversation(provider)
        for turn in range(turns):
            try:
                await conversation.ask(f"turn {turn} of agent {index}")
            except Exception as exc:  # counted, and asserted by the caller
                failed.append(exc)
            else:
                completed += 1

    async with trio.open_nursery() as nursery:
        for index in range(agents):
            nursery.start_soon(agent, index)
    return completed, failed


async def eventually(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds, for at most 3 seconds.

    Real time: sockets are involved, so there is no event to wait on and
    ``wait_all_tasks_blocked`` cannot tell a task waiting for bytes from an
    idle one.
    """
    with trio.fail_after(3):
        while not predicate():  # noqa: ASYNC110 (polling state across sockets, see above)
            await trio.sleep(0.001)


def messages_of(request: FakeRequest) -> list[dict[str, Any]]:
    """The wire messages of a recorded request."""
    messages: list[dict[str, Any]] = request.body["messages"]
    return messages


def texts_of(request: FakeRequest) -> list[str]:
    """Every text the request carried, whatever its format, in order."""
    texts: list[str] = []
    for message in messages_of(request):
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for block in content:
                if block.get("type") == "text":
                    texts.append(block["text"])
                elif block.get("type") == "tool_result":
                    texts.append(block["content"])
    return texts


def answers_tools(request: FakeRequest) -> bool:
    """Whether the request's last message carries tool results."""
    last = messages_of(request)[-1]
    if request.format == "openai":
        return bool(last["role"] == "tool")
    return any(block.get("type") == "tool_result" for block in last["content"])


def last_text(request: FakeRequest) -> str:
    """The text of the request's last message."""
    return texts_of(request)[-1]


def tools_then(
    calls: tuple[FakeToolCall, ...],
    answer: str = "done",
    **reply: Any,  # noqa: ANN401 (FakeReply fields)
) -> FakeScript:
    """A model that calls ``calls``, then answers ``answer`` once it has results."""

    def choose(request: FakeRequest) -> FakeReply:
        if answers_tools(request):
            return FakeReply(text=answer, **reply)
        return FakeReply(text="", tool_calls=calls, **reply)

    return FakeScript(choose=choose)


def echo(**reply: Any) -> FakeScript:  # noqa: ANN401 (FakeReply fields)
    """A model that answers ``re: <the last text>``."""
    return FakeScript(
        choose=lambda request: FakeReply(text=f"re: {last_text(request)}", **reply)
    )


def tool(
    name: str,
    run: Callable[[dict[str, Any]], Awaitable[str]],
    properties: dict[str, Any] | None = None,
    **schema: Any,  # noqa: ANN401 (more schema keywords)
) -> Tool:
    """A tool with an object schema."""
    return Tool(
        name=name,
        description=f"the {name} tool",
        parameters={"type": "object", "properties": properties or {}, **schema},
        run=run,
    )


def roles(history: tuple[ChatMessage, ...]) -> list[str]:
    """The roles of the history, in order."""
    return [message.role for message in history]


async def add(arguments: dict[str, Any]) -> str:
    """A tool: the sum of ``a`` and ``b``."""
    await trio.lowlevel.checkpoint()
    return str(arguments["a"] + arguments["b"])


ADD = tool(
    "add",
    add,
    {"a": {"type": "integer"}, "b": {"type": "integer"}},
    required=["a", "b"],
)
