"""``open_dispatcher(server_load=...)``: a server's own load keeps our requests out of its queue.

Against the fake server that queues (``FakeBatching``), served in this
trio run (``StreamingASGITransport``), its ``/metrics`` read by the
dispatcher, in virtual time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import ServerLoad, ServerMetrics, open_dispatcher, parse_server_load
from trio_dispatch.testing import (
    FakeBatching,
    FakeLLMServer,
    FakeReply,
    FakeScript,
    StreamingASGITransport,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from trio_dispatch import Dispatcher

KEY = "sk-test"
BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "q"}],
}


def fake_server(slots: int) -> FakeLLMServer:
    """A server of ``slots`` batch slots whose answers take 10 steps of 0.1 s."""
    reply = FakeReply(text=" ".join(["t"] * 10), output_tokens=10)
    batching = FakeBatching(
        slots=slots, prefill_per_token=0.0, decode_per_token=0.1, decode_growth=0.0
    )
    return FakeLLMServer(FakeScript(default=reply), api_key=KEY, batching=batching)


def metrics_of(server: FakeLLMServer) -> Callable[[], Awaitable[ServerLoad]]:
    """The server's ``/metrics``, read and parsed, as an async callable."""

    async def read() -> ServerLoad:
        async with httpx2.AsyncClient(
            transport=StreamingASGITransport(server)
        ) as client:
            answer = await client.get("http://server.test/metrics")
        return parse_server_load(answer.text)

    return read


async def call(dispatcher: Dispatcher, http: httpx2.AsyncClient) -> None:
    async with http.stream(
        "POST",
        "http://server.test/v1/chat/completions",
        json=BODY,
        headers={"authorization": f"Bearer {KEY}"},
    ) as response:
        async for _ in response.aiter_bytes():
            pass


async def burst(server: FakeLLMServer, calls: int, **options: Any) -> Dispatcher:  # noqa: ANN401
    """``calls`` calls at once through a dispatcher of limit 10, to their end."""
    async with (
        open_dispatcher({"p": 10}, **options) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=StreamingASGITransport(server))
        ) as http,
    ):
        # The first reading (or none), then the calls, together.
        await trio.sleep(0.05)
        async with trio.open_nursery() as nursery:
            for _ in range(calls):
                nursery.start_soon(call, dispatcher, http)
        return dispatcher


async def test_without_it_a_limit_above_the_slots_fills_the_servers_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = fake_server(2)
    await burst(server, 6)
    assert server.statistics().peak_waiting == 4


async def test_with_it_the_queue_stays_ours_once_the_slots_are_learned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = fake_server(2)
    # Learn the slots: a first burst queues on the server (seen at a reading).
    async with (
        open_dispatcher(
            {"p": 10}, server_load={"p": metrics_of(server)}, server_load_interval=0.1
        ) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=StreamingASGITransport(server))
        ) as http,
    ):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(call, dispatcher, http)
            await trio.sleep(0.15)
            stats = dispatcher.statistics().providers["p"]
            assert stats.server_load == ServerLoad(running=2, waiting=1, format="vllm")
            assert stats.server_slots == 2
        peak = server.statistics().peak_waiting
        # From now on, a burst waits in the dispatcher, in turn order.
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(call, dispatcher, http)
            await trio.sleep(0.05)
            assert dispatcher.statistics().providers["p"].waiting >= 4
        assert server.statistics().peak_waiting == peak == 1
        # 6 calls of 0.9 s (10 tokens, the first at once) through 2 slots:
        # 3 rounds, none late, since our own slots given back count at once.
        assert trio.current_time() - started == pytest.approx(2.7)


async def test_a_server_that_does_not_answer_is_ignored_and_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    server = fake_server(4)
    # Nothing listens at port 1 on loopback: every reading fails at once.
    metrics = ServerMetrics("http://127.0.0.1:1/metrics")
    with caplog.at_level(logging.INFO, logger="trio_dispatch"):
        dispatcher = await burst(
            server, 3, server_load={"p": metrics}, server_load_interval=0.01
        )
    assert server.statistics().completed == 3
    assert dispatcher.statistics().providers["p"].server_load is None
    warnings = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(warnings) == 1  # once per run of failures
    assert warnings[0].levelno == logging.WARNING
    assert "'p'" in warnings[0].getMessage()


async def test_a_callable_that_raises_is_ignored_and_its_recovery_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    readings: Iterator[ServerLoad | Exception] = iter(
        [RuntimeError("down"), RuntimeError("down"), ServerLoad(running=0, waiting=0)]
    )

    async def flaky() -> ServerLoad:
        reading = next(readings, ServerLoad(running=0, waiting=0))
        if isinstance(reading, Exception):
            raise reading
        return reading

    with caplog.at_level(logging.INFO, logger="trio_dispatch"):
        async with open_dispatcher(
            {"p": 1}, server_load={"p": flaky}, server_load_interval=1.0
        ) as dispatcher:
            await trio.sleep(2.5)
            assert dispatcher.statistics().providers["p"].server_load == ServerLoad(
                running=0, waiting=0
            )
    messages = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if "server load" in r.getMessage()
    ]
    assert messages == [
        (
            logging.WARNING,
            "the server load of 'p' could not be read, and is ignored until it can: down",
        ),
        (logging.INFO, "the server load of 'p' is read again"),
    ]


async def test_it_is_refused_with_redis_url_and_for_bad_values() -> None:
    async def source() -> ServerLoad:
        return ServerLoad(running=0, waiting=0)  # pragma: no cover (never read)

    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        (
            {"server_load": {"p": source}, "redis_url": "redis://nowhere.invalid"},
            ValueError,
            "^server_load cannot be used with redis_url: the fleet's grants do not"
            " read a server's load yet$",
        ),
        (
            {"server_load": ["p"]},
            TypeError,
            "^server_load must be a mapping of provider names to ServerMetrics or"
            r" async callables, got \['p'\]$",
        ),
        (
            {"server_load": {"p": "http://user:secret@host/metrics"}},
            TypeError,
            r"^server_load\['p'\] must be a ServerMetrics or an async callable"
            " returning a ServerLoad, got 'http://\\*\\*\\*@host/metrics'$",
        ),
        (
            {"server_load": {"": source}},
            ValueError,
            "provider",
        ),
        (
            {"server_load_interval": 0},
            ValueError,
            "^server_load_interval must be a positive",
        ),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            async with open_dispatcher({"p": 1}, **options):
                pass  # pragma: no cover (refused at open)
