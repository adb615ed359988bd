"""Per-model budgets: in ``SlotPolicy``, through the dispatcher, and against quotas.

In the policy core: a model's throttle (configured, or learned from the
figures of that model's answers) is asked beside the provider's, for that
model's tickets only: a model it holds back blocks only itself, the other
models' tickets still go, nobody of the model passes its held-back head,
and ``wake_at`` is the first instant any held-back model (or the provider)
is ready.

Through the real dispatcher, its transport and providers: two models sent
through one ``dispatcher.transport("openai")`` (one client, one provider)
to the fake LLM server, served in the test's own trio run
(``httpx2.ASGITransport``), in virtual time: a model's budget
(``"provider/model"``, a key checked where it is given) holds back that
model's calls and no other's, and what an answer of a model says of its
limits teaches that model's budget.

Against the fake server's quotas per model, through the ``openai`` SDK on
one client over sockets: the fleet of two models whose bar is stated in its
section below.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import TYPE_CHECKING, Any, final

import httpx2
import openai
import pytest
import trio
import trio.testing

from trio_dispatch import (
    Budget,
    Dispatcher,
    QueueFull,
    Quota,
    RateLimitInfo,
    Tenant,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch._integrations._hooks import takes_model
from trio_dispatch._policy._budgets import FORGET_AFTER
from trio_dispatch.lowlevel import Plumbing, SlotPolicy, Throttle, Ticket, plumbing
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.providers import OpenAIProvider
from trio_dispatch.testing import (
    FakeLLMServer,
    FakeQuotas,
    FakeReply,
    FakeScript,
    StreamingASGITransport,
)

if TYPE_CHECKING:
    from trio_dispatch.testing import FakeRequest


# -- in the policy core ------------------------------------------------------------

ONE_PER_MINUTE = Budget(requests_per_minute=1)


def wake_at(policy: SlotPolicy) -> float | None:
    """The policy's ``wake_at``, read afresh (not narrowed by an earlier assert)."""
    return policy.wake_at


class Tickets:
    """Fresh tickets in arrival order."""

    def __init__(self) -> None:
        self.seq = itertools.count()

    def __call__(
        self, rank: float, model: str | None = None, tenant: str | None = None
    ) -> Ticket:
        return Ticket(float(rank), next(self.seq), 0, tenant, model)


def test_a_held_back_model_does_not_block_another() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    slow0, slow1, fast2, none3 = t(0, "slow"), t(1, "slow"), t(2, "fast"), t(3)
    assert policy.acquire(slow0) == [slow0]
    assert policy.acquire(slow1) == []  # its minute's request is spent
    assert policy.acquire(fast2) == [fast2]  # younger, of another model
    assert policy.acquire(none3) == [none3]  # and of none
    assert wake_at(policy) == 60.0
    stats = policy.model_budget_statistics()
    assert set(stats) == {"slow"}
    assert stats["slow"].waiting_for_budget
    assert policy.budget_statistics() is None  # the provider has none
    assert policy.tick(59.0) == []
    assert policy.tick(60.0) == [slow1]
    assert wake_at(policy) is None


def test_within_a_model_nobody_passes_its_held_back_head() -> None:
    # 100 tokens a minute: the head needs 80 of the 20 left, 36 s away;
    # a younger request of 10 tokens fits, but waits behind it.
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    big0, big1, small2 = t(0, "m"), t(1, "m"), t(2, "m")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    assert policy.acquire(small2, 10) == []
    assert wake_at(policy) == 36.0
    assert policy.tick(36.0) == [big1]
    # 10 tokens are missing for small2 now: 6 s.
    assert wake_at(policy) == 42.0
    assert policy.tick(42.0) == [small2]


def test_an_older_ticket_of_the_model_may_become_its_head() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    policy.acquire(t(0, "m"), 80)
    young = t(9, "m")
    assert policy.acquire(young, 80) == []
    old = t(1, "m")  # an older turn's retry: the new head, and it fits
    assert policy.acquire(old, 10) == [old]
    assert policy.waiters() == [young]


def test_the_provider_budget_still_blocks_every_model() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4,
        throttle=Throttle(ONE_PER_MINUTE),
        models={"fast": Throttle(Budget(requests_per_minute=600))},
    )
    policy.advance(0.0)
    first, fast1, none2 = t(0, "fast"), t(1, "fast"), t(2)
    assert policy.acquire(first) == [first]
    assert policy.acquire(fast1) == []
    assert policy.acquire(none2) == []  # nobody passes the provider's head
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [fast1]
    assert wake_at(policy) == 120.0
    stats = policy.model_budget_statistics()
    assert stats["fast"].requests_available == 599.0  # full again at 60, less 1


