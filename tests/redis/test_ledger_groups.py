"""The Redis ledger's groups against the pure core's pools, on the same random operations.

A group is what ``Ledger.step`` schedules with ``members`` and ``pools``:
each member keeps its own limit, pause, backoff and leases under its own
keys, and each entry waits in its lane (a member's, a pool's, or any
member's, less the members it avoids) for the members that may take it.
The rule is the pure core's (``SlotPolicy`` with members and pools); the
Lua repeats it, and this test holds the copy to the original as
``test_ledger_differential`` does for a provider: a generated sequence of
requests (a turn's age, a priority, a lane and the members avoided),
releases, cancellations, rate-limit answers on a member (with and without
``Retry-After``), resumes of a member, limit changes of a member (fixed or
unlimited) and time passing is applied to a ``SlotPolicy`` and to one
process's ``SharedBook`` driving a ``Ledger`` on a real redis-server; after
every operation both must have granted the same tickets in the same order,
each on the same member, and agree on the holders, the waiters and each
member's limit, slots held and pause left.

The members are three, and the two pools list them in orders other than
the group's (ties between members go by the pool's order, and by the
group's for a request that any member may take). Time is the test's, set
in a key the scripts read (see ``test_ledger_differential``).
"""

from __future__ import annotations

import math
import os
import uuid
from typing import TYPE_CHECKING

import coredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_dispatch._policy._slots import SlotPolicy
from trio_dispatch._redis._book import SharedBook
from trio_dispatch._redis._ledger import Ledger
from trio_dispatch._redis._scripts import lane_text, load_scripts
from trio_dispatch.messages._protocol import Ticket

from .._redis import needs_redis

if TYPE_CHECKING:
    from trio_dispatch._redis._ledger import StepResult

    from .._redis import RedisServer

pytestmark = needs_redis

TEST_CLOCK = "local now = tonumber(redis.call('GET', KEYS[1] .. ':clock'))\n"
SCRIPTS = load_scripts(TEST_CLOCK)

GROUP = "g"
MEMBERS = ("a", "b", "c")
POOLS = {"p": ("b", "a"), "q": ("c", "b")}
# None: any member of the group.
LANES = (None, None, "a", "b", "c", "p", "p", "q", "q")
LEASE = 3600.0
DEFAULT_PAUSE = 1.0
MAX_PAUSE = 8.0
AGING = 10.0

member = st.sampled_from(MEMBERS)
member_limits = st.sampled_from([1, 1, 2, 3, None])
acquire = st.tuples(
    st.just("acquire"),
    st.integers(0, 4),  # how many seconds older its turn is
    st.integers(0, 2),  # priority class
    st.sampled_from(LANES),
    st.sets(member, max_size=2),  # the members it avoids
)
operation = st.one_of(
    acquire,
    acquire,
    acquire,
    acquire,
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("wait"), st.sampled_from([1, 2, 4, 8])),  # 1/4 s
    st.tuples(
        st.just("rate_limit"),
        member,
        st.none() | st.sampled_from([0.0, 0.5, 2.0, 30.0]),
    ),
    st.tuples(st.just("resume"), member),
    st.tuples(st.just("set_limit"), member, member_limits),
)


def examples() -> settings:
    return settings(
        max_examples=120 if os.environ.get("CI") else 40,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
        ],
    )


