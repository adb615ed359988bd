"""Tenant accounting for the scheduling policy: the pure core of fair shares.

A plain synchronous bookkeeper with no I/O and no trio, used by
``SlotPolicy`` once tenants are in play (see its docstring for the
invariants this serves, and the service-gap bound).

Each tenant (the default tenant, for tickets made for none, is the key
``None``) keeps its waiting tickets in one heap per model, in ticket order,
and a service counter in slot-seconds divided by its weight::

    c_t(now) = base_t + held_t * (now - last_t) / w_t

folded into ``base_t`` at every grant, release and weight change (so
``last_t`` is the time of the latest of them): the same value as the
design's ``base_t + (held_t * now - sum of grant times) / w_t``, kept with
no record per slot.

A tenant is backlogged while it has waiting tickets. When it becomes
backlogged its counter is raised to the floor: the least counter among the
other backlogged tenants, or, if none is, the counter of the tenant that
most recently stopped being backlogged, taken then (0 at first). Idle time
is not banked. ``select`` finds, among backlogged tenants below their cap
whose head is not of a model held back, the least
``(c_t(now), held_t / w_t, head)``: O(T * M) for T backlogged tenants with
M non-empty model queues each (both small in practice); the counter is
compared first, so only a tenant that may win looks at its queues. A heap
over tenants would not do: the counters of tenants that hold slots grow
with time, each at its own pace, so their order changes between events.

A ticket withdrawn while waiting stays in its heap and is skipped when it
surfaces; the heaps are rebuilt from the living when such dead entries
outnumber them. A tenant nobody configured is forgotten once it holds and
waits for nothing, and starts from the floor when it comes back.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, final

import attrs

from .messages._limits import Tenant

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from .messages._scheduling import Ticket

_COMPACT_SLACK = 64


@final
@attrs.frozen
class TenantStatistics:
    """One tenant's part of one provider, as its scheduler sees it.

    Attributes:
        tenant: The tenant's name.
        weight: Its share weight (``Tenant.weight``).
        limit: Its cap on the provider's slots (``Tenant.limit``), or
            ``None``.
        in_flight: Slots the tenant holds now.
        waiting: The tenant's requests waiting now.
        service: The tenant's service counter: the slot-seconds it has
            received, divided by its weight, raised when it starts waiting
            to the least counter of the tenants already waiting (idle time
            is not banked). The next free slot goes to the waiting tenant
            with the least counter.
    """

    tenant: str
    weight: float
    limit: int | None
    in_flight: int
    waiting: int
    service: float


@final
class TenantState:
    """One tenant's share, counter and queues."""

    __slots__ = (
        "base",
        "configured",
        "held",
        "last",
        "limit",
        "name",
        "queues",
        "waiting",
        "weight",
    )

    def __init__(self, name: str | None, now: float) -> None:
        self.name = name
        self.weight = 1.0
        self.limit: int | None = None
        self.configured = False
        self.held = 0
        self.waiting = 0
        self.base = 0.0
        self.last = now
        # Waiting tickets by model, each a heap in ticket order.
        self.queues: dict[str | None, list[Ticket]] = {}

    def __repr__(self) -> str:
        return (
            f"<TenantState {self.name!r} weight={self.weight} limit={self.limit}"
            f" held={self.held} waiting={self.waiting} base={self.base}>"
        )

    def service(self, now: float) -> float:
        """The service counter at ``now``: slot-seconds over the weight."""
        if not self.held or now <= self.last:
            return self.base
        return self.base + self.held * (now - self.last) / self.weight

    def fold(self, now: float) -> None:
        """Fold what accrued up to ``now`` into the base."""
        if now > self.last:
            self.base = self.service(now)
            self.last = now

    def head(
        self, waiting: Collection[Ticket], blocked: Collection[str]
    ) -> Ticket | None:
        """The oldest waiting ticket of a model not in ``blocked``, or ``None``."""
        best: Ticket | None = None
        empty: list[str | None] = []
        for model, queue in self.queues.items():
            while queue and queue[0] not in waiting:
                heapq.heappop(queue)  # withdrawn while waiting
            if not queue:
                empty.append(model)
            elif (model is None or model not in blocked) and (
                best is None or queue[0] < best
            ):
                best = queue[0]
        for model in empty:
            del self.queues[model]
        return best


