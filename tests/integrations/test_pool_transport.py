"""The official SDKs through a pool's transport, to two servers over real sockets.

Two fake LLM servers on loopback, each accepting one key only (any other
is answered 401), are the members of a pool; the SDK's client is given a
base URL that resolves nowhere and a key neither accepts. Every call must
reach the member its slot was granted on, with that member's key, and
each server's peak in flight stays within its member's limit. The main
cases run twice: with the local scheduler, and with the fleet's through a
redis-server of the test's own (``backend``). Real time: keep the
latencies small.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anthropic
import attrs
import httpx2
import openai
import pytest
import trio
import trio.testing

from trio_dispatch import Endpoint, PoolUnreachable, open_dispatcher
from trio_dispatch.testing import FakeReply, FakeScript, Fault, open_fake_llm_server

from .._redis import needs_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher
    from trio_dispatch.testing import FakeLLMServer

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)

Wire = Literal["openai", "anthropic"]
TEXT = "one two three four"


SCRIPT = FakeScript(default=FakeReply(text=TEXT, tokens_per_second=200))


@pytest.fixture(params=["local", pytest.param("redis", marks=needs_redis)])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The pool's scheduler: the local one, or the fleet's on a redis-server of the test's own."""
    if request.param == "local":
        return {}
    server = request.getfixturevalue("server")
    return {"redis_url": server.url, "lease": 1.5}


@asynccontextmanager
async def open_pool(
    wire: Wire,
    script_a: FakeScript = SCRIPT,
    script_b: FakeScript = SCRIPT,
    *,
    limits: tuple[int, int] = (2, 1),
    b_down: bool = False,
    **options: Any,  # noqa: ANN401 (open_dispatcher's)
) -> AsyncIterator[tuple[FakeLLMServer, FakeLLMServer, Dispatcher, Any]]:
    """Two servers (keys ``secret-a``, ``secret-b``), a pool over them, an SDK client.

    ``b_down``: key-b's endpoint is a port nobody listens on (its server
    is stopped before the pool opens): every connection is refused.
    """
    async with (
        open_fake_llm_server(script_a, api_key="secret-a") as a,
        open_fake_llm_server(script_b, api_key="secret-b") as b,
        open_dispatcher(
            {"key-a": limits[0], "key-b": limits[1]},
            pools={"gpt": ("key-a", "key-b")},
            **options,
        ) as d,
    ):
        base = "openai_base_url" if wire == "openai" else "anthropic_base_url"
        b_url = await _refusing(getattr(b, base)) if b_down else getattr(b, base)
        endpoints = {
            "key-a": Endpoint(getattr(a, base), "secret-a"),
            "key-b": Endpoint(b_url, "secret-b"),
        }
        async with httpx2.AsyncClient(
            transport=d.transport("gpt", endpoints=endpoints)
        ) as http:
            if wire == "openai":
                client: Any = openai.AsyncOpenAI(
                    api_key="the-clients-own",
                    base_url="http://pool.invalid/v1",
                    http_client=http,
                    max_retries=0,
                )
            else:
                client = anthropic.AsyncAnthropic(
                    api_key="the-clients-own",
                    base_url="http://pool.invalid",
                    http_client=http,
                    max_retries=0,
                )
            yield a, b, d, client


async def _refusing(url: str) -> str:
    """``url`` on a loopback port that was free a moment ago: connections are refused."""
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    parsed = httpx2.URL(url)
    return str(parsed.copy_with(port=port))


