"""``ServerMetrics`` and callables of one's own: reading a server's load, never hanging.

The server is an ASGI app in the test, reached through
``httpx2.ASGITransport``, in virtual time (``autojump_clock``): a server
that never answers is given up at exactly the timeout.
"""

from __future__ import annotations

import functools
import pathlib
from typing import TYPE_CHECKING, Any

import httpx
import httpx2
import pytest
import trio
import trio.lowlevel

from trio_dispatch import (
    ServerLoad,
    ServerLoadUnavailable,
    ServerMetrics,
    UnknownServerMetrics,
)
from trio_dispatch._server_load._probe import (
    check_server_load_source,
    read_server_load,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping

    Scope = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
    Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures"
VLLM = (FIXTURES / "metrics_vllm.prom").read_bytes()
URL = "http://127.0.0.1:8000/metrics"
# Credentials as a gateway in front of the server may want them.
SECRET_URL = "http://reader:hunter2@127.0.0.1:8000/metrics?token=sk-secret"
SHOWN_SECRET_URL = "http://***@127.0.0.1:8000/metrics?token=***"


class MetricsServer:
    """An ASGI app answering ``/metrics`` as told, and noting what it was asked."""

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = VLLM,
        hang: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.hang = hang  # None, "before-headers" or "in-body"
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {key.decode(): value.decode() for key, value in scope["headers"]}
        self.requests.append((scope["method"], scope["path"], headers))
        if self.hang == "before-headers":
            await trio.sleep_forever()
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [(b"content-type", b"text/plain; version=0.0.4")],
            }
        )
        if self.hang == "in-body":
            await send(
                {
                    "type": "http.response.body",
                    "body": self.body[:100],
                    "more_body": True,
                }
            )
            await trio.sleep_forever()
        await send({"type": "http.response.body", "body": self.body})


@pytest.fixture
def server() -> MetricsServer:
    return MetricsServer()


@pytest.fixture
async def client(server: MetricsServer) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=server)) as client:
        yield client


async def test_a_server_s_metrics_give_its_load(
    server: MetricsServer, client: httpx2.AsyncClient
) -> None:
    load = await ServerMetrics(URL).read(client)
    assert load == ServerLoad(running=12, waiting=3, format="vllm")
    ((method, path, headers),) = server.requests
    assert (method, path) == ("GET", "/metrics")
    # The classic text format, which the parser reads, not OpenMetrics.
    assert headers["accept"] == "text/plain; version=0.0.4"


async def test_credentials_in_the_url_are_sent(
    server: MetricsServer, client: httpx2.AsyncClient
) -> None:
    await ServerMetrics(SECRET_URL).read(client)
    ((_, _, headers),) = server.requests
    assert headers["authorization"] == "Basic cmVhZGVyOmh1bnRlcjI="  # reader:hunter2


@pytest.mark.parametrize("status", [204, 301, 401, 404, 500, 503])
async def test_an_answer_other_than_200_is_unavailable(
    server: MetricsServer, client: httpx2.AsyncClient, status: int
) -> None:
    server.status = status
    with pytest.raises(
        ServerLoadUnavailable, match=rf"^{URL} answered {status}, not 200$"
    ) as caught:
        await ServerMetrics(URL).read(client)
    assert type(caught.value) is ServerLoadUnavailable
    assert (caught.value.url, caught.value.status_code) == (URL, status)


@pytest.mark.parametrize(
    "body",
    [b"<html><body>Welcome to nginx!</body></html>", b"", b'{"status": "ok"}'],
    ids=["html", "empty", "json"],
)
async def test_an_answer_that_is_no_load_is_unknown_metrics(
    server: MetricsServer, client: httpx2.AsyncClient, body: bytes
) -> None:
    server.body = body
    with pytest.raises(
        UnknownServerMetrics, match=rf"^the answer of {URL} is not a load: the text .+$"
    ) as caught:
        await ServerMetrics(URL).read(client)
    # Caught by the same except as every other failed reading.
    assert isinstance(caught.value, ServerLoadUnavailable)
    assert (caught.value.url, caught.value.status_code) == (URL, None)


@pytest.mark.parametrize("hang", ["before-headers", "in-body"])
async def test_a_server_that_never_answers_is_given_up_at_exactly_the_timeout(
    server: MetricsServer,
    client: httpx2.AsyncClient,
    autojump_clock: trio.testing.MockClock,
    hang: str,
) -> None:
    server.hang = hang
    start = trio.current_time()
    with pytest.raises(
        ServerLoadUnavailable, match=rf"^{URL} gave no answer within 2\.5 seconds$"
    ) as caught:
        await ServerMetrics(URL, timeout=2.5).read(client)
    assert trio.current_time() == start + 2.5
    assert (caught.value.url, caught.value.status_code) == (URL, None)
    # The client is as good as before: the next reading succeeds at once.
    server.hang = None
    later = trio.current_time()
    assert (await ServerMetrics(URL).read(client)).running == 12
    assert trio.current_time() == later


