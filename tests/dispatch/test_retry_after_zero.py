"""A ``Retry-After`` that names no delay backs off, as no header does.

``Retry-After: 0``, a negative delay, ``retry-after-ms: 0`` or an HTTP-date
in the past used to pause for nothing: every waiter went again at once and
met the same 429, thousands of requests a second. Through the SDK
transport (answers from ``httpx2.MockTransport``, in virtual time), the
policy's report path and the Redis ledger's pause, each is now the
backoff: ``default_pause``, doubling.
"""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING

import httpx2
import pytest
import trio
import trio.testing

from trio_dispatch import open_dispatcher
from trio_dispatch._policy._slots import SlotPolicy
from trio_dispatch._redis._ledger import Ledger
from trio_dispatch.messages._protocol import Ticket

from .._redis import needs_redis

if TYPE_CHECKING:
    import coredis

URL = "https://llm.test/v1/chat/completions"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
# Enough to end a storm quickly when the pause is not there.
STORM = 500


def refusals() -> list[dict[str, str]]:
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    return [
        {"retry-after": "0"},
        {"retry-after": "-5"},
        {"retry-after-ms": "0"},
        {"retry-after": past},
    ]


@pytest.mark.parametrize(
    "headers", refusals(), ids=["zero", "negative", "zero-ms", "date-in-the-past"]
)
async def test_a_429_that_names_no_delay_backs_off_through_the_transport(
    autojump_clock: trio.testing.MockClock, headers: dict[str, str]
) -> None:
    sent: list[float] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(trio.current_time())
        return httpx2.Response(429, headers=headers, json={"error": {}})

    async def agent(client: httpx2.AsyncClient) -> None:
        while len(sent) < STORM:
            response = await client.post(URL, content=BODY)
            assert response.status_code == 429

    async with open_dispatcher({"p": 8}, default_pause=1.0) as dispatcher:
        transport = dispatcher.transport("p", inner=httpx2.MockTransport(handle))
        async with httpx2.AsyncClient(transport=transport) as client:
            start = trio.current_time()
            with trio.move_on_after(2.0):
                async with trio.open_nursery() as nursery:
                    for _ in range(8):
                        nursery.start_soon(agent, client)
            # 8 at once, a pause of 1 s, 8 more, then a pause of 2 s.
            assert [when - start for when in sent] == [0.0] * 8 + [1.0] * 8
            stats = dispatcher.statistics().providers["p"]
            assert stats.paused_until == start + 3.0


@pytest.mark.parametrize("retry_after", [0, 0.0])
def test_the_policy_backs_off_for_a_zero_delay(retry_after: float) -> None:
    policy = SlotPolicy(2, default_pause=1.0, max_pause=60.0)
    policy.report_rate_limit(10.0, retry_after)
    assert policy.paused_until == 11.0
    assert policy.tick(11.0) == []
    policy.acquire(Ticket(11.0, 0))
    policy.report_rate_limit(11.0, retry_after)  # a new round: doubled
    assert policy.paused_until == 13.0


@needs_redis
async def test_the_ledger_backs_off_for_a_zero_delay(
    client: coredis.Redis[str],
) -> None:
    ledger = Ledger(client, "ns", 10.0)
    left = await ledger.pause("p", 0.0, default_pause=1.0, max_pause=60.0)
    assert 0.9 < left <= 1.0
    assert (await ledger.step("p", "a")).paused_for > 0.8
