"""A holder cut off from Redis for a whole lease is stopped: ``LeaseLost``.

Once a slot's lease may have expired in Redis, the fleet may grant that
slot again, so its holder must not go on: its body is cancelled at the
last moment the lease was sure to live, and the slot given back. A shorter
outage costs the holder nothing. Dispatchers in one trio run stand for
processes; ``Faults`` cuts one off from Redis while the others reach it (a
partition). Time is real (Redis keeps its own); what is asserted is order,
and bounds that follow from the renewal interval.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest
import trio

from trio_dispatch import DispatchError, LeaseLost, SlotHoldTimeout, open_dispatcher

from .._redis import Faults, RedisServer, needs_redis, node_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from trio_dispatch import Dispatcher

pytestmark = needs_redis

LEASE = 1.5


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    return Faults.install(monkeypatch)


async def open_fleet(
    stack: AsyncExitStack, server: RedisServer, count: int, **kwargs: object
) -> list[Dispatcher]:
    return [
        await stack.enter_async_context(
            open_dispatcher(
                {"p": 1},
                redis_url=server.url,
                namespace="ns",
                lease=LEASE,
                **kwargs,  # type: ignore[arg-type]  # the tests pass valid settings
            )
        )
        for _ in range(count)
    ]


async def until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (state across sockets)
            await trio.sleep(0.005)


async def test_a_holder_cut_off_for_a_lease_is_stopped_before_the_slot_is_regranted(
    server: RedisServer, faults: Faults
) -> None:
    lost: list[tuple[float, LeaseLost]] = []
    granted: list[float] = []
    async with AsyncExitStack() as stack:
        cut, other = await open_fleet(stack, server, 2)
        holding = trio.Event()
        down_at = 0.0

        async def hold() -> None:
            try:
                async with cut.slot("p"):
                    holding.set()
                    await trio.sleep_forever()
            except LeaseLost as exc:
                lost.append((trio.current_time(), exc))

        async def wait() -> None:
            async with other.slot("p"):
                granted.append(trio.current_time())

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                await holding.wait()
                nursery.start_soon(wait)
                await until(lambda: other.statistics().providers["p"].waiting == 1)
                faults.down.add(node_of(cut))
                down_at = trio.current_time()
        [(lost_at, error)] = lost
        assert (
            str(error) == "the lease of a slot of 'p' went 1.5 seconds without renewal"
        )
        assert (error.provider, error.lease) == ("p", 1.5)
        # Renewed a third of a lease before the cut at the earliest, so
        # stopped no sooner than two thirds of a lease after it; and
        # before the fleet could grant the slot again.
        assert lost_at - down_at >= LEASE * 2 / 3
        [granted_at] = granted
        assert lost_at <= granted_at
        stats = cut.statistics().providers["p"]
        assert (stats.local_in_flight, stats.released_total) == (0, 1)


async def test_a_holder_that_reaches_redis_again_within_the_lease_keeps_its_slot(
    server: RedisServer, faults: Faults
) -> None:
    async with AsyncExitStack() as stack:
        [dispatcher] = await open_fleet(stack, server, 1)
        node = node_of(dispatcher)
        with trio.fail_after(10):
            async with dispatcher.slot("p"):
                # Two outages of a third of a lease once seen (at most half
                # a lease since the last renewal, retries included), then a
                # lease more: every renewal moves the deadline on.
                for _ in range(2):
                    faults.down.add(node)
                    await until(
                        lambda: not dispatcher.statistics().providers["p"].backend_up
                    )
                    await trio.sleep(LEASE / 3)
                    faults.down.discard(node)
                    await until(
                        lambda: dispatcher.statistics().providers["p"].backend_up
                    )
                await trio.sleep(LEASE)
                assert dispatcher.statistics().providers["p"].local_in_flight == 1


async def test_max_hold_still_bounds_a_shared_slot(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        [dispatcher] = await open_fleet(stack, server, 1, max_hold=0.2)
        with pytest.raises(
            SlotHoldTimeout,
            match=r"^a slot of 'p' was held longer than max_hold=0\.2 seconds$",
        ):
            async with dispatcher.slot("p"):
                await trio.sleep_forever()
        assert dispatcher.statistics().providers["p"].released_total == 1


async def test_an_unlimited_provider_s_holder_is_never_stopped(
    server: RedisServer, faults: Faults
) -> None:
    async with AsyncExitStack() as stack:
        [dispatcher] = await open_fleet(stack, server, 1)
        dispatcher.remove_limit("p")
        await until(lambda: dispatcher.limits() == {})
        with trio.fail_after(10):
            async with dispatcher.slot("p"):
                faults.down.add(node_of(dispatcher))
                await trio.sleep(LEASE * 1.5)
            faults.down.clear()
        assert dispatcher.statistics().providers["p"].released_total == 1


def test_the_exception_is_a_dispatch_error() -> None:
    assert issubclass(LeaseLost, DispatchError)
    assert LeaseLost.__module__ == "trio_dispatch"
    # One raised by code of one's own may not say which provider or lease.
    bare = LeaseLost("lost")
    assert (str(bare), bare.provider, bare.lease) == ("lost", None, None)