def refuse(request: httpx2.Request) -> httpx2.Response:
    """A MockTransport's handler for a server out of reach."""
    # httpx2's own messages may quote the URL, credentials and all.
    raise httpx2.ConnectError(f"cannot connect to {request.url}", request=request)


async def test_a_server_out_of_reach_is_unavailable() -> None:
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)) as client:
        with pytest.raises(
            ServerLoadUnavailable,
            match=rf"^cannot read the load of {URL}: ConnectError$",
        ):
            await ServerMetrics(URL).read(client)


FAILURES = {
    "refused": None,
    "status": MetricsServer(status=500),
    "garbage": MetricsServer(body=b"<html></html>"),
    "hang": MetricsServer(hang="before-headers"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_credentials_never_appear_in_an_error(
    failure: str, autojump_clock: trio.testing.MockClock
) -> None:
    app = FAILURES[failure]
    transport: httpx2.AsyncBaseTransport = (
        httpx2.MockTransport(refuse) if app is None else httpx2.ASGITransport(app=app)
    )
    async with httpx2.AsyncClient(transport=transport) as client:
        with pytest.raises(ServerLoadUnavailable) as caught:
            await ServerMetrics(SECRET_URL).read(client)
    assert caught.value.url == SHOWN_SECRET_URL
    # Nor in what rides along: httpx2's exception (which holds the request,
    # its Authorization header included) is no cause or context of it.
    error: BaseException | None = caught.value
    while error is not None:
        assert not isinstance(error, httpx2.HTTPError)
        shown = f"{error} {error.args} {getattr(error, 'url', '')}"
        assert "hunter2" not in shown
        assert "sk-secret" not in shown
        error = error.__cause__ or error.__context__


def test_the_repr_masks_credentials() -> None:
    metrics = ServerMetrics(SECRET_URL, timeout=0.5)
    assert repr(metrics) == f"ServerMetrics(url={SHOWN_SECRET_URL!r}, timeout=0.5)"
    assert metrics.url == SECRET_URL  # the real one, for the request


async def test_a_legacy_httpx_client_is_refused() -> None:
    async with httpx.AsyncClient() as legacy:
        with pytest.raises(
            TypeError,
            match=r"^client must be an httpx2\.AsyncClient, got httpx\.AsyncClient: "
            r"trio-dispatch uses httpx2, httpx's maintained line; use httpx2\.AsyncClient instead$",
        ):
            await ServerMetrics(URL).read(legacy)  # type: ignore[arg-type]  # the wrong client is the test


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        pytest.param(
            {"url": 8000},
            TypeError,
            r"^url must be an http:// or https:// URL with a host, got 8000$",
            id="not-a-string",
        ),
        pytest.param(
            {"url": "127.0.0.1:8000/metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got '127\.0\.0\.1:8000/metrics'$",
            id="no-scheme",
        ),
        pytest.param(
            {"url": "ftp://host/metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got 'ftp://host/metrics'$",
            id="another-scheme",
        ),
        pytest.param(
            {"url": "http:///metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got 'http:///metrics'$",
            id="no-host",
        ),
        pytest.param(
            {"url": "http://host:99999/metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got 'http://host:99999/metrics'$",
            id="a-port-out-of-range",
        ),
        pytest.param(
            {"url": "http://host/my metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got 'http://host/my metrics'$",
            id="a-space",
        ),
        pytest.param(
            {"url": "http://reader:hunter2@host:port/metrics"},
            ValueError,
            r"^url must be an http:// or https:// URL with a host, got 'http://\*\*\*@host:port/metrics'$",
            id="credentials-masked",
        ),
        pytest.param(
            {"url": URL, "timeout": 0},
            ValueError,
            r"^timeout must be a positive number of seconds, got 0$",
            id="zero-timeout",
        ),
        pytest.param(
            {"url": URL, "timeout": -1.0},
            ValueError,
            r"^timeout must be a positive number of seconds, got -1\.0$",
            id="negative-timeout",
        ),
        pytest.param(
            {"url": URL, "timeout": float("nan")},
            ValueError,
            r"^timeout must be a positive number of seconds, got nan$",
            id="nan-timeout",
        ),
        pytest.param(
            {"url": URL, "timeout": float("inf")},
            ValueError,
            r"^timeout must be a positive number of seconds, got inf$",
            id="no-timeout",
        ),
        pytest.param(
            {"url": URL, "timeout": "1"},
            TypeError,
            r"^timeout must be a positive number of seconds, got '1'$",
            id="timeout-as-text",
        ),
    ],
)
def test_server_metrics_refuses_what_it_cannot_read(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    url = arguments.pop("url")
    with pytest.raises(error, match=message):
        ServerMetrics(url, **arguments)


def test_the_timeout_is_a_keyword_and_one_second_by_default() -> None:
    assert ServerMetrics(URL).timeout == 1.0
    with pytest.raises(TypeError):
        ServerMetrics(URL, 2.0)  # type: ignore[call-arg]  # the positional timeout is the test


# -- the callable of one's own, and the one way both are read ------------------


async def vllm_load() -> ServerLoad:
    await trio.sleep(0.25)
    return ServerLoad(running=3, waiting=1)


async def hang() -> ServerLoad:
    await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def no_load() -> tuple[int, int]:
    await trio.lowlevel.checkpoint()
    return (3, 0)


async def busy_restarting() -> ServerLoad:
    await trio.lowlevel.checkpoint()
    raise ServerLoadUnavailable("the server is restarting")


class Gateway:
    """A callable object, as a user's own reader may be."""

    async def __call__(self) -> ServerLoad:
        await trio.lowlevel.checkpoint()
        return ServerLoad(running=2, waiting=0)


async def test_a_callable_of_one_s_own_gives_its_load(
    client: httpx2.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    start = trio.current_time()
    assert await read_server_load(vllm_load, client) == ServerLoad(running=3, waiting=1)
    assert trio.current_time() == start + 0.25
    assert await read_server_load(Gateway(), client) == ServerLoad(running=2, waiting=0)


async def test_a_callable_that_never_answers_is_given_up_at_exactly_the_timeout(
    client: httpx2.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    start = trio.current_time()
    with pytest.raises(
        ServerLoadUnavailable, match=r"^hang gave no load within 0\.5 seconds$"
    ) as caught:
        await read_server_load(hang, client, timeout=0.5)
    assert trio.current_time() == start + 0.5
    assert (caught.value.url, caught.value.status_code) == (None, None)


async def test_a_callable_s_own_unavailable_load_passes_through(
    client: httpx2.AsyncClient,
) -> None:
    with pytest.raises(ServerLoadUnavailable, match=r"^the server is restarting$"):
        await read_server_load(busy_restarting, client)


async def test_a_callable_must_return_a_server_load(client: httpx2.AsyncClient) -> None:
    with pytest.raises(
        TypeError, match=r"^no_load must return a ServerLoad, got \(3, 0\)$"
    ):
        await read_server_load(no_load, client)  # type: ignore[arg-type]  # the wrong result is the test


async def test_server_metrics_are_read_within_their_own_timeout(
    server: MetricsServer,
    client: httpx2.AsyncClient,
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await read_server_load(ServerMetrics(URL), client) == ServerLoad(
        running=12, waiting=3, format="vllm"
    )
    server.hang = "before-headers"
    start = trio.current_time()
    with pytest.raises(ServerLoadUnavailable, match=r"within 2 seconds$"):
        await read_server_load(ServerMetrics(URL, timeout=2), client, timeout=5)
    assert trio.current_time() == start + 2


async def test_a_callable_s_timeout_is_checked(client: httpx2.AsyncClient) -> None:
    with pytest.raises(
        ValueError, match=r"^timeout must be a positive number of seconds, got 0$"
    ):
        await read_server_load(vllm_load, client, timeout=0)


@pytest.mark.parametrize(
    "source",
    [
        ServerMetrics(URL),
        vllm_load,
        Gateway(),
        functools.partial(read_server_load, vllm_load),
    ],
    ids=["metrics", "function", "callable-object", "partial"],
)
def test_a_source_is_server_metrics_or_an_async_callable(source: object) -> None:
    assert check_server_load_source(source) is source


def plain_load() -> ServerLoad:
    return ServerLoad(running=0, waiting=0)


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        (plain_load, "<function plain_load at 0x[0-9a-f]+>"),
        (None, "None"),
        # An address given bare, credentials and all, is shown masked.
        (
            SECRET_URL,
            "'http://\\*\\*\\*@127\\.0\\.0\\.1:8000/metrics\\?token=\\*\\*\\*'",
        ),
    ],
    ids=["a-plain-function", "none", "a-bare-url"],
)
def test_anything_else_is_no_source(source: object, shown: str) -> None:
    with pytest.raises(
        TypeError,
        match=rf"^server_load\['local'\] must be a ServerMetrics or an async callable"
        rf" returning a ServerLoad, got {shown}$",
    ):
        check_server_load_source(source, "server_load['local']")