def test_wake_at_is_the_first_held_back_model_ready() -> None:
    t = Tickets()
    policy = SlotPolicy(
        5,
        models={
            "a": Throttle(Budget(requests_per_minute=1)),
            "b": Throttle(Budget(requests_per_minute=2)),
        },
    )
    policy.advance(0.0)
    a0, b1, b2, a3, b4 = t(0, "a"), t(1, "b"), t(2, "b"), t(3, "a"), t(4, "b")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(b1) == [b1]
    assert policy.acquire(b2) == [b2]
    assert policy.acquire(a3) == []
    assert policy.acquire(b4) == []
    # b refills 1 request in 30 s, a in 60 s.
    assert wake_at(policy) == 30.0
    assert policy.tick(30.0) == [b4]
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [a3]
    assert wake_at(policy) is None


def test_no_wake_up_for_a_model_while_no_slot_is_free() -> None:
    t = Tickets()
    policy = SlotPolicy(2, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    slow0, slow1, fast2 = t(0, "slow"), t(1, "slow"), t(2, "fast")
    policy.acquire(slow0)
    policy.acquire(slow1)
    assert wake_at(policy) == 60.0
    assert policy.acquire(fast2) == [fast2]
    # Both slots are held: a release looks again, no timer needed.
    assert wake_at(policy) is None
    policy.advance(61.0)
    assert policy.release(fast2) == [slow1]


def test_figures_for_a_model_teach_that_model_only() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
    assert policy.observe_rate_limits(0.0, info, model="m") == []
    assert policy.budget_statistics() is None
    stats = policy.model_budget_statistics()
    assert set(stats) == {"m"}
    assert stats["m"].learned
    assert stats["m"].requests_per_minute == 60.0
    m0, other1 = t(0, "m"), t(1, "other")
    assert policy.acquire(m0) == []  # none left: 1 s to the next
    assert policy.acquire(other1) == [other1]
    assert wake_at(policy) == 1.0
    assert policy.tick(1.0) == [m0]


def test_figures_without_a_model_teach_the_provider() -> None:
    policy = SlotPolicy(4)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=60.0))
    policy.observe_rate_limits(0.0, info)
    assert policy.model_budget_statistics() == {}
    stats = policy.budget_statistics()
    assert stats is not None
    assert stats.requests_available == 10.0


def test_a_budget_set_at_run_time_applies_to_the_waiting() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    info = RateLimitInfo(requests=Quota(limit=60, remaining=0, reset=60.0))
    policy.observe_rate_limits(0.0, info, model="m")
    m0 = t(0, "m")
    assert policy.acquire(m0) == []
    # A configured budget replaces the learned one; it starts full.
    assert policy.set_model_budget("m", Budget(requests_per_minute=5)) == [m0]
    stats = policy.model_budget_statistics()["m"]
    assert (stats.requests_per_minute, stats.requests_available) == (5.0, 4.0)
    # A new model's budget too.
    assert policy.set_model_budget("n", ONE_PER_MINUTE) == []
    n1, n2 = t(1, "n"), t(2, "n")
    assert policy.acquire(n1) == [n1]
    assert policy.acquire(n2) == []


def test_usage_given_back_lets_the_model_head_through() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"m": Throttle(Budget(tokens_per_minute=100))})
    policy.advance(0.0)
    big0, big1 = t(0, "m"), t(1, "m")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    # big0 used only 10 of its 80: 70 come back, and big1 fits.
    assert policy.report_usage(big0, 10) == [big1]


def test_models_and_tenants_together() -> None:
    # b has the least counter, but its head is of the held-back model: a's
    # ticket takes the slot; b's younger ticket, of another model, goes
    # before a's next.
    t = Tickets()
    policy = SlotPolicy(2, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    a0, spent = t(0, "fast", "a"), t(1, "slow", "c")
    assert policy.acquire(a0) == [a0]
    assert policy.acquire(spent) == [spent]
    policy.advance(1.0)
    b2 = t(2, "slow", "b")
    assert policy.acquire(b2) == []
    policy.advance(3.0)
    a4 = t(4, "fast", "a")
    assert policy.acquire(a4) == []
    stats = policy.tenant_statistics()
    assert (stats["a"].service, stats["b"].service) == (3.0, 0.0)
    policy.advance(4.0)
    assert policy.release(spent) == [a4]
    b5 = t(5, "fast", "b")
    assert policy.acquire(b5) == []
    assert wake_at(policy) is None  # no slot free: a release looks again
    policy.advance(5.0)
    assert policy.release(a0) == [b5]
    assert policy.waiters() == [b2]
    policy.advance(6.0)
    assert policy.release(a4) == []
    assert wake_at(policy) == 60.0
    assert policy.tick(60.0) == [b2]


def test_an_answer_for_a_model_makes_its_next_figures_the_newest() -> None:
    # The figures of the answer of a request granted after the latest
    # figures may raise the learned level (see _budgets), for a model too.
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    first = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=60.0))
    policy.observe_rate_limits(0.0, first, model="m")
    m0 = t(0, "m")
    assert policy.acquire(m0) == [m0]
    policy.answered(m0)
    later = RateLimitInfo(requests=Quota(limit=60, remaining=50, reset=60.0))
    policy.observe_rate_limits(0.0, later, model="m")
    assert policy.model_budget_statistics()["m"].requests_available == 50.0