async def call(wire: Wire, client: Any) -> str:  # noqa: ANN401 (either SDK)
    """One streamed call, read to its end: its text."""
    if wire == "openai":
        stream = await client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        parts: list[str] = []
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
        return "".join(parts)
    async with client.messages.stream(
        model="fake", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text: str = await stream.get_final_text()
        return text


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_each_call_goes_to_its_members_server_with_its_members_key(
    wire: Wire, backend: dict[str, Any]
) -> None:
    texts: list[str] = []
    async with open_pool(wire, **backend) as (a, b, d, client):

        async def one() -> None:
            texts.append(await call(wire, client))

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(one)
        stats = d.statistics()
        served_a, served_b = await a.wait_idle(), await b.wait_idle()
    # A key either server refuses would have failed its call (401).
    assert texts == [TEXT] * 12
    assert served_a.requests_total == stats.providers["key-a"].granted_total
    assert served_b.requests_total == stats.providers["key-b"].granted_total
    assert served_a.requests_total + served_b.requests_total == 12
    assert served_a.requests_total >= 1
    assert served_b.requests_total >= 1
    assert served_a.peak_in_flight <= 2
    assert served_b.peak_in_flight <= 1


async def test_a_rate_limit_answer_pauses_only_its_member(
    backend: dict[str, Any],
) -> None:
    # Member a (the most free slots: the first call's) answers one 429,
    # with Retry-After: 30: the call goes to b at once, the SDK none the wiser.
    limited = attrs.evolve(
        SCRIPT, replies=(FakeReply(fault=Fault("rate_limit", retry_after=30.0)),)
    )
    async with open_pool("openai", limited, **backend) as (a, b, d, client):
        assert await call("openai", client) == TEXT
        assert (await a.wait_idle()).requests_total == 1
        assert (await b.wait_idle()).requests_total == 1
        stats = d.statistics()
        assert stats.providers["key-a"].paused
        assert not stats.providers["key-b"].paused
        # The next calls go to b, within its limit, while a rests.
        for _ in range(3):
            assert await call("openai", client) == TEXT
        stats = d.statistics()
    # The first call's fallback, and the next three.
    assert stats.providers["key-b"].granted_total == 4
    assert stats.providers["key-a"].granted_total == 1
    assert stats.providers["key-a"].failures == 0  # a rate limit is no failure


def test_an_endpoints_key_never_shows() -> None:
    endpoint = Endpoint("https://api.example.com/v1", "sk-very-secret")
    assert "sk-very-secret" not in repr(endpoint)
    assert repr(endpoint) == "Endpoint(base_url='https://api.example.com/v1')"
    with pytest.raises(ValueError, match="api_key must be printable ASCII") as caught:
        Endpoint("https://api.example.com/v1", "sk-\nsecret")
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        (("api.example.com/v1",), ValueError, r"^base_url must be an http or https"),
        ((b"https://x",), TypeError, r"^base_url must be a string, got bytes$"),
        (("https://x/v1?a=1",), ValueError, r"^base_url must have no query"),
        (("https://user:pw@x/v1",), ValueError, r"^base_url must have no query"),
        (("https://x/v1", ""), ValueError, r"^api_key must not be empty"),
        (
            ("https://x/v1", 12),
            TypeError,
            r"^api_key must be a string or None, got int$",
        ),
    ],
)
def test_endpoints_are_checked(
    arguments: tuple[object, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Endpoint(*arguments)  # type: ignore[arg-type]


async def test_a_pools_transport_needs_endpoints_of_its_members_only() -> None:
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1, "solo": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as d:
        with pytest.raises(
            ValueError,
            match=r"^endpoints name providers that are not members of 'gpt':"
            r" \['key-z'\]; its members: \['key-a', 'key-b'\]$",
        ):
            d.transport("gpt", endpoints={"key-z": Endpoint("http://z/v1", "k")})
        with pytest.raises(
            ValueError, match=r"^pool 'gpt' has no member this integration can reach"
        ):
            d.transport("gpt", endpoints={})
        with pytest.raises(
            ValueError, match=r"^endpoints must name 'solo', which is no pool$"
        ):
            d.transport("solo", endpoints={})
        # A member without one is avoided (see below): only key-a here.
        await d.transport(
            "gpt", endpoints={"key-a": Endpoint("http://127.0.0.1:1/v1", "k")}
        ).aclose()
        with pytest.raises(
            TypeError, match=r"^endpoints\['key-a'\] must be an Endpoint"
        ):
            d.transport("gpt", endpoints={"key-a": "http://x", "key-b": "http://y"})  # type: ignore[dict-item]
        transport = d.transport(
            "gpt",
            endpoints={
                "key-a": Endpoint("http://127.0.0.1:1/v1", "sk-aaa"),
                "key-b": Endpoint("http://127.0.0.1:2/v1", "sk-bbb"),
            },
        )
        assert "sk-" not in repr(transport)
        await transport.aclose()


async def test_every_model_call_carries_its_members_key_and_never_the_clients() -> None:
    sent: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, json={})

    async with open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d:
        transport = d.transport(
            "gpt",
            inner=httpx2.MockTransport(answer),
            endpoints={"key-a": Endpoint("http://member.example/v1", "sk-member")},
        )
        async with httpx2.AsyncClient(
            transport=transport,
            base_url="http://client.example",
            headers={
                "Authorization": "Bearer sk-client",
                "x-api-key": "sk-client",
                "api-key": "sk-client",
            },
        ) as client:
            for path in ("/v1/embeddings", "/v1/responses", "/v1/completions"):
                await client.post(path + "?api-version=1&api-key=sk-client", json={})
            await client.post("/v1/messages", json={})
    assert [str(r.url) for r in sent] == [
        "http://member.example/v1/embeddings?api-version=1",
        "http://member.example/v1/responses?api-version=1",
        "http://member.example/v1/completions?api-version=1",
        "http://member.example/v1/v1/messages",
    ]
    for request in sent:
        values = " ".join(request.headers.values())
        assert "sk-client" not in values
        assert "sk-member" in values
    assert sent[0].headers["authorization"] == "Bearer sk-member"
    assert sent[-1].headers["x-api-key"] == "sk-member"
    assert sent[0].headers["host"] == "member.example"


async def test_a_pool_with_no_member_this_transport_reaches_fails_before_a_slot() -> (
    None
):
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a",), "all": ("key-a", "key-b")}
    ) as d:
        transport = d.transport(
            "gpt",
            inner=httpx2.MockTransport(lambda _: httpx2.Response(200, json={})),
            endpoints={"key-a": Endpoint("http://a.example/v1", "sk-a")},
        )
        d.set_pool("gpt", ("key-b",))
        async with httpx2.AsyncClient(transport=transport) as client:
            with pytest.raises(
                PoolUnreachable,
                match=r"^pool 'gpt' has no member this integration can reach: its"
                r" members are 'key-b', it reaches 'key-a'$",
            ) as caught:
                await client.post("http://x/v1/chat/completions", json={})
        assert caught.value.pool == "gpt"
        assert isinstance(caught.value, ValueError)
        stats = d.statistics().providers["key-b"]
        assert (stats.in_flight, stats.granted_total) == (0, 0)


