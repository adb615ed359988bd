"""``StreamingASGITransport``: an ASGI app served in the same trio run, streaming."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch.testing import (
    FakeLLMServer,
    FakeReply,
    FakeScript,
    StreamingASGITransport,
)

if TYPE_CHECKING:
    from collections.abc import Callable


def paced_app(
    heard: list[dict[str, Any]], *, fail_after: int | None = None
) -> Callable[..., Any]:
    """An app that sends three chunks a second apart, recording what it receives."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # noqa: ANN401
        request = await receive()
        heard.append({"path": scope["path"], "query": scope["query_string"], **request})
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        for n in range(3):
            if n == fail_after:
                raise ValueError("the app broke")
            await send(
                {"type": "http.response.body", "body": b"%d" % n, "more_body": True}
            )
            with trio.move_on_after(1.0):
                message = await receive()
                heard.append(message)
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def test_chunks_arrive_as_the_app_sends_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    heard: list[dict[str, Any]] = []
    async with httpx2.AsyncClient(
        transport=StreamingASGITransport(paced_app(heard))
    ) as client:
        start = trio.current_time()
        async with client.stream(
            "POST", "http://app.test/x?y=1", content=b"hi"
        ) as response:
            assert response.status_code == 201
            assert response.headers["content-type"] == "text/plain"
            arrivals = [
                (chunk, trio.current_time() - start)
                async for chunk in response.aiter_bytes()
            ]
    assert arrivals == [(b"0", 0.0), (b"1", 1.0), (b"2", 2.0)]
    assert heard == [
        {
            "path": "/x",
            "query": b"y=1",
            "type": "http.request",
            "body": b"hi",
            "more_body": False,
        }
    ]


async def test_a_response_closed_early_disconnects_the_app(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The transport's own response, read and closed as a client closes it
    # (httpx2's client wraps the body in async generators of its own, which
    # its older versions leave to the garbage collector when left early).
    heard: list[dict[str, Any]] = []
    async with StreamingASGITransport(paced_app(heard)) as transport:
        response = await transport.handle_async_request(
            httpx2.Request("GET", "http://app.test/")
        )
        body = response.stream
        assert isinstance(body, httpx2.AsyncByteStream)
        assert await anext(aiter(body)) == b"0"
        await body.aclose()
        await trio.testing.wait_all_tasks_blocked()
        # Heard at once, not after the second's pause.
        assert trio.current_time() == 0.0
    assert heard[-1] == {"type": "http.disconnect"}


async def test_an_app_error_before_its_response_fails_the_request() -> None:
    async def broken(scope: object, receive: object, send: object) -> None:
        raise KeyError("nope")

    async with httpx2.AsyncClient(transport=StreamingASGITransport(broken)) as client:
        with pytest.raises(KeyError, match="nope"):
            await client.get("http://app.test/")


async def test_an_app_error_mid_body_fails_the_read_after_what_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    heard: list[dict[str, Any]] = []
    app = paced_app(heard, fail_after=2)
    chunks = []
    async with (
        httpx2.AsyncClient(transport=StreamingASGITransport(app)) as client,
        client.stream("GET", "http://app.test/") as response,
    ):
        with pytest.raises(ValueError, match="the app broke"):
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
    assert chunks == [b"0", b"1"]


async def test_an_app_that_sends_no_response_fails_the_request() -> None:
    async def silent(scope: object, receive: object, send: object) -> None:
        return

    async with httpx2.AsyncClient(transport=StreamingASGITransport(silent)) as client:
        with pytest.raises(RuntimeError, match=r"^the app ended without a response$"):
            await client.get("http://app.test/")


async def test_it_serves_only_inside_its_clients_block() -> None:
    transport = StreamingASGITransport(paced_app([]))
    client = httpx2.AsyncClient(transport=transport)
    with pytest.raises(RuntimeError, match="only inside its client's `async with`"):
        await client.get("http://app.test/")
    async with transport:
        with pytest.raises(RuntimeError, match="can be entered only once"):
            await transport.__aenter__()
    with pytest.raises(TypeError, match=r"^app must be an ASGI application, got 3$"):
        StreamingASGITransport(3)  # type: ignore[arg-type]


async def test_the_fake_server_streams_at_its_scripted_pace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    reply = FakeReply(
        text="a b c", output_tokens=3, time_to_first_token=0.5, tokens_per_second=4
    )
    server = FakeLLMServer(FakeScript(default=reply), api_key="sk-test")
    async with httpx2.AsyncClient(transport=StreamingASGITransport(server)) as client:
        start = trio.current_time()
        async with client.stream(
            "POST",
            "http://fake.test/v1/chat/completions",
            json={
                "model": "m",
                "stream": True,
                "messages": [{"role": "user", "content": "q"}],
            },
            headers={"authorization": "Bearer sk-test"},
        ) as response:
            assert response.status_code == 200
            times = {trio.current_time() - start async for _ in response.aiter_bytes()}
    # The opening event at once, the tokens at 0.5, 0.75 and 1.0.
    assert {0.5, 0.75, 1.0} <= times
    assert max(times) == 1.0
