"""The turn as context (``Dispatcher.turn``) and priority classes, in virtual time."""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from trio_dispatch import (
    Tool,
    Turn,
    current_turn,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch.messages import ChatMessage, ChatRequest, Finish, TextDelta, ToolCall

from .._helpers import settle

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from trio_dispatch import Dispatcher
    from trio_dispatch.messages import StreamEvent


async def _queue(
    nursery: trio.Nursery,
    dispatcher: Dispatcher,
    order: list[tuple[str, float]],
    name: str,
    hold: float = 1.0,
    **slot: Any,  # noqa: ANN401 (slot's keyword arguments)
) -> None:
    """Start a task that takes a slot of ``"p"``, records its grant, holds it."""

    async def call() -> None:
        async with dispatcher.slot("p", **slot):
            order.append((name, trio.current_time()))
            await trio.sleep(hold)

    nursery.start_soon(call)
    await settle()


# ---------------------------------------------------------------- turn()


async def test_calls_of_an_older_turn_go_before_calls_of_newer_turns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        with dispatcher.turn(conversation_id="old") as old:
            assert old == Turn(conversation_id="old", started_at=0.0, priority=0)
            await trio.sleep(5)
            async with trio.open_nursery() as nursery:
                await _queue(nursery, dispatcher, order, "plug", hold=10)
                # A turn that starts later asks first; the old turn's next
                # call, asked after it, is still granted before it.
                with dispatcher.turn(conversation_id="new"):
                    await _queue(nursery, dispatcher, order, "new")
                await trio.sleep(1)
                await _queue(nursery, dispatcher, order, "old")
    assert order == [("plug", 5.0), ("old", 15.0), ("new", 16.0)]


async def test_a_slot_takes_the_turn_and_what_it_is_given_wins_field_by_field(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        await trio.sleep(3)
        outside = dispatcher.slot("p")
        assert (outside.conversation_id, outside.started_at, outside.priority) == (
            None,
            3.0,
            0,
        )
        with dispatcher.turn(conversation_id="c", started_at=1.5, priority=2):
            await trio.sleep(1)
            inside = dispatcher.slot("p")
            assert (inside.conversation_id, inside.started_at, inside.priority) == (
                "c",
                1.5,
                2,
            )
            given = dispatcher.slot("p", conversation_id="d", priority=0)
            assert (given.conversation_id, given.started_at, given.priority) == (
                "d",
                1.5,
                0,
            )
            async with inside:
                assert inside.ticket is not None
                assert inside.ticket.priority == 2
                # The rank: the start less two classes of 60 s.
                assert inside.ticket.rank == 1.5 - 2 * 60.0
        assert current_turn() is None


async def test_tasks_started_inside_a_turn_inherit_it_and_earlier_ones_do_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: dict[str, tuple[Turn | None, float, int]] = {}
    async with open_dispatcher({"p": 1}) as dispatcher:

        async def record(name: str, wait: trio.Event | None = None) -> None:
            if wait is not None:
                await wait.wait()
            slot = dispatcher.slot("p")
            async with slot:
                seen[name] = (current_turn(), slot.started_at, slot.priority)

        go = trio.Event()
        async with trio.open_nursery() as outer:
            # Started before the turn: its context was copied without it.
            outer.start_soon(record, "before", go)
            await trio.sleep(2)
            with dispatcher.turn(conversation_id="t", priority=1) as turn:
                # A nursery opened earlier: the context is copied at spawn.
                outer.start_soon(record, "spawned-inside")
                async with trio.open_nursery() as inner:
                    inner.start_soon(record, "child")
            await trio.sleep(1)
            go.set()
    assert seen == {
        "before": (None, 3.0, 0),
        "spawned-inside": (turn, 2.0, 1),
        "child": (turn, 2.0, 1),
    }


async def test_an_inner_turn_replaces_the_outer_one_whole_until_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with dispatcher.turn(conversation_id="outer", priority=3) as outer:
            await trio.sleep(1)
            with dispatcher.turn() as inner:
                assert current_turn() is inner
                assert inner == Turn(conversation_id=None, started_at=1.0, priority=0)
                slot = dispatcher.slot("p")
                assert (slot.conversation_id, slot.priority) == (None, 0)
            assert current_turn() is outer
        assert current_turn() is None


async def test_a_turn_is_no_dispatchers_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher({"p": 1}) as one,
        open_dispatcher({"p": 1}, priority_aging=10.0) as other,
    ):
        await trio.sleep(4)
        with one.turn(conversation_id="c", priority=1):
            slot = other.slot("p")
            async with slot:
                assert (slot.conversation_id, slot.started_at, slot.priority) == (
                    "c",
                    4.0,
                    1,
                )
                # Ranked with the aging of the dispatcher that grants it.
                assert slot.ticket is not None
                assert slot.ticket.rank == 4.0 - 10.0
        scope = one.turn()
    # Plain data: it outlives the dispatcher that made it.
    with scope as turn:
        assert current_turn() is turn
    assert current_turn() is None


async def test_a_turn_is_entered_once_and_left_where_it_was_entered() -> None:
    async with open_dispatcher() as dispatcher:
        scope = dispatcher.turn(started_at=2, priority=1)
        assert repr(scope) == (
            "<TurnScope Turn(conversation_id=None, started_at=2.0, priority=1, tenant=None)>"
        )
        with scope:
            pass
        with (
            pytest.raises(RuntimeError, match=r"^a turn can be entered only once$"),
            scope,
        ):
            pass
        with pytest.raises(
            RuntimeError, match=r"^a turn must be entered before it is left$"
        ):
            dispatcher.turn().__exit__(None, None, None)
        assert current_turn() is None


async def test_wrapped_providers_stream_in_the_current_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[Turn | None] = []
    order: list[tuple[str, float]] = []
    async with open_dispatcher({"memory": 1}) as dispatcher:
        provider = wrap_provider(_Recorder(seen), dispatcher)

        async def stream(name: str) -> None:
            async with provider.stream(_REQUEST) as events:
                order.append((name, trio.current_time()))
                assert [e async for e in events] == [TextDelta("hi"), Finish("stop")]
                await trio.sleep(1)

        with dispatcher.turn(conversation_id="w", priority=0) as old:
            await trio.sleep(5)
            async with (
                trio.open_nursery() as nursery,
                dispatcher.slot("memory", started_at=5.0),
            ):
                with dispatcher.turn(conversation_id="new"):
                    nursery.start_soon(stream, "new")
                    await settle()
                nursery.start_soon(stream, "old")
                await settle()
                await trio.sleep(2)
    # The old turn's stream, asked last, goes first, and streams in its turn.
    assert order == [("old", 7.0), ("new", 8.0)]
    assert seen == [old, Turn(conversation_id="new", started_at=5.0, priority=0)]


# ---------------------------------------------------------------- classes


async def test_grants_go_by_class_first_then_oldest_turn_then_arrival(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}) as dispatcher:
        await trio.sleep(10)
        async with trio.open_nursery() as nursery:
            await _queue(nursery, dispatcher, order, "plug", started_at=0)
            for name, started_at, priority in [
                ("low-old", 1.0, 0),
                ("high-new", 9.0, 1),
                ("high-old", 2.0, 1),
                ("top", 10.0, 5),
                ("low-older", 0.5, 0),
                ("high-tie", 2.0, 1),
            ]:
                await _queue(
                    nursery,
                    dispatcher,
                    order,
                    name,
                    started_at=started_at,
                    priority=priority,
                )
    assert [name for name, _ in order] == [
        "plug",
        "top",
        "high-old",
        "high-tie",
        "high-new",
        "low-older",
        "low-old",
    ]
    assert [at for _, at in order] == [10.0 + i for i in range(7)]


