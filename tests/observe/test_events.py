"""``dispatcher.events()``: exact event sequences in virtual time.

Then the same story told by a dispatcher that shares its limits through a
real redis-server, in real time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from trio_dispatch import (
    DispatcherClosed,
    QueueFull,
    Quota,
    RateLimitInfo,
    Tenant,
    open_dispatcher,
)
from trio_dispatch._observe._hub import EventHub
from trio_dispatch._observe._translator import Translator
from trio_dispatch.events import (
    EventSubscription,
    Granted,
    LimitChanged,
    Paused,
    Queued,
    RateLimitsReceived,
    Refused,
    Released,
    Resumed,
    Withdrawn,
)
from trio_dispatch.messages._protocol import Ticket

from .._events import record
from .._helpers import settle
from .._redis import needs_redis

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher
    from trio_dispatch.events import DispatchEvent

    from .._redis import RedisServer


async def hold(
    dispatcher: Dispatcher,
    conversation_id: str,
    after: float,
    seconds: float,
) -> None:
    await trio.sleep(after)
    async with dispatcher.slot("p", conversation_id=conversation_id):
        await trio.sleep(seconds)


async def test_a_contended_slot_tells_queued_granted_with_the_wait_and_released(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        await nursery.start(record, dispatcher, events)
        start = trio.current_time()
        async with trio.open_nursery() as agents:
            agents.start_soon(hold, dispatcher, "a", 0, 2)
            agents.start_soon(hold, dispatcher, "b", 0.5, 1)
        await settle()
        nursery.cancel_scope.cancel()
    t = start
    assert events == [
        Granted("p", t, "a", t, 0.0, in_flight=1, waiting=0),
        Queued("p", t + 0.5, "b", t + 0.5, in_flight=1, waiting=1),
        Released("p", t + 2, "a", t, 2.0, in_flight=0, waiting=1),
        Granted("p", t + 2, "b", t + 0.5, 1.5, in_flight=1, waiting=0),
        Released("p", t + 3, "b", t + 0.5, 1.0, in_flight=0, waiting=0),
    ]


async def test_a_raised_limit_grants_in_ticket_order_each_event_with_its_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        nursery.start_soon(hold, dispatcher, "a", 0, 10)
        await settle()
        nursery.start_soon(hold, dispatcher, "b", 0, 10)
        await settle()
        nursery.start_soon(hold, dispatcher, "c", 0, 10)
        await trio.sleep(1)
        dispatcher.set_limit("p", 3)
        await settle()
        nursery.cancel_scope.cancel()
    assert events[3:] == [
        LimitChanged("p", t + 1, limit=3, previous=1),
        Granted("p", t + 1, "b", t, 1.0, in_flight=2, waiting=1),
        Granted("p", t + 1, "c", t, 1.0, in_flight=3, waiting=0),
    ]
    assert [type(e) for e in events[:3]] == [Granted, Queued, Queued]


async def test_a_cancelled_waiter_is_withdrawn_and_a_full_queue_refuses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    refused: list[BaseException] = []

    async def refused_waiter() -> None:
        with pytest.raises(QueueFull) as caught:
            await dispatcher.slot("p", conversation_id="c").__aenter__()
        refused.append(caught.value)

    async with (
        open_dispatcher({"p": 1}, max_waiting=1) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        nursery.start_soon(hold, dispatcher, "a", 0, 10)
        await settle()
        async with trio.open_nursery() as waiters:
            waiters.start_soon(hold, dispatcher, "b", 0, 1)
            await settle()
            await refused_waiter()
            await trio.sleep(3)
            waiters.cancel_scope.cancel()
        await trio.sleep(8)
        nursery.cancel_scope.cancel()
    assert events == [
        Granted("p", t, "a", t, 0.0, in_flight=1, waiting=0),
        Queued("p", t, "b", t, in_flight=1, waiting=1),
        Refused("p", t, "c", t, str(refused[0]), in_flight=1, waiting=1),
        Withdrawn("p", t + 3, "b", t, 3.0, in_flight=1, waiting=0),
        Released("p", t + 10, "a", t, 10.0, in_flight=0, waiting=0),
    ]
    assert str(refused[0]) == "1 request already waits for 'p' (max_waiting=1)"


async def test_a_rate_limit_pause_and_its_end_and_a_resume(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    async with (
        open_dispatcher({"p": 1}, default_pause=2.0) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        dispatcher.report_rate_limit("p", 5.0)
        await trio.sleep(1)
        dispatcher.report_rate_limit("p")
        await trio.sleep(10)
        dispatcher.report_rate_limit("p")
        await trio.sleep(1)
        dispatcher.resume("p")
        await settle()
        nursery.cancel_scope.cancel()
    assert events == [
        Paused("p", t, until=t + 5, why="rate_limited", retry_after=5.0),
        # A report within the pause that would end earlier extends nothing.
        Paused("p", t + 1, until=t + 5, why="rate_limited", retry_after=None),
        Resumed("p", t + 5, why="expired"),
        # No slot was granted since the last report: the same round of the
        # backoff, so the same default pause.
        Paused("p", t + 11, until=t + 13, why="rate_limited", retry_after=None),
        Resumed("p", t + 12, why="resumed"),
    ]


async def test_rate_limit_figures_reach_the_subscribers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    info = RateLimitInfo(requests=Quota(limit=500, remaining=499, reset=0.12))
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        # Nobody listens: nothing to do, and nothing fails.
        dispatcher.observe_rate_limits("p", info)
        async with trio.open_nursery() as nursery:
            await nursery.start(record, dispatcher, events)
            await trio.sleep(1)
            dispatcher.observe_rate_limits("p", info)
            # Figures that say nothing are no event.
            dispatcher.observe_rate_limits("p", RateLimitInfo())
            t = trio.current_time()
            await settle()
            nursery.cancel_scope.cancel()
    assert events == [RateLimitsReceived("p", t, info)]


async def test_rate_limit_figures_are_events_even_when_budgets_ignore_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    info = RateLimitInfo(tokens=Quota(limit=1000, remaining=10, reset=6.0))
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}, learn_budgets=False) as dispatcher:
        async with trio.open_nursery() as nursery:
            await nursery.start(record, dispatcher, events)
            dispatcher.observe_rate_limits("p", info)
            t = trio.current_time()
            await settle()
            nursery.cancel_scope.cancel()
        assert dispatcher.statistics().providers["p"].budget is None
    assert events == [RateLimitsReceived("p", t, info)]


async def test_a_slow_subscriber_never_delays_a_grant_and_counts_its_drops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[tuple[str, float]] = []

    async def agent(dispatcher: Dispatcher, name: str) -> None:
        async with dispatcher.slot("p", conversation_id=name):
            granted.append((name, trio.current_time()))
            await trio.sleep(1)

    async with (
        open_dispatcher({"p": 1}) as dispatcher,
        dispatcher.events(buffer=2) as events,
    ):
        t = trio.current_time()
        async with trio.open_nursery() as agents:
            for name in "abcde":
                agents.start_soon(agent, dispatcher, name)
                await settle()
        await settle()
        # Never read while the agents ran: 1 grant at once, 4 queued,
        # 5 released, 4 granted on release, of which 2 are kept.
        assert (events.pending, events.dropped) == (2, 12)
        kept = [await events.__anext__() for _ in range(2)]
    assert granted == [(name, t + i) for i, name in enumerate("abcde")]
    assert kept == [
        Granted("p", t, "a", t, 0.0, in_flight=1, waiting=0),
        Queued("p", t, "b", t, in_flight=1, waiting=1),
    ]


async def test_a_slot_granted_before_subscribing_is_released_without_its_hold(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        nursery.start_soon(hold, dispatcher, "a", 0, 2)
        await settle()
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert events == [Released("p", t + 2, None, t, None, in_flight=0, waiting=0)]


async def test_the_iteration_ends_when_the_dispatcher_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []
    async with trio.open_nursery() as nursery:
        async with open_dispatcher() as dispatcher:
            subscription = await nursery.start(record, dispatcher, events)
            dispatcher.set_limit("q", 2)
            t = trio.current_time()
        await settle()
        # record() returned on its own: the nursery has nothing left to wait for.
        assert nursery.child_tasks == frozenset()
    assert events == [LimitChanged("q", t, 2, None)]
    assert subscription.dropped == 0
    with pytest.raises(DispatcherClosed, match=r"^the dispatcher is closed$"):
        async with dispatcher.events():
            pass


async def test_misuse_of_a_subscription(autojump_clock: trio.testing.MockClock) -> None:
    async with open_dispatcher() as dispatcher:
        subscription = dispatcher.events()
        assert isinstance(subscription, EventSubscription)
        with pytest.raises(RuntimeError, match=r"^read events inside"):
            await subscription.__anext__()
        async with subscription:
            pass
        with pytest.raises(RuntimeError, match=r"^an event subscription can be"):
            await subscription.__aenter__()
        # Left: the iteration ends at once.
        assert [event async for event in subscription] == []
        with pytest.raises(ValueError, match=r"^buffer must be a positive integer"):
            dispatcher.events(buffer=0)
        with pytest.raises(TypeError, match=r"^buffer must be a positive integer"):
            dispatcher.events(buffer=1.5)  # type: ignore[arg-type]  # the error is the point
        with pytest.raises(TypeError, match=r"has no public constructor$"):
            EventSubscription()  # type: ignore[call-arg]  # the error is the point


async def test_two_subscribers_see_the_same_events_and_a_left_one_sees_no_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first: list[DispatchEvent] = []
    second: list[DispatchEvent] = []
    async with open_dispatcher() as dispatcher, trio.open_nursery() as nursery:
        await nursery.start(record, dispatcher, first)
        async with trio.open_nursery() as inner:
            await inner.start(record, dispatcher, second)
            dispatcher.set_limit("p", 1)
            await settle()
            inner.cancel_scope.cancel()
        dispatcher.set_limit("p", 2)
        await settle()
        nursery.cancel_scope.cancel()
    assert [(e.limit, e.previous) for e in first] == [(1, None), (2, 1)]  # type: ignore[union-attr]  # all LimitChanged
    assert second == first[:1]


async def test_events_carry_the_turns_start_whatever_the_priority_class(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []

    async def high(t: float) -> None:
        async with dispatcher.slot(
            "p", conversation_id="high", started_at=t + 0.25, priority=3
        ):
            pass

    async with (
        open_dispatcher({"p": 1}, priority_aging=7.0) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        async with (
            trio.open_nursery() as agents,
            dispatcher.slot("p", conversation_id="low"),
        ):
            agents.start_soon(high, t)
            await trio.sleep(1)
        await settle()
        nursery.cancel_scope.cancel()
    assert [type(event) for event in events] == [
        Granted,
        Queued,
        Released,
        Granted,
        Released,
    ]
    starts = {event.conversation_id: event.started_at for event in events}  # type: ignore[union-attr]  # slot events only
    assert starts == {"low": t, "high": t + 0.25}


class _Sink:
    """A hub sink that keeps every event."""

    def __init__(self) -> None:
        self.events: list[DispatchEvent] = []

    def push(self, event: DispatchEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


def test_every_request_event_carries_the_tickets_tenant_and_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The one translator both backends go through, fed by hand: each
    # request's event names the tenant and the model its ticket carries.
    hub = EventHub(aging=10.0)
    sink = _Sink()
    hub.attach(sink)
    events = Translator("p", hub)
    a = Ticket(5.0, 1, 0, "acme", "gpt-4o")
    b = Ticket(6.0, 2, 1, "beta", None)
    c = Ticket(7.0, 3, 0, None, "gpt-4o-mini")
    events.granted_at_once(a, "ca", 10.0, 1, 0)
    events.queued(b, "cb", 11.0, 1, 1)
    events.queued(c, None, 11.5, 1, 2)
    events.left(a, 12.0, (1, 2), in_flight=1, waiting=1, granted=1)
    events.granted([b], 12.0, 1, 1)
    events.withdrawn(c, 13.0, 1, 0)
    with caplog.at_level(logging.INFO, logger="trio_dispatch"):
        events.refused(a, "ca", 14.0, QueueFull("full"), 1, 0)
        events.refused(c, None, 14.0, QueueFull("full"), 1, 0)
    assert sink.events == [
        Granted("p", 10.0, "ca", 5.0, 0.0, 1, 0, tenant="acme", model="gpt-4o"),
        Queued("p", 11.0, "cb", 16.0, 1, 1, tenant="beta", model=None),
        Queued("p", 11.5, None, 7.0, 1, 2, tenant=None, model="gpt-4o-mini"),
        Released("p", 12.0, "ca", 5.0, 2.0, 0, 2, tenant="acme", model="gpt-4o"),
        Granted("p", 12.0, "cb", 16.0, 1.0, 1, 1, tenant="beta", model=None),
        Withdrawn("p", 13.0, None, 7.0, 1.5, 1, 0, tenant=None, model="gpt-4o-mini"),
        Refused("p", 14.0, "ca", 5.0, "full", 1, 0, tenant="acme", model="gpt-4o"),
        Refused("p", 14.0, None, 7.0, "full", 1, 0, tenant=None, model="gpt-4o-mini"),
    ]
    assert [record.getMessage() for record in caplog.records] == [
        "provider 'p' refused a request of tenant 'acme': full",
        "provider 'p' refused a request: full",
    ]


def test_events_without_a_tenant_or_model_are_as_before() -> None:
    # The two fields come last, with defaults: events built as before
    # compare equal to those the schedulers make for requests without them.
    assert Granted("p", 1.0, "a", 0.0, 0.0, 1, 0) == Granted(
        "p", 1.0, "a", 0.0, 0.0, 1, 0, tenant=None, model=None
    )
    assert RateLimitsReceived("p", 1.0, RateLimitInfo()).model is None


async def test_a_dispatchers_events_name_the_tenant_and_model_of_each_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[DispatchEvent] = []

    async def ask(tenant: str | None, model: str | None, seconds: float) -> None:
        async with dispatcher.slot(
            "p", conversation_id=tenant, tenant=tenant, model=model
        ):
            await trio.sleep(seconds)

    async with (
        open_dispatcher({"p": 1}, tenants={"acme": Tenant(weight=2.0)}) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        async with trio.open_nursery() as agents:
            agents.start_soon(ask, "acme", "gpt-4o", 2)
            await settle()
            agents.start_soon(ask, "beta", None, 1)
        await settle()
        nursery.cancel_scope.cancel()
    assert events == [
        Granted("p", t, "acme", t, 0.0, 1, 0, tenant="acme", model="gpt-4o"),
        Queued("p", t, "beta", t, 1, 1, tenant="beta"),
        Released("p", t + 2, "acme", t, 2.0, 0, 1, tenant="acme", model="gpt-4o"),
        Granted("p", t + 2, "beta", t, 2.0, 1, 0, tenant="beta"),
        Released("p", t + 3, "beta", t, 1.0, 0, 0, tenant="beta"),
    ]


async def test_rate_limit_figures_name_the_model_they_are_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    info = RateLimitInfo(requests=Quota(limit=500, remaining=499, reset=0.12))
    events: list[DispatchEvent] = []
    async with open_dispatcher({"p": 1}) as dispatcher, trio.open_nursery() as nursery:
        await nursery.start(record, dispatcher, events)
        t = trio.current_time()
        dispatcher.observe_rate_limits("p", info, model="gpt-4o")
        dispatcher.observe_rate_limits("p", info)
        await settle()
        nursery.cancel_scope.cancel()
    assert events == [
        RateLimitsReceived("p", t, info, model="gpt-4o"),
        RateLimitsReceived("p", t, info, model=None),
    ]


# -- a dispatcher sharing its limits through Redis ---------------------------------


async def until(events: list[DispatchEvent], count: int) -> None:
    """Wait (real time: the state lives in Redis) until ``count`` events came."""
    with trio.fail_after(5):
        while len(events) < count:  # noqa: ASYNC110 (events come through Redis rounds)
            await trio.sleep(0.005)


@needs_redis
async def test_the_shared_scheduler_tells_the_same_story(server: RedisServer) -> None:
    events: list[DispatchEvent] = []
    release = trio.Event()

    async def hold(dispatcher: Dispatcher, name: str) -> None:
        async with dispatcher.slot(
            "p", conversation_id=name, tenant=f"tenant-{name}", model="m"
        ):
            await release.wait()

    async with (
        open_dispatcher(
            {"p": 1}, redis_url=server.url, namespace="events", lease=1.5
        ) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(record, dispatcher, events)
        nursery.start_soon(hold, dispatcher, "a")
        await until(events, 2)
        nursery.start_soon(hold, dispatcher, "b")
        await until(events, 3)
        release.set()
        await until(events, 6)
        dispatcher.set_limit("p", 2)
        await until(events, 7)
        dispatcher.report_rate_limit("p", 0.2)
        await until(events, 8)
        # The fleet's pause is seen to end by the next round after it.
        await trio.sleep(0.3)
        nursery.start_soon(hold, dispatcher, "c")
        await until(events, 12)
        nursery.cancel_scope.cancel()
    kinds = [(type(e), getattr(e, "conversation_id", None)) for e in events]
    assert kinds == [
        (Queued, "a"),
        (Granted, "a"),
        (Queued, "b"),
        (Released, "a"),
        (Granted, "b"),
        (Released, "b"),
        (LimitChanged, None),
        (Paused, None),
        (Queued, "c"),
        (Resumed, None),
        (Granted, "c"),
        (Released, "c"),
    ]
    # Each request's events name its tenant and model, as the local ones do.
    assert [
        (getattr(e, "tenant", None), getattr(e, "model", None)) for e in events
    ] == [
        (f"tenant-{who}", "m") if who is not None else (None, None) for _, who in kinds
    ]
    granted_b = events[4]
    assert isinstance(granted_b, Granted)
    assert granted_b.wait is not None
    assert granted_b.wait > 0
    assert (granted_b.in_flight, granted_b.waiting) == (1, 0)
    limit = events[6]
    assert isinstance(limit, LimitChanged)
    assert (limit.limit, limit.previous) == (2, 1)
