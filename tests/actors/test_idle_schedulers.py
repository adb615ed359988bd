"""An unlimited provider's scheduler stops when idle and starts on demand.

Idle means no slot held, none waiting, nothing queued: then nobody holds a
ticket of that scheduler, so no ``Release`` or ``Cancel`` can be sent to it
after it stops. Its policy (limit, counters) carries over to the next one.
"""

from __future__ import annotations

import trio
import trio.testing

from trio_dispatch import Dispatcher, open_dispatcher
from trio_dispatch.lowlevel import Acquire, Release, Ticket, plumbing

from .._helpers import RecordingReply, local_scheduler, settle, task_names


def schedulers() -> list[str]:
    """The names of the scheduler tasks running now, sorted."""
    return sorted(n for n in task_names() if n.startswith("trio_dispatch scheduler"))


def totals(dispatcher: Dispatcher, provider: str) -> tuple[int, int, int]:
    stats = dispatcher.statistics().providers[provider]
    return stats.in_flight, stats.granted_total, stats.released_total


async def test_an_unlimited_scheduler_stops_when_idle_and_starts_again() -> None:
    async with open_dispatcher({"limited": 1}, unknown_providers="allow") as dispatcher:
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'limited'"]
        async with dispatcher.slot("free"):
            async with dispatcher.slot("free"):
                await settle()
                assert schedulers() == [
                    "trio_dispatch scheduler 'free'",
                    "trio_dispatch scheduler 'limited'",
                ]
            await settle()
            # One slot is still held: its scheduler keeps counting it.
            assert "trio_dispatch scheduler 'free'" in schedulers()
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'limited'"]
        async with dispatcher.slot("free") as again:
            assert again.held
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'limited'"]
        # The counters carried over from one scheduler to the next.
        dispatcher.set_limit("free", 1)
        assert totals(dispatcher, "free") == (0, 3, 3)


async def test_a_thousand_provider_names_leave_no_scheduler_task_behind() -> None:
    async with open_dispatcher({"limited": 2}, unknown_providers="allow") as dispatcher:
        for i in range(1_000):
            async with dispatcher.slot(f"model-{i}"):
                pass
        await settle()
        assert len(plumbing(dispatcher)._nursery.child_tasks) == 1
        # All at once, then all gone.
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for i in range(1_000):
                nursery.start_soon(_hold_until, dispatcher, f"model-{i}", done)
            await settle()
            assert len(plumbing(dispatcher)._nursery.child_tasks) == 1_001
            done.set()
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'limited'"]
        stats = dispatcher.statistics().providers
        assert len(stats) == 1_001
        assert {
            (s.limit, s.in_flight, s.granted_total, s.released_total)
            for name, s in stats.items()
            if name != "limited"
        } == {(None, 0, 2, 2)}
        dispatcher.set_limit("model-999", 1)
        assert totals(dispatcher, "model-999") == (0, 2, 2)


async def _hold_until(dispatcher: Dispatcher, provider: str, done: trio.Event) -> None:
    async with dispatcher.slot(provider):
        await done.wait()


async def test_an_acquire_reaching_a_scheduler_as_it_turns_idle_is_served() -> None:
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        first = dispatcher.slot("p")
        await first.__aenter__()
        await settle()
        await first.__aexit__(None, None, None)
        # statistics() handles the Release here: the scheduler is now idle
        # and unlimited, but its task has not run to see it.
        dispatcher.statistics()
        second = dispatcher.slot("p")
        await second.__aenter__()
        # The same scheduler took the Acquire before it could stop.
        assert second._actor is first._actor
        assert second.held
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'p'"]
        await second.__aexit__(None, None, None)
        await settle()
        assert schedulers() == []
        dispatcher.set_limit("p", 1)
        assert totals(dispatcher, "p") == (0, 2, 2)


async def test_a_scheduler_never_stops_under_a_holder_so_no_release_is_lost() -> None:
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        outer = dispatcher.slot("p")
        await outer.__aenter__()
        for _ in range(3):
            async with dispatcher.slot("p"):
                pass
            await settle()
            # The holder's scheduler is still the one running.
            assert plumbing(dispatcher)._host.actors["p"] is outer._actor
        await outer.__aexit__(None, None, None)
        await settle()
        assert schedulers() == []
        dispatcher.set_limit("p", 1)
        assert totals(dispatcher, "p") == (0, 4, 4)


async def test_set_limit_on_a_provider_whose_scheduler_just_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []

    async def call() -> None:
        async with dispatcher.slot("p"):
            granted.append(trio.current_time())
            await trio.sleep(1)

    async with (
        open_dispatcher(unknown_providers="allow") as dispatcher,
        trio.open_nursery() as nursery,
    ):
        async with dispatcher.slot("p"):
            pass
        await settle()
        assert schedulers() == []
        dispatcher.set_limit("p", 1)
        assert totals(dispatcher, "p") == (0, 1, 1)
        for _ in range(2):
            nursery.start_soon(call)
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.in_flight, stats.waiting) == (1, 1, 1)
    assert granted == [0.0, 1.0]


async def test_set_limit_reaching_a_scheduler_as_it_turns_idle_keeps_it() -> None:
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        for handle_release_first in (False, True):
            provider = f"p-{handle_release_first}"
            slot = dispatcher.slot(provider)
            await slot.__aenter__()
            await settle()
            await slot.__aexit__(None, None, None)
            if handle_release_first:
                dispatcher.statistics()  # idle now; its task has not run
            dispatcher.set_limit(provider, 1)
            await settle()
            assert f"trio_dispatch scheduler {provider!r}" in schedulers()
            assert plumbing(dispatcher)._host.actors[provider] is slot._actor
            assert totals(dispatcher, provider) == (0, 1, 1)
        dispatcher.remove_limit("p-True")
        await settle()
        assert schedulers() == ["trio_dispatch scheduler 'p-False'"]


async def test_a_scheduler_whose_work_statistics_did_before_it_ran_stops() -> None:
    async with open_dispatcher(unknown_providers="allow") as dispatcher:
        # Started, but its task has not run yet: statistics() does its work.
        actor = local_scheduler(dispatcher, "p")
        reply = RecordingReply()
        actor.send(Acquire(Ticket(0.0, 0), reply))
        dispatcher.statistics()
        assert [grant.ticket for grant in reply.grants] == [Ticket(0.0, 0)]
        actor.send(Release(Ticket(0.0, 0)))
        assert totals(dispatcher, "p") == (0, 1, 1)
        await settle()
        assert schedulers() == []