def test_queue_full_refuses_a_newcomer_held_back_by_a_budget() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4,
        max_waiting=1,
        throttle=Throttle(Budget(tokens_per_minute=100)),
        models={"slow": Throttle(ONE_PER_MINUTE)},
        tenants={"a": Tenant()},
    )
    policy.advance(0.0)
    slow0, slow1 = t(0, "slow"), t(1, "slow")
    assert policy.acquire(slow0, 1) == [slow0]
    assert policy.acquire(slow1) == []
    # The queue is full: a newcomer of the held-back model is refused...
    with pytest.raises(QueueFull):
        policy.acquire(t(2, "slow"))
    # ...and so is one the provider's tokens do not hold (99 left).
    with pytest.raises(QueueFull):
        policy.acquire(t(3, "fast"), 100)
    # One that may go, goes.
    fast4 = t(4, "fast")
    assert policy.acquire(fast4, 50) == [fast4]
    assert policy.statistics().rejected_total == 2


def test_withdrawing_the_head_the_provider_holds_back_lets_the_next_go() -> None:
    t = Tickets()
    policy = SlotPolicy(
        4, throttle=Throttle(Budget(tokens_per_minute=100)), tenants={"a": Tenant()}
    )
    policy.advance(0.0)
    big0, big1, small2 = t(0, "m", "a"), t(1, "m", "a"), t(2, "m", "a")
    assert policy.acquire(big0, 80) == [big0]
    assert policy.acquire(big1, 80) == []
    assert policy.acquire(small2, 10) == []  # nobody passes the held-back head
    assert wake_at(policy) == 36.0
    assert policy.cancel(big1) == [small2]
    assert wake_at(policy) is None


def test_a_pause_outlasts_a_held_back_model() -> None:
    t = Tickets()
    policy = SlotPolicy(4, models={"slow": Throttle(ONE_PER_MINUTE)})
    policy.advance(0.0)
    policy.acquire(t(0, "slow"))
    policy.acquire(t(1, "slow"))
    assert wake_at(policy) == 60.0
    policy.pause(90.0)
    assert wake_at(policy) == 90.0
    assert policy.tick(60.0) == []
    assert wake_at(policy) == 90.0


def test_model_throttles_are_checked_by_the_constructor() -> None:
    with pytest.raises(TypeError, match=r"^throttle of 'm' must be a Throttle, got 5$"):
        SlotPolicy(1, models={"m": 5})  # type: ignore[dict-item]  # on purpose
    with pytest.raises(ValueError, match=r"^model must be a non-empty string, got ''$"):
        SlotPolicy(1, models={"": Throttle()})


# Learned budgets are forgotten once their model is idle and they are full.


def per_minute(limit: int, remaining: int, reset: float | None = None) -> RateLimitInfo:
    """Request figures: ``limit`` a minute, ``remaining`` left."""
    return RateLimitInfo(requests=Quota(limit=limit, remaining=remaining, reset=reset))


def test_a_learned_model_budget_is_forgotten_once_idle_for_a_while_and_full() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    # Half of 10 a minute left: full again 30 s later, at 30.
    policy.observe_rate_limits(0.0, per_minute(10, 5), "m")
    ticket = t(0, "m")
    assert policy.acquire(ticket) == [ticket]
    policy.advance(1.0)
    policy.release(ticket)
    assert FORGET_AFTER == 60.0
    policy.advance(60.75)  # idle since 1: not for long enough yet
    assert set(policy.model_budget_statistics()) == {"m"}
    assert policy.throttled
    assert policy.model_budget_statistics(61.0) == {}  # as it would be then
    policy.advance(61.0)
    assert policy.model_budget_statistics() == {}
    assert not policy.throttled  # no throttle left, of a model or the provider


def test_a_learned_model_budget_is_kept_until_its_buckets_are_full_again() -> None:
    policy = SlotPolicy(4)
    policy.advance(0.0)
    # 600 a minute, none left, the whole back in an hour: 1 every 6 s.
    policy.observe_rate_limits(0.0, per_minute(600, 0, reset=3600.0), "m")
    policy.advance(3599.0)
    [stats] = policy.model_budget_statistics().values()
    assert stats.requests_available == pytest.approx(3599 / 6)
    policy.advance(3600.0)
    assert policy.model_budget_statistics() == {}


