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

from typing import TYPE_CHECKING

import httpx2
import trio

from trio_dispatch import open_dispatcher

from ._redis import RedisServer, needs_redis

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