class GroupPair:
    """The pure core's pools and the ledger's group, side by side, at one instant."""

    def __init__(
        self,
        client: coredis.Redis[str],
        ledger: Ledger,
        policy: SlotPolicy,
        base_ms: int,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.policy = policy
        self.book = SharedBook("n", GROUP, pooled=True)
        self.base_ms = base_ms
        self.ms = 0
        self.result: StepResult | None = None
        # The member of each lease the ledger granted.
        self.on: dict[str, str] = {}
        self.seq = 0
        self.tickets: list[Ticket] = []
        self.log: list[str] = []

    @property
    def now(self) -> float:
        return self.ms / 1000

    async def set_clock(self) -> None:
        key = self.ledger.names(GROUP)[0][0] + ":clock"
        await self.client.set(key, str(self.base_ms + self.ms))

    async def round(self) -> list[Ticket]:
        """Rounds of the book until nothing more is granted."""
        granted: list[Ticket] = []
        for _ in range(4):
            book = self.book
            plan = book.plan(None, renew=False)
            result = await self.ledger.step(
                GROUP,
                book.node,
                plan,
                waiting=book.waiting,
                members=MEMBERS,
                pools=POOLS,
            )
            self.result = result
            assert len(result.granted_on) == len(result.granted)
            for queued, name in zip(result.granted, result.granted_on, strict=True):
                self.on[queued[17:]] = name
            grants = book.applied(plan, result.granted, result.granted_on)
            granted += grants
            if not grants:
                break
        return granted

    def compare(self, pure: list[Ticket], shared: list[Ticket]) -> None:
        policy, result, book = self.policy, self.result, self.book
        assert result is not None
        where = "\n".join(self.log)
        assert shared == pure, where
        assert book.holders() == policy.holders(), where
        assert book.waiters() == policy.waiters(), where
        for holder in book.holders():
            assert self.on[book.lease_id(holder)] == policy.member_of(holder), where
        assert result.in_flight == policy.in_flight, where
        assert list(result.members) == list(MEMBERS), where
        statistics = policy.member_statistics()
        pauses = policy.member_pauses()
        for name, seen in result.members.items():
            pure_member = statistics[name]
            assert seen.limit == pure_member.limit, where
            assert seen.in_flight == pure_member.in_flight, where
            until = pauses[name]
            if pure_member.limit is not None:
                left = (
                    0
                    if until is None or until <= self.now
                    else round((until - self.now) * 1000)
                )
                assert round(seen.paused_for * 1000) == left, where


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


def _pick(items: list[Ticket], index: object) -> Ticket | None:
    return items[_int(index) % len(items)] if items else None


async def _apply(pair: GroupPair, op: tuple[object, ...]) -> None:
    policy, book, ledger = pair.policy, pair.book, pair.ledger
    kind = op[0]
    pure: list[Ticket] = []
    pair.log.append(f"t={pair.now} {op!r}")
    if kind == "wait":
        pair.ms += 250 * _int(op[1])
        await pair.set_clock()
        pure = policy.tick(pair.now)
    elif kind == "acquire":
        older, priority, lane, avoid = op[1:]
        assert lane is None or isinstance(lane, str)
        assert isinstance(avoid, frozenset | set)
        avoided = sorted(avoid)
        rank = pair.now - _int(older) - _int(priority) * AGING
        ticket = Ticket(rank, pair.seq, _int(priority))
        pair.seq += 1
        pair.tickets.append(ticket)
        # The ticket's lane as the dispatcher gives it: a member's or a
        # pool's name (a member asked for avoids nothing), or any member.
        pure = policy.acquire(ticket, member=lane, avoid=avoided)
        shown = [] if lane in MEMBERS else avoided
        book.acquire(
            ticket, rank, pair.now + ticket.seq * 1e-6, lane=lane_text(lane, shown)
        )
    elif kind == "release":
        holder = _pick(sorted(policy.holders()), op[1])
        if holder is None:
            return
        pure = policy.release(holder)
        book.release(holder)
    elif kind == "cancel":
        victim = _pick(pair.tickets, op[1])
        if victim is None:
            return
        pure = policy.cancel(victim)
        book.cancel(victim)
    elif kind == "rate_limit":
        name, retry_after = op[1], op[2]
        assert isinstance(name, str)
        assert retry_after is None or isinstance(retry_after, float)
        pure = policy.report_rate_limit(pair.now, retry_after, member=name)
        await ledger.pause(
            GROUP,
            retry_after,
            default_pause=DEFAULT_PAUSE,
            max_pause=MAX_PAUSE,
            member=name,
        )
    elif kind == "resume":
        name = op[1]
        assert isinstance(name, str)
        pure = policy.resume(member=name)
        await ledger.resume(GROUP, member=name)
    else:
        assert kind == "set_limit"
        name, limit = op[1], op[2]
        assert isinstance(name, str)
        assert limit is None or isinstance(limit, int)
        pure = policy.set_limit(limit, member=name)
        await ledger.set_limit(GROUP, limit, member=name)
    pair.compare(pure, await pair.round())


async def replay(
    url: str, limits: dict[str, int | None], ops: list[tuple[object, ...]]
) -> None:
    """Apply ``ops`` to both sides, comparing them after each (see the module)."""
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        base_ms = math.ceil((await client.time()).timestamp() * 1000)
        ledger = Ledger(client, uuid.uuid4().hex, LEASE, scripts=SCRIPTS)
        first, *others = MEMBERS
        policy = SlotPolicy(
            limits[first],
            provider=first,
            default_pause=DEFAULT_PAUSE,
            max_pause=MAX_PAUSE,
        )
        for name in others:
            policy.add_member(name, limits[name])
        for pool, names in POOLS.items():
            policy.set_pool(pool, names)
        pair = GroupPair(client, ledger, policy, base_ms)
        await pair.set_clock()
        for name in MEMBERS:
            await ledger.set_limit(GROUP, limits[name], member=name)
        pair.log.append(f"limits={limits!r}")
        pair.compare([], await pair.round())
        for op in ops:
            await _apply(pair, op)


@examples()
@given(
    limits=st.fixed_dictionaries(dict.fromkeys(MEMBERS, member_limits)),
    ops=st.lists(operation, min_size=20, max_size=80),
)
async def test_the_ledger_grants_a_group_as_the_pure_core_grants_its_pools(
    shared_server: RedisServer,
    limits: dict[str, int | None],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, limits, ops)


# What the differential test is sure to meet, kept as cases.
@pytest.mark.parametrize(
    ("limits", "ops"),
    [
        pytest.param(
            {"a": 1, "b": 2, "c": 1},
            [
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "p", set()),
            ],
            id="a_pool_fills_the_member_with_the_most_free_slots_first",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, "b", set()),
                ("acquire", 1, 0, "p", set()),
                ("acquire", 2, 0, "a", set()),
                ("acquire", 3, 0, "p", set()),
                ("release", 0),
                ("release", 0),
            ],
            id="oldest_turn_first_across_a_pool_and_its_members",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, None, {"a", "b"}),
                ("acquire", 0, 0, "q", {"c"}),
                ("acquire", 0, 0, "p", {"a", "b"}),
            ],
            id="avoided_members_unless_none_is_left",
        ),
        pytest.param(
            {"a": 2, "b": 2, "c": None},
            [
                ("rate_limit", "b", 2.0),
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "p", set()),
                ("acquire", 0, 0, "b", set()),
                ("wait", 8),
                ("rate_limit", "c", None),
                ("acquire", 0, 0, "q", set()),
                ("resume", "b"),
            ],
            id="a_paused_member_takes_nothing_until_its_pause_ends",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, "a", set()),
                ("acquire", 0, 0, "a", set()),
                ("acquire", 0, 0, "p", set()),
                ("set_limit", "a", 3),
                ("set_limit", "b", None),
                ("acquire", 0, 0, "b", set()),
            ],
            id="a_raised_limit_grants_at_once",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_agree_on_a_group(
    shared_server: RedisServer,
    limits: dict[str, int | None],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, limits, ops)


