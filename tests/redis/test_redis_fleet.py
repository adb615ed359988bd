"""Faults of a fleet sharing limits through a real redis-server.

Whole OS processes (``tests/_fleet_worker.py``) share a namespace with
each other and with this one; the fake LLM server runs here and records
what reaches it. Redis is killed and restarted, a process holding slots is
killed with SIGKILL. Time is real: bounds derive from the lease, with
slack, and the order of events is what is asserted.
"""

from __future__ import annotations

import pathlib
import signal
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import open_dispatcher
from trio_dispatch.testing import (
    FakeReply,
    FakeScript,
    Fault,
    open_fake_llm_server,
)

from .._redis import RedisServer, coredis_leaks, needs_redis
from .._workers import worker

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Dispatcher
    from trio_dispatch.testing import FakeLLMServer, FakeRequest

pytestmark = needs_redis

ROOT = pathlib.Path(__file__).parent.parent.parent
LEASE = 1.5


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` (state across sockets) for at most 10 seconds."""
    with trio.fail_after(10):
        while not condition():  # noqa: ASYNC110 (polling state across sockets)
            await trio.sleep(0.005)


async def run_conversations(
    llm: FakeLLMServer,
    server: RedisServer,
    *,
    processes: int,
    limit: int,
    count: int,
    questions: int,
) -> list[object]:
    """Run ``processes`` workers of conversations on one namespace; their reports."""
    async with AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                worker(
                    "tests._fleet_worker",
                    mode="conversations",
                    name=f"w{n}",
                    base_url=llm.openai_base_url,
                    redis_url=server.url,
                    namespace="fleet",
                    lease=LEASE,
                    limit=limit,
                    count=count,
                    questions=questions,
                )
            )
            for n in range(processes)
        ]
        with trio.fail_after(60):
            for w in workers:
                assert await w.line() == {"ready": True}
            return [await w.line() for w in workers]


async def test_a_fleet_of_processes_never_exceeds_the_limit_and_every_turn_completes(
    server: RedisServer,
) -> None:
    script = FakeScript(default=FakeReply(text="done", latency=0.03))
    async with open_fake_llm_server(script) as llm:
        done = await run_conversations(
            llm, server, processes=4, limit=3, count=10, questions=1
        )
        assert done == [{"turns": 10}] * 4
        stats = llm.statistics()
        assert stats.requests_total == 40
        assert stats.peak_in_flight == 3


async def test_a_rate_limit_in_one_process_pauses_the_fleet(
    server: RedisServer,
) -> None:
    refused: list[FakeRequest] = []

    def choose(request: FakeRequest) -> FakeReply | None:
        if not refused:
            refused.append(request)
            return FakeReply(fault=Fault("rate_limit", retry_after=1.0))
        return None

    script = FakeScript(default=FakeReply(text="ok", latency=0.02), choose=choose)
    async with open_fake_llm_server(script) as llm:
        done = await run_conversations(
            llm, server, processes=2, limit=2, count=4, questions=3
        )
        assert done == [{"turns": 12}] * 2
        # The server's own clock: after the 429, and once the pause is
        # stored (a few milliseconds), nothing arrives from either process
        # until Retry-After has passed.
        refused_at = refused[0].arrived_at
        arrivals = sorted(r.arrived_at - refused_at for r in llm.requests)
        assert not [t for t in arrivals if 0.25 < t < 0.95]
        assert len([t for t in arrivals if t >= 0.95]) >= 20


async def test_slots_of_a_killed_process_come_back_after_the_lease(
    server: RedisServer,
) -> None:
    async with (
        worker(
            "tests._fleet_worker",
            mode="hold",
            redis_url=server.url,
            namespace="fleet",
            lease=LEASE,
            limit=2,
            count=2,
        ) as holder,
        open_dispatcher(
            {"p": 2}, redis_url=server.url, namespace="fleet", lease=LEASE
        ) as dispatcher,
    ):
        with trio.fail_after(30):
            assert await holder.line() == {"ready": True, "held": 2}
        granted: list[float] = []

        async def wait() -> None:
            async with dispatcher.slot("p"):
                granted.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            # The holder renews: nothing is granted while it lives, past
            # its lease.
            await trio.sleep(LEASE + 0.2)
            assert granted == []
            holder.process.send_signal(signal.SIGKILL)
            killed_at = trio.current_time()
        [granted_at] = granted
        # Its leases were renewed at most a renewal interval before the
        # kill, so they expire within (lease - lease/3, lease] after it;
        # the waiter learns it within a poll (lease/3) more.
        assert LEASE * 2 / 3 - 0.1 < granted_at - killed_at < LEASE + LEASE / 3 + 0.5


@coredis_leaks
async def test_redis_lost_and_restarted_empty_grants_nothing_meanwhile_and_recovers(
    server: RedisServer,
) -> None:
    limit = 3
    holding = 0
    samples: list[tuple[float, int]] = []
    grants: list[float] = []
    completed = 0
    settled = trio.Event()
    finished = trio.Event()

    def enter() -> None:
        nonlocal holding
        grants.append(trio.current_time())
        holding += 1
        samples.append((trio.current_time(), holding))

    async def hold_long(dispatcher: Dispatcher) -> None:
        # Through the outage and past the recovery: the restarted ledger
        # must learn of it again.
        nonlocal holding, completed
        async with dispatcher.slot("p"):
            enter()
            await settled.wait()
            await trio.sleep(0.5)
            holding -= 1
        completed += 1
        finished.set()

    async def work(dispatcher: Dispatcher) -> None:
        # Short turns, one after another, until after the long holders.
        nonlocal holding, completed
        while not finished.is_set():
            async with dispatcher.slot("p"):
                enter()
                await trio.sleep(0.1)
                holding -= 1
        completed += 1

    async with AsyncExitStack() as stack:
        fleet = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": limit}, redis_url=server.url, namespace="f", lease=LEASE
                )
            )
            for _ in range(2)
        ]
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for dispatcher in fleet:
                    nursery.start_soon(hold_long, dispatcher)
                await until(lambda: holding == 2)
                for n in range(6):
                    nursery.start_soon(work, fleet[n % 2])
                await until(lambda: len(grants) >= 5)
                server.kill()
                killed_at = trio.current_time()
                await until(
                    lambda: (
                        not any(d.statistics().providers["p"].backend_up for d in fleet)
                    )
                )
                # A waiter's own deadline still applies while Redis is away.
                with trio.move_on_after(0.2) as waited:
                    async with fleet[0].slot("p"):
                        pytest.fail("granted while the ledger was unreachable")
                assert waited.cancelled_caught
                await trio.sleep(0.5)
                server.start()
                restarted_at = trio.current_time()
                # Every holder registers again within a renewal interval
                # and a retry of the reconnection.
                await trio.sleep(LEASE / 3 + 1.0)
                settled_at = trio.current_time()
                settled.set()
        assert completed == 8
        # Nothing was granted while Redis was away (a round in flight at
        # the kill may still land within a few milliseconds).
        assert not [t for t in grants if killed_at + 0.05 < t < restarted_at]
        # Redis came back empty: until the holders register again, the
        # ledger may admit up to one limit too many, never more; after
        # that, the limit holds with the long holders still in.
        assert max(n for _, n in samples) <= 2 * limit
        assert [n for t, n in samples if t > settled_at]
        assert all(n <= limit for t, n in samples if t > settled_at)
        assert all(d.statistics().providers["p"].backend_up for d in fleet)
