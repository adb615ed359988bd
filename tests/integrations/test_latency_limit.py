"""``AdaptiveLimit(signal="latency")`` against the fake server that queues, in virtual time.

Twelve agents make calls back to back through ``Dispatcher.transport`` to
a ``FakeBatching`` server of a few slots (its throughput grows with the
batch up to them, not beyond), served in this trio run. The limit must
settle at the server's slots (give or take the slot it probes past them),
follow the server when it gets slower or faster (the calls switched to
another server, as when a replica goes or comes), and never leave its
bounds.
"""

from __future__ import annotations

import random
import statistics
from typing import TYPE_CHECKING, Any

import httpx2
import trio
import trio.testing

from trio_dispatch import AdaptiveLimit, open_dispatcher
from trio_dispatch.testing import (
    FakeBatching,
    FakeLLMServer,
    FakeReply,
    FakeScript,
    StreamingASGITransport,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from trio_dispatch.testing import FakeRequest

KEY = "sk-test"
AGENTS = 12
BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def server(slots: int, seed: int = 1) -> FakeLLMServer:
    """A server of ``slots`` slots whose answers are 20 to 60 tokens, seeded."""
    lengths = random.Random(seed)

    def reply(request: FakeRequest) -> FakeReply:
        tokens = lengths.randint(20, 60)
        return FakeReply(text="word " * tokens, output_tokens=tokens)

    return FakeLLMServer(
        FakeScript(choose=reply),
        api_key=KEY,
        batching=FakeBatching(slots=slots, decode_per_token=0.02, decode_growth=0.25),
    )


class Switch:
    """An ASGI app that passes each request to the server it points at now."""

    def __init__(self, first: FakeLLMServer) -> None:
        self.to = first

    async def __call__(
        self,
        scope: dict[str, object],
        receive: Callable[[], Awaitable[dict[str, object]]],
        send: Callable[[dict[str, object]], Awaitable[None]],
    ) -> None:
        await self.to(scope, receive, send)


async def run(
    limit: AdaptiveLimit, phases: list[tuple[FakeLLMServer, float]]
) -> list[list[int]]:
    """The limit every second of each phase: ``(server, seconds)`` in turn."""
    switch = Switch(phases[0][0])
    traces: list[list[int]] = []
    async with (
        open_dispatcher({"p": limit}) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("p", inner=StreamingASGITransport(switch))
        ) as http,
        trio.open_nursery() as nursery,
    ):

        async def agent() -> None:
            while True:
                async with http.stream(
                    "POST",
                    "http://server.test/v1/chat/completions",
                    json=BODY,
                    headers={"authorization": f"Bearer {KEY}"},
                ) as answer:
                    async for _ in answer.aiter_bytes():
                        pass

        for _ in range(AGENTS):
            nursery.start_soon(agent)
        for to, seconds in phases:
            switch.to = to
            trace = []
            for _ in range(int(seconds)):
                await trio.sleep(1.0)
                trace.append(dispatcher.limits()["p"])
            traces.append(trace)
        nursery.cancel_scope.cancel()
    return traces


LATENCY = AdaptiveLimit(initial=1, maximum=64, signal="latency")


def settled(trace: list[int]) -> float:
    """The limit's median over the last half of a phase."""
    return statistics.median(trace[len(trace) // 2 :])


async def test_it_settles_at_the_servers_slots_and_keeps_its_queue_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    six = server(6)
    (trace,) = await run(LATENCY, [(six, 120)])
    assert settled(trace) in {6, 6.5, 7}
    # Within a few slots of the knee from its first half-minute on.
    assert all(5 <= value <= 9 for value in trace[30:]), trace
    stats = six.statistics()
    assert stats.waiting_seconds / 120 <= 0.5


async def test_it_comes_down_when_the_server_gets_slower_and_up_when_faster(
    autojump_clock: trio.testing.MockClock,
) -> None:
    six, three, six_again = server(6), server(3), server(6)
    before, slower, faster = await run(
        LATENCY, [(six, 90), (three, 120), (six_again, 120)]
    )
    assert settled(before) in {6, 6.5, 7}
    assert settled(slower) in {3, 3.5, 4}
    assert settled(faster) in {6, 6.5, 7}


async def test_it_never_leaves_its_bounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    (high,) = await run(
        AdaptiveLimit(initial=1, maximum=4, signal="latency"), [(server(6), 60)]
    )
    assert max(high) == 4
    (low,) = await run(
        AdaptiveLimit(initial=5, minimum=5, maximum=64, signal="latency"),
        [(server(2), 60)],
    )
    assert min(low) == 5