def test_a_configured_model_budget_is_never_forgotten() -> None:
    policy = SlotPolicy(4, models={"c": Throttle(Budget(requests_per_minute=10))})
    policy.set_model_budget("d", Budget(tokens_per_minute=100))
    policy.observe_rate_limits(0.0, per_minute(10, 5), "c")
    policy.observe_rate_limits(0.0, per_minute(10, 5), "d")
    # Learned first, configured later: kept too.
    policy.observe_rate_limits(0.0, per_minute(10, 5), "e")
    policy.set_model_budget("e", Budget(requests_per_minute=20))
    for hour in range(1, 11):
        policy.advance(3600.0 * hour)
    assert set(policy.model_budget_statistics()) == {"c", "d", "e"}


def test_a_model_with_waiters_or_holders_is_never_forgotten() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(10, 10), "held")
    policy.observe_rate_limits(0.0, per_minute(10, 10), "waits")
    held = t(0, "held")
    assert policy.acquire(held) == [held]  # holds the only slot for hours
    waiter = t(1, "waits")
    assert policy.acquire(waiter) == []
    policy.advance(7200.0)
    assert set(policy.model_budget_statistics()) == {"waits", "held"}
    assert policy.release(held) == [waiter]
    policy.advance(14400.0)  # "held" idle since 7200, "waits" holds
    assert set(policy.model_budget_statistics()) == {"waits"}
    assert policy.release(waiter) == []
    policy.advance(14459.75)
    assert set(policy.model_budget_statistics()) == {"waits"}
    policy.advance(14460.0)
    assert policy.model_budget_statistics() == {}


def test_a_waiter_withdrawn_leaves_its_model_idle_from_then() -> None:
    t = Tickets()
    policy = SlotPolicy(1)
    policy.advance(0.0)
    other = t(0)
    assert policy.acquire(other) == [other]
    policy.observe_rate_limits(0.0, per_minute(10, 10), "m")
    waiter = t(1, "m")
    assert policy.acquire(waiter) == []
    policy.advance(100.0)
    assert policy.cancel(waiter) == []
    policy.advance(159.75)
    assert set(policy.model_budget_statistics()) == {"m"}
    policy.advance(160.0)
    assert policy.model_budget_statistics() == {}


def test_a_forgotten_model_that_reports_again_is_learned_afresh() -> None:
    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(10, 0), "m")  # 60 s to full
    policy.advance(60.0)
    assert policy.model_budget_statistics() == {}
    ticket = t(1, "m")
    assert policy.acquire(ticket) == [ticket]  # no budget left to ask
    policy.observe_rate_limits(60.0, per_minute(20, 15), "m")
    [stats] = policy.model_budget_statistics().values()
    assert (stats.requests_per_minute, stats.requests_available) == (20.0, 15.0)
    assert stats.learned


def test_figures_for_an_idle_model_move_when_it_is_forgotten() -> None:
    policy = SlotPolicy(4)
    policy.advance(0.0)
    policy.observe_rate_limits(0.0, per_minute(60, 60), "m")  # full
    policy.observe_rate_limits(30.0, per_minute(60, 0), "m")  # empty: full at 90
    policy.advance(89.75)
    assert set(policy.model_budget_statistics()) == {"m"}
    policy.advance(90.0)
    assert policy.model_budget_statistics() == {}