async def test_a_member_that_joins_after_the_transport_is_avoided_until_it_has_an_endpoint() -> (
    None
):
    seen: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.url.host)
        return httpx2.Response(200, json={})

    async with open_dispatcher({"key-a": 4}, pools={"gpt": ("key-a",)}) as d:
        transport = d.transport(
            "gpt",
            inner=httpx2.MockTransport(answer),
            endpoints={"key-a": Endpoint("http://a.example/v1", "sk-a")},
        )
        # key-c joins, unlimited, with more free slots than key-a: the
        # transport's calls still go to key-a, which it reaches.
        d.set_pool("gpt", ("key-a", "key-c"))
        async with httpx2.AsyncClient(transport=transport) as client:
            await client.post("http://x/v1/chat/completions", json={})
            transport.set_endpoint("key-c", Endpoint("http://c.example/v1", "sk-c"))
            await client.post("http://x/v1/chat/completions", json={})
        with pytest.raises(ValueError, match=r"^'key-z' is not a member of pool 'gpt'"):
            transport.set_endpoint("key-z", Endpoint("http://z.example/v1", "sk-z"))
        with pytest.raises(TypeError, match=r"^endpoint must be an Endpoint"):
            transport.set_endpoint("key-c", "http://c.example/v1")  # type: ignore[arg-type]
        plain = d.transport("gpt", inner=httpx2.MockTransport(answer))
        with pytest.raises(ValueError, match=r"made without endpoints"):
            plain.set_endpoint("key-c", Endpoint("http://c.example/v1", "sk-c"))
    # Unlimited key-c has the most free slots: once reached, it is chosen.
    assert seen == ["a.example", "c.example"]


