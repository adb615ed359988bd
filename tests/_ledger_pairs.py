"""What the differential tests of the Redis ledger share.

``test_ledger_differential`` (a provider) and ``test_ledger_groups`` (a
group of members and pools) each apply the same operations to the pure core
and to one process's book on a real Redis, on a clock the test sets, and
compare what both show after each.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    import coredis

    from trio_dispatch._policy._budgets import BudgetStatistics
    from trio_dispatch._policy._slots import SlotPolicy
    from trio_dispatch._redis._book import SharedBook
    from trio_dispatch._redis._ledger import Ledger, LedgerBudget, StepResult
    from trio_dispatch.messages._protocol import Ticket


def examples(in_ci: int = 150) -> settings:
    """Hypothesis's settings: ``in_ci`` examples under ``CI``, 40 elsewhere."""
    return settings(
        max_examples=in_ci if os.environ.get("CI") else 40,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
        ],
    )


class Stage:
    """The pure core and one process's book on the ledger, at one instant of the test's clock.

    The scripts read the clock from a key beside ``provider``'s (see the
    module notes): ``set_clock`` puts ``ms`` there.
    """

    def __init__(
        self,
        client: coredis.Redis[str],
        ledger: Ledger,
        policy: SlotPolicy,
        base_ms: int,
        book: SharedBook,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.policy = policy
        self.book = book
        self.base_ms = base_ms
        self.ms = 0
        self.result: StepResult | None = None
        self.seq = 0
        self.tickets: list[Ticket] = []
        self.log: list[str] = []

    @property
    def now(self) -> float:
        return self.ms / 1000

    async def set_clock(self) -> None:
        key = self.ledger.names(self.book.provider)[0][0] + ":clock"
        await self.client.set(key, str(self.base_ms + self.ms))


def same_tenants(
    policy: SlotPolicy, result: StepResult, now: float, where: str
) -> None:
    """The tenants as the pure core and a step see them."""
    # Both count tenants from the same moment (never for the defaults of a
    # tenant where none is counted).
    assert result.counting == policy.counts_tenants, where
    tenants = policy.tenant_statistics(now)
    assert set(result.tenants) == set(tenants), where
    for name, pure_tenant in tenants.items():
        shared_tenant = result.tenants[name]
        assert (
            shared_tenant.weight,
            shared_tenant.limit,
            shared_tenant.in_flight,
        ) == (pure_tenant.weight, pure_tenant.limit, pure_tenant.in_flight), where
        # Computed alike, in the same order, on the same instants.
        assert shared_tenant.service == pure_tenant.service, where
        # All waiters are published once tenants are counted.
        assert shared_tenant.queued == pure_tenant.waiting, where


def same_budgets(
    budget: BudgetStatistics | None,
    shown: BudgetStatistics | LedgerBudget | None,
    where: str,
) -> None:
    """The figures the pure core shows, as the ledger or a process shows them."""
    if budget is None:
        assert shown is None, where
        return
    assert shown is not None, where
    for pure_value, shared_value in (
        (budget.requests_per_minute, shown.requests_per_minute),
        (budget.requests_available, shown.requests_available),
        (budget.tokens_per_minute, shown.tokens_per_minute),
        (budget.tokens_available, shown.tokens_available),
    ):
        if pure_value is None:
            assert shared_value is None, where
        else:
            assert shared_value is not None, where
            assert math.isclose(pure_value, shared_value, rel_tol=1e-9, abs_tol=1e-9), (
                where
            )
    assert shown.learned == budget.learned, where


def as_int(value: object) -> int:
    assert isinstance(value, int)
    return value


def pick(items: list[Ticket], index: object) -> Ticket | None:
    return items[as_int(index) % len(items)] if items else None
