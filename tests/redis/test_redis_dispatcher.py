"""Dispatchers sharing their limits through a real redis-server.

Several dispatchers in one trio run stand for several processes: each has
its own schedulers and its own connection, and they meet only in Redis.
Time is real here (Redis keeps its own), so waits are short and bounds
generous; the order of events is what is asserted.
"""

from __future__ import annotations

import gc
import logging
import math
import re
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import coredis
import httpx
import pytest
import trio
import trio.testing
from coredis.tokens import PureToken

import trio_dispatch
from trio_dispatch import (
    BackendUnavailable,
    DispatcherClosed,
    QueueFull,
    open_dispatcher,
)
from trio_dispatch._redis._ledger import Ledger, StepResult
from trio_dispatch.lowlevel import plumbing

from .._admin import AUTH, serve_admin
from .._redis import (
    RedisServer,
    coredis_leaks,
    grant_split,
    lose_everything,
    needs_redis,
    open_lossy_link,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from trio_dispatch import Dispatcher

pytestmark = needs_redis

LEASE = 1.5


async def open_fleet(
    stack: AsyncExitStack,
    server: RedisServer,
    count: int,
    limits: dict[str, int] | None = None,
    **kwargs: object,
) -> list[Dispatcher]:
    """``count`` dispatchers on one namespace, as if in ``count`` processes."""
    return [
        await stack.enter_async_context(
            open_dispatcher(
                limits,
                redis_url=server.url,
                namespace="fleet",
                lease=LEASE,
                **kwargs,  # type: ignore[arg-type]  # the tests pass valid settings
            )
        )
        for _ in range(count)
    ]


async def until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds, for at most 5 seconds.

    Real time: the state lives in Redis, across sockets, so there is no
    event to wait on.
    """
    with trio.fail_after(5):
        while not condition():  # noqa: ASYNC110 (polling state across sockets, see above)
            await trio.sleep(0.005)


async def test_the_limit_holds_across_dispatchers(server: RedisServer) -> None:
    holding = peak = 0

    async def work(dispatcher: Dispatcher) -> None:
        nonlocal holding, peak
        async with dispatcher.slot("p"):
            holding += 1
            peak = max(peak, holding)
            await trio.sleep(0.005)
            holding -= 1

    async with AsyncExitStack() as stack:
        fleet = await open_fleet(stack, server, 3, {"p": 2})
        async with trio.open_nursery() as nursery:
            for n in range(30):
                nursery.start_soon(work, fleet[n % 3])
        assert peak == 2
        stats = [d.statistics().providers["p"] for d in fleet]
        assert [s.granted_total for s in stats] == [10, 10, 10]
        assert all(s.backend == "redis" and s.backend_up for s in stats)
        assert all(s.local_in_flight == s.local_waiting == 0 for s in stats)


async def test_grants_follow_turn_starts_across_dispatchers(
    server: RedisServer,
) -> None:
    order: list[str] = []
    async with AsyncExitStack() as stack:
        holder, left, right = await open_fleet(stack, server, 3, {"p": 1})

        async def wait(dispatcher: Dispatcher, name: str, started_at: float) -> None:
            async with dispatcher.slot("p", started_at=started_at):
                order.append(name)
                await trio.sleep(0.01)

        release = trio.Event()
        async with trio.open_nursery() as nursery:

            async def hold() -> None:
                async with holder.slot("p"):
                    await release.wait()

            nursery.start_soon(hold)
            await until(lambda: holder.statistics().providers["p"].local_in_flight == 1)
            now = trio.current_time()
            # Interleaved starts, queued in an order unlike theirs.
            for dispatcher, name, age in [
                (left, "l3", 3),
                (right, "r4", 4),
                (left, "l1", 1),
                (right, "r2", 2),
                (right, "r5", 5),
            ]:
                nursery.start_soon(wait, dispatcher, name, now - 10 + age)
            await until(
                lambda: (
                    left.statistics().providers["p"].waiting == 5
                    and right.statistics().providers["p"].waiting == 5
                )
            )
            release.set()
        assert order == ["l1", "r2", "l3", "r4", "r5"]


async def test_a_stored_limit_wins_over_the_one_given_at_open(
    server: RedisServer,
) -> None:
    async with open_dispatcher(
        {"p": 4}, redis_url=server.url, namespace="ns", lease=LEASE
    ) as first:
        assert first.limits() == {"p": 4}
        # Stored by the time the dispatcher has closed.
        first.set_limit("p", 2)
    # The fleet's limit outlives every process that set it.
    async with open_dispatcher(
        {"p": 9}, redis_url=server.url, namespace="ns", lease=LEASE
    ) as second:
        assert second.limits() == {"p": 2}
    async with open_dispatcher(
        {"p": 9}, redis_url=server.url, namespace="other", lease=LEASE
    ) as elsewhere:
        assert elsewhere.limits() == {"p": 9}


async def test_set_limit_and_remove_limit_reach_every_dispatcher(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"p": 1})
        one.set_limit("p", 3)
        with trio.fail_after(1):  # within a second, fleet-wide
            await until(lambda: two.limits() == {"p": 3})
        two.remove_limit("p")
        with trio.fail_after(1):
            await until(lambda: one.limits() == {})
        # Unlimited fleet-wide: many at once in both.
        async with AsyncExitStack() as slots:
            for dispatcher in (one, two) * 3:
                await slots.enter_async_context(dispatcher.slot("p"))
            assert one.statistics().providers["p"].local_in_flight == 3


async def test_a_cancelled_waiter_leaves_the_shared_queue(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"p": 1})
        client = await stack.enter_async_context(
            coredis.Redis.from_url(server.url, decode_responses=True)
        )
        async with one.slot("p"):
            with trio.move_on_after(0.2):
                async with two.slot("p"):
                    pytest.fail("granted while the only slot was held")
            await until(lambda: two.statistics().providers["p"].local_waiting == 0)
            # Withdrawn, not left to expire (the lease is longer).
            with trio.fail_after(LEASE / 3):
                while await client.zcard("{fleet:p}:queue"):  # noqa: ASYNC110 (Redis's state)
                    await trio.sleep(0.01)
            assert two.statistics().providers["p"].withdrawn_total == 1


async def test_a_rate_limit_in_one_dispatcher_pauses_all(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"p": 2})
        reported = trio.current_time()
        one.report_rate_limit("p", retry_after=0.4)
        await until(lambda: one.statistics().providers["p"].paused)
        async with two.slot("p"):
            granted = trio.current_time()
        # The pause is Redis's (server time): the grant waits it out.
        assert granted - reported >= 0.3
        stats = two.statistics().providers["p"]
        assert stats.granted_total == 1


async def test_the_fleet_waiting_figure_is_exact_in_the_granting_process(
    server: RedisServer,
) -> None:
    async def wait() -> None:
        async with two.slot("p"):
            stats = two.statistics().providers["p"]
            assert (stats.in_flight, stats.waiting) == (1, 0)

    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"p": 1})
        async with trio.open_nursery() as nursery, one.slot("p"):
            # Granted in the exchange that published it: not waiting.
            stats = one.statistics().providers["p"]
            assert (stats.in_flight, stats.waiting) == (1, 0)
            assert (stats.local_in_flight, stats.local_waiting) == (1, 0)
            nursery.start_soon(wait)
            await until(lambda: two.statistics().providers["p"].waiting == 1)
            stats = two.statistics().providers["p"]
            assert (stats.in_flight, stats.local_waiting) == (1, 1)
        assert two.statistics().providers["p"].granted_total == 1


async def test_local_statistics_say_local(autojump_clock: trio.abc.Clock) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher, dispatcher.slot("p"):
        stats = dispatcher.statistics().providers["p"]
        assert (stats.backend, stats.backend_up) == ("local", True)
        assert (stats.local_in_flight, stats.local_waiting) == (1, 0)


@coredis_leaks
async def test_an_unreachable_redis_fails_at_open_without_the_password(
    server: RedisServer,
) -> None:
    server.kill()
    url = f"redis://user:secret@127.0.0.1:{server.port}/0"
    with pytest.raises(BackendUnavailable) as caught:
        async with open_dispatcher(
            {"p": 1}, redis_url=url, lease=LEASE, redis_connect_timeout=0.2
        ):
            pytest.fail("opened without Redis")
    message = str(caught.value)
    assert re.match(
        r"^cannot reach redis at redis://\*\*\*@127\.0\.0\.1:\d+/0: ", message
    )
    assert "secret" not in message
    assert "user" not in message


@coredis_leaks
@pytest.mark.parametrize("resets", [1, 3])
async def test_connections_reset_at_start_up_are_retried_until_redis_answers(
    server: RedisServer, resets: int
) -> None:
    async with (
        open_lossy_link(server.port, resets) as link,
        open_dispatcher({"p": 1}, redis_url=link.url(), lease=LEASE) as dispatcher,
    ):
        async with dispatcher.slot("p"):
            stats = dispatcher.statistics().providers["p"]
        assert link.connections > resets
    assert (stats.backend_up, stats.in_flight) == (True, 1)


@coredis_leaks
async def test_a_redis_that_never_answers_fails_at_open_after_the_connect_timeout(
    server: RedisServer,
) -> None:
    async with open_lossy_link(server.port, math.inf) as link:
        started = trio.current_time()
        with pytest.raises(BackendUnavailable) as caught:
            async with open_dispatcher(
                {"p": 1}, redis_url=link.url(), lease=LEASE, redis_connect_timeout=0.5
            ):
                pytest.fail("opened without Redis")
        elapsed = trio.current_time() - started
    # Tried again and again (delays from 0.05 s, doubling), for the whole
    # bound and no longer than one more call (a loaded machine's slack).
    assert link.connections >= 3
    assert 0.5 <= elapsed < 0.5 + 3.0
    cause = caught.value.__cause__
    assert isinstance(cause, coredis.exceptions.ConnectionError)
    assert str(caught.value) == f"cannot reach redis at {link.url()}: {cause}"


SECRET = "hunter2-secret"


@pytest.fixture
def locked_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server that wants ``SECRET`` as the default user's password."""
    server = RedisServer(tmp_path, password=SECRET)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        # coredis's leaks surface here, under the test's filters.
        gc.collect()


@coredis_leaks
async def test_credentials_in_the_url_show_in_no_error_log_repr_or_statistics(
    locked_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    port = locked_server.port
    url = f"redis://127.0.0.1:{port}/0?username=default&password={SECRET}"
    shown = f"redis://127.0.0.1:{port}/0?username=***&password=***"
    caplog.set_level(logging.DEBUG)
    async with open_dispatcher({"p": 1}, redis_url=url, lease=LEASE) as dispatcher:
        async with dispatcher.slot("p"):
            pass
        assert repr(shown) in repr(plumbing(dispatcher)._settings)
        async with (
            serve_admin(dispatcher) as base_url,
            httpx.AsyncClient(base_url=base_url, headers=AUTH) as client,
        ):
            for path in ("/status", "/limits", "/metrics"):
                response = await client.get(path)
                assert response.status_code == 200
                assert SECRET not in response.text
        locked_server.kill()
        with trio.move_on_after(LEASE / 2):
            async with dispatcher.slot("p"):
                pytest.fail("granted without Redis")
        stats = dispatcher.statistics()
        assert not stats.providers["p"].backend_up
        assert SECRET not in repr(stats)
    with pytest.raises(BackendUnavailable) as caught:
        async with open_dispatcher(
            {"p": 1}, redis_url=url, lease=LEASE, redis_connect_timeout=0.2
        ):
            pytest.fail("opened without Redis")
    assert str(caught.value).startswith(f"cannot reach redis at {shown}: ")
    assert "unreachable" in caplog.text
    assert SECRET not in caplog.text
    assert all(SECRET not in str(record.args) for record in caplog.records)


@coredis_leaks
@pytest.mark.parametrize(
    ("path", "cause"),
    [
        (f"/0?password=not-{SECRET}", coredis.exceptions.AuthenticationError),
        ("/0", coredis.exceptions.AuthenticationError),
        (f"/99?password={SECRET}", coredis.exceptions.ResponseError),
    ],
    ids=["wrong password", "no password", "no such database"],
)
async def test_a_refusal_that_trying_again_cannot_mend_fails_at_open_at_once(
    locked_server: RedisServer, path: str, cause: type[Exception]
) -> None:
    async with open_lossy_link(locked_server.port, 0) as link:
        with pytest.raises(BackendUnavailable) as caught:
            async with open_dispatcher(
                {"p": 1}, redis_url=link.url(path), redis_connect_timeout=60.0
            ):
                pytest.fail("opened with a refused connection")
    # One connection, refused: no second try.
    assert link.connections == 1
    assert isinstance(caught.value.__cause__, cause)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"redis_url": 6379},
            TypeError,
            "redis_url must be a redis://, rediss:// or unix:// URL, got 6379",
        ),
        (
            {"redis_url": "http://127.0.0.1:6379"},
            ValueError,
            "redis_url must be a redis://, rediss:// or unix:// URL, got 'http://127.0.0.1:6379'",
        ),
        (
            {"redis_url": "redis://"},
            ValueError,
            "redis_url must be a redis://, rediss:// or unix:// URL, got 'redis://'",
        ),
        (
            {"redis_url": "redis://:pw@host:99999"},
            ValueError,
            "redis_url must be a redis://, rediss:// or unix:// URL, got 'redis://***@host:99999'",
        ),
        (
            {"redis_url": "redis://host:99999/0?db=0&password=pw"},
            ValueError,
            "redis_url must be a redis://, rediss:// or unix:// URL,"
            " got 'redis://host:99999/0?db=0&password=***'",
        ),
        ({"namespace": ""}, ValueError, "namespace must be a non-empty string, got ''"),
        (
            {"namespace": None},
            TypeError,
            "namespace must be a non-empty string, got None",
        ),
        (
            {"namespace": "a:b"},
            ValueError,
            "namespace must not contain ':', '{', '}', '*', '?', '[', ']' or '\\',"
            " got 'a:b'",
        ),
        (
            {"namespace": "{a}"},
            ValueError,
            "namespace must not contain ':', '{', '}', '*', '?', '[', ']' or '\\',"
            " got '{a}'",
        ),
        (
            {"namespace": "a[b]c"},
            ValueError,
            "namespace must not contain ':', '{', '}', '*', '?', '[', ']' or '\\',"
            " got 'a[b]c'",
        ),
        ({"lease": 0}, ValueError, "lease must be a positive number of seconds, got 0"),
        (
            {"lease": math.nan},
            ValueError,
            "lease must be a positive number of seconds, got nan",
        ),
        (
            {"lease": math.inf},
            ValueError,
            "lease must be a positive number of seconds, got inf",
        ),
        (
            {"lease": "15"},
            TypeError,
            "lease must be a positive number of seconds, got '15'",
        ),
        (
            {"lease": True},
            TypeError,
            "lease must be a positive number of seconds, got True",
        ),
        (
            {"redis_url": "redis://h", "redis_connect_timeout": 0},
            ValueError,
            "redis_connect_timeout must be a positive number of seconds, got 0",
        ),
        (
            {"redis_url": "redis://h", "redis_connect_timeout": math.inf},
            ValueError,
            "redis_connect_timeout must be a positive number of seconds, got inf",
        ),
        (
            {"redis_url": "redis://h", "redis_connect_timeout": "10"},
            TypeError,
            "redis_connect_timeout must be a positive number of seconds, got '10'",
        ),
    ],
)
def test_bad_backend_arguments_fail_at_the_call(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        open_dispatcher({"p": 1}, **kwargs)  # type: ignore[arg-type]  # bad on purpose


def test_the_exception_is_public() -> None:
    assert issubclass(trio_dispatch.BackendUnavailable, trio_dispatch.DispatchError)


@pytest.mark.parametrize("skew", [2.0, 30.0, -30.0])
async def test_a_process_whose_clock_is_off_gets_its_fair_share_of_turns(
    server: RedisServer, skew: float
) -> None:
    # Turns are placed on the Redis server's clock: each hand-off goes to
    # the other process's older turn, whatever the hosts' clocks say. The
    # turns alternate but where a process's ask is not yet published when
    # the slot comes free (a round trip, against holds of 5 ms): a share
    # below 40% is a bias, not noise (on the wall clocks, the process
    # 30 s ahead got no grant at all).
    one, two = await grant_split(server.url, skew, 60)
    assert one + two >= 60
    assert min(one, two) >= 0.4 * (one + two), (one, two)


async def test_a_process_is_not_woken_by_its_own_releases(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = 0
    step = Ledger.step

    async def counted(self: Ledger, *args: Any, **kwargs: Any) -> StepResult:  # noqa: ANN401  # passed through
        nonlocal rounds
        rounds += 1
        return await step(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "step", counted)
    async with open_dispatcher(
        {"p": 1}, redis_url=server.url, namespace="ns", lease=LEASE
    ) as dispatcher:
        async with dispatcher.slot("p"):
            pass
        await trio.sleep(0.1)
        rounds = 0
        for _ in range(20):
            async with dispatcher.slot("p"):
                pass
        # One round per cycle: the release and the next request go
        # together, and the wake-up that release publishes is not ours to
        # act on.
        assert rounds == 20
        await trio.sleep(0.1)
        assert rounds == 21


async def test_requests_taken_by_statistics_during_a_round_get_their_own_round(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = Ledger.step
    gate: trio.Event | None = None

    async def gated(self: Ledger, *args: Any, **kwargs: Any) -> StepResult:  # noqa: ANN401  # passed through
        if gate is not None:
            await gate.wait()
        return await step(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "step", gated)
    granted: list[str] = []
    async with (
        open_dispatcher(
            {"p": 3}, redis_url=server.url, namespace="ns", lease=LEASE
        ) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        release = trio.Event()

        async def hold(name: str) -> None:
            async with dispatcher.slot("p"):
                granted.append(name)
                await release.wait()

        nursery.start_soon(hold, "a")
        await until(lambda: granted == ["a"])
        gate = trio.Event()
        nursery.start_soon(hold, "b")
        await trio.sleep(0.05)  # b's round is on its way, held at the gate
        nursery.start_soon(hold, "c")
        await trio.sleep(0.01)
        assert dispatcher.statistics().providers["p"].local_waiting == 2
        gate.set()
        gate = None
        # Not left for the slow poll (a third of the lease).
        with trio.fail_after(LEASE / 6):
            await until(lambda: len(granted) == 3)
        release.set()


async def test_a_fleet_limit_binds_a_process_that_never_named_the_provider(
    server: RedisServer,
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, unknown_providers="allow")
        one.set_limit("q", 1)
        async with one.slot("q"):
            with trio.move_on_after(0.3) as waited:
                async with two.slot("q"):
                    pytest.fail("an unknown name passed the fleet's limit")
            assert waited.cancelled_caught
        assert two.limits() == {"q": 1}
        # Unlimited names still go straight through, and their scheduler
        # stops when idle, as in a local dispatcher.
        async with two.slot("free"):
            pass
        stats = two.statistics().providers["free"]
        assert (stats.limit, stats.granted_total, stats.released_total) == (None, 1, 1)
        await until(lambda: "free" not in plumbing(two)._host.actors)


@pytest.mark.parametrize("bystander", [False, True], ids=["reporter", "bystander"])
async def test_resume_ends_the_pause_of_the_fleet(
    server: RedisServer, *, bystander: bool
) -> None:
    async with AsyncExitStack() as stack:
        one, two = await open_fleet(stack, server, 2, {"p": 1})
        # A process that never used the provider resumes the fleet as well.
        resumer = (await open_fleet(stack, server, 1))[0] if bystander else one
        one.report_rate_limit("p", retry_after=30.0)
        await until(lambda: one.statistics().providers["p"].paused)
        async with trio.open_nursery() as nursery:
            granted = trio.Event()

            async def wait() -> None:
                async with two.slot("p"):
                    granted.set()

            nursery.start_soon(wait)
            await until(lambda: two.statistics().providers["p"].paused)
            assert not granted.is_set()
            resumer.resume("p")
            with trio.fail_after(LEASE / 3):
                await granted.wait()


async def test_max_waiting_counts_this_process_waiters(server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        [dispatcher] = await open_fleet(stack, server, 1, {"p": 1}, max_waiting=1)
        async with dispatcher.slot("p"), trio.open_nursery() as nursery:
            nursery.start_soon(dispatcher.slot("p").__aenter__)
            await until(
                lambda: dispatcher.statistics().providers["p"].local_waiting == 1
            )
            with pytest.raises(
                QueueFull, match=r"^1 request already waits for 'p' \(max_waiting=1\)$"
            ):
                async with dispatcher.slot("p"):
                    pytest.fail("granted beyond max_waiting")
            assert dispatcher.statistics().providers["p"].rejected_total == 1
            nursery.cancel_scope.cancel()


async def test_closing_fails_the_waiters_and_withdraws_their_entries(
    server: RedisServer,
) -> None:
    failed: list[BaseException] = []
    async with (
        open_dispatcher(
            {"p": 1}, redis_url=server.url, namespace="ns", lease=LEASE
        ) as holder,
        holder.slot("p"),
        coredis.Redis.from_url(server.url, decode_responses=True) as client,
        trio.open_nursery() as nursery,
    ):
        async with open_dispatcher(
            {"p": 1}, redis_url=server.url, namespace="ns", lease=LEASE
        ) as dispatcher:

            async def wait() -> None:
                try:
                    async with dispatcher.slot("p"):
                        pytest.fail("granted while the only slot was held")
                except DispatcherClosed as exc:
                    failed.append(exc)

            nursery.start_soon(wait)
            await until(lambda: dispatcher.statistics().providers["p"].waiting == 1)
        await until(lambda: bool(failed))
        assert [str(e) for e in failed] == [
            "the dispatcher closed while waiting for 'p'"
        ]
        # Withdrawn as it closed, not left to expire.
        assert await client.zcard("{ns:p}:queue") == 0


async def test_a_release_in_flight_when_the_dispatcher_closes_reaches_redis(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The round that gives the slot back is still waiting for Redis's
    # answer when the block ends: it must finish, not leave the lease taken
    # in Redis for a whole lease.
    step = Ledger.step
    slow = trio.Event()

    async def slow_step(self: Ledger, *args: Any, **kwargs: Any) -> StepResult:  # noqa: ANN401 (passed through)
        if slow.is_set():
            await trio.sleep(0.3)
        return await step(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "step", slow_step)
    async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
        async with open_dispatcher(
            {"p": 1}, redis_url=server.url, namespace="ns", lease=30.0
        ) as dispatcher:
            slot = dispatcher.slot("p")
            await slot.__aenter__()
            assert await client.zcard("{ns:p}:leases") == 1
            slow.set()
            await slot.__aexit__(None, None, None)
            # The round that gives it back has started and waits on Redis:
            # close now.
            await trio.sleep(0.1)
        assert await client.zcard("{ns:p}:leases") == 0
        assert await client.zcard("{ns:p}:queue") == 0


async def test_a_grant_in_flight_when_the_dispatcher_closes_is_given_back(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis grants the waiter, and the answer is slow to come back while the
    # block ends: whichever way the waiter ends (the slot, or
    # DispatcherClosed), the lease must not stay taken in Redis.
    step = Ledger.step
    slow = trio.Event()

    async def slow_step(self: Ledger, *args: Any, **kwargs: Any) -> StepResult:  # noqa: ANN401 (passed through)
        result = await step(self, *args, **kwargs)
        if slow.is_set():
            await trio.sleep(0.3)
        return result

    monkeypatch.setattr(Ledger, "step", slow_step)
    outcomes: list[str] = []
    async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
        async with (
            trio.open_nursery() as nursery,
            open_dispatcher(
                {"p": 1}, redis_url=server.url, namespace="ns", lease=30.0
            ) as dispatcher,
        ):

            async def wait() -> None:
                try:
                    async with dispatcher.slot("p"):
                        outcomes.append("granted")
                except DispatcherClosed:
                    outcomes.append("closed")

            slow.set()
            nursery.start_soon(wait)
            await until_async(lambda: client.zcard("{ns:p}:leases"), 1)
        assert len(outcomes) == 1
        assert await client.zcard("{ns:p}:leases") == 0
        assert await client.zcard("{ns:p}:queue") == 0


async def until_async(read: Callable[[], Any], expected: object) -> None:
    """Poll the awaitable ``read()`` until it gives ``expected``, for 5 s."""
    with trio.fail_after(5):
        while await read() != expected:  # noqa: ASYNC110 (Redis's state)
            await trio.sleep(0.01)


async def test_grants_go_on_after_the_wake_up_connection_is_lost_again_and_again(
    server: RedisServer,
) -> None:
    # Each lost subscription must leave the connection pool as it found it.
    # A pool of two connections here, so that a connection it never gets
    # back shows at once (in the default pool of 64, after 63 losses).
    async with (
        coredis.Redis.from_url(server.url, decode_responses=True) as client,
        open_dispatcher(
            {"p": 1},
            redis_url=server.url + "?max_connections=2",
            namespace="ns",
            lease=LEASE,
        ) as dispatcher,
    ):
        for _ in range(3):
            await until_async(client.pubsub_numpat, 1)
            await client.client_kill(type_=PureToken.PUBSUB)
            await until_async(client.pubsub_numpat, 0)
        await until_async(client.pubsub_numpat, 1)
        with trio.fail_after(5):
            async with dispatcher.slot("p"):
                pass


async def test_holders_register_again_at_once_when_redis_was_flushed(
    server: RedisServer,
) -> None:
    # A long lease: a renewal comes only every ten seconds.
    lease = 30.0
    async with AsyncExitStack() as stack:
        holder, other = [
            await stack.enter_async_context(
                open_dispatcher(
                    {"p": 1}, redis_url=server.url, namespace="flushed", lease=lease
                )
            )
            for _ in range(2)
        ]
        async with holder.slot("p"):
            await lose_everything(server, "flushall")
            # The lease went with everything else: the other process may
            # take a slot too many (one limit at most) ...
            async with other.slot("p"):
                # ... until the holder's round, which the other's wakes,
                # finds the namespace lost and registers its lease again
                # at once, not at its next renewal.
                with trio.fail_after(lease / 6):
                    while holder.statistics().providers["p"].in_flight < 2:  # noqa: ASYNC110 (state across sockets)
                        await trio.sleep(0.01)
            with trio.move_on_after(0.5) as waited:
                async with other.slot("p"):
                    pytest.fail("granted a slot that the holder holds")
            assert waited.cancelled_caught