def test_a_grant_looks_only_at_the_throttles_of_the_models_it_meets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3,000 models seen once, idle: a grant for another costs what it did."""
    touched: list[set[int]] = [set()]

    def counting(name: str) -> None:
        method = getattr(Throttle, name)

        def counted(self: Throttle, *args: object, **kwargs: object) -> object:
            touched[-1].add(id(self))
            return method(self, *args, **kwargs)

        monkeypatch.setattr(Throttle, name, counted)

    t = Tickets()
    policy = SlotPolicy(4)
    policy.advance(0.0)
    for k in range(3000):
        ticket = t(k, f"ft-{k}")
        assert policy.acquire(ticket) == [ticket]
        policy.observe_rate_limits(0.0, per_minute(100, 99), f"ft-{k}")
        policy.release(ticket)
    policy.observe_rate_limits(0.0, per_minute(10**6, 10**6), "other")
    for name in [n for n in vars(Throttle) if not n.startswith("_")]:
        if callable(getattr(Throttle, name)):
            counting(name)
    now = 1.0
    for k in range(200):
        # One batch of the actor: the time, then what arrived.
        touched.append(set())
        policy.advance(now)
        ticket = t(3000 + k, "other")
        assert policy.acquire(ticket) == [ticket]
        now += 0.25
        policy.advance(now)
        assert policy.release(ticket) == []
    assert max(len(ids) for ids in touched[1:]) == 1


# -- through the dispatcher, its transport and providers ---------------------------


@pytest.mark.parametrize(
    ("key", "error", "message"),
    [
        (
            "openai/",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got 'openai/'$",
        ),
        (
            "/x",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got '/x'$",
        ),
        (
            "/",
            ValueError,
            r"^budget key must be 'provider' or 'provider/model', both parts"
            r" non-empty, got '/'$",
        ),
        ("", ValueError, r"^provider must be a non-empty string, got ''$"),
        (7, TypeError, r"^provider must be a non-empty string, got 7$"),
    ],
)
def test_open_dispatcher_refuses_a_bad_budget_key(
    key: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        open_dispatcher(budgets={key: Budget(requests_per_minute=60)})  # type: ignore[dict-item]  # the point


def test_a_model_budget_must_be_a_budget() -> None:
    with pytest.raises(
        TypeError, match=r"^budget for 'openai/gpt-4o' must be a Budget, got 60$"
    ):
        open_dispatcher(budgets={"openai/gpt-4o": 60})  # type: ignore[dict-item]  # the point


async def test_a_model_key_splits_at_its_first_slash() -> None:
    budgets = {
        "openai": Budget(requests_per_minute=100),
        "openai/gpt-4o": Budget(requests_per_minute=10, default_max_tokens=64),
        "vllm/org/llama": Budget(tokens_per_minute=1000, default_max_tokens=32),
    }
    async with open_dispatcher(budgets=budgets) as dispatcher:
        # Each model's own budget answers for it; the provider's for the rest.
        assert plumbing(dispatcher).default_max_tokens("openai", "gpt-4o") == 64
        assert plumbing(dispatcher).default_max_tokens("openai", "gpt-4o-mini") == (
            budgets["openai"].default_max_tokens
        )
        assert plumbing(dispatcher).default_max_tokens("vllm", "org/llama") == 32
        assert plumbing(dispatcher).default_max_tokens("vllm", "org") == (
            Budget(requests_per_minute=1).default_max_tokens
        )


URL = "http://fake.test/v1/chat/completions"


def body(model: str | None, **fields: Any) -> bytes:  # noqa: ANN401 (JSON values)
    """A streamed chat completions body asking ``model`` (none if ``None``)."""
    named = {} if model is None else {"model": model}
    return json.dumps(
        {
            **named,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            **fields,
        }
    ).encode()


async def call(client: httpx2.AsyncClient, model: str | None) -> int:
    """One model call, read to its end: its status."""
    async with client.stream("POST", URL, content=body(model)) as response:
        await response.aread()
        return response.status_code


def asgi(server: FakeLLMServer) -> httpx2.ASGITransport:
    """The fake server, served in this trio run: no sockets, virtual time."""
    return httpx2.ASGITransport(app=server)  # type: ignore[arg-type]  # an ASGI app; its annotations are narrower than httpx2's


def client_of(dispatcher: Dispatcher, server: FakeLLMServer) -> httpx2.AsyncClient:
    """An SDK's client: its model calls hold slots of ``"openai"``."""
    inner = asgi(server)
    return httpx2.AsyncClient(
        transport=dispatcher.transport("openai", inner=inner),
        headers={"authorization": "Bearer sk-test"},
    )


async def test_a_model_held_back_by_its_budget_holds_back_no_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(default=FakeReply(latency=1.0)))
    done: dict[str, list[float]] = {"slow": [], "fast": []}
    async with (
        open_dispatcher(
            {"openai": 4},
            # 6 requests a minute for the slow model: 6 at once, then one
            # every 10 s; the fast model has no budget of its own.
            budgets={"openai/slow": Budget(requests_per_minute=6)},
        ) as dispatcher,
        client_of(dispatcher, server) as client,
    ):

        async def ask(model: str) -> None:
            assert await call(client, model) == 200
            done[model].append(trio.current_time())

        async with trio.open_nursery() as nursery:
            # Eight slow calls first: the oldest wait for the slow budget.
            for _ in range(8):
                nursery.start_soon(ask, "slow")
                await trio.testing.wait_all_tasks_blocked()
            for _ in range(8):
                nursery.start_soon(ask, "fast")
                await trio.testing.wait_all_tasks_blocked()
        stats = dispatcher.statistics().providers["openai"]
    # The slow model: 4 slots at t=0 (the limit), 2 more at t=1 (its
    # bucket's last 2), then one per 10 s as its budget refills.
    assert done["slow"] == pytest.approx([1.0] * 4 + [2.0] * 2 + [11.0, 21.0])
    # The fast model is never held to the slow one's pace: it takes every
    # slot the slow model's budget leaves free, from t=1 on.
    assert done["fast"] == [2.0] * 2 + [3.0] * 4 + [4.0] * 2
    assert stats.granted_total == 16
    assert set(stats.models) == {"slow"}
    assert stats.budget is None


async def test_a_model_s_figures_teach_that_model_s_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=60, remaining=10, reset=50.0))
    async with open_dispatcher({"openai": 2}) as dispatcher:
        dispatcher.observe_rate_limits("openai", figures, model="gpt-4o")
        stats = dispatcher.statistics().providers["openai"]
        assert stats.budget is None
        assert set(stats.models) == {"gpt-4o"}
        # Figures of no model teach the provider's own budget.
        dispatcher.observe_rate_limits("openai", figures)
        stats = dispatcher.statistics().providers["openai"]
        assert stats.budget is not None
        assert set(stats.models) == {"gpt-4o"}