@final
class Tenants:
    """Every tenant's state on one provider, and the rule between them."""

    __slots__ = ("_backlogged", "_dead", "_last_left", "_states")

    def __init__(self) -> None:
        self._states: dict[str | None, TenantState] = {}
        # The tenants with waiting tickets, in the order they became so.
        self._backlogged: dict[str | None, TenantState] = {}
        self._last_left = 0.0
        self._dead = 0

    def __repr__(self) -> str:
        return f"<Tenants {list(self._states.values())!r}>"

    def get(self, name: str | None) -> TenantState | None:
        """The state of tenant ``name``, if it has one."""
        return self._states.get(name)

    def _state(self, name: str | None, now: float) -> TenantState:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = TenantState(name, now)
        return state

    def configure(self, name: str, settings: Tenant | None, now: float) -> None:
        """Give ``name`` a weight and cap; ``None``: the defaults, unconfigured.

        What accrued so far is folded in at the old weight.
        """
        state = self._states.get(name)
        if state is None:
            if settings is None:
                return
            state = self._state(name, now)
        state.fold(now)
        if settings is None:
            state.weight, state.limit, state.configured = 1.0, None, False
            self._drop_if_idle(state)
        else:
            state.weight, state.limit = settings.weight, settings.limit
            state.configured = True

    def configured(self) -> dict[str, Tenant]:
        """The configured tenants' settings, by name."""
        return {
            name: Tenant(state.weight, state.limit)
            for name, state in self._states.items()
            if name is not None and state.configured
        }

    def hold(self, ticket: Ticket, now: float) -> None:
        """Count ``ticket`` as held from ``now`` (a holder from before tenants)."""
        state = self._state(ticket.tenant, now)
        state.fold(now)
        state.held += 1

    def queue(self, ticket: Ticket, now: float) -> None:
        """``ticket`` waits: in its tenant's queue, which may become backlogged."""
        state = self._state(ticket.tenant, now)
        if not state.waiting:
            self._join(state, now)
        state.waiting += 1
        heapq.heappush(state.queues.setdefault(ticket.model, []), ticket)

    def _join(self, state: TenantState, now: float) -> None:
        """``state`` becomes backlogged: raise its counter to the floor."""
        backlogged = self._backlogged
        if backlogged:
            floor = min(other.service(now) for other in backlogged.values())
        else:
            floor = self._last_left
        state.fold(now)
        state.base = max(state.base, floor)
        backlogged[state.name] = state

    def _leave(self, state: TenantState, now: float) -> None:
        """``state`` stops being backlogged: its counter is the new floor."""
        del self._backlogged[state.name]
        self._last_left = state.service(now)
        state.queues.clear()  # only withdrawn tickets are left

    def withdraw(self, ticket: Ticket, now: float, waiting: Collection[Ticket]) -> None:
        """Waiting ``ticket`` was withdrawn (``waiting``: those still waiting)."""
        state = self._states[ticket.tenant]
        state.waiting -= 1
        if not state.waiting:
            self._leave(state, now)
            self._drop_if_idle(state)
        else:
            self._dead += 1
            if self._dead > len(waiting) + _COMPACT_SLACK:
                self._rebuild(waiting)

    def _rebuild(self, waiting: Iterable[Ticket]) -> None:
        for state in self._backlogged.values():
            state.queues.clear()
        states = self._states
        for ticket in waiting:
            states[ticket.tenant].queues.setdefault(ticket.model, []).append(ticket)
        for state in self._backlogged.values():
            for queue in state.queues.values():
                heapq.heapify(queue)
        self._dead = 0

    def release(self, ticket: Ticket, now: float) -> None:
        """Held ``ticket`` gave its slot back at ``now``."""
        state = self._states.get(ticket.tenant)
        if state is None or not state.held:
            return  # held from before tenants were counted
        state.fold(now)
        state.held -= 1
        self._drop_if_idle(state)

    def _drop_if_idle(self, state: TenantState) -> None:
        if not state.configured and not state.held and not state.waiting:
            del self._states[state.name]

    def select(
        self, now: float, waiting: Collection[Ticket], blocked: Collection[str]
    ) -> tuple[TenantState, Ticket] | None:
        """The tenant and ticket the next free slot goes to, or ``None``.

        Among backlogged tenants below their cap with a head of a model not
        in ``blocked``: the least ``(counter, held / weight, head)``.
        """
        best: tuple[float, float, Ticket] | None = None
        least = math.inf  # best's counter, for a cheap first test
        chosen: TenantState | None = None
        for state in self._backlogged.values():
            held = state.held
            cap = state.limit
            if cap is not None and held >= cap:
                continue
            # service(now), inline: this loop runs per grant over every
            # backlogged tenant, and most lose on the counter alone.
            counter = state.base
            if held and now > state.last:
                counter += held * (now - state.last) / state.weight
            if counter > least:
                continue
            head = state.head(waiting, blocked)
            if head is None:
                continue
            key = (counter, held / state.weight, head)
            if best is None or key < best:
                best, chosen, least = key, state, counter
        if chosen is None or best is None:
            return None
        return chosen, best[2]

    def grant(self, state: TenantState, ticket: Ticket, now: float) -> None:
        """``select``'s choice is granted at ``now``."""
        heapq.heappop(state.queues[ticket.model])
        state.fold(now)
        state.held += 1
        state.waiting -= 1
        if not state.waiting:
            self._leave(state, now)

    def statistics(self, now: float) -> dict[str, TenantStatistics]:
        """Each named tenant's share at ``now``."""
        return {
            name: TenantStatistics(
                tenant=name,
                weight=state.weight,
                limit=state.limit,
                in_flight=state.held,
                waiting=state.waiting,
                service=state.service(now),
            )
            for name, state in self._states.items()
            if name is not None
        }
