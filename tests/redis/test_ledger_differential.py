"""The Redis ledger against the pure core, on the same random operations.

Every scheduling rule is written once, in the pure core (``SlotPolicy`` and
its ``Throttle``); the ledger's Lua repeats them only because Redis needs
atomic steps. This test holds the copy to the original: a generated
sequence of operations (requests with a rank, a priority and a token
estimate, releases, cancellations, rate-limit answers with and without
``Retry-After``, usage reports, answers with and without rate-limit
figures, limit changes to fixed and adaptive limits, the verdicts of a
latency signal, resumes, and time passing) is applied to a ``SlotPolicy`` and to one process's
``SharedBook`` driving a ``Ledger`` on a real redis-server, and after every
operation both must have granted the same tickets in the same order, and
agree on the limit, the holders, the waiters, the pause left and the
budgets' levels and rates.

Time. The scripts read their clock from ``clock.lua``; here it is composed
with a clock the test sets (a key beside the provider's, in milliseconds,
starting at the server's own time so that the keys' expiry stays ahead),
so both sides see the same instants. Steps of time are multiples of 250 ms,
exact in seconds and in milliseconds; the budgets still refill by
``rate * seconds`` on one side and ``rate / 1000 * milliseconds`` on the
other, so levels agree to a relative 1e-9 (and grants, whose check has the
same 1e-9 slack on both sides, exactly). Leases live an hour: nothing
expires in an example, as nothing does in the pure core.

The actor sends an answer's start and its figures in one round, and so
does this test (``answer``); figures that come with no answer (``observe``)
go alone. A budget is configured, or not: then the budgets are learned
from scratch, and both sides keep the books of grants (charges, answers
not started) from the moment the pure core's ``Throttle`` exists (made by
a budget, the first figures, usable or not, or an adaptive limit), and
charge a request the estimate it was queued with, whenever its budget
came.

Tenants and models. Requests carry a tenant (or none) and a model (or
none); tenants are configured, changed and removed at random (weights and
caps), and both sides must agree on every tenant's weight, cap, holders
and service counter besides the grants. Each model of the example may get
a budget of its own from the start, and the figures of an answer go to its
model's budget (learned from the first of them, if it has none), those of
an answer for no model to the provider's (``model_observe`` sends a
model's figures alone); both sides must agree on each model's budgets too.
A step answers the budgets of the models it met only, so the ledger's side
is what the process sees of them (``SeenModels``, as its scheduler keeps
them), learned budgets forgotten on both sides by the same rule.

Latency. A latency-signal adaptive limit moves by the verdicts of a
process's own ``LatencySignal``; the signal itself runs in the process,
not in Lua, so what is held here is the move: a verdict (``verdict``: a
change of the limit) goes to ``SlotPolicy.apply_latency_verdict`` on one
side and with the next step on the other, and both must agree on the
limit and on what it lets through, slow start, bounds and the rate-limit
decreases between them included. Successes move such a limit on neither
side.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING

import coredis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import Tenant
from trio_dispatch._policy._budgets import AdaptiveLimit, Budget, Throttle
from trio_dispatch._policy._ratelimits import Quota, RateLimitInfo
from trio_dispatch._policy._slots import SlotPolicy
from trio_dispatch._redis._book import SharedBook
from trio_dispatch._redis._ledger import Ledger, SeenModels
from trio_dispatch._redis._scheduler import SharedView
from trio_dispatch._redis._scripts import load_scripts
from trio_dispatch.messages._protocol import Ticket

from .._ledger_pairs import Stage, as_int, examples, pick, same_budgets, same_tenants
from .._redis import needs_redis

if TYPE_CHECKING:
    from .._redis import RedisServer

pytestmark = needs_redis

# The server's clock replaced by one the test sets (see the module notes).
TEST_CLOCK = "local now = tonumber(redis.call('GET', KEYS[1] .. ':clock'))\n"
SCRIPTS = load_scripts(TEST_CLOCK)

PROVIDER = "p"
LEASE = 3600.0
DEFAULT_PAUSE = 1.0
MAX_PAUSE = 8.0
AGING = 10.0

quotas = st.builds(
    Quota,
    limit=st.none() | st.integers(1, 40),
    remaining=st.none() | st.integers(0, 40),
    reset=st.none() | st.sampled_from([0.5, 1.0, 2.0, 30.0, 120.0, 86400.0]),
)
figures = st.builds(
    RateLimitInfo, requests=st.none() | quotas, tokens=st.none() | quotas
)
limits = st.sampled_from([1, 2, 3, 5, None]) | st.builds(
    AdaptiveLimit,
    initial=st.integers(1, 3),
    minimum=st.just(1),
    maximum=st.integers(3, 9),
    backoff=st.sampled_from([0.5, 0.75, 0.9]),
    signal=st.sampled_from(["rate_limits", "latency"]),
)
TENANTS = ("a", "b", "c")
MODELS = ("m1", "m2")
acquire = st.tuples(
    st.just("acquire"),
    st.integers(0, 4),  # how many seconds older its turn is
    st.integers(0, 2),  # priority class
    st.sampled_from([0, 0, 1, 5, 20, 50]),  # estimated tokens
)
tenant_acquire = st.tuples(
    st.just("acquire"),
    st.integers(0, 4),
    st.integers(0, 2),
    st.sampled_from([0, 0, 1, 5, 20, 50]),
    st.sampled_from([None, None, *TENANTS]),
    st.sampled_from([None, *MODELS]),
)
tenant_settings = st.none() | st.builds(
    Tenant,
    weight=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    limit=st.none() | st.integers(1, 2),
)
release = st.tuples(st.just("release"), st.integers(0, 20))
wait = st.tuples(st.just("wait"), st.sampled_from([1, 2, 4, 4, 8, 16]))  # 1/4 s
rate_limit = st.tuples(
    st.just("rate_limit"),
    st.none() | st.sampled_from([0.0, 0.5, 2.0, 30.0]),
)
# Weighted towards what moves the order, the pauses and the budgets.
operation = st.one_of(
    acquire,
    acquire,
    acquire,
    release,
    release,
    wait,
    wait,
    rate_limit,
    rate_limit,
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("usage"), st.integers(0, 20), st.integers(0, 60)),
    st.tuples(st.just("answer"), st.integers(0, 20), st.none() | figures),
    st.tuples(st.just("observe"), figures),
    st.tuples(st.just("set_limit"), limits),
    st.tuples(st.just("resume")),
    st.tuples(st.just("verdict"), st.sampled_from([1, 1, 1, 0, -1, -2])),
)
# The same, with tenants and models.
tenant_operation = st.one_of(
    operation,
    tenant_acquire,
    tenant_acquire,
    tenant_acquire,
    tenant_acquire,
    release,
    release,
    st.tuples(st.just("set_tenant"), st.sampled_from(TENANTS), tenant_settings),
    st.tuples(st.just("model_observe"), st.sampled_from(MODELS), figures),
)
# Small ones too, so that a model holds its head back now and then.
model_budgets = st.dictionaries(
    st.sampled_from(MODELS),
    st.sampled_from(
        [
            Budget(requests_per_minute=rpm, tokens_per_minute=tpm)
            for rpm in (None, 1.0, 3.0, 60.0)
            for tpm in (None, 20.0, 600.0)
            if rpm or tpm
        ]
    ),
)
budgets = st.none() | st.sampled_from(
    [
        Budget(requests_per_minute=rpm, tokens_per_minute=tpm)
        for rpm in (None, 6.0, 30.0, 120.0)
        for tpm in (None, 60.0, 600.0)
        if rpm or tpm
    ]
)


class Pair(Stage):
    """The pure core and the ledger, side by side, at one instant."""

    def __init__(
        self,
        client: coredis.Redis[str],
        ledger: Ledger,
        policy: SlotPolicy,
        base_ms: int,
    ) -> None:
        super().__init__(client, ledger, policy, base_ms, SharedBook("n", PROVIDER))
        self.limit: int | None = policy.limit
        self.models = SeenModels()

    async def round(
        self,
        observed: RateLimitInfo | None = None,
        model: str | None = None,
        verdicts: list[int] | None = None,
    ) -> list[Ticket]:
        """Rounds of the book until nothing more is granted or published."""
        granted: list[Ticket] = []
        for _ in range(4):
            book = self.book
            plan = book.plan(self.limit, renew=False)
            result = await self.ledger.step(
                PROVIDER,
                book.node,
                plan,
                waiting=book.waiting,
                observed=observed if model is None else None,
                observed_models=None
                if model is None or observed is None
                else {model: observed},
                verdicts=verdicts or [],
            )
            observed = verdicts = None
            self.result = result
            self.models.update(result, self.now)
            grants = book.applied(plan, result.granted)
            granted += grants
            limit_moved = result.limit != self.limit
            self.limit = result.limit
            grouped = result.counting and book.group()
            if not grants and not limit_moved and not grouped:
                break
        return granted

    def compare(self, pure: list[Ticket], shared: list[Ticket]) -> None:
        policy, result, book = self.policy, self.result, self.book
        assert result is not None
        where = "\n".join(self.log)
        assert shared == pure, where
        assert result.limit == policy.limit, where
        assert book.holders() == policy.holders(), where
        assert book.waiters() == policy.waiters(), where
        assert result.in_flight == policy.in_flight, where
        until = policy.paused_until
        left = (
            0
            if until is None or until <= self.now
            else round((until - self.now) * 1000)
        )
        assert round(result.paused_for * 1000) == left, where
        same_tenants(policy, result, self.now, where)
        models = policy.model_budget_statistics(self.now)
        seen = SharedView(models=self.models).model_statistics(self.now)
        assert set(seen) == set(models), where
        for name, pure_budget in models.items():
            same_budgets(pure_budget, seen[name], where)
        same_budgets(policy.budget_statistics(self.now), result.budget, where)


def _learn(
    policy: SlotPolicy, now: float, info: RateLimitInfo, model: str | None
) -> list[Ticket]:
    """Figures learned, and what the budgets then let through.

    The policy grants nothing as it learns: its actor looks again at
    ``wake_at``, the budgets' ready time, which figures that raised a level
    have brought to now; the ledger's step grants in the same round.
    """
    return policy.observe_rate_limits(now, info, model) + policy.tick(now)


def _name(value: object) -> str | None:
    assert value is None or isinstance(value, str)
    return value


async def _apply(pair: Pair, op: tuple[object, ...]) -> None:
    policy, book, ledger = pair.policy, pair.book, pair.ledger
    kind = op[0]
    pure: list[Ticket] = []
    observed: RateLimitInfo | None = None
    model: str | None = None
    verdicts: list[int] = []
    pair.log.append(f"t={pair.now} {op!r}")
    if kind == "wait":
        pair.ms += 250 * as_int(op[1])
        await pair.set_clock()
        pure = policy.tick(pair.now)
        pair.compare(pure, await pair.round())
        return
    if kind == "acquire":
        older, priority, tokens = as_int(op[1]), as_int(op[2]), as_int(op[3])
        tenant = _name(op[4]) if len(op) > 4 else None
        model = _name(op[5]) if len(op) > 4 else None
        rank = pair.now - older - priority * AGING
        ticket = Ticket(rank, pair.seq, priority, tenant, model)
        pair.seq += 1
        pair.tickets.append(ticket)
        pure = policy.acquire(ticket, tokens)
        # The actor's wall-clock start is the rank on its clock.
        book.acquire(ticket, rank, pair.now + ticket.seq * 1e-6, tokens)
    elif kind in {"release", "usage", "answer"}:
        holder = pick(sorted(policy.holders()), op[1])
        if holder is None:
            return
        if kind == "release":
            pure = policy.release(holder)
            book.release(holder)
        elif kind == "usage":
            pure = policy.report_usage(holder, as_int(op[2]))
            book.report_usage(holder, as_int(op[2]))
        else:
            policy.answered(holder)
            book.answered(holder)
            if isinstance(op[2], RateLimitInfo):
                observed = op[2]
                # An answer's figures teach its model's budget, as the
                # dispatcher's (see the module notes).
                model = holder.model
                pure = _learn(policy, pair.now, observed, model)
    elif kind == "cancel":
        victim = pick(pair.tickets, op[1])
        if victim is None:
            return
        pure = policy.cancel(victim)
        book.cancel(victim)
    elif kind == "rate_limit":
        retry_after = op[1]
        assert retry_after is None or isinstance(retry_after, float)
        policy.report_rate_limit(pair.now, retry_after)
        await ledger.pause(
            PROVIDER,
            retry_after,
            default_pause=DEFAULT_PAUSE,
            max_pause=MAX_PAUSE,
        )
    elif kind == "observe":
        assert isinstance(op[1], RateLimitInfo)
        observed = op[1]
        pure = _learn(policy, pair.now, observed, None)
    elif kind == "model_observe":
        assert isinstance(op[1], str)
        assert isinstance(op[2], RateLimitInfo)
        model, observed = op[1], op[2]
        pure = _learn(policy, pair.now, observed, model)
    elif kind == "set_tenant":
        assert isinstance(op[1], str)
        settings = op[2]
        assert settings is None or isinstance(settings, Tenant)
        pure = policy.set_tenant(op[1], settings)
        await ledger.set_tenant(PROVIDER, op[1], settings)
    elif kind == "set_limit":
        limit = op[1]
        assert limit is None or isinstance(limit, int | AdaptiveLimit)
        pure = policy.set_limit(limit)
        await ledger.set_limit(PROVIDER, limit)
    elif kind == "verdict":
        # What a process's signal found at the end of a round: only a
        # non-zero one is sent, as the scheduler sends them.
        change = as_int(op[1])
        pure = policy.apply_latency_verdict(change)
        if change:
            verdicts.append(change)
    else:
        assert kind == "resume"
        pure = policy.resume()
        await ledger.resume(PROVIDER)
    pair.compare(pure, await pair.round(observed, model, verdicts))


async def replay(
    url: str,
    first: int | AdaptiveLimit | None,
    budget: Budget | None,
    ops: list[tuple[object, ...]],
    *,
    models: dict[str, Budget] | None = None,
    tenants: dict[str, Tenant] | None = None,
) -> None:
    """Apply ``ops`` to both sides, comparing them after each (see the module)."""
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        base_ms = math.ceil((await client.time()).timestamp() * 1000)
        ledger = Ledger(client, uuid.uuid4().hex, LEASE, scripts=SCRIPTS)
        policy = SlotPolicy(
            None,
            default_pause=DEFAULT_PAUSE,
            max_pause=MAX_PAUSE,
            throttle=None if budget is None else Throttle(budget, now=0.0),
        )
        pair = Pair(client, ledger, policy, base_ms)
        await pair.set_clock()
        policy.set_limit(first)
        await ledger.set_limit(PROVIDER, first)
        if budget is not None:
            await ledger.set_budget(PROVIDER, budget)
        for model, own in (models or {}).items():
            policy.set_model_budget(model, own)
            await ledger.set_budget(PROVIDER, own, model=model)
        for name, settings in (tenants or {}).items():
            policy.set_tenant(name, settings)
            await ledger.set_tenant(PROVIDER, name, settings)
        pair.log.append(
            f"limit={first!r} budget={budget!r} models={models!r} tenants={tenants!r}"
        )
        pair.compare([], await pair.round())
        for op in ops:
            await _apply(pair, op)


TOKENS = Budget(tokens_per_minute=60.0)
HALVING = AdaptiveLimit(initial=2, minimum=1, maximum=3, backoff=0.5)
LATENCY = AdaptiveLimit(initial=1, minimum=1, maximum=5, signal="latency")


# What the differential test found, each kept as the sequence that shows it.
@pytest.mark.parametrize(
    ("first", "budget", "ops"),
    [
        pytest.param(
            1,
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("rate_limit", None),
                ("set_limit", HALVING),
                ("rate_limit", None),
            ],
            id="a_limit_made_adaptive_within_a_round_of_reports_decreases_at_its_first",
        ),
        pytest.param(
            AdaptiveLimit(initial=6, minimum=1, maximum=6, backoff=0.75),
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("rate_limit", None),
                ("resume",),
                ("rate_limit", None),
            ],
            id="a_report_after_a_resume_with_no_grant_since_does_not_decrease_again",
        ),
        pytest.param(
            AdaptiveLimit(initial=1, minimum=1, maximum=3, backoff=0.5),
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("set_limit", AdaptiveLimit(initial=1, minimum=1, maximum=3)),
                ("release", 0),
            ],
            id="a_slot_held_across_a_new_limit_is_no_success_of_it",
        ),
        pytest.param(
            1,
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("answer", 0, RateLimitInfo(tokens=Quota())),
                ("wait", 1),
                ("usage", 0, 1),
                ("usage", 0, 0),
            ],
            id="token_figures_with_no_usable_field_settle_the_charges_answered",
        ),
        pytest.param(
            2,
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("usage", 0, 1),
                ("answer", 1, RateLimitInfo(tokens=Quota(remaining=0))),
            ],
            id="answers_started_in_an_earlier_round_are_unseen_by_the_next_figures",
        ),
        pytest.param(
            None,
            TOKENS,
            [
                ("acquire", 0, 0, 50),
                ("acquire", 0, 0, 50),
                ("acquire", 0, 1, 0),
            ],
            id="a_newcomer_before_the_head_the_budget_holds_back_is_granted_at_once",
        ),
        # Rules a random sequence reaches only now and then, kept as cases.
        pytest.param(
            AdaptiveLimit(initial=2, minimum=1, maximum=6, backoff=0.5),
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("rate_limit", 2.0),
                ("wait", 8),
                ("release", 0),
                ("release", 0),
                ("acquire", 0, 0, 0),
                ("release", 0),
            ],
            id="after_a_rate_limit_the_adaptive_limit_grows_one_per_round_trip_of_it",
        ),
        pytest.param(
            1,
            TOKENS,
            [
                ("acquire", 0, 0, 50),
                ("answer", 0, RateLimitInfo(tokens=Quota(remaining=40))),
            ],
            id="the_newest_figures_raise_a_configured_budget_up_to_its_own_count",
        ),
        # With no budget configured: the books start with the throttle.
        pytest.param(
            HALVING,
            None,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("observe", RateLimitInfo(requests=Quota(limit=5, remaining=5))),
            ],
            id="an_adaptive_limit_keeps_the_books_of_grants_before_the_first_figures",
        ),
        pytest.param(
            None,
            None,
            [
                ("observe", RateLimitInfo(requests=Quota(remaining=3))),
                ("acquire", 0, 0, 0),
                ("observe", RateLimitInfo(requests=Quota(limit=5, remaining=5))),
            ],
            id="figures_with_no_usable_field_start_the_books_of_grants",
        ),
        pytest.param(
            1,
            None,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 50),
                ("observe", RateLimitInfo(tokens=Quota(limit=100, remaining=100))),
                ("release", 0),
            ],
            id="a_budget_learned_while_a_request_waits_charges_its_estimate",
        ),
        pytest.param(
            1,
            None,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("acquire", 0, 1, 0),
                ("acquire", 0, 0, 0),
                ("acquire", 0, 1, 0),
                ("set_limit", None),
            ],
            id="with_no_budget_an_unlimited_provider_grants_in_ticket_order",
        ),
        pytest.param(
            1,
            None,
            [
                *[("acquire", 0, 0, 0)] * 6,
                ("release", 0),
                ("wait", 1),
                *[("acquire", 0, 0, 0)] * 5,
                ("set_limit", HALVING),
                ("observe", RateLimitInfo()),
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("acquire", 0, 1, 0),
                ("release", 0),
                ("answer", 0, RateLimitInfo(requests=Quota(limit=1, remaining=0))),
            ],
            id="a_limit_made_adaptive_later_stamps_its_grants_with_the_time_now",
        ),
        # A latency signal's verdicts, moved alike.
        pytest.param(
            LATENCY,
            None,
            [
                *[("acquire", 0, 0, 0)] * 6,
                ("verdict", 1),
                ("verdict", 1),
                ("verdict", 1),
                ("verdict", -2),
                ("verdict", 1),
                ("verdict", 1),
            ],
            id="a_latency_limit_doubles_in_the_slow_start_then_steps_after_a_fall",
        ),
        pytest.param(
            LATENCY,
            TOKENS,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("release", 0),
                ("acquire", 0, 0, 0),
                ("release", 0),
                ("verdict", -5),
                ("verdict", 0),
            ],
            id="a_latency_limit_ignores_successes_and_keeps_its_minimum",
        ),
        pytest.param(
            LATENCY,
            None,
            [
                ("acquire", 0, 0, 0),
                ("acquire", 0, 0, 0),
                ("verdict", 1),
                ("rate_limit", None),
                ("verdict", 1),
                ("wait", 8),
                ("verdict", 1),
            ],
            id="a_rate_limit_lowers_a_latency_limit_and_ends_its_slow_start",
        ),
        pytest.param(
            2,
            None,
            [("acquire", 0, 0, 0), ("verdict", 1), ("verdict", -1)],
            id="verdicts_leave_a_fixed_limit_alone",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_agree_on(
    shared_server: RedisServer,
    first: int | AdaptiveLimit | None,
    budget: Budget | None,
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, first, budget, ops)


@examples()
@given(
    first=limits,
    budget=budgets,
    ops=st.lists(operation, min_size=20, max_size=80),
)
async def test_the_ledger_grants_pauses_and_budgets_as_the_pure_core(
    shared_server: RedisServer,
    first: int | AdaptiveLimit | None,
    budget: Budget | None,
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, first, budget, ops)


@examples()
@given(
    first=limits,
    budget=budgets,
    models=model_budgets,
    tenants=st.dictionaries(st.sampled_from(TENANTS), tenant_settings.filter(bool)),
    ops=st.lists(tenant_operation, min_size=20, max_size=80),
)
async def test_the_ledger_shares_tenants_and_models_as_the_pure_core(
    shared_server: RedisServer,
    *,
    first: int | AdaptiveLimit | None,
    budget: Budget | None,
    models: dict[str, Budget],
    tenants: dict[str, Tenant],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, first, budget, ops, models=models, tenants=tenants)


A, B = "a", "b"


# Rules of tenants and models that random sequences reach only now and then,
# kept as cases.
@pytest.mark.parametrize(
    ("first", "models", "tenants", "ops"),
    [
        pytest.param(
            None,
            {},
            {A: Tenant(limit=1)},
            [
                ("acquire", 0, 0, 0, A, None),
                ("acquire", 1, 0, 0, A, None),
                ("acquire", 0, 0, 0, B, None),
                ("release", 0),
            ],
            id="a_tenant_at_its_cap_waits_while_others_pass_even_unlimited",
        ),
        pytest.param(
            1,
            {},
            {B: Tenant(weight=3.0)},
            [
                *[("acquire", 4, 0, 0, A, None)] * 3,
                *[("acquire", 0, 0, 0, B, None)] * 5,
                *[op for _ in range(7) for op in (("wait", 4), ("release", 0))],
            ],
            id="weights_three_to_one_share_the_slot_three_to_one",
        ),
        pytest.param(
            1,
            {},
            {},
            [
                ("acquire", 0, 0, 0, A, None),
                ("acquire", 0, 0, 0, A, None),
                ("wait", 16),
                ("release", 0),
                ("wait", 16),
                ("acquire", 4, 0, 0, B, None),
                ("acquire", 4, 0, 0, B, None),
                ("release", 0),
                ("wait", 4),
                ("release", 0),
                ("wait", 4),
                ("release", 0),
            ],
            id="a_tenant_that_becomes_backlogged_starts_from_the_floor",
        ),
        pytest.param(
            2,
            {"m1": Budget(requests_per_minute=1.0)},
            {},
            [
                ("acquire", 0, 0, 0, A, "m1"),
                ("release", 0),
                ("acquire", 3, 0, 0, A, "m1"),
                ("acquire", 0, 0, 0, A, "m2"),
                ("acquire", 0, 0, 0, B, "m1"),
                ("wait", 16),
                ("wait", 16),
                ("wait", 16),
                ("wait", 16),
            ],
            id="a_model_held_back_blocks_only_its_own_requests",
        ),
        pytest.param(
            1,
            {},
            {},
            [
                ("acquire", 0, 0, 0, None, None),
                ("acquire", 0, 0, 0, None, None),
                ("wait", 8),
                ("acquire", 0, 0, 0, A, None),
                ("release", 0),
                ("wait", 8),
                ("release", 0),
            ],
            id="holders_from_before_tenants_are_counted_from_then",
        ),
        pytest.param(
            1,
            {},
            {A: Tenant(weight=2.0)},
            [
                ("acquire", 0, 0, 0, A, None),
                ("acquire", 0, 0, 0, B, None),
                ("wait", 8),
                ("set_tenant", A, Tenant(weight=0.5)),
                ("wait", 8),
                ("release", 0),
                ("set_tenant", A, None),
                ("acquire", 0, 0, 0, A, None),
                ("release", 0),
            ],
            id="a_weight_change_folds_what_accrued_at_the_old_weight",
        ),
        pytest.param(
            1,
            {},
            {},
            [
                ("set_tenant", A, None),
                ("acquire", 0, 0, 0, None, None),
                ("acquire", 0, 0, 0, None, None),
                ("release", 0),
            ],
            id="the_defaults_where_no_tenant_is_counted_change_nothing",
        ),
        pytest.param(
            None,
            {},
            {},
            [
                ("model_observe", "m1", RateLimitInfo(requests=Quota(remaining=1))),
                ("acquire", 0, 0, 0, None, "m1"),
                ("acquire", 0, 0, 20, None, "m2"),
                ("model_observe", "m1", RateLimitInfo(requests=Quota(limit=5))),
                ("model_observe", "m2", RateLimitInfo(tokens=Quota(limit=40))),
                ("answer", 0, RateLimitInfo(requests=Quota(limit=5, remaining=5))),
            ],
            id="a_model_s_first_figures_start_the_books_of_its_grants",
        ),
        pytest.param(
            1,
            {"kept": Budget(requests_per_minute=3.0)},
            {},
            [
                ("model_observe", "m1", RateLimitInfo(requests=Quota(limit=5))),
                ("model_observe", "m2", RateLimitInfo(requests=Quota(limit=5))),
                ("acquire", 0, 0, 0, None, "m1"),
                ("acquire", 0, 0, 0, None, "m2"),  # waits all along
                ("answer", 0, RateLimitInfo(requests=Quota(limit=5, remaining=0))),
                ("wait", 4),
                ("release", 0),
                *[("wait", 16)] * 15,
                ("wait", 2),
                ("wait", 1),  # m1 idle for a minute, full again: forgotten
                ("acquire", 0, 0, 0, None, "m1"),
                ("model_observe", "m1", RateLimitInfo(requests=Quota(limit=8))),
            ],
            id="a_learned_model_budget_is_forgotten_once_idle_and_full_alike",
        ),
    ],
)
async def test_the_ledger_and_the_pure_core_share_tenants_and_models_on(
    shared_server: RedisServer,
    first: int | None,
    models: dict[str, Budget],
    tenants: dict[str, Tenant],
    ops: list[tuple[object, ...]],
) -> None:
    await replay(shared_server.url, first, TOKENS, ops, models=models, tenants=tenants)