async def test_a_transport_call_takes_its_body_s_model(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = FakeLLMServer(FakeScript())
    slots: list[tuple[str | None, int]] = []
    hold = Plumbing.hold

    async def spy(
        self: Plumbing,
        provider: str,
        tokens: int = 0,
        model: str | None = None,
        avoid: tuple[str, ...] = (),
    ) -> Any:  # noqa: ANN401 (hold's own result)
        slots.append((model, tokens))
        return await hold(self, provider, tokens, model, avoid)

    monkeypatch.setattr(Plumbing, "hold", spy)
    async with (
        open_dispatcher({"openai": 2}) as dispatcher,
        client_of(dispatcher, server) as client,
    ):
        assert await call(client, "gpt-4o") == 200
        # The fake server refuses a body without a model, as OpenAI does.
        assert await call(client, None) == 400
        # Not JSON: no model, no estimate.
        response = await client.post(URL, content=b"not json")
        assert response.status_code == 400
    assert [model for model, _ in slots] == ["gpt-4o", None, None]
    assert slots[0][1] > 0
    assert slots[2][1] == 0


async def test_our_provider_s_model_goes_with_its_slot_and_its_figures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript())
    http = httpx2.AsyncClient(transport=asgi(server))
    async with (
        http,
        OpenAIProvider(
            id="openai",
            base_url="http://fake.test/v1",
            api_key="sk-test",
            model="gpt-4o-mini",
            client=http,
        ) as provider,
        open_dispatcher(
            {"openai": 2},
            budgets={"openai/gpt-4o-mini": Budget(requests_per_minute=600)},
        ) as dispatcher,
    ):
        limited = wrap_provider(provider, dispatcher)
        request = ChatRequest(messages=[ChatMessage("user", "hi")])
        async with limited.stream(request) as stream:
            async for _ in stream:
                pass
        stats = dispatcher.statistics().providers["openai"]
        assert set(stats.models) == {"gpt-4o-mini"}
        assert stats.models["gpt-4o-mini"].requests_per_minute == 600


@pytest.mark.parametrize("observer_takes_model", [True, False])
async def test_a_provider_tells_its_model_to_an_observer_that_takes_one(
    autojump_clock: trio.testing.MockClock, observer_takes_model: bool
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(requests_per_minute=60))
    told: list[tuple[str, str | None]] = []

    def with_model(
        provider: str, info: RateLimitInfo, *, model: str | None = None
    ) -> None:
        told.append((provider, model))

    def without(provider: str, info: RateLimitInfo) -> None:
        told.append((provider, None))

    http = httpx2.AsyncClient(transport=asgi(server))
    async with (
        http,
        OpenAIProvider(
            id="openai",
            base_url="http://fake.test/v1",
            api_key="sk-test",
            model="gpt-4o",
            client=http,
            on_rate_limits=with_model if observer_takes_model else without,
        ) as provider,
    ):
        request = ChatRequest(messages=[ChatMessage("user", "hi")])
        async with provider.stream(request) as stream:
            async for _ in stream:
                pass
    assert told == [("openai", "gpt-4o" if observer_takes_model else None)]


async def test_a_provider_s_own_two_argument_callback_teaches_its_call_s_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeLLMServer(FakeScript(), quotas=FakeQuotas(requests_per_minute=60))
    http = httpx2.AsyncClient(transport=asgi(server))
    async with open_dispatcher({"openai": 2}) as dispatcher:

        def observe(provider: str, info: RateLimitInfo) -> None:
            # Told no model: the call under way in this task names it.
            dispatcher.observe_rate_limits(provider, info)

        async with (
            http,
            OpenAIProvider(
                id="openai",
                base_url="http://fake.test/v1",
                api_key="sk-test",
                model="gpt-4o",
                client=http,
                on_rate_limits=observe,
            ) as provider,
        ):
            request = ChatRequest(messages=[ChatMessage("user", "hi")])
            async with wrap_provider(provider, dispatcher).stream(request) as stream:
                async for _ in stream:
                    pass
        stats = dispatcher.statistics().providers["openai"]
    assert stats.budget is None
    assert stats.models["gpt-4o"].requests_per_minute == 60
    assert stats.models["gpt-4o"].learned


def _two(provider: str, info: RateLimitInfo) -> None: ...


def _keyword(
    provider: str, info: RateLimitInfo, *, model: str | None = None
) -> None: ...


def _named(provider: str, info: RateLimitInfo, model: str | None = None) -> None: ...


def _positional(
    provider: str, info: RateLimitInfo, model: str | None = None, /
) -> None: ...


def _anything(*args: object, **kwargs: object) -> None: ...


