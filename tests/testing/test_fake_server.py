"""The fake LLM server: what it checks, what it streams, what it counts.

These tests talk to it with plain httpx2 over loopback, reading the raw
server-sent events, so they check the wire itself rather than what a
provider makes of it.
"""

from __future__ import annotations

import itertools
import json
import re
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch.testing import (
    FakeLLMServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    FakeToolCall,
    Fault,
    open_fake_llm_server,
)
from trio_dispatch.testing._encoders import encode_reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from trio_dispatch.testing import FaultKind, WireFormat

KEY = "sk-fake-server-test"
OPENAI_BODY: dict[str, Any] = {
    "model": "gpt-test",
    "messages": [{"role": "user", "content": "Hello"}],
    "stream": True,
}
ANTHROPIC_BODY: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "Hello"}],
    "stream": True,
}
USAGE = {"stream_options": {"include_usage": True}}
OPENAI_HEADERS = {"authorization": f"Bearer {KEY}"}
ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


@pytest.fixture
async def server() -> AsyncIterator[FakeLLMServer]:
    async with open_fake_llm_server() as fake:
        yield fake


@pytest.fixture
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient() as http:
        yield http


async def post_openai(
    client: httpx2.AsyncClient,
    server: FakeLLMServer,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    return await client.post(
        f"{server.openai_base_url}/chat/completions",
        json=OPENAI_BODY if body is None else body,
        headers=OPENAI_HEADERS if headers is None else headers,
    )


async def post_anthropic(
    client: httpx2.AsyncClient,
    server: FakeLLMServer,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    return await client.post(
        f"{server.anthropic_base_url}/v1/messages",
        json=ANTHROPIC_BODY if body is None else body,
        headers=ANTHROPIC_HEADERS if headers is None else headers,
    )


def events_of(response: httpx2.Response) -> list[tuple[str, str]]:
    """``(event name, data)`` of every server-sent event in a whole body."""
    events = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields.get("event", ""), fields["data"]))
    return events


def openai_chunks(response: httpx2.Response) -> list[Any]:
    return [json.loads(data) for _, data in events_of(response) if data != "[DONE]"]


def openai_text(response: httpx2.Response, field: str = "content") -> str:
    return "".join(
        chunk["choices"][0]["delta"].get(field) or ""
        for chunk in openai_chunks(response)
        if chunk["choices"]
    )


# -- where it is -------------------------------------------------------------


async def test_urls(server: FakeLLMServer) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.base_url)
    assert server.openai_base_url == server.base_url + "/v1"
    assert server.anthropic_base_url == server.base_url
    assert repr(server) == f"<FakeLLMServer {server.base_url}>"


def test_urls_are_unknown_before_serving() -> None:
    fake = FakeLLMServer(FakeScript())
    with pytest.raises(RuntimeError, match=r"^the fake server is not serving yet$"):
        fake.base_url  # noqa: B018 (the property raises)


async def test_two_servers_get_two_ports() -> None:
    async with open_fake_llm_server() as one, open_fake_llm_server() as two:
        assert one.base_url != two.base_url


# -- what it refuses -------------------------------------------------------------


