"""Random schedules through the real actors: nothing leaks, every rule holds.

Hypothesis generates a list of operations; each example replays it in one
trio run in virtual time. Some operations are applied back to back with no
scheduling between them, so grants race cancellations and releases race
limit changes, as they do in production.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_dispatch import DispatcherClosed, open_dispatcher

if TYPE_CHECKING:
    from trio_dispatch import Dispatcher, Slot
    from trio_dispatch.lowlevel import Ticket


class State(enum.Enum):
    STARTING = "starting"
    WAITING = "waiting"
    HOLDING = "holding"
    RELEASED = "released"
    WITHDRAWN = "withdrawn"
    CLOSED = "closed"


@attrs.define(eq=False)
class Agent:
    started_at: float
    slot: Slot
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    done: trio.Event = attrs.Factory(trio.Event)
    state: State = State.STARTING
    bodies: int = 0

    @property
    def ticket(self) -> Ticket | None:
        return self.slot.ticket

    async def run(self) -> None:
        self.state = State.WAITING
        try:
            with self.scope:
                async with self.slot:
                    self.state = State.HOLDING
                    self.bodies += 1
                    await self.done.wait()
        except DispatcherClosed:
            assert self.state is State.WAITING
            self.state = State.CLOSED
            return
        if self.state is State.WAITING:
            assert self.scope.cancelled_caught
            self.state = State.WITHDRAWN
        else:
            self.state = State.RELEASED


# Acquires are drawn as often as everything else together, so queues form
# and the cancellations and limit changes have waiters to act on. Each
# operation reads its argument as it needs (an age, a limit, an index).
OPERATION_NAMES = ["acquire"] * 7 + [
    "release",
    "cancel_waiting",
    "cancel_holding",
    "set_limit",
    "remove_limit",
    "pause",
    "advance",
]
OPERATIONS = st.tuples(st.sampled_from(OPERATION_NAMES), st.integers(0, 60))
STEPS = st.lists(st.tuples(OPERATIONS, st.booleans()), min_size=5, max_size=60)


@attrs.define
class Checker:
    dispatcher: Dispatcher
    agents: list[Agent] = attrs.Factory(list)
    limit: int | None = 2
    # The most slots that may be held at the next check: the highest limit
    # in force since the last one, or the holders then, if more (a lowered
    # limit lets them finish). None: unlimited was in force.
    bound: int | None = 2
    waiting_before: set[Ticket] = attrs.Factory(set)
    granted_before: set[int] = attrs.Factory(set)

    def of(self, state: State) -> list[Agent]:
        return [agent for agent in self.agents if agent.state is state]

    def check(self) -> None:
        """Called when every task is blocked."""
        holding = self.of(State.HOLDING)
        waiting = self.of(State.WAITING)
        assert all(agent.bodies <= 1 for agent in self.agents)
        assert all(agent.bodies == 0 for agent in self.of(State.WITHDRAWN))
        stats = self.dispatcher.statistics().providers.get("p")
        assert stats is not None
        if self.limit is None:
            # Unlimited: listed, every holder still counted, nobody waits.
            assert (stats.limit, stats.waiting) == (None, 0)
            assert stats.in_flight == len(holding)
            assert not waiting
            self.waiting_before = set()
            return
        assert stats.limit == self.limit
        # The scheduler's books match what the tasks themselves see.
        assert stats.in_flight == len(holding)
        assert stats.waiting == len(waiting)
        # 1: never above the limit, but after a lowering, holders finish.
        if self.bound is not None:
            assert stats.in_flight <= self.bound
        self.bound = max(self.limit, stats.in_flight)
        # 2: work-conserving while not paused.
        if not stats.paused and stats.waiting:
            assert stats.in_flight >= self.limit
        # 3: whoever was granted since the last check was older than anyone
        # who was already waiting then and still waits now.
        newly = [
            agent.ticket
            for agent in self.agents
            if agent.bodies and id(agent) not in self.granted_before
        ]
        still = {agent.ticket for agent in waiting} & self.waiting_before
        for granted in newly:
            assert granted is not None
            assert all(granted < ticket for ticket in still if ticket is not None)
        self.granted_before = {id(agent) for agent in self.agents if agent.bodies}
        self.waiting_before = {agent.ticket for agent in waiting if agent.ticket}


def pick(agents: list[Agent], index: int) -> Agent | None:
    return agents[index % len(agents)] if agents else None


async def replay(
    steps: list[tuple[tuple[str, int], bool]], close_with_waiters: bool
) -> None:
    async with trio.open_nursery() as outside:
        async with open_dispatcher({"p": 2}, default_pause=1.0) as dispatcher:
            checker = Checker(dispatcher)
            for (operation, argument), back_to_back in steps:
                if operation == "acquire":
                    started_at = trio.current_time() - argument % 7
                    agent = Agent(
                        started_at, dispatcher.slot("p", started_at=started_at)
                    )
                    checker.agents.append(agent)
                    outside.start_soon(agent.run)
                elif operation == "release":
                    if holder := pick(checker.of(State.HOLDING), argument):
                        holder.done.set()
                elif operation == "cancel_waiting":
                    if waiter := pick(checker.of(State.WAITING), argument):
                        waiter.scope.cancel()
                elif operation == "cancel_holding":
                    if holder := pick(checker.of(State.HOLDING), argument):
                        holder.scope.cancel()
                elif operation == "set_limit":
                    limit = 1 + argument % 4
                    dispatcher.set_limit("p", limit)
                    if checker.bound is not None:
                        checker.bound = max(checker.bound, limit)
                    checker.limit = limit
                elif operation == "remove_limit":
                    dispatcher.remove_limit("p")
                    checker.limit = checker.bound = None
                elif operation == "pause":
                    dispatcher.report_rate_limit("p", retry_after=argument % 4)
                else:
                    await trio.sleep(1 + argument % 3)
                if not back_to_back:
                    await trio.testing.wait_all_tasks_blocked()
                    checker.check()
            await trio.testing.wait_all_tasks_blocked()
            checker.check()
            if not close_with_waiters:
                # Let everyone through: lift any pause, release every holder.
                while checker.of(State.WAITING) or checker.of(State.HOLDING):
                    for holder in checker.of(State.HOLDING):
                        holder.done.set()
                    await trio.sleep(1)
                    await trio.testing.wait_all_tasks_blocked()
                    checker.check()
                stats = dispatcher.statistics().providers.get("p")
                if stats is not None:
                    assert (stats.in_flight, stats.waiting) == (0, 0)
                    assert stats.granted_total == stats.released_total
        # Closed: nobody waits any more, wherever their task lives.
        await trio.testing.wait_all_tasks_blocked()
        assert not checker.of(State.WAITING)
        assert not checker.of(State.STARTING)
        for holder in checker.of(State.HOLDING):
            holder.done.set()
    assert all(
        agent.state in {State.RELEASED, State.WITHDRAWN, State.CLOSED}
        for agent in checker.agents
    )
    if not close_with_waiters:
        assert not [agent for agent in checker.agents if agent.state is State.CLOSED]


@settings(deadline=None)
@given(steps=STEPS, close_with_waiters=st.booleans())
def test_random_schedules_keep_every_invariant(
    steps: list[tuple[tuple[str, int], bool]], close_with_waiters: bool
) -> None:
    trio.run(
        replay,
        steps,
        close_with_waiters,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