async def test_a_member_whose_server_is_down_has_its_calls_served_by_the_other(
    backend: dict[str, Any],
) -> None:
    # key-b's connections are refused: its two calls go to key-a at once,
    # in their place; after two failures in a row key-b is out of service,
    # and every later call goes to key-a. The SDK (no retries of its own)
    # sees none of it.
    async with open_pool(
        "openai", limits=(2, 2), b_down=True, failure_threshold=2, **backend
    ) as (
        a,
        _,
        d,
        client,
    ):
        texts: list[str] = []

        async def one() -> None:
            texts.append(await call("openai", client))

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(one)
        for _ in range(3):
            texts.append(await call("openai", client))
        stats = d.statistics().providers
        served = await a.wait_idle()
    assert texts == [TEXT] * 7
    assert served.requests_total == 7
    assert stats["key-a"].granted_total == 7
    # Its second failure took it out. Before that lands, a slot its first
    # failure freed may have gone to a third call (that one depends on the
    # machine's timing): at most the threshold plus its limit less one.
    assert 2 <= stats["key-b"].granted_total <= 3
    assert stats["key-b"].outages_total == 1
    assert stats["key-b"].out_of_service_until is not None
    assert stats["key-a"].failures == 0


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_server_error_is_sent_again_on_the_other_member(
    wire: Wire, backend: dict[str, Any]
) -> None:
    failing = attrs.evolve(SCRIPT, replies=(FakeReply(fault=Fault("server_error")),))
    async with open_pool(wire, failing, **backend) as (a, b, d, client):
        assert await call(wire, client) == TEXT
        stats = d.statistics().providers
        served_a, served_b = await a.wait_idle(), await b.wait_idle()
    assert (served_a.requests_total, served_b.requests_total) == (1, 1)
    assert (stats["key-a"].failures, stats["key-b"].failures) == (1, 0)
    assert stats["key-a"].out_of_service_until is None  # one failure of three


async def test_when_every_member_failed_the_sdk_meets_the_last_error() -> None:
    failing = attrs.evolve(SCRIPT, replies=(FakeReply(fault=Fault("server_error")),))
    async with open_pool("openai", failing, failing) as (a, b, d, client):
        with pytest.raises(openai.InternalServerError):
            await call("openai", client)
        stats = d.statistics().providers
        # Both failed once: the next call is answered (each script's second reply).
        assert await call("openai", client) == TEXT
        served_a, served_b = await a.wait_idle(), await b.wait_idle()
    assert served_a.requests_total + served_b.requests_total == 3
    assert (stats["key-a"].failures, stats["key-b"].failures) == (1, 1)
    assert stats["key-a"].in_flight == stats["key-b"].in_flight == 0


