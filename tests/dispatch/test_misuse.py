"""Misuse of the protocol fails the one who misused it, never the dispatcher.

Code that talks to a ``SchedulerActor`` directly can send what a ``Slot``
never sends (a ticket twice, the release of a ticket that still waits); a
slot can be exited from a task other than the one that entered it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import Slot, Tenant, open_dispatcher, wrap_provider
from trio_dispatch.lowlevel import (
    Acquire,
    Pause,
    Release,
    SetLimit,
    open_dispatcher_with,
)
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import FakeScript, ScriptedProvider, open_fake_llm_server

from .._backend_rigs import Made
from .._helpers import RecordingReply, local_scheduler, settle

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from contextlib import AbstractAsyncContextManager

    from trio_dispatch import Conversation, Dispatcher


async def _hold(slot: Slot, outcomes: list[str]) -> None:
    try:
        async with slot:
            outcomes.append("granted")
    except (RuntimeError, ValueError) as exc:
        outcomes.append(f"{type(exc).__name__}: {exc}")


def _statistics(dispatcher: Dispatcher) -> tuple[int, int, int, int, int]:
    stats = dispatcher.statistics().providers["p"]
    return (
        stats.in_flight,
        stats.waiting,
        stats.granted_total,
        stats.released_total,
        stats.withdrawn_total,
    )


# ---------------------------------------------------------------- scheduler


async def test_an_acquire_with_a_known_ticket_fails_alone_and_others_are_served() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        waiter = dispatcher.slot("p")
        nursery.start_soon(_hold, waiter, outcomes)
        await settle()
        actor = local_scheduler(dispatcher, "p")
        on_holder, on_waiter = RecordingReply(), RecordingReply()
        actor.send(Acquire(holder.ticket, on_holder))  # type: ignore[arg-type]  # set once entered
        actor.send(Acquire(waiter.ticket, on_waiter))  # type: ignore[arg-type]  # set once entered
        await settle()
        for reply, slot in ((on_holder, holder), (on_waiter, waiter)):
            assert reply.grants == []
            assert [(type(e), str(e)) for e in reply.errors] == [
                (ValueError, f"ticket {slot.ticket!r} is already known")
            ]
        # Nothing changed: the holder holds, the waiter still waits its turn.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 0)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 0)
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_a_waiter_asking_again_with_its_own_ticket_is_failed_and_withdrawn() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        confused, patient = dispatcher.slot("p"), dispatcher.slot("p")
        nursery.start_soon(_hold, confused, outcomes)
        await settle()
        nursery.start_soon(_hold, patient, outcomes)
        await settle()
        local_scheduler(dispatcher, "p").send(Acquire(confused.ticket, confused))  # type: ignore[arg-type]  # set once entered
        await settle()
        assert outcomes == [f"ValueError: ticket {confused.ticket!r} is already known"]
        # Its ticket no longer waits: it is never granted to nobody.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 1)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes[1:] == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 1)


async def test_a_release_of_a_waiting_ticket_withdraws_it_and_fails_its_requester() -> (
    None
):
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        holder = dispatcher.slot("p")
        await holder.__aenter__()
        victim, patient = dispatcher.slot("p"), dispatcher.slot("p")
        nursery.start_soon(_hold, victim, outcomes)
        await settle()
        nursery.start_soon(_hold, patient, outcomes)
        await settle()
        local_scheduler(dispatcher, "p").send(Release(victim.ticket))  # type: ignore[arg-type]  # set once entered
        await settle()
        assert outcomes == [
            f"RuntimeError: ticket {victim.ticket!r} is waiting, not holding a slot"
        ]
        assert not victim.held
        # The holder keeps its slot; the withdrawn ticket never gets one.
        assert _statistics(dispatcher) == (1, 1, 1, 0, 1)
        await holder.__aexit__(None, None, None)
        await settle()
        assert outcomes[1:] == ["granted"]
        assert _statistics(dispatcher) == (0, 0, 2, 2, 1)
        async with dispatcher.slot("p") as slot:
            assert slot.held


async def test_a_bad_limit_or_pause_sent_to_a_scheduler_is_logged_and_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_dispatcher({"p": 2}) as dispatcher:
        actor = local_scheduler(dispatcher, "p")
        actor.send(SetLimit(0))
        actor.send(Pause(math.nan))
        await settle()
        stats = dispatcher.statistics().providers["p"]
        assert (stats.limit, stats.paused) == (2, False)
        async with dispatcher.slot("p") as first, dispatcher.slot("p") as second:
            assert first.held
            assert second.held
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "trio_dispatch",
            logging.ERROR,
            "the scheduler of 'p' ignored SetLimit(limit=0):"
            " limit must be a positive integer, got 0",
        ),
        (
            "trio_dispatch",
            logging.ERROR,
            "the scheduler of 'p' ignored Pause(reported_at=nan, retry_after=None):"
            " now must be a finite number, got nan",
        ),
    ]


# ---------------------------------------------------------------- slots


LEFT_ELSEWHERE = r"^a slot must be left by the task that entered it$"


@pytest.mark.parametrize("max_hold", [None, 5.0], ids=["plain", "max_hold"])
async def test_a_slot_left_from_another_task_is_given_back_once_then_refused(
    max_hold: float | None, autojump_clock: trio.testing.MockClock
) -> None:
    events: list[tuple[str, float]] = []
    async with (
        open_dispatcher({"p": 1}, max_hold=max_hold) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        slot = dispatcher.slot("p")
        entered = trio.Event()

        async def task_a() -> None:
            await slot.__aenter__()
            entered.set()
            # Well past max_hold: nothing may cancel this task now.
            await trio.sleep(20)
            events.append(("a done", trio.current_time()))

        async def task_b() -> None:
            await entered.wait()
            await trio.sleep(1)
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)
            events.append(("b refused", trio.current_time()))
            assert not slot.held
            # Leaving again, from anywhere, gives nothing back twice.
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)

        async def next_in_line() -> None:
            await entered.wait()
            async with dispatcher.slot("p", max_hold=None) as other:
                assert other.granted_at is not None
                events.append(("next granted", other.granted_at))

        nursery.start_soon(task_a)
        nursery.start_soon(task_b)
        nursery.start_soon(next_in_line)
    assert events == [("b refused", 1.0), ("next granted", 1.0), ("a done", 20.0)]
    stats = dispatcher.statistics().providers["p"]
    assert (stats.in_flight, stats.granted_total, stats.released_total) == (0, 2, 2)


@pytest.mark.parametrize("max_hold", [None, 5.0], ids=["plain", "max_hold"])
async def test_a_slot_left_elsewhere_then_by_its_own_task_closes_cleanly(
    max_hold: float | None, autojump_clock: trio.testing.MockClock
) -> None:
    events: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}, max_hold=max_hold) as dispatcher:

        async def leave_elsewhere(slot: Slot) -> None:
            with pytest.raises(RuntimeError, match=LEFT_ELSEWHERE):
                await slot.__aexit__(None, None, None)
            events.append(("left elsewhere", trio.current_time()))

        with trio.CancelScope() as outer:
            async with dispatcher.slot("p") as slot:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(leave_elsewhere, slot)
                await trio.sleep(10)
                events.append(("body done", trio.current_time()))
            events.append(("left", trio.current_time()))
        assert not outer.cancelled_caught
        await trio.sleep(10)
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.granted_total, stats.released_total) == (
            0,
            1,
            1,
        )
    assert events == [("left elsewhere", 0.0), ("body done", 10.0), ("left", 10.0)]


# ---------------------------------------------------------------- not under trio


def _opened_by(opener: str) -> AbstractAsyncContextManager[object]:
    if opener == "open_dispatcher":
        return open_dispatcher({"p": 1})
    return open_dispatcher_with(Made(), {"p": 1})


UNDER_ASYNCIO = r"^trio-dispatch runs under trio, not asyncio: open the dispatcher inside trio.run\(\)$"
OUTSIDE_TRIO = (
    r"^trio-dispatch runs under trio: open the dispatcher inside trio.run\(\)$"
)


@pytest.mark.parametrize("opener", ["open_dispatcher", "open_dispatcher_with"])
def test_a_dispatcher_opened_under_asyncio_says_it_runs_under_trio(opener: str) -> None:
    async def main() -> None:
        async with _opened_by(opener):
            pytest.fail("opened under asyncio")

    with pytest.raises(RuntimeError, match=UNDER_ASYNCIO):
        asyncio.run(main())


@pytest.mark.parametrize("opener", ["open_dispatcher", "open_dispatcher_with"])
def test_a_dispatcher_opened_outside_any_event_loop_says_it_runs_under_trio(
    opener: str,
) -> None:
    entering = _opened_by(opener).__aenter__()
    with pytest.raises(RuntimeError, match=OUTSIDE_TRIO):
        entering.send(None)


# ---------------------------------------------------------------- the wrong with

OPEN_WITH = (
    r"^open_dispatcher\(\) is an async context manager:"
    r" use `async with open_dispatcher\(\.\.\.\) as dispatcher`$"
)


def test_open_dispatcher_without_async_with_says_which_with_to_use() -> None:
    opened = open_dispatcher({"p": 1})
    with pytest.raises(AttributeError, match=OPEN_WITH):
        opened.slot("p")  # type: ignore[attr-defined]  # the misuse tested
    with pytest.raises(TypeError, match=OPEN_WITH), opened:  # type: ignore[attr-defined]  # the misuse tested
        pytest.fail("entered with a plain with")
    with pytest.raises(TypeError, match=OPEN_WITH):
        trio.run(_await, opened)
    # Nothing else is hidden behind the message.
    with pytest.raises(
        AttributeError, match=r"^'AsyncWithOnly' object has no attribute '__wrapped__'$"
    ):
        opened.__wrapped__  # type: ignore[attr-defined]  # noqa: B018  # the misuse tested
    with (
        pytest.raises(
            TypeError,
            match=r"^open_dispatcher_with\(\) is an async context manager:"
            r" use `async with open_dispatcher_with\(\.\.\.\) as dispatcher`$",
        ),
        open_dispatcher_with(Made()),  # type: ignore[attr-defined]  # the misuse tested
    ):
        pytest.fail("entered with a plain with")


async def _await(awaitable: object) -> None:
    await awaitable  # type: ignore[misc]  # the misuse tested


async def test_turn_and_slot_in_the_wrong_with_say_which_with_to_use() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            TypeError,
            match=r"^turn\(\) is a plain context manager:"
            r" use `with dispatcher.turn\(\.\.\.\)`$",
        ):
            async with dispatcher.turn():  # type: ignore[attr-defined]  # the misuse tested
                pytest.fail("entered with async with")
        with (
            pytest.raises(
                TypeError,
                match=r"^slot\(\) is an async context manager:"
                r" use `async with dispatcher.slot\(\.\.\.\)`$",
            ),
            dispatcher.slot("p"),  # type: ignore[attr-defined]  # the misuse tested
        ):
            pytest.fail("entered with a plain with")
        # Neither took anything: the right with works as ever.
        with dispatcher.turn():
            async with dispatcher.slot("p") as slot:
                assert slot.held
        stats = dispatcher.statistics().providers["p"]
        assert (stats.granted_total, stats.released_total) == (1, 1)


PROVIDER_STREAM = (
    r"^stream\(\) is an async context manager:"
    r" use `async with provider.stream\(request\) as events`$"
)


async def test_streams_and_servers_in_the_wrong_with_say_which_with_to_use() -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))
    with (
        pytest.raises(
            TypeError,
            match=r"^open_fake_llm_server\(\) is an async context manager:"
            r" use `async with open_fake_llm_server\(\.\.\.\) as server`$",
        ),
        open_fake_llm_server(),  # type: ignore[attr-defined]  # the misuse tested
    ):
        pytest.fail("entered with a plain with")
    scripted = ScriptedProvider(FakeScript(), id="p")
    async with (
        open_fake_llm_server() as server,
        OpenAIProvider(
            base_url=server.openai_base_url, api_key="k", model="m"
        ) as openai,
        open_dispatcher({"p": 1}) as dispatcher,
    ):
        for provider in (openai, scripted, wrap_provider(scripted, dispatcher)):
            with (
                pytest.raises(TypeError, match=PROVIDER_STREAM),
                provider.stream(request),  # type: ignore[attr-defined]  # the misuse tested
            ):
                pytest.fail("entered with a plain with")
        with (
            pytest.raises(
                TypeError,
                match=r"^OpenAIProvider is an async context manager:"
                r" use `async with OpenAIProvider\(\.\.\.\) as provider`$",
            ),
            openai,  # type: ignore[attr-defined]  # the misuse tested
        ):
            pytest.fail("entered with a plain with")
        conversation = dispatcher.start_conversation(scripted)
        with (
            pytest.raises(
                TypeError,
                match=r"^stream\(\) is an async context manager:"
                r" use `async with conversation.stream\(\.\.\.\) as turn`$",
            ),
            conversation.stream("hi"),  # type: ignore[attr-defined]  # the misuse tested
        ):
            pytest.fail("entered with a plain with")
        # Nothing was sent: the right with works as ever.
        assert (await conversation.ask("hi")).llm_calls == 1
        assert len(scripted.requests) == 1
    assert server.requests == []


# ---------------------------------------------------------------- another trio run

ANOTHER_RUN = (
    r"^the dispatcher belongs to another trio run: use it in the run that opened it"
    r" \(from another thread, through trio\.from_thread\.run\)$"
)


async def _model_call(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    def answer(_request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={})

    transport = dispatcher.transport("p", inner=httpx2.MockTransport(answer))
    async with httpx2.AsyncClient(transport=transport) as client:
        await client.post("https://api.test/v1/chat/completions", json={})


async def _slot(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    async with dispatcher.slot("p"):
        pytest.fail("granted in another run")


async def _wrapped_stream(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    request = ChatRequest(messages=(ChatMessage(role="user", content="hi"),))
    provider = wrap_provider(ScriptedProvider(FakeScript(), id="p"), dispatcher)
    async with provider.stream(request):
        pytest.fail("granted in another run")


async def _turn(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    with dispatcher.turn():
        pytest.fail("entered in another run")


async def _ask(_dispatcher: Dispatcher, conversation: Conversation) -> None:
    await conversation.ask("hi")


async def _start_conversation(
    dispatcher: Dispatcher, _conversation: Conversation
) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.start_conversation(ScriptedProvider(FakeScript(), id="p"))


async def _events(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    async with dispatcher.events():
        pytest.fail("subscribed in another run")


async def _set_limit(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.set_limit("p", 3)


async def _remove_limit(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.remove_limit("p")


async def _set_tenant(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.set_tenant("acme", Tenant(limit=1))


async def _close(_dispatcher: Dispatcher, conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    conversation.close()


async def _report_rate_limit(
    dispatcher: Dispatcher, _conversation: Conversation
) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.report_rate_limit("p", retry_after=60)


async def _read_statistics(dispatcher: Dispatcher, _conversation: Conversation) -> None:
    await trio.lowlevel.checkpoint()
    dispatcher.statistics()


def _in_another_run(
    use: Callable[[Dispatcher, Conversation], Awaitable[None]],
    dispatcher: Dispatcher,
    conversation: Conversation,
) -> str:
    """Run ``use`` in a trio run of its own, in this (worker) thread: what it raised."""

    async def main() -> None:
        # Only a guard: refused, the call returns at once.
        with trio.fail_after(10):
            await use(dispatcher, conversation)

    try:
        trio.run(main)
    except Exception as exc:  # what it raised is the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.parametrize("contended", [False, True], ids=["free", "contended"])
@pytest.mark.parametrize(
    "use",
    [
        _slot,
        _model_call,
        _wrapped_stream,
        _turn,
        _ask,
        _start_conversation,
        _events,
        _set_limit,
        _remove_limit,
        _set_tenant,
        _close,
        _report_rate_limit,
        _read_statistics,
    ],
)
async def test_a_dispatcher_used_from_another_trio_run_refuses_it_and_runs_on(
    use: Callable[[Dispatcher, Conversation], Awaitable[None]], contended: bool
) -> None:
    outcomes: list[str] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        conversation = dispatcher.start_conversation(
            ScriptedProvider(FakeScript(), id="p")
        )
        holder = dispatcher.slot("p")
        if contended:
            await holder.__aenter__()
            nursery.start_soon(_hold, dispatcher.slot("p"), outcomes)
            await settle()
        refused = await trio.to_thread.run_sync(
            _in_another_run, use, dispatcher, conversation
        )
        assert refused == (
            "RuntimeError: the dispatcher belongs to another trio run:"
            " use it in the run that opened it"
            " (from another thread, through trio.from_thread.run)"
        )
        # This run is unharmed: the holder gives back, the waiter is granted,
        # and nothing of the other run's was queued, granted or changed.
        if contended:
            await holder.__aexit__(None, None, None)
            await settle()
        assert outcomes == (["granted"] if contended else [])
        stats = dispatcher.statistics().providers["p"]
        granted = 2 if contended else 0
        assert (stats.limit, stats.paused, stats.in_flight, stats.waiting) == (
            1,
            False,
            0,
            0,
        )
        assert (stats.granted_total, stats.released_total, stats.withdrawn_total) == (
            granted,
            granted,
            0,
        )
        assert dispatcher.tenants() == {}
        assert (await conversation.ask("hi")).llm_calls == 1
        assert conversation.statistics().turns_completed == 1