@pytest.mark.parametrize(
    ("observer", "told"),
    [
        (_two, False),
        (_keyword, True),
        (_named, True),
        (_positional, False),
        (_anything, True),
        (min, False),  # a builtin without a signature to read
    ],
    ids=["two", "keyword", "named", "positional", "anything", "builtin"],
)
def test_an_observer_is_told_the_model_if_it_takes_a_model_keyword(
    observer: Any,  # noqa: ANN401 (any callable)
    told: bool,
) -> None:
    assert takes_model(observer) is told


# -- learned per model: two models, two quotas, one client ---------------------

#: Each model's quota at the server, requests a minute: the slow one's is an
#: eighth of the fast one's. Each starts at 5% of a minute's worth.
MODEL_QUOTAS = {"slow": 30, "fast": 240}
RUN = 120.0  # seconds of virtual time


@final
class ByModel(httpx2.AsyncBaseTransport):
    """One fake server per model behind one transport.

    As a provider keeps its quotas per model, a call goes to the server of
    its body's model.
    """

    def __init__(self, servers: dict[str, FakeLLMServer]) -> None:
        self.inner = {model: asgi(server) for model, server in servers.items()}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        model = json.loads(request.content)["model"]
        return await self.inner[model].handle_async_request(request)


async def model_fleet(*, learn_budgets: bool) -> dict[str, list[int]]:
    """Four agents per model, one client, for ``RUN`` s: each call's status."""
    servers = {
        model: FakeLLMServer(
            FakeScript(default=FakeReply(text="ok", latency=0.5)),
            quotas=FakeQuotas(requests_per_minute=quota, initial_fill=0.05),
        )
        for model, quota in MODEL_QUOTAS.items()
    }
    statuses: dict[str, list[int]] = {model: [] for model in MODEL_QUOTAS}
    async with (
        open_dispatcher({"openai": 8}, learn_budgets=learn_budgets) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport("openai", inner=ByModel(servers)),
            headers={"authorization": "Bearer sk-test"},
        ) as client,
    ):
        end = trio.current_time() + RUN

        async def agent(model: str) -> None:
            while trio.current_time() < end:
                statuses[model].append(await call(client, model))

        async with trio.open_nursery() as nursery:
            for model in MODEL_QUOTAS:
                for _ in range(4):
                    nursery.start_soon(agent, model)
        if learn_budgets:
            models = dispatcher.statistics().providers["openai"].models
            assert {
                model: stats.requests_per_minute for model, stats in models.items()
            } == ({model: float(quota) for model, quota in MODEL_QUOTAS.items()})
    return statuses


async def test_each_model_learns_its_own_quota_and_the_fast_one_keeps_its_pace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    statuses = await model_fleet(learn_budgets=True)
    calls = sum(len(answers) for answers in statuses.values())
    refused = sum(answers.count(429) for answers in statuses.values())
    assert refused <= 0.02 * calls
    # Each model at its own quota's pace: what the bucket held, then its rate.
    for model, quota in MODEL_QUOTAS.items():
        served = statuses[model].count(200)
        ideal = quota * (0.05 + RUN / 60)
        assert 0.9 * ideal <= served <= ideal + 4, (model, served, ideal)
    # The control: the same fleet paced by nothing but its pauses. The slow
    # model's 429s pause the provider for both models, and the fast one
    # loses half its pace.
    blind = await model_fleet(learn_budgets=False)
    assert blind["slow"].count(429) > 0.5 * len(blind["slow"])
    assert blind["fast"].count(200) < 0.6 * statuses["fast"].count(200)


async def test_models_seen_once_are_forgotten_and_a_configured_one_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    figures = RateLimitInfo(requests=Quota(limit=100, remaining=99))
    budgets = {"openai/kept": Budget(requests_per_minute=10)}
    async with open_dispatcher({"openai": 4}, budgets=budgets) as dispatcher:
        for k in range(300):
            async with dispatcher.slot("openai", model=f"ft-{k}"):
                dispatcher.observe_rate_limits("openai", figures, model=f"ft-{k}")
        dispatcher.observe_rate_limits("openai", figures, model="kept")
        stats = dispatcher.statistics().providers["openai"]
        assert len(stats.models) == 301
        await trio.sleep(61.0)
        async with dispatcher.slot("openai", model="now"):
            dispatcher.observe_rate_limits("openai", figures, model="now")
        assert set(dispatcher.statistics().providers["openai"].models) == {
            "kept",
            "now",
        }