async def test_a_streamed_upload_is_never_sent_twice() -> None:
    # Its body was not read: it cannot be sent again, so the error is the
    # client's, and the member's failure is counted.
    failing = attrs.evolve(SCRIPT, replies=(FakeReply(fault=Fault("server_error")),))
    async with open_pool("openai", failing) as (a, b, d, _):
        endpoints = {
            "key-a": Endpoint(a.openai_base_url, "secret-a"),
            "key-b": Endpoint(b.openai_base_url, "secret-b"),
        }

        async def body() -> AsyncIterator[bytes]:
            yield b'{"model": "fake", "stream": true,'
            yield b' "messages": [{"role": "user", "content": "hi"}]}'

        async with httpx2.AsyncClient(
            transport=d.transport("gpt", endpoints=endpoints)
        ) as http:
            response = await http.post(
                "http://pool.invalid/v1/chat/completions", content=body()
            )
        stats = d.statistics().providers
        served_b = await b.wait_idle()
    assert response.status_code == 500
    assert served_b.requests_total == 0
    assert stats["key-a"].failures == 1


async def test_a_429_from_every_member_keeps_the_turns_place_in_the_pool(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A is answered 429 (Retry-After: 1) the first time on each member: on
    # key-a, then at once on key-b. The SDK sees the 429, and its retry
    # takes the place the turn kept in the pool (granted on key-a when its
    # pause ended), ahead of D, which asked meanwhile.
    sent: list[tuple[str, str, float]] = []

    async def answer(request: httpx2.Request) -> httpx2.Response:
        name, host = request.content.decode(), request.url.host
        first = (name, host) not in {(n, h) for n, h, _ in sent}
        sent.append((name, host, trio.current_time()))
        await trio.sleep(1.0)
        if name == "A" and first:
            return httpx2.Response(429, headers={"retry-after": "1"})
        return httpx2.Response(200)

    endpoints = {
        "key-a": Endpoint("http://a.example/v1", "sk-a"),
        "key-b": Endpoint("http://b.example/v1", "sk-b"),
    }
    url = "http://pool.invalid/v1/chat/completions"
    statuses: list[int] = []
    async with (
        open_dispatcher(
            {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
        ) as d,
        httpx2.AsyncClient(
            transport=d.transport(
                "gpt", inner=httpx2.MockTransport(answer), endpoints=endpoints
            )
        ) as client,
    ):

        async def a() -> None:
            with d.turn(conversation_id="A"):
                statuses.append((await client.post(url, content=b"A")).status_code)
                await trio.sleep(1.5)  # the SDK's sleep, and a little more
                statuses.append((await client.post(url, content=b"A")).status_code)

        async def late() -> None:
            await trio.sleep(2.2)
            with d.turn(conversation_id="D"):
                assert (await client.post(url, content=b"D")).status_code == 200

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            nursery.start_soon(late)
    assert statuses == [429, 200]
    assert sent == [
        ("A", "a.example", 0.0),
        ("A", "b.example", 1.0),
        ("D", "b.example", 3.0),
        ("A", "a.example", 3.5),
    ]


async def test_a_waiting_call_granted_on_a_member_that_joined_asks_again_in_its_place(
    autojump_clock: trio.abc.Clock,
) -> None:
    sent: list[tuple[str, float]] = []

    async def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append((request.url.host, trio.current_time()))
        await trio.sleep(1.0)
        return httpx2.Response(200)

    url = "http://pool.invalid/v1/chat/completions"
    async with (
        open_dispatcher({"key-a": 1}, pools={"gpt": ("key-a",)}) as d,
        httpx2.AsyncClient(
            transport=d.transport(
                "gpt",
                inner=httpx2.MockTransport(answer),
                endpoints={"key-a": Endpoint("http://a.example/v1", "sk-a")},
            )
        ) as client,
    ):

        async def call() -> None:
            assert (await client.post(url, content=b"{}")).status_code == 200

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call)
            await trio.sleep(0.5)
            # key-c joins, unlimited: the waiting call is granted there at
            # once, gives it back unused, and takes key-a when it frees.
            d.set_pool("gpt", ("key-a", "key-c"))
        stats = d.statistics().providers["key-c"]
    assert sent == [("a.example", 0.0), ("a.example", 1.0)]
    assert (stats.in_flight, stats.granted_total, stats.released_total) == (0, 1, 1)
