"""``Dispatcher.transport`` on a dispatcher shared through a real Redis.

A transport's slot is held from its request until its response is closed,
which happens later, outside the call that took it, perhaps in another
task. With Redis, a slot's lease has a deadline; entering the slot as
``async with`` does would open a cancel scope for it in the sending task,
left open when the call returns, and trio's cancel-scope stack would be
corrupted as soon as that task left an enclosing scope. The transport
takes its slot without one (``Dispatcher._hold``).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import httpx2
import pytest
import trio

from trio_dispatch import LeaseLost, open_dispatcher

from .._redis import Faults, RedisServer, needs_redis, node_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher

pytestmark = needs_redis

URL = "https://llm.test/v1/chat/completions"
LEASE = 1.5
CHUNKS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


class Body(httpx2.AsyncByteStream):
    """A streamed body, a chunk at a time; notes when it is closed."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            await trio.sleep(0.01)
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults.install(monkeypatch)


def held(dispatcher: Dispatcher) -> int:
    """Slots of ``openai`` held by this process now."""
    return dispatcher.statistics().providers["openai"].local_in_flight


async def test_a_stream_closed_after_its_call_returned_gives_its_slot_back(
    server: RedisServer,
) -> None:
    bodies: list[Body] = []
    held_when_sent: list[int] = []
    async with open_dispatcher(
        {"openai": 1}, redis_url=server.url, lease=LEASE
    ) as dispatcher:

        def handle(request: httpx2.Request) -> httpx2.Response:
            held_when_sent.append(held(dispatcher))
            bodies.append(Body())
            return httpx2.Response(200, stream=bodies[-1])

        transport = dispatcher.transport("openai", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            responses: list[httpx2.Response] = []

            async def send() -> None:
                # The call is made inside a scope that is left before the
                # response is read: its slot must not be tied to the task.
                with trio.CancelScope():
                    request = client.build_request("POST", URL, json={"n": 1})
                    responses.append(await client.send(request, stream=True))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
            # The sending task has ended; this one reads and closes.
            (response,) = responses
            assert response.status_code == 200
            assert held(dispatcher) == 1
            assert [chunk async for chunk in response.aiter_raw()] == CHUNKS
            await response.aclose()
            assert bodies[0].closed
            assert held(dispatcher) == 0
            # Past the lease: a scope left open would have cancelled this.
            await trio.sleep(2 * LEASE)
            # Given back in Redis too: the next call gets the only slot.
            with trio.fail_after(5):
                second = await client.post(URL, json={"n": 2})
            assert second.status_code == 200
        # The ledger in Redis hears of the release a moment later.
        with trio.fail_after(5):
            while dispatcher.statistics().providers["openai"].in_flight:  # noqa: ASYNC110 (the state is in Redis, across a socket)
                await trio.sleep(0.005)
        stats = dispatcher.statistics().providers["openai"]
    assert held_when_sent == [1, 1]
    assert (stats.granted_total, stats.released_total) == (2, 2)
    assert (stats.in_flight, stats.local_in_flight) == (0, 0)


class Endless(httpx2.AsyncByteStream):
    """A streamed body that never ends; notes when it is closed."""

    def __init__(self) -> None:
        self.closed_at: float | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            await trio.sleep(0.05)
            yield b"data: more\n\n"

    async def aclose(self) -> None:
        if self.closed_at is None:
            self.closed_at = trio.current_time()


@pytest.mark.parametrize("reading", [True, False], ids=["reading", "not-reading"])
async def test_a_call_cut_off_from_redis_for_a_lease_is_closed_before_regranting(
    server: RedisServer, faults: Faults, *, reading: bool
) -> None:
    bodies: list[Endless] = []
    errors: list[LeaseLost] = []
    granted: list[float] = []
    async with AsyncExitStack() as stack:
        cut, other = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"openai": 1}, redis_url=server.url, namespace="ns", lease=LEASE
                )
            )
            for _ in range(2)
        ]

        def handle(request: httpx2.Request) -> httpx2.Response:
            bodies.append(Endless())
            return httpx2.Response(200, stream=bodies[-1])

        transport = cut.transport("openai", inner=httpx2.MockTransport(handle))
        client = await stack.enter_async_context(
            httpx2.AsyncClient(transport=transport)
        )
        response = await client.send(
            client.build_request("POST", URL, json={"n": 1}), stream=True
        )

        async def wait() -> None:
            async with other.slot("openai"):
                granted.append(trio.current_time())

        async def read() -> None:
            try:
                async for _ in response.aiter_raw():
                    pass
            except LeaseLost as exc:
                errors.append(exc)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                with trio.fail_after(5):
                    while other.statistics().providers["openai"].waiting != 1:  # noqa: ASYNC110 (the state is in Redis, across a socket)
                        await trio.sleep(0.005)
                if reading:
                    nursery.start_soon(read)
                faults.down.add(node_of(cut, "openai"))
                down_at = trio.current_time()
        if not reading:
            # Nobody read: the body was closed under the consumer, whose
            # next read says why.
            await read()
        [error] = errors
        assert str(error) == (
            f"the lease of a slot of 'openai' went {LEASE:g} seconds without renewal"
        )
        assert (error.provider, error.lease) == ("openai", LEASE)
        [body] = bodies
        assert body.closed_at is not None
        # Renewed a third of a lease before the cut at the earliest; closed
        # before the fleet could grant the slot again.
        assert body.closed_at - down_at >= LEASE * 2 / 3
        [granted_at] = granted
        assert body.closed_at <= granted_at
        stats = cut.statistics().providers["openai"]
        assert (stats.local_in_flight, stats.released_total) == (0, 1)
        await response.aclose()


