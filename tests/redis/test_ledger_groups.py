"""The Redis ledger's groups against the pure core's pools, on the same random operations.

A group is what ``Ledger.step`` schedules with ``members`` and ``pools``:
each member keeps its own limit, adaptive limit, budgets, pause, backoff
and leases under its own keys, and each entry waits in its lane (a
member's, a pool's, or any member's, less the members it avoids) for the
members that may take it. The rule is the pure core's (``SlotPolicy`` with
members and pools); the Lua repeats it, and this test holds the copy to
the original as ``test_ledger_differential`` does for a provider: a
generated sequence of requests (a turn's age, a priority, a token
estimate, a lane and the members avoided), releases, cancellations,
rate-limit answers on a member (with and without ``Retry-After``),
resumes of a member, limit changes of a member (fixed, unlimited or
adaptive), answers with and without rate-limit figures (learned by the
member that answered), figures of a member alone, usage reports, the
verdicts of a member's latency signal, calls that fail before their
answer (a member out of service after two in a row, for two seconds, then
half-open with one probe) and time passing is applied to a
``SlotPolicy`` and to one process's ``SharedBook`` driving a ``Ledger`` on
a real redis-server; after every operation both must have granted the
same tickets in the same order, each on the same member, and agree on the
holders, the waiters and each member's limit, slots held, pause left,
budgets (its models' too: each may be configured from the start, or
learned from the figures of an answer of its model), health and affinity: a request may prefer a member (its
conversation's last), and waits for it alone for a second, unless it is
paused, out of service or half-open. Requests may be a tenant's (and of a
model), tenants configured and changed at random: both sides must agree
on every tenant's weight, cap, holders and service counter too. Each member may have a configured budget from the start, or
learn one from its figures.

The members are three, and the two pools list them in orders other than
the group's (ties between members go by the pool's order, and by the
group's for a request that any member may take). Time is the test's, set
in a key the scripts read (see ``test_ledger_differential``).
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING

import coredis
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import Tenant
from trio_dispatch._policy._budgets import AdaptiveLimit, Budget, Throttle
from trio_dispatch._policy._ratelimits import Quota, RateLimitInfo
from trio_dispatch._policy._slots import SlotPolicy
from trio_dispatch._redis._book import SharedBook
from trio_dispatch._redis._ledger import Ledger, SeenModels
from trio_dispatch._redis._scheduler import SharedView
from trio_dispatch._redis._scripts import lane_text, load_scripts
from trio_dispatch.messages._protocol import Ticket

from .._ledger_pairs import Stage, as_int, examples, pick, same_budgets, same_tenants
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
FAILURE_THRESHOLD = 2
FAILURE_COOLDOWN = 2.0
AFFINITY_WAIT = 1.0

member = st.sampled_from(MEMBERS)
member_limits = st.sampled_from([1, 1, 2, 3, None])
adaptive_limits = st.builds(
    AdaptiveLimit,
    initial=st.integers(1, 3),
    minimum=st.just(1),
    maximum=st.integers(3, 6),
    backoff=st.sampled_from([0.5, 0.75]),
    signal=st.sampled_from(["rate_limits", "latency"]),
)
quotas = st.builds(
    Quota,
    limit=st.none() | st.integers(1, 40),
    remaining=st.none() | st.integers(0, 40),
    reset=st.none() | st.sampled_from([0.5, 1.0, 2.0, 30.0, 120.0]),
)
figures = st.builds(
    RateLimitInfo, requests=st.none() | quotas, tokens=st.none() | quotas
)
budgets = st.none() | st.sampled_from(
    [
        Budget(requests_per_minute=rpm, tokens_per_minute=tpm)
        for rpm in (None, 6.0, 30.0)
        for tpm in (None, 60.0, 600.0)
        if rpm or tpm
    ]
)
acquire = st.tuples(
    st.just("acquire"),
    st.integers(0, 4),  # how many seconds older its turn is
    st.integers(0, 2),  # priority class
    st.sampled_from(LANES),
    st.sets(member, max_size=2),  # the members it avoids
    st.sampled_from([0, 0, 1, 5, 20, 50]),  # estimated tokens
    st.none() | member,  # the member it prefers
    st.sampled_from([None, None, "t1", "t2"]),  # its tenant
    st.sampled_from([None, None, "m1"]),  # its model
)
tenant_settings = st.none() | st.builds(
    Tenant,
    weight=st.sampled_from([0.5, 1.0, 2.0]),
    limit=st.none() | st.integers(1, 2),
)
operation = st.one_of(
    acquire,
    acquire,
    acquire,
    acquire,
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("fail"), st.integers(0, 20)),
    st.tuples(st.just("fail"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("wait"), st.sampled_from([1, 2, 4, 8])),  # 1/4 s
    st.tuples(
        st.just("rate_limit"),
        member,
        st.none() | st.sampled_from([0.0, 0.5, 2.0, 30.0]),
    ),
    st.tuples(st.just("resume"), member),
    st.tuples(st.just("set_limit"), member, member_limits),
    st.tuples(st.just("set_limit"), member, adaptive_limits),
    st.tuples(st.just("answer"), st.integers(0, 20), st.none() | figures),
    st.tuples(st.just("answer"), st.integers(0, 20), figures),
    st.tuples(st.just("observe"), member, figures),
    st.tuples(st.just("usage"), st.integers(0, 20), st.integers(0, 60)),
    st.tuples(st.just("verdict"), member, st.sampled_from([1, 1, 0, -1, -2])),
    st.tuples(st.just("set_tenant"), st.sampled_from(["t1", "t2"]), tenant_settings),
    st.tuples(st.just("model_observe"), member, st.just("m1"), figures),
)
# Small ones too, so that a model holds its head back now and then.
model_budgets = st.dictionaries(
    member,
    st.sampled_from(
        [
            Budget(requests_per_minute=rpm, tokens_per_minute=tpm)
            for rpm in (None, 1.0, 3.0)
            for tpm in (None, 20.0, 600.0)
            if rpm or tpm
        ]
    ),
)


class GroupPair(Stage):
    """The pure core's pools and the ledger's group, side by side, at one instant."""

    def __init__(
        self,
        client: coredis.Redis[str],
        ledger: Ledger,
        policy: SlotPolicy,
        base_ms: int,
    ) -> None:
        book = SharedBook("n", GROUP, pooled=True)
        super().__init__(client, ledger, policy, base_ms, book)
        # The member of each lease the ledger granted.
        self.on: dict[str, str] = {}
        # Each member's models' budgets, as this process saw them.
        self.models = {name: SeenModels() for name in MEMBERS}

    async def round(
        self,
        figures: list[tuple[str, str | None, RateLimitInfo]] | None = None,
        verdicts: list[tuple[str, int]] | None = None,
    ) -> list[Ticket]:
        """One round of the book, then one more, which must grant nothing.

        Every waiter of a group's book is published in the first: its step
        grants all that the pure core's fill grants, or the second would.
        """
        granted = await self.step(figures, verdicts)
        assert await self.step() == [], "\n".join(self.log)
        return granted

    async def step(
        self,
        figures: list[tuple[str, str | None, RateLimitInfo]] | None = None,
        verdicts: list[tuple[str, int]] | None = None,
    ) -> list[Ticket]:
        book = self.book
        plan = book.plan(None, renew=False)
        result = await self.ledger.step(
            GROUP,
            book.node,
            plan,
            waiting=book.waiting,
            members=MEMBERS,
            pools=POOLS,
            member_figures=figures or (),
            member_verdicts=verdicts or (),
            failure_threshold=FAILURE_THRESHOLD,
            failure_cooldown=FAILURE_COOLDOWN,
            affinity_wait=AFFINITY_WAIT,
        )
        self.result = result
        for name, seen in result.members.items():
            self.models[name].update(seen, self.now)
        assert len(result.granted_on) == len(result.granted)
        for queued, name in zip(result.granted, result.granted_on, strict=True):
            self.on[queued[17:]] = name
        return book.applied(plan, result.granted, result.granted_on)

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
        same_tenants(policy, result, self.now, where)
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
            health = (
                seen.failures,
                None if seen.out_for is None else self.now + seen.out_for,
                seen.half_open,
                seen.outages,
            )
            assert health == (
                pure_member.failures,
                pure_member.out_of_service_until,
                pure_member.half_open,
                pure_member.outages_total,
            ), where
            assert (seen.affinity_hits, seen.affinity_moves) == (
                pure_member.affinity_hits,
                pure_member.affinity_moves,
            ), where
            same_budgets(
                policy.budget_statistics(self.now, member=name), seen.budget, where
            )
            pure_models = policy.model_budget_statistics(self.now, member=name)
            shown = SharedView(models=self.models[name]).model_statistics(self.now)
            assert set(shown) == set(pure_models), where
            for model, pure_budget in pure_models.items():
                same_budgets(pure_budget, shown[model], where)


async def _apply(pair: GroupPair, op: tuple[object, ...]) -> None:
    policy, book, ledger = pair.policy, pair.book, pair.ledger
    kind = op[0]
    pure: list[Ticket] = []
    figures: list[tuple[str, str | None, RateLimitInfo]] = []
    verdicts: list[tuple[str, int]] = []
    pair.log.append(f"t={pair.now} {op!r}")
    if kind == "wait":
        pair.ms += 250 * as_int(op[1])
        await pair.set_clock()
        pure = policy.tick(pair.now)
    elif kind == "acquire":
        older, priority, lane, avoid, tokens, prefer = op[1:7]
        tenant, model = op[7:9] if len(op) > 7 else (None, None)
        assert lane is None or isinstance(lane, str)
        assert prefer is None or isinstance(prefer, str)
        assert tenant is None or isinstance(tenant, str)
        assert model is None or isinstance(model, str)
        assert isinstance(avoid, frozenset | set)
        avoided = sorted(avoid)
        rank = pair.now - as_int(older) - as_int(priority) * AGING
        ticket = Ticket(rank, pair.seq, as_int(priority), tenant, model)
        pair.seq += 1
        pair.tickets.append(ticket)
        # The ticket's lane as the dispatcher gives it: a member's or a
        # pool's name (a member asked for avoids nothing), or any member.
        pure = policy.acquire(
            ticket, as_int(tokens), member=lane, prefer=prefer, avoid=avoided
        )
        shown = [] if lane in MEMBERS else avoided
        book.acquire(
            ticket,
            rank,
            pair.now + ticket.seq * 1e-6,
            as_int(tokens),
            lane=lane_text(lane, shown, prefer),
        )
    elif kind in {"release", "fail", "usage", "answer"}:
        holder = pick(sorted(policy.holders()), op[1])
        if holder is None:
            return
        if kind == "release":
            pure = policy.release(holder)
            book.release(holder)
        elif kind == "fail":
            pure = policy.fail(holder, pair.now)
            book.fail(holder)
        elif kind == "usage":
            pure = policy.report_usage(holder, as_int(op[2]))
            book.report_usage(holder, as_int(op[2]))
        else:
            policy.answered(holder)
            book.answered(holder)
            info = op[2]
            if isinstance(info, RateLimitInfo):
                # An answer's figures teach the member that answered, its
                # model's budget for an answer of a model.
                answering = policy.member_of(holder)
                assert answering is not None
                pure = _learn(policy, pair.now, info, answering, holder.model)
                figures.append((answering, holder.model, info))
    elif kind == "observe":
        name, info = op[1], op[2]
        assert isinstance(name, str)
        assert isinstance(info, RateLimitInfo)
        pure = _learn(policy, pair.now, info, name)
        figures.append((name, None, info))
    elif kind == "model_observe":
        name, model_name, info = op[1], op[2], op[3]
        assert isinstance(name, str)
        assert isinstance(model_name, str)
        assert isinstance(info, RateLimitInfo)
        pure = _learn(policy, pair.now, info, name, model_name)
        figures.append((name, model_name, info))
    elif kind == "verdict":
        name, change = op[1], as_int(op[2])
        assert isinstance(name, str)
        pure = policy.apply_latency_verdict(change, member=name)
        if change:
            verdicts.append((name, change))
    elif kind == "cancel":
        victim = pick(pair.tickets, op[1])
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
    elif kind == "set_tenant":
        name, tenant_settings = op[1], op[2]
        assert isinstance(name, str)
        assert tenant_settings is None or isinstance(tenant_settings, Tenant)
        pure = policy.set_tenant(name, tenant_settings)
        await ledger.set_tenant(GROUP, name, tenant_settings, members=MEMBERS)
    elif kind == "resume":
        name = op[1]
        assert isinstance(name, str)
        pure = policy.resume(member=name)
        await ledger.resume(GROUP, member=name)
    else:
        assert kind == "set_limit"
        name, limit = op[1], op[2]
        assert isinstance(name, str)
        assert limit is None or isinstance(limit, int | AdaptiveLimit)
        pure = policy.set_limit(limit, member=name)
        await ledger.set_limit(GROUP, limit, member=name)
    pair.compare(pure, await pair.round(figures, verdicts))


def _learn(
    policy: SlotPolicy,
    now: float,
    info: RateLimitInfo,
    member: str,
    model: str | None = None,
) -> list[Ticket]:
    """A member's figures learned (its model's), and what its budgets then let through."""
    learned = policy.observe_rate_limits(now, info, model, member=member)
    return learned + policy.tick(now)


async def replay(
    url: str,
    limits: dict[str, int | None],
    ops: list[tuple[object, ...]],
    budgets: dict[str, Budget | None] | None = None,
    models: dict[str, Budget] | None = None,
) -> None:
    """Apply ``ops`` to both sides, comparing them after each (see the module).

    ``models``: each member's budget of model ``m1``, configured from the start.
    """
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        base_ms = math.ceil((await client.time()).timestamp() * 1000)
        ledger = Ledger(client, uuid.uuid4().hex, LEASE, scripts=SCRIPTS)
        budgets = budgets or {}

        def throttle(name: str) -> Throttle | None:
            budget = budgets.get(name)
            return None if budget is None else Throttle(budget, now=0.0)

        first, *others = MEMBERS
        policy = SlotPolicy(
            limits[first],
            provider=first,
            default_pause=DEFAULT_PAUSE,
            max_pause=MAX_PAUSE,
            throttle=throttle(first),
            failure_threshold=FAILURE_THRESHOLD,
            failure_cooldown=FAILURE_COOLDOWN,
            affinity_wait=AFFINITY_WAIT,
        )
        for name in others:
            policy.add_member(name, limits[name], throttle=throttle(name))
        for pool, names in POOLS.items():
            policy.set_pool(pool, names)
        pair = GroupPair(client, ledger, policy, base_ms)
        await pair.set_clock()
        for name in MEMBERS:
            await ledger.set_limit(GROUP, limits[name], member=name)
            budget = budgets.get(name)
            if budget is not None:
                await ledger.set_budget(GROUP, budget, member=name)
        for name, own in (models or {}).items():
            policy.set_model_budget("m1", own, member=name)
            await ledger.set_budget(
                GROUP, own, model="m1", member=name, members=MEMBERS
            )
        pair.log.append(f"limits={limits!r} budgets={budgets!r} models={models!r}")
        pair.compare([], await pair.round())
        for op in ops:
            await _apply(pair, op)


@examples(in_ci=120)
@given(
    limits=st.fixed_dictionaries(dict.fromkeys(MEMBERS, member_limits)),
    budgets=st.fixed_dictionaries(dict.fromkeys(MEMBERS, budgets)),
    models=model_budgets,
    ops=st.lists(operation, min_size=20, max_size=80),
)
async def test_the_ledger_grants_a_group_as_the_pure_core_grants_its_pools(
    shared_server: RedisServer,
    limits: dict[str, int | None],
    budgets: dict[str, Budget | None],
    models: dict[str, Budget],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, limits, ops, budgets, models)


# What the differential test is sure to meet, kept as cases.
@pytest.mark.parametrize(
    ("limits", "ops"),
    [
        pytest.param(
            {"a": 1, "b": 2, "c": 1},
            [
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
            ],
            id="a_pool_fills_the_member_with_the_most_free_slots_first",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, "b", set(), 0, None),
                ("acquire", 1, 0, "p", set(), 0, None),
                ("acquire", 2, 0, "a", set(), 0, None),
                ("acquire", 3, 0, "p", set(), 0, None),
                ("release", 0),
                ("release", 0),
            ],
            id="oldest_turn_first_across_a_pool_and_its_members",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, None, {"a", "b"}, 0, None),
                ("acquire", 0, 0, "q", {"c"}, 0, None),
                ("acquire", 0, 0, "p", {"a", "b"}, 0, None),
            ],
            id="avoided_members_unless_none_is_left",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, "a", set(), 0, None),
                ("acquire", 0, 0, "b", set(), 0, None),
                ("acquire", 5, 0, "p", {"a"}, 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                # a frees: the older entry avoids it and waits for b; its
                # lane (p less a) held back holds back none of p's others.
                ("release", 0),
            ],
            id="a_lane_less_its_avoided_members_is_held_back_alone",
        ),
        pytest.param(
            {"a": 2, "b": 2, "c": None},
            [
                ("rate_limit", "b", 2.0),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "b", set(), 0, None),
                ("wait", 8),
                ("rate_limit", "c", None),
                ("acquire", 0, 0, "q", set(), 0, None),
                ("resume", "b"),
            ],
            id="a_paused_member_takes_nothing_until_its_pause_ends",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            [
                ("acquire", 0, 0, "a", set(), 0, None),
                ("acquire", 0, 0, "a", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("set_limit", "a", 3),
                ("set_limit", "b", None),
                ("acquire", 0, 0, "b", set(), 0, None),
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


TOKENS = Budget(tokens_per_minute=60.0)


# What random sequences reach only now and then, kept as cases.
@pytest.mark.parametrize(
    ("limits", "budgets", "ops"),
    [
        pytest.param(
            {"a": 3, "b": 1, "c": 1},
            {"a": TOKENS},
            [
                ("acquire", 0, 0, "a", set(), 50, None),
                ("acquire", 0, 0, "b", set(), 0, None),
                # a's budget holds this one back, b is full: it waits, and
                # so does the next for a, which may not pass it there.
                ("acquire", 0, 0, "p", set(), 50, None),
                ("acquire", 0, 0, "a", set(), 5, None),
                # b frees: the pool's goes there, and a opens again for
                # the one its budget holds.
                ("release", 1),
            ],
            id="a_member_a_budget_shut_opens_again_when_its_entry_goes_elsewhere",
        ),
        pytest.param(
            {"a": 2, "b": 2, "c": 1},
            {"a": TOKENS, "b": Budget(requests_per_minute=6.0)},
            [
                ("acquire", 0, 0, "p", set(), 40, None),
                ("acquire", 0, 0, "p", set(), 40, None),
                ("acquire", 0, 0, "p", set(), 40, None),
                ("answer", 0, RateLimitInfo(tokens=Quota(limit=60, remaining=0))),
                ("wait", 8),
                ("acquire", 0, 0, "p", set(), 10, None),
                ("wait", 16),
            ],
            id="each_member_learns_its_own_figures_and_grants_by_its_own_budget",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            {},
            [
                ("set_limit", "b", AdaptiveLimit(initial=1, minimum=1, maximum=4)),
                ("acquire", 0, 0, "b", set(), 0, None),
                ("acquire", 0, 0, "b", set(), 0, None),
                ("release", 0),
                ("rate_limit", "b", None),
                (
                    "set_limit",
                    "c",
                    AdaptiveLimit(initial=1, minimum=1, maximum=4, signal="latency"),
                ),
                ("verdict", "c", 1),
                ("acquire", 0, 0, "c", set(), 0, None),
                ("acquire", 0, 0, "c", set(), 0, None),
            ],
            id="each_member_has_its_own_adaptive_limit",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_agree_on_a_groups_budgets(
    shared_server: RedisServer,
    limits: dict[str, int | None],
    budgets: dict[str, Budget | None],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, limits, ops, budgets)


async def test_what_a_groups_ledger_does_not_take_yet_is_refused_at_once(
    shared_server: RedisServer,
) -> None:
    # Refused before anything reaches Redis: a group's provider-wide
    # figures or verdicts, a provider's member figures, a pool naming a
    # stranger, a pool with a member's name or none.
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        ledger = Ledger(client, uuid.uuid4().hex, LEASE)
        info = RateLimitInfo(requests=Quota(limit=10, remaining=5))
        with pytest.raises(ValueError, match="name their member"):
            await ledger.step(GROUP, "n", observed=info, members=MEMBERS)
        with pytest.raises(ValueError, match="name their member"):
            await ledger.step(GROUP, "n", verdicts=[1], members=MEMBERS)
        with pytest.raises(ValueError, match="no member's figures"):
            await ledger.step(GROUP, "n", member_figures=[("a", None, info)])
        with pytest.raises(ValueError, match="must name members of the group"):
            await ledger.step(GROUP, "n", members=MEMBERS, pools={"x": ("a", "z")})
        with pytest.raises(ValueError, match="must name members of the group"):
            await ledger.step(GROUP, "n", members=MEMBERS, pools={"a": ("b", "c")})
        with pytest.raises(ValueError, match="must name members of the group"):
            await ledger.step(GROUP, "n", members=MEMBERS, pools={"x": ()})
        # Nothing of the group reached Redis.
        assert not await client.keys(f"{{{ledger.namespace}:*")


# A member's health: out of service after two failures in a row, half-open
# after its cooldown with one probe first, back in service when the probe
# succeeds, out again when it fails.
@pytest.mark.parametrize(
    "ops",
    [
        pytest.param(
            [
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("fail", 0),  # on b
                ("acquire", 0, 0, "p", set(), 0, None),
                ("fail", 1),  # on b again: out of service
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "b", set(), 0, None),
                ("release", 0),
                ("wait", 8),  # half-open: the probe goes to b first
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("release", 0),
                ("release", 0),
            ],
            id="a_probe_that_succeeds_puts_its_member_back_in_service",
        ),
        pytest.param(
            [
                ("acquire", 0, 0, "p", set(), 0, None),
                ("fail", 0),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("fail", 0),
                ("wait", 8),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("fail", 0),  # the probe fails: out again
                ("acquire", 0, 0, "b", set(), 0, None),
                ("wait", 8),
                ("cancel", 4),
            ],
            id="a_probe_that_fails_takes_its_member_out_again",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_agree_on_a_members_health(
    shared_server: RedisServer, ops: list[tuple[object, ...]]
) -> None:
    await replay(shared_server.url, {"a": 2, "b": 2, "c": 1}, ops)


async def test_a_half_open_member_takes_its_probe_before_one_with_more_free_slots(
    shared_server: RedisServer,
) -> None:
    ops: list[tuple[object, ...]] = [
        ("acquire", 0, 0, "b", set(), 0, None),
        ("acquire", 0, 0, "b", set(), 0, None),
        ("fail", 0),
        ("acquire", 0, 0, "b", set(), 0, None),
        ("fail", 1),  # out, one slot still held
        ("wait", 8),  # half-open, one slot free against a's three
        ("acquire", 0, 0, "p", set(), 0, None),  # b's probe
        ("acquire", 0, 0, "p", set(), 0, None),  # a: b takes nothing more
    ]
    await replay(shared_server.url, {"a": 3, "b": 2, "c": 1}, ops)


# Affinity: a request waits for the member it prefers alone, at most the
# affinity wait, then goes to any of its pool with that member first; a
# pause of that member ends its wait at once; one member to choose from
# (the others avoided) is no preference at all.
@pytest.mark.parametrize(
    "ops",
    [
        pytest.param(
            [
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, "b"),  # waits for b
                ("acquire", 0, 0, "a", set(), 0, None),
                ("release", 1),  # a frees: the next for a, not b's
                ("wait", 4),  # its wait ends: a's next free slot
                ("release", 0),
            ],
            id="a_wait_for_the_preferred_member_ends_after_the_affinity_wait",
        ),
        pytest.param(
            [
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, None),
                ("acquire", 0, 0, "p", set(), 0, "b"),
                ("rate_limit", "b", 0.5),  # b paused: its wait ends now
                ("release", 1),
                ("wait", 4),
                ("acquire", 0, 0, None, {"a", "c"}, 0, "b"),
            ],
            id="a_pause_of_the_preferred_member_ends_the_wait_for_it",
        ),
        pytest.param(
            [
                ("acquire", 0, 0, "p", set(), 0, "a"),
                ("acquire", 0, 0, "p", set(), 0, "b"),
                ("acquire", 0, 0, "p", {"b"}, 0, "b"),
                ("acquire", 0, 0, "b", set(), 0, "a"),
                ("release", 0),
                ("release", 0),
            ],
            id="a_preference_counts_hits_and_moves",
        ),
        pytest.param(
            [
                ("rate_limit", "a", 2.0),
                # a is paused: no wait for it, b takes it at once.
                ("acquire", 0, 0, "p", set(), 0, "a"),
            ],
            id="no_wait_for_a_preferred_member_paused",
        ),
        pytest.param(
            [
                ("set_limit", "b", 2),
                ("rate_limit", "a", 0.5),
                ("rate_limit", "b", 0.5),
                ("acquire", 0, 0, "p", set(), 0, "a"),
                # Both pauses end: a, preferred, before b's two free slots.
                ("wait", 4),
            ],
            id="the_preferred_member_first_once_it_is_not_waited_for",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_agree_on_affinity(
    shared_server: RedisServer, ops: list[tuple[object, ...]]
) -> None:
    await replay(shared_server.url, {"a": 1, "b": 1, "c": 1}, ops)


async def test_a_groups_slot_goes_to_the_tenant_with_the_least_service(
    shared_server: RedisServer,
) -> None:
    # t1 held the pool's two slots for two seconds, t2 none: the slot given
    # back goes to t2's request, younger though it is.
    ops: list[tuple[object, ...]] = [
        ("acquire", 0, 0, "p", set(), 0, None, "t1", None),
        ("acquire", 0, 0, "p", set(), 0, None, "t1", None),
        ("acquire", 0, 0, "p", set(), 0, None, "t1", "m1"),
        ("acquire", 0, 0, "p", set(), 0, None, "t2", None),
        ("wait", 8),
        ("release", 0),
        ("set_tenant", "t1", Tenant(weight=2.0, limit=1)),
        ("release", 0),
    ]
    await replay(shared_server.url, {"a": 1, "b": 1, "c": 1}, ops)


async def test_a_half_open_members_probe_kept_for_another_process_is_its_only_slot(
    shared_server: RedisServer,
) -> None:
    # b is half-open: its one slot is its probe's. Process 1's older entry,
    # for b, is its probe, kept for it until it asks; process 2's younger
    # entry for the pool goes to a, not to b as a second probe.
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        ledger = Ledger(client, uuid.uuid4().hex, LEASE)
        await ledger.set_limit(GROUP, 2, member="a")
        await ledger.set_limit(GROUP, 2, member="b")
        await ledger.set_limit(GROUP, 1, member="c")
        first = SharedBook("one", GROUP, pooled=True)
        second = SharedBook("two", GROUP, pooled=True)

        async def step(book: SharedBook) -> StepResult:
            plan = book.plan(None, renew=False)
            result = await ledger.step(
                GROUP,
                book.node,
                plan,
                waiting=book.waiting,
                members=MEMBERS,
                pools=POOLS,
                failure_threshold=1,
                failure_cooldown=0.05,
            )
            book.applied(plan, result.granted, result.granted_on)
            return result

        # A call on b fails: b is out for 50 ms, then half-open.
        failing = Ticket(0.0, 0, 0)
        first.acquire(failing, 0.0, 0.0, lane=lane_text("b"))
        assert (await step(first)).granted_on == ["b"]
        first.fail(failing)
        older = Ticket(1.0, 1, 0)
        first.acquire(older, 1.0, 1.0, lane=lane_text("b"))
        result = await step(first)
        assert result.members["b"].out_for is not None
        assert result.granted_on == []  # b is out: it waits
        await trio.sleep(0.1)
        younger = Ticket(2.0, 1, 0)
        second.acquire(younger, 2.0, 2.0, lane=lane_text("p"))
        result = await step(second)
        assert result.members["b"].half_open
        assert result.granted_on == ["a"]
        # Process 1 asks: its entry is b's probe, and b takes nothing more.
        result = await step(first)
        assert result.granted_on == ["b"]
        assert result.members["b"].in_flight == 1


async def test_a_members_model_budget_passes_it_over_for_that_model_until_its_entry_goes_elsewhere(
    shared_server: RedisServer,
) -> None:
    ops: list[tuple[object, ...]] = [
        ("acquire", 0, 0, "a", set(), 50, None, None, "m1"),
        ("acquire", 0, 0, "b", set(), 0, None, None, None),
        # a's budget of m1 holds this one back, b is full: it waits, and so
        # does the next of m1 for a, which may not pass it there.
        ("acquire", 0, 0, "p", set(), 50, None, None, "m1"),
        ("acquire", 0, 0, "a", set(), 5, None, None, "m1"),
        # b frees: the pool's goes there, and a takes m1's next again.
        ("release", 1),
        (
            "model_observe",
            "b",
            "m1",
            RateLimitInfo(tokens=Quota(limit=30, remaining=0)),
        ),
        ("acquire", 0, 0, "b", set(), 5, None, None, "m1"),
        ("wait", 16),
    ]
    await replay(shared_server.url, {"a": 3, "b": 1, "c": 1}, ops, models={"a": TOKENS})


async def test_a_members_settings_without_a_limit_go_with_the_rest(
    shared_server: RedisServer,
) -> None:
    # Unlimited members (no limit stored): a failure writes member b's
    # health into its conf, which then expires with the group's leases and
    # entries, as a provider's conf without a limit does. Nothing is left.
    async with coredis.Redis.from_url(
        shared_server.url, decode_responses=True
    ) as client:
        ledger = Ledger(client, uuid.uuid4().hex, 2.0)
        book = SharedBook("n", GROUP, pooled=True)

        async def step() -> StepResult:
            plan = book.plan(None, renew=False)
            result = await ledger.step(
                GROUP,
                "n",
                plan,
                waiting=book.waiting,
                members=MEMBERS,
                pools=POOLS,
                failure_threshold=5,
            )
            book.applied(plan, result.granted, result.granted_on)
            return result

        ticket = Ticket(0.0, 0, 0)
        book.acquire(ticket, 0.0, 0.0, lane=lane_text("p"))
        assert (await step()).granted_on == ["b"]  # p's first, all unlimited
        book.fail(ticket)
        assert (await step()).members["b"].failures == 1
        member_conf = ledger.names(GROUP)[0][0][: -len("leases")] + "@b:conf"
        ttl = await client.pttl(member_conf)
        assert 0 < ttl <= 2000
        await trio.sleep(2.5)  # every lease, entry and process expired
        assert not await client.keys(f"{{{ledger.namespace}:*")