async def test_a_lower_class_goes_first_once_its_turn_is_older_by_the_aging(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Aging 10 s per class: a class-0 turn that began at 0 ranks with a
    # class-2 turn that began at 20; one that began at 21 goes after it.
    order: list[tuple[str, float]] = []
    async with open_dispatcher({"p": 1}, priority_aging=10.0) as dispatcher:
        await trio.sleep(30)
        async with trio.open_nursery() as nursery:
            await _queue(nursery, dispatcher, order, "plug")
            await _queue(
                nursery, dispatcher, order, "c2-at-21", started_at=21, priority=2
            )
            await _queue(nursery, dispatcher, order, "c0-at-0", started_at=0)
            await _queue(
                nursery, dispatcher, order, "c1-at-5", started_at=5, priority=1
            )
            await _queue(
                nursery, dispatcher, order, "c2-at-19", started_at=19, priority=2
            )
            await _queue(
                nursery, dispatcher, order, "c2-at-20", started_at=20, priority=2
            )
    # Ranks: 1, 0, -5, -1, 0; equal ranks in arrival order.
    assert order == [
        ("plug", 30.0),
        ("c1-at-5", 31.0),
        ("c2-at-19", 32.0),
        ("c0-at-0", 33.0),
        ("c2-at-20", 34.0),
        ("c2-at-21", 35.0),
    ]


@pytest.mark.parametrize(("aging", "low_granted_at"), [(20.0, 31.5), (1e6, 90.0)])
async def test_a_lower_class_is_not_starved_by_a_stream_of_higher_ones(
    autojump_clock: trio.testing.MockClock, aging: float, low_granted_at: float
) -> None:
    # Class-1 requests arrive every second, each held for 1.5 s: more than
    # the slot can serve. With 20 s of aging the class-0 request (its turn
    # began at 0.5) waits only for the class-1 turns that began less than
    # 20 s after its own (seconds 0 to 20: 21 grants of 1.5 s), then goes
    # first. With aging beyond the run it waits while any class 1 waits.
    granted: dict[str, float] = {}
    async with open_dispatcher({"p": 1}, priority_aging=aging) as dispatcher:

        async def call(name: str, priority: int) -> None:
            async with dispatcher.slot("p", priority=priority):
                granted[name] = trio.current_time()
                await trio.sleep(1.5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "high-0", 1)
            await trio.sleep(0.5)
            nursery.start_soon(call, "low", 0)
            for second in range(1, 60):
                await trio.sleep_until(second)
                nursery.start_soon(call, f"high-{second}", 1)
    assert granted["low"] == low_granted_at
    assert sorted(granted.values()) == [1.5 * k for k in range(61)]


# ---------------------------------------------------------------- conversations


async def test_a_conversations_turn_is_the_current_turn_of_its_calls_and_tools(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[Turn | None] = []
    in_tool: list[Turn | None] = []

    async def look(_arguments: dict[str, Any]) -> str:
        in_tool.append(current_turn())
        await trio.sleep(2)
        return "ok"

    tool = Tool(
        name="look", description="Look.", parameters={"type": "object"}, run=look
    )
    async with open_dispatcher({"memory": 1}) as dispatcher:
        recorder = _Recorder(seen, tool_calls=1)
        conversation = dispatcher.start_conversation(
            recorder, conversation_id="conv", tools=[tool], priority=3
        )
        assert conversation.priority == 3
        await trio.sleep(7)
        result = await conversation.ask("Look, please.")
    expected = Turn(conversation_id="conv", started_at=7.0, priority=3)
    assert in_tool == [expected]
    assert result.started_at == 7.0
    # Both calls of the turn, before and after the tool, ran in it.
    assert seen == [expected, expected]


async def test_a_higher_class_conversation_goes_before_older_lower_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    finished: list[str] = []
    async with open_dispatcher({"memory": 1}) as dispatcher:
        seen: list[Turn | None] = []
        plain = dispatcher.start_conversation(_Recorder(seen, hold=1.0))
        starred = dispatcher.start_conversation(_Recorder(seen, hold=1.0), priority=1)

        async def ask(name: str, conversation: Any) -> None:  # noqa: ANN401 (a Conversation)
            await conversation.ask("Hi.")
            finished.append(name)

        async with trio.open_nursery() as nursery, dispatcher.slot("memory"):
            nursery.start_soon(ask, "plain", plain)
            await settle()
            await trio.sleep(5)
            nursery.start_soon(ask, "starred", starred)
            await settle()
    assert finished == ["starred", "plain"]
    assert trio.current_time() == 7.0


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"priority": True},
            TypeError,
            r"^priority must be an integer from -1000000 to 1000000, got True$",
        ),
        (
            {"priority": 1.0},
            TypeError,
            r"^priority must be an integer from -1000000 to 1000000, got 1\.0$",
        ),
        (
            {"priority": 10**7},
            ValueError,
            r"^priority must be an integer from -1000000 to 1000000, got 10000000$",
        ),
        (
            {"started_at": math.nan},
            ValueError,
            r"^started_at must be a finite number, got nan$",
        ),
        (
            {"started_at": math.inf},
            ValueError,
            r"^started_at must be a finite number, got inf$",
        ),
        (
            {"started_at": "0"},
            TypeError,
            r"^started_at must be a finite number, got '0'$",
        ),
        (
            {"conversation_id": 7},
            TypeError,
            r"^conversation_id must be a string or None, got 7$",
        ),
    ],
)
async def test_bad_turns_and_slots_are_refused_at_the_call(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(error, match=message):
            dispatcher.turn(**arguments)
        with pytest.raises(error, match=message):
            dispatcher.slot("p", **arguments)
        assert current_turn() is None
        assert dispatcher.statistics().providers["p"].granted_total == 0


async def test_a_bad_provider_or_conversation_priority_is_refused_at_the_call() -> None:
    async with open_dispatcher({"memory": 1}) as dispatcher:
        with pytest.raises(
            TypeError, match=r"^provider must be a non-empty string, got 1$"
        ):
            dispatcher.slot(1, priority=1)  # type: ignore[arg-type]  # the point
        with pytest.raises(
            TypeError,
            match=r"^priority must be an integer from -1000000 to 1000000, got False$",
        ):
            dispatcher.start_conversation(_Recorder([]), priority=False)


@pytest.mark.parametrize(
    ("aging", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
        (True, TypeError),
        ("60", TypeError),
    ],
)
def test_a_bad_priority_aging_is_refused_at_the_call(
    aging: object, error: type[Exception]
) -> None:
    with pytest.raises(
        error,
        match=r"^priority_aging must be a positive number of seconds, got ",
    ):
        open_dispatcher(priority_aging=aging)  # type: ignore[arg-type]  # the point


# ---------------------------------------------------------------- a provider


_REQUEST = ChatRequest(messages=[ChatMessage("user", "Hi.")])


class _Recorder:
    """A provider in memory that records the turn each of its streams runs in.

    It answers ``tool_calls`` times with a call of the ``look`` tool, then
    with text, each answer ``hold`` seconds long.
    """

    id = "memory"

    def __init__(
        self,
        seen: list[Turn | None],
        *,
        tool_calls: int = 0,
        hold: float = 0.0,
    ) -> None:
        self.seen = seen
        self.tool_calls = tool_calls
        self.hold = hold

    def stream(self, request: ChatRequest) -> Any:  # noqa: ANN401 (a stream's context manager)
        return self._stream(request)

    @asynccontextmanager
    async def _stream(
        self, _request: ChatRequest
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        self.seen.append(current_turn())
        await trio.sleep(self.hold)
        if self.tool_calls:
            self.tool_calls -= 1
            events: list[StreamEvent] = [
                ToolCall(id=f"call-{self.tool_calls}", name="look"),
                Finish("tool_calls"),
            ]
        else:
            events = [TextDelta("hi"), Finish("stop")]

        async def play() -> AsyncIterator[StreamEvent]:
            for event in events:
                yield event

        yield play()