async def test_a_call_answered_429_keeps_its_turn_s_place_across_the_fleet(
    server: RedisServer,
) -> None:
    # Limit 1 for the fleet. Turn A, in one process, is answered 429 with a
    # 0.3 s pause; turns B and C, younger, wait in another process. A's
    # retry comes 0.3 s after the pause has ended: the fleet kept A's place
    # meanwhile, in the shared queue, so B does not pass it.
    sent: list[tuple[str, float]] = []

    async def handle(request: httpx2.Request) -> httpx2.Response:
        name = request.content.decode()
        first = name not in {seen for seen, _ in sent}
        sent.append((name, trio.current_time()))
        if name == "A" and first:
            await trio.sleep(0.5)
            return httpx2.Response(429, headers={"retry-after-ms": "300"})
        await trio.sleep(0.05)
        return httpx2.Response(200)

    statuses: list[int] = []
    async with AsyncExitStack() as stack:
        first, second = [
            await stack.enter_async_context(
                open_dispatcher({"openai": 1}, redis_url=server.url, namespace="ns")
            )
            for _ in range(2)
        ]
        clients = [
            await stack.enter_async_context(
                httpx2.AsyncClient(
                    transport=d.transport("openai", inner=httpx2.MockTransport(handle))
                )
            )
            for d in (first, second)
        ]

        async def a() -> None:
            with first.turn(conversation_id="A"):
                statuses.append((await clients[0].post(URL, content=b"A")).status_code)
                await trio.sleep(0.6)  # the SDK's sleep, and a little more
                statuses.append((await clients[0].post(URL, content=b"A")).status_code)

        async def younger(name: str) -> None:
            with second.turn(conversation_id=name):
                statuses.append(
                    (await clients[1].post(URL, content=name.encode())).status_code
                )

        def local(dispatcher: Dispatcher) -> tuple[int, int]:
            stats = dispatcher.statistics().providers["openai"]
            return stats.local_in_flight, stats.local_waiting

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a)
                while not sent:  # noqa: ASYNC110 (a request sent through Redis)
                    await trio.sleep(0.005)
                for waiting, name in enumerate("BC", start=1):
                    nursery.start_soon(younger, name)
                    while local(second) != (0, waiting):  # noqa: ASYNC110 (the state is in Redis, across a socket)
                        await trio.sleep(0.005)
        first_left, second_left = local(first), local(second)
    assert [name for name, _ in sent] == ["A", "A", "B", "C"]
    assert sorted(statuses) == [200, 200, 200, 429]
    # The retry went after the pause (0.3 s after the 429 at the earliest).
    (_, a_sent), (_, retried), _, _ = sent
    assert retried - a_sent >= 0.5 + 0.3
    assert first_left == second_left == (0, 0)