async def test_openai_without_a_key_is_401(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    response = await post_openai(client, server, headers={})
    assert response.status_code == 401
    assert response.json() == {
        "error": {
            "message": "missing or invalid Authorization",
            "type": "authentication_error",
            "param": None,
            "code": None,
        }
    }
    (request,) = server.requests
    assert not request.authenticated


async def test_anthropic_without_a_key_is_401(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    response = await post_anthropic(
        client, server, headers={"anthropic-version": "2023-06-01"}
    )
    assert response.status_code == 401
    assert response.json()["type"] == "error"
    assert response.json()["error"] == {
        "type": "authentication_error",
        "message": "missing or invalid x-api-key",
    }


async def test_a_configured_key_must_match(client: httpx2.AsyncClient) -> None:
    async with open_fake_llm_server(api_key="right") as server:
        wrong = await post_openai(
            client, server, headers={"authorization": "Bearer wrong"}
        )
        right = await post_openai(
            client, server, headers={"authorization": "Bearer right"}
        )
        basic = await post_openai(
            client, server, headers={"authorization": "Basic right"}
        )
    assert (wrong.status_code, right.status_code, basic.status_code) == (401, 200, 401)
    assert [r.authenticated for r in server.requests] == [False, True, False]


@pytest.mark.parametrize(
    ("api_key", "error", "message"),
    [
        ("", ValueError, r"^api_key must not be empty; pass None to accept any key$"),
        (" sk-x", ValueError, r"^api_key must not begin or end with whitespace$"),
        ("sk-x\n", ValueError, r"^api_key must not begin or end with whitespace$"),
        (b"sk-x", TypeError, r"^api_key must be a string or None, got bytes$"),
    ],
)
def test_a_key_no_request_could_match_is_refused_at_the_call(
    api_key: object, error: type[Exception], message: str
) -> None:
    # Refused when called, outside any trio run: nothing is bound, and no
    # server is left answering every request with 401.
    with pytest.raises(error, match=message):
        open_fake_llm_server(api_key=api_key)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        FakeLLMServer(FakeScript(), api_key=api_key)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("wire", "body", "headers", "message"),
    [
        (
            "anthropic",
            None,
            {"x-api-key": KEY},
            "anthropic-version: header is required",
        ),
        ("openai", {"messages": []}, None, "model: Field required"),
        ("openai", {"model": "m"}, None, "messages: Field required"),
        (
            "openai",
            {"model": "m", "messages": "hi", "stream": True},
            None,
            "messages: must be an array",
        ),
        (
            "anthropic",
            {"model": "m", "messages": [], "stream": True},
            None,
            "max_tokens: Field required",
        ),
        (
            "openai",
            {**OPENAI_BODY, "stream": False},
            None,
            "the fake server only streams: set stream",
        ),
        ("anthropic", [1, 2], None, "the body is not a JSON object"),
    ],
)
async def test_bad_requests_are_400(
    server: FakeLLMServer,
    client: httpx2.AsyncClient,
    *,
    wire: str,
    body: object,
    headers: dict[str, str] | None,
    message: str,
) -> None:
    post = post_openai if wire == "openai" else post_anthropic
    response = await post(client, server, body, headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["message"]) == ("invalid_request_error", message)
    assert server.statistics().responses_by_status == {400: 1}


async def test_a_body_that_is_not_json(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    response = await client.post(
        f"{server.openai_base_url}/chat/completions",
        content=b"{nope",
        headers=OPENAI_HEADERS,
    )
    assert response.status_code == 400
    (request,) = server.requests
    assert request.body is None


async def test_unknown_routes_and_methods(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    assert (await client.post(f"{server.base_url}/v1/completions")).status_code == 404
    assert (
        await client.get(f"{server.openai_base_url}/chat/completions")
    ).status_code == 405
    assert server.requests == []  # not LLM requests
    assert server.statistics().responses_by_status == {404: 1, 405: 1}


async def test_recorded_requests_keep_no_secrets(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    before = trio.current_time()
    await post_openai(client, server, headers={**OPENAI_HEADERS, "x-trace": "t1"})
    await post_anthropic(client, server)
    first, second = server.requests
    assert isinstance(first, FakeRequest)
    assert (first.format, first.path, first.body) == (
        "openai",
        "/v1/chat/completions",
        OPENAI_BODY,
    )
    assert (second.format, second.path, second.body) == (
        "anthropic",
        "/v1/messages",
        ANTHROPIC_BODY,
    )
    assert first.headers["x-trace"] == "t1"
    assert second.headers["anthropic-version"] == "2023-06-01"
    for request in (first, second):
        assert "authorization" not in request.headers
        assert "x-api-key" not in request.headers
        assert KEY not in repr(request)
        assert request.authenticated
        assert before <= request.arrived_at <= trio.current_time()
    assert first.arrived_at <= second.arrived_at


# -- what it streams ---------------------------------------------------------------


async def test_the_server_streams_what_the_encoders_make(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    # The shape of each format is the encoders' (test_fake_encoders.py); the
    # server sends their bytes as they are, with the request's model and
    # usage option, numbering its ids from 1.
    reply = FakeReply(
        text="Hi there",
        reasoning="Hmm.",
        tool_calls=(FakeToolCall("f", {"x": 1}),),
        input_tokens=10,
    )
    server.set_script(FakeScript(default=reply))
    ids = itertools.count(1)
    asked: list[tuple[Any, WireFormat, dict[str, Any], bool]] = [
        (post_openai, "openai", OPENAI_BODY, False),
        (post_openai, "openai", {**OPENAI_BODY, **USAGE}, True),
        (post_anthropic, "anthropic", ANTHROPIC_BODY, True),
    ]
    for post, wire, body, include_usage in asked:
        response = await post(client, server, body)
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = encode_reply(
            reply,
            wire,
            model=body["model"],
            estimated_input_tokens=1,
            include_usage=include_usage,
            ids=ids,
        )
        assert response.content == b"".join(event.data for event in events)


async def test_estimated_usage(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(FakeScript(default=FakeReply(text="a b c", reasoning="d e")))
    data = [json.loads(d) for _, d in events_of(await post_anthropic(client, server))]
    messages = json.dumps(ANTHROPIC_BODY["messages"])
    assert data[0]["message"]["usage"]["input_tokens"] == len(messages) // 4
    assert data[-2]["usage"]["output_tokens"] == 5  # one per chunk


# -- faults on the wire --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "openai_type", "anthropic_type"),
    [
        ("rate_limit", 429, "rate_limit_exceeded", "rate_limit_error"),
        ("server_error", 500, "server_error", "api_error"),
        ("unavailable", 503, "service_unavailable", "overloaded_error"),
        ("overloaded", 529, "overloaded_error", "overloaded_error"),
    ],
)
async def test_status_faults_on_the_wire(
    server: FakeLLMServer,
    client: httpx2.AsyncClient,
    *,
    kind: FaultKind,
    status: int,
    openai_type: str,
    anthropic_type: str,
) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(fault=Fault(kind, retry_after=2, retry_after_ms=1500))
        )
    )
    openai = await post_openai(client, server)
    anthropic = await post_anthropic(client, server)
    for response in (openai, anthropic):
        assert response.status_code == status
        assert response.headers["retry-after"] == "2"
        assert response.headers["retry-after-ms"] == "1500"
    assert openai.json()["error"]["type"] == openai_type
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == anthropic_type
    assert server.statistics().responses_by_status == {status: 2}


async def test_overloaded_529_is_anthropics_body(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=Fault("overloaded"))))
    response = await post_anthropic(client, server)
    assert response.status_code == 529
    assert "retry-after" not in response.headers
    assert response.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_fake",
    }


