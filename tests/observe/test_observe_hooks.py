"""What metrics observe, through public names: ``observe_events``, ``observe_calls``.

The Prometheus collector and the OpenTelemetry metrics are built on these
two methods of the dispatcher, and on nothing private of it: an AST test
reads them for any underscore attribute of another object.
"""

from __future__ import annotations

import ast
import math
import pathlib

import pytest
import trio
import trio.testing

import trio_dispatch
from trio_dispatch import Budget, events, open_dispatcher, wrap_provider
from trio_dispatch.lowlevel import plumbing
from trio_dispatch.messages import ChatMessage, ChatRequest, Usage
from trio_dispatch.testing import FakeReply, FakeScript, ScriptedProvider

PACKAGE = pathlib.Path(trio_dispatch.__file__).parent


class Sink:
    """An event sink that keeps what it is handed."""

    def __init__(self) -> None:
        self.events: list[events.DispatchEvent] = []
        self.closed = 0

    def push(self, event: events.DispatchEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        self.closed += 1


class Observer:
    """A call observer that keeps what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, Usage | None, BaseException | None]] = []

    def call_ended(
        self,
        provider: trio_dispatch.Provider,
        duration: float,
        usage: Usage | None,
        error: BaseException | None,
    ) -> None:
        self.calls.append((provider.id, duration, usage, error))


async def test_observe_events_hands_every_event_as_it_happens_then_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Sink()
    async with open_dispatcher({"p": 1}) as dispatcher:
        plumbing(dispatcher).observe_events(sink)
        async with dispatcher.slot("p"):
            # No buffer, no reader task: the grant is there already.
            assert [type(event) for event in sink.events] == [events.Granted]
            await trio.sleep(2)
        assert [type(event) for event in sink.events] == [
            events.Granted,
            events.Released,
        ]
        released = sink.events[-1]
        assert isinstance(released, events.Released)
        assert released.held == 2
        assert sink.closed == 0
    assert sink.closed == 1


async def test_observe_events_after_closing_closes_the_sink_at_once() -> None:
    sink = Sink()
    async with open_dispatcher({"p": 1}) as dispatcher:
        pass
    plumbing(dispatcher).observe_events(sink)
    assert sink.closed == 1
    assert sink.events == []


async def test_observe_calls_tells_of_every_call_through_wrap_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = FakeScript(
        replies=(FakeReply(text="hi", input_tokens=3, output_tokens=2, latency=1.5),)
    )
    observer = Observer()
    request = ChatRequest(messages=[ChatMessage("user", "hello")])
    async with open_dispatcher({"acme": 1}) as dispatcher:
        plumbing(dispatcher).observe_calls(observer)
        limited = wrap_provider(ScriptedProvider(script, id="acme"), dispatcher)
        async with limited.stream(request) as stream:
            async for _ in stream:
                pass
    [(provider, duration, usage, error)] = observer.calls
    assert (provider, duration, error) == ("acme", 1.5, None)
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens) == (3, 2)


async def test_observe_refuses_what_cannot_observe() -> None:
    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.raises(
            TypeError, match=r"^sink must have a push method, got object\(\)$"
        ):
            plumbing(dispatcher).observe_events(Named())  # type: ignore[arg-type]  # the point
        with pytest.raises(
            TypeError, match=r"^sink must have a close method, got object\(\)$"
        ):
            plumbing(dispatcher).observe_events(PushOnly())  # type: ignore[arg-type]  # the point
        with pytest.raises(
            TypeError, match=r"^observer must have a call_ended method, got object\(\)$"
        ):
            plumbing(dispatcher).observe_calls(Named())  # type: ignore[arg-type]  # the point


class Named:
    """Shows as ``object()``: an exact message to match."""

    def __repr__(self) -> str:
        return "object()"


class PushOnly(Named):
    def push(self, event: events.DispatchEvent) -> None:
        """Takes events, but cannot be closed."""


def foreign_private_reads(source: str) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` or ``cls``, in ``source``."""
    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
    ]