async def test_a_groups_slot_kept_for_another_processs_older_entry(
    shared_server: RedisServer,
) -> None:
    # Process 1's older entry for pool p is first in the queue: the one
    # free slot of the pool is kept for it, on the member it would take,
    # until process 1 asks, even as process 2 asks for the pool (and for
    # a member of it) meanwhile. A member lane the pool's choice left free
    # still goes to process 2.
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        ledger = Ledger(client, uuid.uuid4().hex, LEASE)
        for name, limit in (("a", 1), ("b", 1), ("c", 1)):
            await ledger.set_limit(GROUP, limit, member=name)
        first = SharedBook("one", GROUP, pooled=True)
        second = SharedBook("two", GROUP, pooled=True)

        async def step(book: SharedBook) -> tuple[list[Ticket], StepResult]:
            plan = book.plan(None, renew=False)
            result = await ledger.step(
                GROUP,
                book.node,
                plan,
                waiting=book.waiting,
                members=MEMBERS,
                pools=POOLS,
            )
            return book.applied(plan, result.granted, result.granted_on), result

        holder = Ticket(0.0, 0, 0)
        first.acquire(holder, 0.0, 0.0, lane=lane_text("p"))
        second_holder = Ticket(0.5, 0, 0)
        second.acquire(second_holder, 0.5, 0.5, lane=lane_text("p"))
        assert (await step(first))[0] == [holder]  # on b, the pool's first
        assert (await step(second))[0] == [second_holder]  # on a
        # Both of p's members are full; process 1's older entry waits in the
        # queue first, then process 2's entries for p and for c.
        older = Ticket(1.0, 1, 0)
        first.acquire(older, 1.0, 1.0, lane=lane_text("p"))
        granted, result = await step(first)
        assert granted == []
        younger, for_c = Ticket(2.0, 1, 0), Ticket(3.0, 2, 0)
        second.acquire(younger, 2.0, 2.0, lane=lane_text("p"))
        second.acquire(for_c, 3.0, 3.0, lane=lane_text("c"))
        granted, result = await step(second)
        assert granted == [for_c]
        assert result.granted_on == ["c"]
        # Process 2's holder on a leaves: the slot is kept for process 1's
        # older entry, not granted to process 2's younger one.
        second.release(second_holder)
        granted, result = await step(second)
        assert granted == []
        assert result.members["a"].in_flight == 0
        granted, result = await step(first)
        assert granted == [older]
        assert result.granted_on == ["a"]
        assert {name: m.in_flight for name, m in result.members.items()} == {
            "a": 1,
            "b": 1,
            "c": 1,
        }