async def test_truncate_ends_cleanly_without_the_terminator(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(FakeScript(default=FakeReply(fault=Fault("truncate"))))
    response = await post_openai(client, server)
    assert response.status_code == 200
    assert events_of(response)[-1][1] != "[DONE]"
    assert openai_chunks(response)[-1]["choices"][0]["finish_reason"] == "stop"
    response = await post_anthropic(client, server)
    assert [name for name, _ in events_of(response)][-1] == "message_delta"
    assert server.statistics().completed == 2


async def test_disconnect_drops_the_connection(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("disconnect", after_events=2)))
    )
    with pytest.raises(httpx2.RemoteProtocolError):
        await post_openai(client, server)


async def test_malformed_sends_invalid_json_then_the_rest(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(text="a b", fault=Fault("malformed", after_events=1))
        )
    )
    events = events_of(await post_openai(client, server))
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[1][1])
    assert events[-1] == ("", "[DONE]")
    assert len(events) == 1 + 1 + 2 + 1 + 1  # role, malformed, words, finish, [DONE]


async def test_stream_error_event(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    fault = Fault(
        "stream_error", after_events=1, error_type="api_error", message="oops"
    )
    server.set_script(FakeScript(default=FakeReply(fault=fault)))
    openai = events_of(await post_openai(client, server))
    assert json.loads(openai[-1][1]) == {
        "error": {"message": "oops", "type": "api_error", "param": None, "code": None}
    }
    anthropic = events_of(await post_anthropic(client, server))
    assert anthropic[-1][0] == "error"
    assert json.loads(anthropic[-1][1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "oops"},
    }


async def test_a_stall_lasts_until_the_client_leaves(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("stall", after_events=1)))
    )
    with pytest.raises(httpx2.ReadTimeout):
        await client.post(
            f"{server.openai_base_url}/chat/completions",
            json=OPENAI_BODY,
            headers=OPENAI_HEADERS,
            timeout=httpx2.Timeout(5, read=0.1),
        )
    with trio.fail_after(2):
        stats = await server.wait_idle()
    assert stats.client_disconnects == 1
    assert stats.completed == 0


