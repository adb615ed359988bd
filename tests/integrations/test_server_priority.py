"""A call's place in line, sent to a server that queues by priority.

``Dispatcher.transport(..., server_priority=True)`` and a provider's
``server_priority`` (``wrap_provider``, conversations) send each chat
completion or completion with ``"priority"``: its slot's ticket's rank
(the turn's start, less its class's credit) as whole milliseconds on the
dispatcher's wall clock (``Plumbing.wall_ms``). In virtual time against
the fake server served in-process; the values are exact, counted from
``wall_ms(0.0)``, where the trio clock stands when the dispatcher opens.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Self

import httpx
import httpx2
import openai
import pytest
import trio
import trio.testing

from trio_dispatch import open_dispatcher, wrap_provider
from trio_dispatch.lowlevel import plumbing
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import AnthropicProvider, OpenAIProvider
from trio_dispatch.testing import (
    FakeLLMServer,
    FakeReply,
    FakeScript,
    Fault,
    StreamingASGITransport,
)

from .._redis import needs_redis, skewed_clocks

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher

    from .._redis import RedisServer

# The openai SDK leaves the async generators under a stream unclosed when it
# stops at ``[DONE]`` (it does so without a transport too).
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)

BASE = "http://fake.test"
CHAT: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


class Recording(httpx2.AsyncBaseTransport):
    """A transport that keeps every request it sends on, as sent."""

    def __init__(self, inner: StreamingASGITransport) -> None:
        self._inner = inner
        self.sent: list[httpx2.Request] = []

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:  # noqa: ANN401 (passed on)
        await self._inner.__aexit__(*exc_info)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(request)
        return await self._inner.handle_async_request(request)


@asynccontextmanager
async def serving(
    server: FakeLLMServer,
    limit: int,
    **options: Any,  # noqa: ANN401 (open_dispatcher's)
) -> AsyncIterator[tuple[Dispatcher, httpx2.AsyncClient]]:
    """A dispatcher limiting ``"vllm"`` to ``limit``, and a client to ``server``.

    The client goes through the dispatcher's transport, with
    ``server_priority``, to the server served in this run.
    """
    async with (
        open_dispatcher({"vllm": limit}, **options) as d,
        httpx2.AsyncClient(
            transport=d.transport(
                "vllm", inner=StreamingASGITransport(server), server_priority=True
            )
        ) as http,
    ):
        yield d, http


async def post(
    http: httpx2.AsyncClient,
    path: str = "/v1/chat/completions",
    **content: Any,  # noqa: ANN401 (httpx2's content arguments)
) -> None:
    """One request, its answer read to its end and closed."""
    async with http.stream("POST", f"{BASE}{path}", **content) as response:
        await response.aread()


def base(dispatcher: Dispatcher) -> int:
    """The number of a call whose rank is 0.0 on the trio clock."""
    return plumbing(dispatcher).wall_ms(0.0)


async def test_no_priority_is_sent_by_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with (
        open_dispatcher({"vllm": 2}) as d,
        httpx2.AsyncClient(
            transport=d.transport("vllm", inner=StreamingASGITransport(server))
        ) as http,
    ):
        with d.turn(started_at=-3.0):
            await post(http, json=CHAT)
    (request,) = server.requests
    assert request.body == CHAT


async def test_each_call_carries_its_turns_start_in_milliseconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with serving(server, 1) as (d, http):
        await trio.sleep(10)
        with d.turn(started_at=7.25):
            await post(http, json=CHAT)
        with d.turn(started_at=2.5):
            await post(http, json=CHAT)
            await trio.sleep(1)
            # The turn's next call: the same place.
            await post(http, json=CHAT)
        # Outside any turn, a call is a turn of its own, started as it asks.
        asked = trio.current_time()
        await post(http, json=CHAT)
        origin = base(d)
    places = [request.body["priority"] for request in server.requests]
    assert asked == 11.0
    assert [place - origin for place in places] == [7250, 2500, 2500, 11000]
    assert all(type(place) is int for place in places)
    # Everything else is the caller's, as sent.
    assert [{**r.body, "priority": None} for r in server.requests] == [
        {**CHAT, "priority": None}
    ] * 4


async def test_a_priority_class_moves_the_place_by_its_credit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with serving(server, 1, priority_aging=30.0) as (d, http):
        with d.turn(started_at=40.0, priority=2):
            await post(http, json=CHAT)
        with d.turn(started_at=12.5, priority=0):
            await post(http, json=CHAT)
        with d.turn(started_at=12.5, priority=-1):
            await post(http, json=CHAT)
        origin = base(d)
    places = [request.body["priority"] - origin for request in server.requests]
    # 40 s - 2 x 30 s; 12.5 s; 12.5 s + 30 s: the order the dispatcher grants in.
    assert places == [-20_000, 12_500, 42_500]


async def test_a_place_beyond_what_vllm_takes_is_clamped_to_its_range(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # vLLM takes a signed 64-bit integer; a turn started at the far ends of
    # the trio clock (any finite instant is a start) gets its bounds.
    server = FakeLLMServer(FakeScript())
    async with serving(server, 1) as (d, http):
        for start in (1e300, -1.7e308):
            with d.turn(started_at=start):
                await post(http, json=CHAT)
    places = [request.body["priority"] for request in server.requests]
    assert places == [2**63 - 1, -(2**63)]


async def test_the_retry_of_a_rate_limited_call_keeps_its_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The official SDK through the transport: its retry takes over the
    # turn's kept place, and so is sent with the same number.
    server = FakeLLMServer(
        FakeScript(replies=(FakeReply(fault=Fault("rate_limit", retry_after=2.0)),))
    )
    async with serving(server, 1) as (d, http):
        client = openai.AsyncOpenAI(
            api_key="sk-test",
            base_url=f"{BASE}/v1",
            http_client=http,
            max_retries=1,
        )
        await trio.sleep(5)
        with d.turn(started_at=1.5):
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async with stream:
                text = "".join(
                    [
                        c.choices[0].delta.content or ""
                        async for c in stream
                        if c.choices
                    ]
                )
        origin = base(d)
    assert text == FakeReply().text
    first, retry = server.requests
    assert first.body["priority"] == retry.body["priority"] == origin + 1500
    assert retry.arrived_at >= first.arrived_at + 2.0


async def test_the_openai_sdk_sends_it_and_a_priority_of_its_own_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with serving(server, 2) as (d, http):
        client = openai.AsyncOpenAI(
            api_key="sk-test", base_url=f"{BASE}/v1", http_client=http, max_retries=0
        )
        with d.turn(started_at=-0.004):
            for extra in ({}, {"priority": 3}):
                stream = await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    extra_body=extra,
                )
                async with stream:
                    async for _ in stream:
                        pass
        origin = base(d)
    mine, theirs = server.requests
    assert mine.body["priority"] == origin - 4
    assert theirs.body["priority"] == 3


# Requests the transport sends on as they are: path, and httpx2's content
# arguments. A model call's place goes only into a chat completion's or a
# completion's JSON object with messages or a prompt, and no priority.
UNTOUCHED: dict[str, tuple[str, dict[str, Any]]] = {
    "its own priority": ("/v1/chat/completions", {"json": {**CHAT, "priority": -7}}),
    "a null priority": ("/v1/chat/completions", {"json": {**CHAT, "priority": None}}),
    "not json": ("/v1/chat/completions", {"content": b"messages, not json"}),
    "a json array": ("/v1/chat/completions", {"json": [CHAT]}),
    "no messages": ("/v1/chat/completions", {"json": {"model": "m"}}),
    "anthropic's messages": ("/v1/messages", {"json": {**CHAT, "max_tokens": 9}}),
    "responses": ("/v1/responses", {"json": {"model": "m", "input": "hi"}}),
    "embeddings": ("/v1/embeddings", {"json": {"model": "m", "prompt": "hi"}}),
    "no model call": ("/v1/files", {"json": {"messages": [], "prompt": "hi"}}),
}


@pytest.mark.parametrize("case", sorted(UNTOUCHED))
async def test_other_requests_are_sent_untouched(
    case: str, autojump_clock: trio.testing.MockClock
) -> None:
    path, content = UNTOUCHED[case]
    recording = Recording(StreamingASGITransport(FakeLLMServer(FakeScript())))
    async with (
        open_dispatcher({"vllm": 1}) as d,
        httpx2.AsyncClient(
            transport=d.transport("vllm", inner=recording, server_priority=True)
        ) as http,
    ):
        original = http.build_request("POST", f"{BASE}{path}", **content)
        await post(http, path, **content)
    (sent,) = recording.sent
    assert sent.content == original.content
    assert sent.headers == original.headers


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/openai/deployments/x/chat/completions/", CHAT),
        ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 5}),
    ],
)
async def test_the_place_is_spliced_in_and_the_length_follows(
    path: str, body: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    recording = Recording(StreamingASGITransport(FakeLLMServer(FakeScript())))
    async with (
        open_dispatcher({"vllm": 1}) as d,
        httpx2.AsyncClient(
            transport=d.transport("vllm", inner=recording, server_priority=True)
        ) as http,
    ):
        with d.turn(started_at=0.0):
            original = http.build_request(
                "POST", f"{BASE}{path}", json=body, timeout=12.0
            )
            await post(http, path, json=body, timeout=12.0)
        origin = base(d)
    (sent,) = recording.sent
    assert sent.content == b'{"priority":%d,%s' % (origin, original.content[1:])
    assert json.loads(sent.content) == {"priority": origin, **body}
    assert sent.headers["content-length"] == str(len(sent.content))
    assert list(sent.headers) == list(original.headers)
    assert {**sent.headers, "content-length": ""} == {
        **original.headers,
        "content-length": "",
    }
    assert (sent.method, sent.url) == (original.method, original.url)
    assert sent.extensions["timeout"] == original.extensions["timeout"]


async def test_the_legacy_httpx_transport_sends_it_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={})

    async with (
        open_dispatcher({"vllm": 1}) as d,
        httpx.AsyncClient(
            transport=d.transport(
                "vllm", inner=httpx.MockTransport(answer), server_priority=True
            )
        ) as http,
    ):
        with d.turn(started_at=0.75):
            await http.post(f"{BASE}/v1/chat/completions", json=CHAT)
        origin = base(d)
    (request,) = sent
    assert json.loads(request.content) == {"priority": origin + 750, **CHAT}
    assert request.headers["content-length"] == str(len(request.content))


async def test_a_bad_option_is_refused_at_once() -> None:
    async with open_dispatcher({"vllm": 1}) as d:
        with pytest.raises(
            TypeError, match=r"^server_priority must be True or False, got 'yes'$"
        ):
            d.transport("vllm", server_priority="yes")  # type: ignore[call-overload]
        with pytest.raises(
            TypeError, match=r"^server_priority must be True or False, got 1$"
        ):
            d.transport("vllm", inner=httpx.AsyncHTTPTransport(), server_priority=1)  # type: ignore[call-overload]
    with pytest.raises(
        TypeError, match=r"^server_priority must be True or False, got None$"
    ):
        OpenAIProvider(
            base_url="http://x/v1",
            api_key="k",
            model="m",
            server_priority=None,  # type: ignore[arg-type]
        )
    # Anthropic's Messages API has no such field: its provider takes no flag.
    with pytest.raises(TypeError, match="server_priority"):
        AnthropicProvider(  # type: ignore[call-arg]
            base_url="http://x/v1", api_key="k", model="m", server_priority=True
        )


# -- our own providers -----------------------------------------------------------


@asynccontextmanager
async def open_provider(
    server: FakeLLMServer, *, server_priority: bool
) -> AsyncIterator[OpenAIProvider]:
    """An ``OpenAIProvider`` of the fake server, served in-process."""
    async with (
        httpx2.AsyncClient(transport=StreamingASGITransport(server)) as http,
        OpenAIProvider(
            "vllm",
            base_url=f"{BASE}/v1",
            api_key="k",
            model="m",
            client=http,
            server_priority=server_priority,
        ) as provider,
    ):
        yield provider


REQUEST = ChatRequest([ChatMessage("user", "hi")])


async def read(provider: Any, request: ChatRequest = REQUEST) -> None:  # noqa: ANN401 (a Provider)
    async with provider.stream(request) as events:
        async for _ in events:
            pass


async def test_a_provider_flag_sends_the_place_through_wrap_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with (
        open_dispatcher({"vllm": 1}, priority_aging=10.0) as d,
        open_provider(server, server_priority=True) as provider,
    ):
        limited = wrap_provider(provider, d)
        await trio.sleep(3)
        with d.turn(started_at=2.0, priority=1):
            await read(limited)
            # A priority the request gives is the request's.
            await read(limited, ChatRequest(REQUEST.messages, extra={"priority": 5}))
        asked = trio.current_time()
        await read(limited)
        # Without a dispatcher's slot, a request has no place in line.
        await read(provider)
        origin = base(d)
    places = [request.body.get("priority") for request in server.requests]
    assert asked == 3.0
    assert places == [origin - 8000, 5, origin + 3000, None]
    assert server.requests[0].body["messages"] == [{"role": "user", "content": "hi"}]


async def test_a_provider_without_the_flag_sends_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with (
        open_dispatcher({"vllm": 1}) as d,
        open_provider(server, server_priority=False) as provider,
    ):
        with d.turn(started_at=1.0):
            await read(wrap_provider(provider, d))
    (request,) = server.requests
    assert "priority" not in request.body


async def test_a_conversations_calls_carry_its_turns_place(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    async with (
        open_dispatcher({"vllm": 1}, priority_aging=10.0) as d,
        open_provider(server, server_priority=True) as provider,
    ):
        conversation = d.start_conversation(provider, priority=2)
        await trio.sleep(4.5)
        result = await conversation.ask("hi")
        origin = base(d)
        conversation.close()
    (request,) = server.requests
    assert result.started_at == 4.5
    assert request.body["priority"] == origin + 4500 - 20_000


# -- a fleet ------------------------------------------------------------------


@needs_redis
async def test_with_redis_the_place_is_on_the_servers_clock_not_the_hosts(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This host's clock runs 30 s ahead. Without redis_url a dispatcher's
    # numbers follow it; with it they are on the Redis server's clock (as
    # the fleet's queue places turns), so that processes on hosts whose
    # clocks disagree send one number for one turn start.
    fake = FakeLLMServer(FakeScript())
    right = time.time
    async with open_dispatcher({"vllm": 1}) as reference:
        monkeypatch.setattr(time, "time", lambda: right() + 30.0)
        with skewed_clocks([0.0]):  # the ledger reads this host's clock too
            async with (
                open_dispatcher({"vllm": 1}) as alone,
                open_dispatcher(
                    {"vllm": 1}, redis_url=server.url, namespace=uuid.uuid4().hex
                ) as fleet,
                httpx2.AsyncClient(
                    transport=fleet.transport(
                        "vllm", inner=StreamingASGITransport(fake), server_priority=True
                    )
                ) as http,
            ):
                start = trio.current_time() - 60.0
                with fleet.turn(started_at=start):
                    await post(http, json=CHAT)
                ahead = plumbing(alone).wall_ms(start)
        right_place = plumbing(reference).wall_ms(start)
    (request,) = fake.requests
    assert abs(ahead - right_place - 30_000) < 1000
    assert abs(request.body["priority"] - right_place) < 1000