async def test_a_groups_grant_whose_answer_was_lost_is_reported_again(
    shared_server: RedisServer,
) -> None:
    # A step granted an entry on member b, and its answer never came: the
    # same plan sent again (recheck) reports the grant again, on b, and
    # grants nothing twice; a withdrawal then gives the lease back.
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        ledger = Ledger(client, uuid.uuid4().hex, LEASE)
        await ledger.set_limit(GROUP, 1, member="a")
        await ledger.set_limit(GROUP, 1, member="b")
        await ledger.set_limit(GROUP, 1, member="c")
        book = SharedBook("n", GROUP, pooled=True)
        ticket = Ticket(0.0, 0, 0)
        book.acquire(ticket, 0.0, 0.0, lane=lane_text("b"))
        plan = book.plan(None, renew=False)
        lost = await ledger.step(
            GROUP, "n", plan, waiting=1, members=MEMBERS, pools=POOLS
        )
        assert lost.granted_on == ["b"]
        book.failed(plan)
        again = book.plan(None, renew=False)
        assert again.recheck
        result = await ledger.step(
            GROUP, "n", again, waiting=1, members=MEMBERS, pools=POOLS
        )
        assert result.granted == lost.granted
        assert result.granted_on == ["b"]
        assert result.members["b"].in_flight == 1
        assert book.applied(again, result.granted, result.granted_on) == [ticket]
        book.cancel(ticket)
        result = await ledger.step(
            GROUP,
            "n",
            book.plan(None, renew=False),
            waiting=0,
            members=MEMBERS,
            pools=POOLS,
        )
        assert result.members["b"].in_flight == 0
        assert result.in_flight == 0