def test_the_finder_finds_a_private_read() -> None:
    source = "dispatcher._hub.attach(sink)\nself._x = 1\nself._dispatcher._hub\n"
    assert sorted(foreign_private_reads(source)) == [
        "dispatcher._hub",
        "self._dispatcher._hub",
    ]


# What a module reads of its own objects (a slot, in the slot's module).
OWN = {"_dispatch/_slot.py": {"slot._acquire", "slot._task"}}


@pytest.mark.parametrize(
    "module",
    [
        "_observe/_otel.py",
        "_observe/_prometheus.py",
        "_dispatch/_open.py",
        "_dispatch/_settings.py",
        "_dispatch/_slot.py",
        "_dispatch/_statistics.py",
    ],
)
def test_metrics_and_the_core_read_no_private_state_of_other_objects(
    module: str,
) -> None:
    source = (PACKAGE / module).read_text(encoding="utf-8")
    assert set(foreign_private_reads(source)) <= OWN.get(module, set())


async def test_the_plumbing_members_on_dispatcher_are_deprecated_aliases(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Sink()
    observer = Observer()
    script = FakeScript(replies=(FakeReply(text="hi"),))
    provider = ScriptedProvider(script, id="p")
    ran: list[str] = []

    async def task(name: str) -> None:
        ran.append(name)

    def moved(name: str) -> str:
        return (
            rf"^Dispatcher\.{name} is deprecated: use"
            rf" trio_dispatch\.lowlevel\.plumbing\(dispatcher\)\.{name}$"
        )

    async with open_dispatcher({"p": 1}) as dispatcher:
        with pytest.warns(DeprecationWarning, match=moved("observe_events")):
            dispatcher.observe_events(sink)
        with pytest.warns(DeprecationWarning, match=moved("observe_calls")):
            dispatcher.observe_calls(observer)
        with pytest.warns(DeprecationWarning, match=moved("start_soon")):
            dispatcher.start_soon(task, "t", name="t")
        with pytest.warns(DeprecationWarning, match=moved("check_known")):
            dispatcher.check_known("p")
        with pytest.warns(DeprecationWarning, match=moved("default_max_tokens")):
            assert dispatcher.default_max_tokens("p") == Budget().default_max_tokens
        with pytest.warns(DeprecationWarning, match=moved("watch_call")):
            watch = dispatcher.watch_call(provider)
        assert watch is not None
        with pytest.warns(DeprecationWarning, match=moved("hold")):
            slot, deadline = await dispatcher.hold("p")
        with pytest.warns(DeprecationWarning, match=moved("hold_deadline")):
            assert dispatcher.hold_deadline(slot) == deadline == math.inf
        slot.release()
        await trio.testing.wait_all_tasks_blocked()
    assert ran == ["t"]
    assert [type(event) for event in sink.events] == [events.Granted, events.Released]
    assert sink.closed == 1


async def test_plumbing_is_given_for_a_dispatcher_only() -> None:
    with pytest.raises(
        TypeError, match=r"^dispatcher must be a Dispatcher, got 'dispatcher'$"
    ):
        plumbing("dispatcher")  # type: ignore[arg-type]  # the misuse tested
    async with open_dispatcher({"p": 1}) as dispatcher:
        assert plumbing(dispatcher) is plumbing(dispatcher)
        assert repr(plumbing(dispatcher)) == "<Plumbing open limits={'p': 1}>"


async def test_the_deprecated_calling_still_works_and_warns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = Sink()
    async with open_dispatcher({"p": 1}) as dispatcher:
        trio_dispatch.lowlevel.plumbing(dispatcher).observe_events(sink)
        async with dispatcher.slot("p") as slot:
            with pytest.warns(
                DeprecationWarning,
                match=r"^Dispatcher\.calling is deprecated and no longer needed: ",
            ):
                call = dispatcher.calling(slot)
            with call:
                assert (call.slot, call.observed, call.reported) == (slot, False, False)
                call.answered()
                call.answered()
        await trio.testing.wait_all_tasks_blocked()
        seen = dispatcher.statistics().providers["p"]
    assert seen.granted_total == seen.released_total == 1
    assert [type(event) for event in sink.events] == [events.Granted, events.Released]