# -- timing ----------------------------------------------------------------------------


async def test_latency_delays_the_headers(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(FakeScript(default=FakeReply(latency=0.1)))
    started = trio.current_time()
    async with client.stream(
        "POST",
        f"{server.openai_base_url}/chat/completions",
        json=OPENAI_BODY,
        headers=OPENAI_HEADERS,
    ) as response:
        headers_at = trio.current_time()
        await response.aread()
    assert headers_at - started >= 0.1


async def test_time_to_first_token_and_rate(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(
                text="a b c d e", time_to_first_token=0.05, tokens_per_second=100
            )
        )
    )
    arrivals: list[float] = []
    async with client.stream(
        "POST",
        f"{server.openai_base_url}/chat/completions",
        json=OPENAI_BODY,
        headers=OPENAI_HEADERS,
    ) as response:
        started = trio.current_time()
        async for line in response.aiter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                arrivals.append(trio.current_time())
    assert len(arrivals) == 5
    assert arrivals[0] - started >= 0.05
    assert arrivals[-1] - arrivals[0] >= 4 / 100


# -- the script ------------------------------------------------------------------------


async def test_replies_in_order_then_the_default(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(
            default=FakeReply(text="default"),
            replies=(FakeReply(text="first"), FakeReply(text="second")),
        )
    )
    texts = [openai_text(await post_openai(client, server)) for _ in range(4)]
    assert texts == ["first", "second", "default", "default"]


