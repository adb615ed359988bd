"""Learned budgets that neither collapse nor count a request twice.

The policy core first, then end to end through ``Dispatcher.transport``
(answers from ``httpx2.MockTransport``, in virtual time, with exact
times): a server whose reset claims a day for one request of 100 no longer
stalls the fleet, later answers raise the level again, and the requests in
flight that the server had already counted when it answered are not taken
from its ``remaining`` a second time. The Redis ledger's ``learn`` is held
to the same figures in ``test_ledger_budgets.py``.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import Budget, Quota, RateLimitInfo, open_dispatcher
from trio_dispatch.lowlevel import SlotPolicy, Throttle, Ticket

if TYPE_CHECKING:
    from trio_dispatch import BudgetStatistics, Dispatcher

URL = "https://llm.test/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def t(seq: int) -> Ticket:
    return Ticket(0.0, seq)


def requests(limit: int, remaining: int, reset: float) -> RateLimitInfo:
    return RateLimitInfo(requests=Quota(limit=limit, remaining=remaining, reset=reset))


def budget(policy: SlotPolicy) -> BudgetStatistics:
    stats = policy.budget_statistics()
    assert stats is not None
    return stats


# -- the policy core -----------------------------------------------------------


def test_a_reset_of_a_day_for_one_request_cannot_stall_the_pace() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 99, 86_400.0))
    # Not 1 request a day: the whole limit within an hour at the slowest.
    assert budget(policy).requests_per_minute == pytest.approx(100 / 60)
    # A reset within the hour is believed: 50 used, back in 20 minutes.
    policy.observe_rate_limits(0.0, requests(100, 50, 1200.0))
    assert budget(policy).requests_per_minute == pytest.approx(2.5)


def test_the_newest_answer_raises_the_level_again() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 0, 60.0))
    assert budget(policy).requests_available == 0
    policy.tick(60.0)
    assert policy.acquire(t(0)) == [t(0)]
    # Its answer starts, and says what is left now: the level follows.
    policy.answered(t(0))
    policy.observe_rate_limits(60.0, requests(100, 99, 86_400.0))
    assert budget(policy).requests_available == 99
    # Never above the limit, whatever a server says is left.
    policy.tick(61.0)
    assert policy.acquire(t(1)) == [t(1)]
    policy.answered(t(1))
    policy.observe_rate_limits(61.0, requests(100, 10**6, 1.0))
    assert budget(policy).requests_available == 100


def test_requests_granted_before_an_answered_one_are_not_counted_twice() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 100, 0.0))
    for seq in range(4):
        policy.tick(float(seq))  # one after the other, as they arrive
        assert policy.acquire(t(seq)) == [t(seq)]
    # The third answer starts: the server counted it and the two granted
    # before it on arrival; only the fourth may not have reached it yet.
    policy.answered(t(2))
    policy.observe_rate_limits(3.0, requests(100, 97, 1.8))
    assert budget(policy).requests_available == 96


def test_answers_reported_together_count_as_unseen_but_the_last() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 100, 0.0))
    for seq in range(3):
        policy.tick(float(seq))
        assert policy.acquire(t(seq)) == [t(seq)]
    # Three answers start before any figures: these are the last one's,
    # and the two others may have reached the server after it.
    for seq in range(3):
        policy.answered(t(seq))
    policy.observe_rate_limits(3.0, requests(100, 97, 1.8))
    assert budget(policy).requests_available == 95


def test_requests_granted_at_the_same_instant_count_as_unseen() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 100, 0.0))
    for seq in range(4):
        assert policy.acquire(t(seq)) == [t(seq)]
    # Which of them reached the server first, nobody knows: the three
    # others count as unseen, and the other answers are not the newest.
    policy.answered(t(2))
    policy.observe_rate_limits(0.0, requests(100, 97, 1.8))
    assert budget(policy).requests_available == 94
    policy.answered(t(3))
    policy.observe_rate_limits(0.0, requests(100, 99, 0.6))
    assert budget(policy).requests_available == 94


def test_the_figures_of_an_older_answer_only_lower_the_level() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, requests(100, 100, 0.0))
    for seq in range(4):
        policy.tick(float(seq))  # one after the other, as they arrive
        assert policy.acquire(t(seq)) == [t(seq)]
    policy.answered(t(3))
    policy.observe_rate_limits(3.0, requests(100, 96, 2.4))
    assert budget(policy).requests_available == 96
    # The first answer comes late: its remaining (99) is older than what
    # the fourth said, so it cannot raise the level...
    policy.answered(t(0))
    policy.observe_rate_limits(3.0, requests(100, 99, 0.6))
    assert budget(policy).requests_available == 96
    # ...and neither can figures reported with no answer.
    policy.observe_rate_limits(3.0, requests(100, 99, 0.6))
    assert budget(policy).requests_available == 96
    policy.observe_rate_limits(3.0, requests(100, 90, 6.0))
    assert budget(policy).requests_available == 90


def tokens(remaining: int) -> RateLimitInfo:
    return RateLimitInfo(tokens=Quota(limit=6000, remaining=remaining, reset=0.0))


def test_a_charge_the_newest_figures_counted_gives_nothing_back() -> None:
    policy = SlotPolicy(8)
    policy.observe_rate_limits(0.0, tokens(6000))
    policy.tick(1.0)
    assert policy.acquire(t(0), 1000) == [t(0)]
    # The server charged its own estimate, 1100: its figures say so.
    policy.answered(t(0))
    policy.observe_rate_limits(1.0, tokens(4900))
    assert budget(policy).tokens_available == 4900
    # 300 used: giving back the 700 of our own estimate would count 100
    # the server never gave back; what it gives, its next figures say.
    policy.report_usage(t(0), 300)
    assert budget(policy).tokens_available == 4900
    # More than charged: the excess is taken.
    policy.report_usage(t(0), 1500)
    assert budget(policy).tokens_available == 3700


def test_a_configured_budget_is_lowered_by_figures_never_raised() -> None:
    policy = SlotPolicy(8, throttle=Throttle(Budget(requests_per_minute=60)))
    policy.observe_rate_limits(0.0, requests(600, 5, 1.0))
    assert budget(policy).requests_available == 5
    policy.observe_rate_limits(0.0, requests(600, 500, 1.0))
    assert budget(policy).requests_available == 5
    assert budget(policy).requests_per_minute == 60


# -- end to end, through the transport, in virtual time ------------------------


class Server:
    """A provider answering after ``latency``, its figures as of each arrival.

    With ``per_minute``, a request bucket as OpenAI keeps it (full, then
    refilled at a sixtieth a second; a request beyond it is answered 429);
    without, the same figures every time: ``figures``.

    Without ``spread``, the answers of requests sent together come back
    together, and trio runs the tasks woken at one virtual instant in a
    random order: requests granted together reach the server, and their
    answers the client, in any order. With ``spread="arrivals"``, the n-th
    answer takes ``n % 7`` ms more, so that no two are granted at once and,
    as over a network, requests arrive in the order they were granted.
    """

    def __init__(
        self,
        latency: float,
        *,
        per_minute: int | None = None,
        figures: dict[str, str] | None = None,
        spread: str | None = None,
    ) -> None:
        self.latency = latency
        self.spread = spread
        self.per_minute = per_minute
        self.level = float(per_minute or 0)
        self.at = 0.0
        self.figures = figures or {}
        self.sent = 0
        self.refused = 0

    def _counted(self) -> dict[str, str] | None:
        """Charge a request arriving now; its figures, or ``None`` if refused."""
        limit = self.per_minute
        if limit is None:
            return self.figures
        now = trio.current_time()
        self.level = min(limit, self.level + (now - self.at) * limit / 60)
        self.at = now
        if self.level < 1:
            return None
        self.level -= 1
        reset = (limit - self.level) * 60 / limit
        return {
            "x-ratelimit-limit-requests": str(limit),
            "x-ratelimit-remaining-requests": str(math.floor(self.level)),
            "x-ratelimit-reset-requests": f"{math.ceil(reset * 1000)}ms",
        }

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.sent += 1
        figures = self._counted()
        extra = self.sent % 7 / 1000 if self.spread == "arrivals" else 0.0
        await trio.sleep(self.latency + extra)
        if figures is None:
            self.refused += 1
            return httpx2.Response(429, headers={"retry-after": "1"})
        return httpx2.Response(200, headers=figures, json={"choices": []})


async def fleet(
    dispatcher: Dispatcher, server: Server, agents: int, calls: int
) -> float:
    """``agents`` closed loops of ``calls`` successful calls; when the last ended."""
    transport = dispatcher.transport("p", inner=httpx2.MockTransport(server))
    start = trio.current_time()
    async with httpx2.AsyncClient(transport=transport) as client:

        async def agent() -> None:
            done = 0
            while done < calls:
                response = await client.post(URL, content=BODY)
                done += response.status_code == 200

        async with trio.open_nursery() as nursery:
            for _ in range(agents):
                nursery.start_soon(agent)
    return trio.current_time() - start


async def test_a_server_whose_reset_claims_a_day_does_not_stall_the_fleet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # "Limit 100, remaining 99, reset 999999h", every time.
    figures = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-requests": "999999h",
    }
    server = Server(0.3, figures=figures)
    async with open_dispatcher({"p": 8}) as dispatcher:
        elapsed = await fleet(dispatcher, server, agents=8, calls=20)
    # 160 requests, 8 at a time, 0.3 s each: nothing but the limit paces them.
    assert server.sent == 160
    assert elapsed == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("budgets", "spread"),
    [
        pytest.param({}, "arrivals", id="learned"),
        # Requests sent and answered in any order: the figures of the
        # first answer to come back count requests still in flight, which
        # used to lower a configured budget's level for good.
        pytest.param({"p": Budget(requests_per_minute=240)}, None, id="configured"),
    ],
)
async def test_a_fleet_under_a_quota_ends_close_to_the_ideal(
    autojump_clock: trio.testing.MockClock,
    budgets: dict[str, Budget],
    spread: str | None,
) -> None:
    # 30 agents x 10 calls of 0.3 s against 240 requests a minute: the
    # bucket's 240 go in the first 2.5 s (with 10 more refilled), the last
    # 50 at 4 a second, so the ideal end is 2.5 + 12.5 + 0.3 = 15.3 s (a
    # few ms more with the spread).
    server = Server(0.3, per_minute=240, spread=spread)
    async with open_dispatcher({"p": 30}, budgets=budgets) as dispatcher:
        elapsed = await fleet(dispatcher, server, agents=30, calls=10)
    assert (server.sent, server.refused) == (300, 0)
    assert elapsed <= 1.15 * 15.3
