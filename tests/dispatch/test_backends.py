"""The backend interface: a third backend, written with lowlevel names only.

``CountingBackend`` (in ``tests/_backend_rigs.py``) wraps the local
scheduler and counts what the dispatcher asks of it: the dispatcher must
reach every backend through ``trio_dispatch.lowlevel.Backend`` alone, and
never ask which it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import (
    AdaptiveLimit,
    QueueFull,
    Quota,
    RateLimitInfo,
    open_dispatcher,
)
from trio_dispatch.actors._mailbox import Mailbox
from trio_dispatch.lowlevel import (
    Backend,
    SchedulerActor,
    SchedulerMessage,
    open_dispatcher_with,
)

from .._backend_rigs import CountingBackend, Made
from .._helpers import settle, task_names

if TYPE_CHECKING:
    import collections

    from trio_dispatch._redis._scheduler import SharedSchedulerActor


def _is_a_backend(local: SchedulerActor, shared: SharedSchedulerActor) -> list[Backend]:
    # Checked by mypy: both backends of the package implement the protocol.
    return [local, shared, CountingBackend("p")]


async def test_a_dispatcher_runs_on_a_backend_of_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    granted: list[tuple[str, float]] = []

    async def call(name: str) -> None:
        async with dispatcher.slot("p", conversation_id=name):
            granted.append((name, trio.current_time()))
            await trio.sleep(1)

    async with open_dispatcher_with(made, {"p": 1}) as dispatcher:
        async with trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(call, name)
                await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["p"]
        backend = made.backends["p"]
        assert (stats.limit, stats.granted_total, stats.released_total) == (1, 3, 3)
        assert stats.backend == "local"
    assert granted == [("a", 0.0), ("b", 1.0), ("c", 2.0)]
    assert {
        name: backend.calls[name]
        for name in ("set_limit", "acquire", "release", "cancel", "statistics", "close")
    } == {
        "set_limit": 1,
        "acquire": 3,
        "release": 3,
        "cancel": 0,
        "statistics": 1,
        "close": 1,
    }


async def test_a_backend_answers_a_slot_through_the_reply_public_names(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    async with open_dispatcher_with(made, {"p": 1}) as dispatcher:
        slot = dispatcher.slot("p")
        backend = made.backends["p"]
        backend.refusal = QueueFull("refused by the backend")
        with pytest.raises(QueueFull, match=r"^refused by the backend$"):
            async with slot:
                pytest.fail("a refused slot is never entered")  # pragma: no cover
        assert not slot.held
        backend.refusal = None
        backend.granting_at = 42.0
        async with dispatcher.slot("p") as granted:
            assert (granted.held, granted.granted_at) == (True, 42.0)
        assert not granted.held
    assert backend.calls["acquire"] == 2


async def test_every_setting_reaches_the_backend_through_the_protocol(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    async with open_dispatcher_with(made, {"p": 2}) as dispatcher:
        dispatcher.report_rate_limit("p", 5)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.paused_until) == (True, 5.0)
        dispatcher.resume("p")
        dispatcher.observe_rate_limits(
            "p", RateLimitInfo(requests=Quota(limit=60, remaining=3))
        )
        dispatcher.set_limit("p", AdaptiveLimit(initial=2, minimum=1, maximum=4))
        assert dispatcher.limits() == {"p": 2}
        async with dispatcher.slot("p") as slot:
            slot.report_usage(10)
        with trio.move_on_after(1) as timer:
            async with dispatcher.slot("p"):
                await trio.sleep_forever()
        assert timer.cancelled_caught
        dispatcher.remove_limit("p")
        stats = dispatcher.statistics().providers["p"]
        assert (stats.paused, stats.limit, stats.adaptive) == (False, None, False)
    calls = made.backends["p"].calls
    assert [
        calls[name]
        for name in (
            "pause",
            "resume",
            "observe_rate_limits",
            "set_limit",
            "report_usage",
            "acquire",
            "release",
        )
    ] == [1, 1, 1, 3, 1, 2, 2]


async def test_a_backend_stopped_when_idle_runs_again_with_its_counters() -> None:
    made = Made()
    async with open_dispatcher_with(made, unknown_providers="allow") as dispatcher:
        for _ in range(2):
            async with dispatcher.slot("q"):
                pass
            await settle()
            assert "trio_dispatch scheduler 'q'" not in task_names()
        stats = dispatcher.statistics().providers["q"]
        assert (stats.granted_total, stats.released_total) == (2, 2)
    assert list(made.backends) == ["q"]
    assert made.backends["q"].calls["run"] == 2


async def test_open_dispatcher_with_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"^new_backend must be callable, got 3$"):
        open_dispatcher_with(3)  # type: ignore[arg-type]  # the misuse tested
    with pytest.raises(
        TypeError, match=r"^open_dispatcher_with\(\) takes no redis_url$"
    ):
        open_dispatcher_with(Made(), redis_url="redis://localhost")
    with pytest.raises(
        TypeError, match=r"^open_dispatcher_with\(\) takes no redis_connect_timeout$"
    ):
        open_dispatcher_with(Made(), redis_connect_timeout=1.0)
    with pytest.raises(
        ValueError, match=r"^limit for 'p' must be a positive integer, got 0$"
    ):
        open_dispatcher_with(Made(), {"p": 0})


async def test_an_uncontended_slot_never_wakes_the_scheduler_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The caller's task handles its Acquire and Release itself, through the
    # actor's handler, when nothing is queued before them: the actor's task
    # takes no batch at all.
    batches = 0
    take_all = Mailbox.take_all

    def counting(
        self: Mailbox[SchedulerMessage],
    ) -> collections.deque[SchedulerMessage]:
        nonlocal batches
        batches += 1
        return take_all(self)

    monkeypatch.setattr(Mailbox, "take_all", counting)
    async with open_dispatcher({"p": 2}) as dispatcher:
        await settle()
        batches = 0  # the limit, set as it opened
        for _ in range(10):
            async with dispatcher.slot("p") as slot:
                assert slot.held
            await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.granted_total, stats.released_total, stats.in_flight) == (
            10,
            10,
            0,
        )
        assert batches == 0