async def test_choose_decides_first(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    def choose(request: FakeRequest) -> FakeReply | None:
        if request.format == "anthropic":
            return FakeReply(text="for claude")
        return None

    server.set_script(
        FakeScript(
            default=FakeReply(text="default"),
            replies=(FakeReply(text="queued"),),
            choose=choose,
        )
    )
    first = openai_text(await post_openai(client, server))
    data = [json.loads(d) for _, d in events_of(await post_anthropic(client, server))]
    second = openai_text(await post_openai(client, server))
    claude = "".join(
        d["delta"].get("text", "") for d in data if d["type"] == "content_block_delta"
    )
    assert (first, claude, second) == ("queued", "for claude", "default")


async def test_set_script_starts_the_replies_again(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    script = FakeScript(
        replies=(FakeReply(text="one"),), default=FakeReply(text="later")
    )
    server.set_script(script)
    assert openai_text(await post_openai(client, server)) == "one"
    assert openai_text(await post_openai(client, server)) == "later"
    server.set_script(script)
    assert server.script is script
    assert openai_text(await post_openai(client, server)) == "one"


async def test_the_script_can_change_while_a_stream_runs(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    server.set_script(
        FakeScript(default=FakeReply(text="slow answer here", tokens_per_second=20))
    )
    async with client.stream(
        "POST",
        f"{server.openai_base_url}/chat/completions",
        json=OPENAI_BODY,
        headers=OPENAI_HEADERS,
    ) as response:
        server.set_script(FakeScript(default=FakeReply(text="new")))
        body = await response.aread()
    assert b"slow" in body  # the running stream keeps its reply
    assert openai_text(await post_openai(client, server)) == "new"


# -- statistics ------------------------------------------------------------------------


async def test_peak_concurrency_and_disconnects(server: FakeLLMServer) -> None:
    server.set_script(
        FakeScript(default=FakeReply(fault=Fault("stall", after_events=1)))
    )
    async with httpx2.AsyncClient() as client, trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(post_openai, client, server)
        with trio.fail_after(2):
            stats = await server.wait_until(
                lambda s: s.in_flight == 3 and s.responses_by_status.get(200) == 3
            )
        assert stats.peak_in_flight == 3
        assert stats.responses_by_status == {200: 3}
        nursery.cancel_scope.cancel()
    with trio.fail_after(2):
        stats = await server.wait_idle()
    assert (stats.in_flight, stats.peak_in_flight, stats.requests_total) == (0, 3, 3)
    assert stats.client_disconnects == 3
    assert stats.completed == 0


async def test_requests_one_at_a_time_peak_at_one(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    for _ in range(3):
        await post_openai(client, server)
    stats = server.statistics()
    assert (stats.requests_total, stats.peak_in_flight, stats.completed) == (3, 1, 3)
    assert stats.responses_by_status == {200: 3}
    assert stats.client_disconnects == 0


async def test_statistics_are_a_snapshot(
    server: FakeLLMServer, client: httpx2.AsyncClient
) -> None:
    before = server.statistics()
    await post_openai(client, server)
    assert before.requests_total == 0
    assert before.responses_by_status == {}
    assert server.statistics().requests_total == 1


async def test_wait_until_returns_at_once_when_true(server: FakeLLMServer) -> None:
    with trio.fail_after(1):
        stats = await server.wait_until(lambda s: s.requests_total == 0)
    assert stats.in_flight == 0


async def test_exit_stops_streams_in_flight() -> None:
    script = FakeScript(default=FakeReply(fault=Fault("stall", after_events=1)))
    failures: list[BaseException] = []

    async def request(client: httpx2.AsyncClient, server: FakeLLMServer) -> None:
        try:
            await post_openai(client, server)
        except httpx2.TransportError as exc:
            failures.append(exc)

    with trio.fail_after(2):
        async with (
            httpx2.AsyncClient() as client,
            trio.open_nursery() as nursery,
            open_fake_llm_server(script) as server,
        ):
            nursery.start_soon(request, client, server)
            await server.wait_until(lambda s: s.in_flight == 1)
            # Leaving the server's block first stops it, so the request
            # fails (rather than hangs) before the nursery waits for it.
    assert len(failures) == 1


async def test_a_ctrl_c_that_hypercorn_swallows_still_ends_the_block(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # trio raises Ctrl+C's KeyboardInterrupt in whatever task is running;
    # here, one of hypercorn's, once it listens. hypercorn takes it as its
    # cue to stop and returns, and the block slept on with no server.
    listen = trio.serve_listeners

    async def ctrl_c_once_listening(
        handler: Callable[[trio.SocketStream], Awaitable[object]],
        listeners: list[trio.SocketListener],
        *,
        handler_nursery: trio.Nursery | None = None,
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(listen, handler, listeners, handler_nursery=handler_nursery)
            )
            await trio.testing.wait_all_tasks_blocked()
            raise KeyboardInterrupt

    monkeypatch.setattr(trio, "serve_listeners", ctrl_c_once_listening)
    with pytest.RaisesGroup(KeyboardInterrupt), trio.fail_after(60):
        async with open_fake_llm_server():
            await trio.sleep_forever()


# -- the script's own checks --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Fault("nope"), r"^kind must be one of "),  # type: ignore[arg-type]
        (
            lambda: Fault("stall", after_events=-1),
            r"^after_events must be a non-negative integer, got -1$",
        ),
        (
            lambda: Fault("rate_limit", retry_after=-1),
            r"^retry_after must be a non-negative number of seconds, got -1$",
        ),
        (
            lambda: FakeReply(latency=float("inf")),
            r"^latency must be a non-negative number of seconds, got inf$",
        ),
        (
            lambda: FakeReply(tokens_per_second=0),
            r"^tokens_per_second must be a positive number, got 0$",
        ),
        (
            lambda: FakeReply(argument_chunks=0),
            r"^argument_chunks must be a positive integer, got 0$",
        ),
        (
            lambda: FakeReply(output_tokens=-5),
            r"^output_tokens must be a non-negative integer, got -5$",
        ),
    ],
)
def test_script_values_are_checked(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_fault_status() -> None:
    assert [
        Fault(k).status
        for k in ("rate_limit", "server_error", "unavailable", "overloaded", "stall")
    ] == [429, 500, 503, 529, None]


async def test_set_script_wants_a_script(server: FakeLLMServer) -> None:
    with pytest.raises(TypeError, match=r"^script must be a FakeScript, got "):
        server.set_script(FakeReply())  # type: ignore[arg-type]
