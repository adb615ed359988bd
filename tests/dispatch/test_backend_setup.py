"""A third backend that does not wrap the local scheduler honours every option.

``PolicyBackend`` below is written with ``trio_dispatch.lowlevel`` names
alone, on ``SlotPolicy`` and no inbox: each message is handled at once in
the sender's task, and its task only watches the clock for the policy (a pause's
end, a budget's refill). Opened with ``open_dispatcher_with``, it is made
from the ``BackendSetup`` the dispatcher hands it, so ``max_waiting``, the
budgets (the provider's and its models'), the tenants, the pauses,
``learn_budgets`` and the events reach it with no wiring of its own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, final

import pytest
import trio
import trio.testing

from trio_dispatch import (
    Budget,
    DispatcherClosed,
    ProviderStatistics,
    QueueFull,
    Quota,
    RateLimitInfo,
    Tenant,
    events,
)
from trio_dispatch.lowlevel import (
    Acquire,
    Adapt,
    Answered,
    Backend,
    BackendSetup,
    Cancel,
    ObserveLatency,
    ObserveRateLimits,
    ObserveServerLoad,
    Pause,
    Release,
    ReportUsage,
    Resume,
    SchedulerActor,
    SetLimit,
    SetModelBudget,
    SetTenant,
    Ticket,
    open_dispatcher_with,
    policy_statistics,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trio_dispatch import BudgetStatistics, Dispatcher
    from trio_dispatch.lowlevel import Reply, SchedulerMessage


@final
class PolicyBackend:
    """One provider's scheduler on ``setup.policy()``, handled in the caller's task."""

    def __init__(self, setup: BackendSetup) -> None:
        self.setup = setup
        self.policy = setup.policy()
        self.events = setup.events
        self.replies: dict[Ticket, Reply] = {}
        self.seq = 0
        self.closed = False
        self.changed = trio.Event()

    @property
    def provider(self) -> str:
        return self.setup.provider

    def now(self) -> float:
        now = self.setup.clock()
        self.policy.advance(now)
        return now

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        self.seq += 1
        return Ticket(rank, self.seq, priority, tenant, model)

    def deliver(self, grants: Sequence[Ticket], now: float) -> None:
        for ticket in grants:
            self.replies.pop(ticket).granted(ticket, now)
        if grants and self.events.listening:
            policy = self.policy
            self.events.granted(grants, now, policy.in_flight, policy.waiting)
        # The task looks at the policy's wake_at again.
        self.changed.set()

    def send(self, message: SchedulerMessage) -> None:
        self.check_open()
        now = self.now()
        policy = self.policy
        match message:
            case Acquire(ticket, reply, conversation_id, tokens):
                self.acquire(ticket, reply, conversation_id, tokens, now)
            case Release(ticket):
                self.leave(ticket, now, cancel=False)
            case Cancel(ticket):
                self.leave(ticket, now, cancel=True)
            case Answered(ticket):
                policy.answered(ticket)
            case ObserveLatency(ticket, first, between, duration, prompt):
                self.deliver(
                    policy.observe_latency(ticket, first, between, duration, prompt),
                    now,
                )
            case ObserveServerLoad(load):
                self.deliver(policy.observe_server_load(load), now)
            case ReportUsage(ticket, tokens):
                self.deliver(policy.report_usage(ticket, tokens), now)
            case SetLimit(limit) | Adapt(limit):
                previous = policy.limit
                grants = policy.set_limit(limit)
                self.events.limit_changed(previous, policy.limit, now)
                self.deliver(grants, now)
            case Pause(reported_at, retry_after):
                policy.report_rate_limit(reported_at, retry_after)
                self.events.paused(now, policy.paused_until, retry_after)
                self.changed.set()
            case Resume():
                self.events.resumed(now, "resumed")
                self.deliver(policy.resume(), now)
            case SetTenant(tenant, settings):
                self.deliver(policy.set_tenant(tenant, settings), now)
            case SetModelBudget(model, budget):
                self.deliver(policy.set_model_budget(model, budget), now)
            case ObserveRateLimits(observed_at, info, model):
                self.deliver(policy.observe_rate_limits(observed_at, info, model), now)

    def acquire(
        self,
        ticket: Ticket,
        reply: Reply,
        conversation_id: str | None,
        tokens: int,
        now: float,
    ) -> None:
        policy = self.policy
        try:
            grants = policy.acquire(ticket, tokens)
        except QueueFull as exc:
            reply.refused(exc)
            self.events.refused(
                ticket, conversation_id, now, exc, policy.in_flight, policy.waiting
            )
            return
        self.replies[ticket] = reply
        if self.events.listening:
            self.events.queued(
                ticket, conversation_id, now, policy.in_flight, policy.waiting
            )
        self.deliver(grants, now)

    def leave(self, ticket: Ticket, now: float, *, cancel: bool) -> None:
        policy = self.policy
        before = (policy.in_flight, policy.waiting)
        self.replies.pop(ticket, None) if cancel else None
        grants = policy.cancel(ticket) if cancel else policy.release(ticket)
        if self.events.listening:
            self.events.left(
                ticket, now, before, policy.in_flight, policy.waiting, len(grants)
            )
        self.deliver(grants, now)

    def tick(self) -> None:
        now = self.now()
        paused = self.policy.paused_until is not None
        grants = self.policy.tick(now)
        if paused and self.policy.paused_until is None:
            self.events.resumed(now, "expired")
        if grants:
            self.deliver(grants, now)

    def statistics(self) -> ProviderStatistics:
        self.tick()
        return policy_statistics(self.provider, self.policy, self.setup.clock())

    def check_open(self) -> None:
        if self.closed:
            raise trio.ClosedResourceError

    def close(self) -> None:
        self.closed = True
        self.changed.set()

    async def run(self, *, stop_when_idle: bool = False) -> bool:
        try:
            while not self.closed:
                policy = self.policy
                if (
                    stop_when_idle
                    and policy.limit is None
                    and not policy.in_flight
                    and not policy.waiting
                ):
                    return True
                wake_at = policy.wake_at
                with trio.move_on_at(math.inf if wake_at is None else wake_at):
                    await self.changed.wait()
                self.changed = trio.Event()
                self.tick()
            return False
        finally:
            if not stop_when_idle or self.closed:
                replies, self.replies = self.replies, {}
                for reply in replies.values():
                    reply.refused(DispatcherClosed("the dispatcher closed"))


class Made:
    """The factory: one ``PolicyBackend`` per provider, kept by name."""

    def __init__(self) -> None:
        self.backends: dict[str, PolicyBackend] = {}

    def __call__(self, setup: BackendSetup) -> Backend:
        backend = self.backends[setup.provider] = PolicyBackend(setup)
        return backend


async def hold(
    dispatcher: Dispatcher, provider: str, tenant: str | None = None
) -> None:
    async with dispatcher.slot(provider, tenant=tenant):
        await trio.sleep_forever()


async def test_max_waiting_refuses_the_one_more_with_queue_full(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher_with(Made(), {"p": 1}, max_waiting=1) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(hold, dispatcher, "p")
        nursery.start_soon(hold, dispatcher, "p")
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(
            QueueFull, match=r"^1 request already waits for 'p' \(max_waiting=1\)$"
        ):
            async with dispatcher.slot("p"):
                pytest.fail("refused")  # pragma: no cover
        stats = dispatcher.statistics().providers["p"]
        assert (stats.in_flight, stats.waiting, stats.rejected_total) == (1, 1, 1)
        nursery.cancel_scope.cancel()


async def test_a_budget_shows_in_statistics_and_paces_the_grants(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[float] = []

    async def call() -> None:
        async with dispatcher.slot("p"):
            granted.append(trio.current_time())

    async with open_dispatcher_with(
        Made(), {"p": 5}, budgets={"p": Budget(requests_per_minute=2)}
    ) as dispatcher:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(call)
        budget = dispatcher.statistics().providers["p"].budget
    assert granted == [0.0, 0.0, 30.0, 60.0]
    assert budget is not None
    assert (budget.requests_per_minute, budget.learned) == (2, False)


async def test_a_model_budget_paces_that_model_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    granted: list[tuple[str, float]] = []

    async def call(model: str) -> None:
        async with dispatcher.slot("p", model=model):
            granted.append((model, trio.current_time()))

    async with open_dispatcher_with(
        Made(), {"p": 5}, budgets={"p/slow": Budget(requests_per_minute=1)}
    ) as dispatcher:
        async with trio.open_nursery() as nursery:
            for model in ("slow", "slow", "fast", "fast"):
                nursery.start_soon(call, model)
                await trio.testing.wait_all_tasks_blocked()
        models = dispatcher.statistics().providers["p"].models
    assert granted == [("slow", 0.0), ("fast", 0.0), ("fast", 0.0), ("slow", 60.0)]
    assert models["slow"].requests_per_minute == 1


async def test_a_tenant_cap_holds_and_the_tenants_show(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher_with(
            Made(), {"p": 3}, tenants={"acme": Tenant(limit=1, weight=2.0)}
        ) as dispatcher,
        trio.open_nursery() as nursery,
    ):
        for tenant in ("acme", "acme", "beta"):
            nursery.start_soon(hold, dispatcher, "p", tenant)
            await trio.testing.wait_all_tasks_blocked()
        tenants = dispatcher.statistics().providers["p"].tenants
        nursery.cancel_scope.cancel()
    acme = tenants["acme"]
    assert (acme.weight, acme.limit, acme.in_flight, acme.waiting) == (2.0, 1, 1, 1)
    assert (tenants["beta"].in_flight, tenants["beta"].waiting) == (1, 0)


async def test_the_pause_settings_back_off_from_default_pause_to_max_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_dispatcher_with(
        Made(), {"p": 1}, default_pause=2.0, max_pause=3.0
    ) as dispatcher:
        pauses = []
        for _ in range(3):
            # No grant since the report inside the slot: the same round.
            dispatcher.report_rate_limit("p")
            pauses.append(dispatcher.statistics().providers["p"].paused_until)
            async with dispatcher.slot("p"):
                # Granted once the pause ends; a new round, whose pause
                # doubles from default_pause (2 s) up to max_pause (3 s).
                dispatcher.report_rate_limit("p")
        assert pauses == [2.0, 5.0, 8.0]


async def test_learn_budgets_says_whether_the_figures_pace_the_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=60, remaining=10))
    budgets: dict[bool, BudgetStatistics | None] = {}
    for learn in (True, False):
        async with open_dispatcher_with(
            Made(), {"p": 1}, learn_budgets=learn
        ) as dispatcher:
            dispatcher.observe_rate_limits("p", figures)
            budgets[learn] = dispatcher.statistics().providers["p"].budget
    learned = budgets[True]
    assert learned is not None
    assert (learned.requests_per_minute, learned.learned) == (60, True)
    assert budgets[False] is None


async def test_events_reach_a_subscriber(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        open_dispatcher_with(Made(), {"p": 1}) as dispatcher,
        dispatcher.events() as seen,
        dispatcher.slot("p", conversation_id="a"),
    ):
        await trio.sleep(1)
    kinds = [type(event) async for event in seen]
    assert kinds == [events.Queued, events.Granted, events.Released]


async def test_the_setup_holds_what_the_dispatcher_knows_of_the_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    made = Made()
    async with open_dispatcher_with(
        made,
        {"p": 2},
        budgets={
            "p": Budget(tokens_per_minute=1000),
            "p/m": Budget(requests_per_minute=5),
        },
        tenants={"acme": Tenant(weight=3.0)},
        max_waiting=7,
        default_pause=0.5,
        max_pause=9.0,
        learn_budgets=False,
        priority_aging=30.0,
        unknown_providers="allow",
    ) as dispatcher:
        dispatcher.set_tenant("beta", Tenant(limit=2))
        dispatcher.set_limit("q", 4)
        await trio.sleep(5)
        async with dispatcher.slot("r"):
            pass
    p, q, r = (made.backends[name].setup for name in ("p", "q", "r"))
    assert (p.provider, p.limit, p.budget, dict(p.model_budgets)) == (
        "p",
        None,  # made by the limit's own set_limit, which tells it next
        Budget(tokens_per_minute=1000),
        {"m": Budget(requests_per_minute=5)},
    )
    assert (p.max_waiting, p.default_pause, p.max_pause) == (7, 0.5, 9.0)
    assert (p.learn_budgets, p.priority_aging) == (False, 30.0)
    assert (dict(p.tenants), dict(q.tenants)) == (
        {"acme": Tenant(weight=3.0)},
        {"acme": Tenant(weight=3.0), "beta": Tenant(limit=2)},
    )
    assert (q.budget, dict(q.model_budgets)) == (None, {})
    assert (p.events.provider, r.events.provider) == ("p", "r")
    assert r.clock() == trio.current_time() == 5.0


async def test_the_local_backend_is_made_from_the_setup_as_a_third_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The reproduction, on the local actor made as the dispatcher
    # makes its own: max_waiting, the budget and the events all reach it.
    async with (
        open_dispatcher_with(
            SchedulerActor.from_setup,
            {"p": 1},
            max_waiting=1,
            budgets={"p": Budget(requests_per_minute=60)},
        ) as dispatcher,
        dispatcher.events() as seen,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(hold, dispatcher, "p")
        nursery.start_soon(hold, dispatcher, "p")
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(QueueFull):
            async with dispatcher.slot("p"):
                pytest.fail("refused")  # pragma: no cover
        stats = dispatcher.statistics().providers["p"]
        nursery.cancel_scope.cancel()
    assert stats.budget is not None
    assert stats.budget.requests_per_minute == 60
    assert events.Queued in [type(event) async for event in seen]