# -- two models through the openai SDK, against the server's quotas per model ------
#
# OpenAI keeps rate limits per model, and every answer's ``x-ratelimit-*``
# headers report the bucket of the model it answered. An application that
# sends a slow model and a fast one through one client (the ``openai`` SDK on
# one ``dispatcher.transport("openai")``) must learn two budgets from those
# headers, one per model, with nothing configured: one budget learned from
# both models' figures either holds the fast model to the slow one's pace, or
# lets the slow one run into 429s.
#
# The fake LLM server keeps the two quotas apart (``FakeQuotas.models``) and
# counts its own 429s. The server and the dispatcher both run on trio's
# clock, so ``autojump_clock`` runs a virtual minute of traffic over real
# sockets in a few seconds. The demand of each model is well above its quota,
# so each quota binds; the buckets start a tenth full, so the refill rate
# binds within a few seconds, not after a minute's worth of requests.
#
# The bar (issue 21): at most 2% of all requests answered 429, and the fast
# model served at no less than 80% of its quota's refill rate after a short
# warm-up, which is 20 times the slow model's whole quota: a single budget,
# learned from both models' headers, cannot meet both. With one budget for
# both, as the dispatcher learned before it knew of models, this fleet had
# 6 of its 36 requests answered 429, and 13 fast answers after the warm-up
# where 200 were due.

SLOW, FAST = "slow-model", "fast-model"
SLOW_PER_MINUTE, FAST_PER_MINUTE = 15, 300
FILL = 0.1
QUOTAS = FakeQuotas(
    models={
        SLOW: FakeQuotas(requests_per_minute=SLOW_PER_MINUTE, initial_fill=FILL),
        FAST: FakeQuotas(requests_per_minute=FAST_PER_MINUTE, initial_fill=FILL),
    }
)
LATENCY = {SLOW: 1.0, FAST: 0.2}
# Demand: 4 slow agents could ask 240 a minute (16x the slow quota), 12 fast
# ones 3,600 (12x the fast quota); 16 slots hold them all.
AGENTS = {SLOW: 4, FAST: 12}
LIMIT = 16
TWO_MODELS_RUN = 60.0  # virtual seconds
WARM_UP = 10.0


def _reply(request: FakeRequest) -> FakeReply:
    return FakeReply(text="ok", latency=LATENCY.get(request.model or "", 0.0))


async def run_two_models() -> tuple[
    int, int, dict[str, list[float]], dict[str, float | None]
]:
    """Run the fleet: requests, 429s, each model's answer times, its budget.

    The budget is the requests per minute the dispatcher learned for each
    model (``None`` if it learned none).
    """
    answered: dict[str, list[float]] = {SLOW: [], FAST: []}
    # Served in this trio run, streaming, with no socket: the virtual clock
    # never jumps while a byte is on its way, whatever the machine's load.
    server = FakeLLMServer(
        FakeScript(choose=_reply), quotas=QUOTAS, api_key="sk-two-models"
    )
    async with (
        open_dispatcher({"openai": LIMIT}) as dispatcher,
        httpx2.AsyncClient(
            transport=dispatcher.transport(
                "openai", inner=StreamingASGITransport(server)
            ),
            timeout=600.0,
        ) as http,
    ):
        client = openai.AsyncOpenAI(
            api_key="sk-two-models",
            base_url="http://fake.test/v1",
            http_client=http,
            max_retries=0,
        )
        start = trio.current_time()
        messages: list[Any] = [{"role": "user", "content": "hi"}]

        async def agent(model: str) -> None:
            while True:
                try:
                    stream = await client.chat.completions.create(
                        model=model, messages=messages, stream=True
                    )
                except openai.RateLimitError:
                    continue
                async with stream:
                    async for _ in stream:
                        pass
                answered[model].append(trio.current_time() - start)

        with trio.move_on_at(start + TWO_MODELS_RUN):
            async with trio.open_nursery() as nursery:
                for model, agents in AGENTS.items():
                    for _ in range(agents):
                        nursery.start_soon(agent, model)
        stats = server.statistics()
        learned = {
            model: budget.requests_per_minute if budget.learned else None
            for model, budget in dispatcher.statistics()
            .providers["openai"]
            .models.items()
        }
    return stats.requests_total, stats.quota_refusals, answered, learned


# The openai SDK leaves the async generators under a stream unclosed when it
# stops at ``[DONE]``: trio warns when they are collected.
@pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning"
)
async def test_two_models_through_one_client_each_learn_their_own_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    requests, refused, answered, learned = await run_two_models()
    assert requests > 0
    assert refused <= 0.02 * requests, (refused, requests)
    # The slow model is held to its quota by the server in any case.
    slow_cap = SLOW_PER_MINUTE * (FILL + TWO_MODELS_RUN / 60.0)
    assert len(answered[SLOW]) <= math.ceil(slow_cap)
    # The fast model runs at its own quota's pace, not the slow one's.
    window = TWO_MODELS_RUN - WARM_UP
    fast = sum(at >= WARM_UP for at in answered[FAST])
    assert fast >= 0.8 * FAST_PER_MINUTE * window / 60.0, (fast, len(answered[SLOW]))
    # Each model's budget, learned from its own answers' headers.
    assert learned == {SLOW: SLOW_PER_MINUTE, FAST: FAST_PER_MINUTE}
