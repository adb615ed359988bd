"""Tenant accounting for the scheduling policy: the pure core of fair shares.

A plain synchronous bookkeeper with no I/O and no trio: ``SlotPolicy``'s
queue, every waiting ticket of every tenant from the first ticket on (see
its docstring for the invariants this serves, and the service-gap bound).

Each tenant (the default tenant, for tickets made for none, is the key
``None``, a tenant like the others) keeps its waiting tickets in one heap
per lane (the policy's: a model, or a model for one member of a pool), in
ticket order, and a service counter in slot-seconds divided by its
weight::

    c_t(now) = base_t + held_t * (now - last_t) / w_t

folded into ``base_t`` at every grant, release and weight change (so
``last_t`` is the time of the latest of them): the same value as the
design's ``base_t + (held_t * now - sum of grant times) / w_t``, kept with
no record per slot. ``restart`` starts every counter, and the floor, at 0:
the policy counts service from the first tenant or model on.

A tenant is backlogged while it has waiting tickets. When it becomes
backlogged its counter is raised to the floor: the least counter among the
other backlogged tenants, or, if none is, the counter of the tenant that
most recently stopped being backlogged, taken then (0 at first). Idle time
is not banked. ``select`` finds, among backlogged tenants below their cap
whose head is not of a lane held back, the least
``(c_t(now), held_t / w_t, head)``.

Both are found in heaps over the backlogged tenants, not by a scan: one
keyed by the counter (for the floor), one keyed by the whole key above,
over those below their cap (for the choice). The counters of tenants
that hold slots grow with time, each at its own pace, so no heap can
keep them in order; but no tenant's key ever falls without an event on
that tenant (a counter only grows: folds, raises to the floor and time
all add to it), so each heap keeps, per tenant, a key it had at some
time: one at most its key now. The least kept key is looked at anew: if
it is still the tenant's key, that tenant is the least (every other key
now is at least the one kept for it); if not, it is kept again, as it is
now, and the next least is looked at. The events that can lower a key
place the tenant again with its key then: its joining, a ticket older
than its head, a slot given back (fewer held for its weight), a new
weight or cap. A tenant backlogged alone is the choice whatever its key:
its key is not looked at, and the one kept for it stays one it had. So a
choice or an arrival costs O(log T) for T backlogged tenants, plus
O(log T) for each tenant looked at anew because its key grew since it
was kept: the tenant granted last, one whose head was withdrawn, and those
holding slots while time passed (at most one per slot); and O(M) for
each head looked at, of a tenant with M non-empty lanes. In a fill that
holds a lane back, a tenant's head may be one only this fill passes over
to, and its key then above its key after the fill: such a tenant (and one
with nothing left to take in the fill) is set aside, placed again by the
next fill's first choice, so holding a lane back costs a look at each
tenant of that lane that comes first in the fill.
Entries left behind (a tenant placed again, or no longer backlogged) are
skipped when they surface, and swept when they outnumber the living.

A ticket withdrawn while waiting, or moved to another lane (``relane``),
stays in its heap and is skipped when it surfaces (the policy's waiting
tickets map each to its lane now); the heaps are rebuilt from the living when such dead entries
outnumber them. A tenant nobody configured is forgotten once it holds and
waits for nothing, and starts from the floor when it comes back.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, TypeVar, final

import attrs

from ..messages._limits import Tenant

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from typing import TypeAlias

    from ..messages._protocol import Ticket

    #: A lane of the policy's queue: a model (``None``: none named), for
    #: any member; ``(model, member)``, for that member only (or a pool's
    #: name, for its members); or ``(model, pool, avoided)``, for the
    #: members of a pool (``None``: any member) but those ``avoided``.
    Lane: TypeAlias = (
        str
        | tuple[str | None, str]
        | tuple[str | None, str | None, frozenset[str]]
        | None
    )

    # A tenant in the choice's heap: its counter, held / weight and head,
    # when it was placed; the order it was placed in, so that two entries
    # of one tenant never compare the tenant.
    _Entry: TypeAlias = tuple[float, float, Ticket, int, "TenantState"]
    # A tenant in the floor's heap: its counter when it was placed.
    _FloorEntry: TypeAlias = tuple[float, int, "TenantState"]

_COMPACT_SLACK = 64

# What a ticket no longer waiting maps to: no lane.
_GONE = object()

_HeapEntry = TypeVar("_HeapEntry", "_Entry", "_FloorEntry")


def _sweep(heap: list[_HeapEntry]) -> None:
    """Drop ``heap``'s dead entries (once they outnumber the living)."""
    heap[:] = [entry for entry in heap if _alive(entry)]
    heapq.heapify(heap)


def _alive(entry: _Entry | _FloorEntry) -> bool:
    """Whether ``entry``, in either heap, is its tenant's own there."""
    state = entry[-1]
    return state.entry is entry or state.floor_entry is entry


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
        "entry",
        "floor_entry",
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
        # Waiting tickets by lane, each a heap in ticket order.
        self.queues: dict[Lane, list[Ticket]] = {}
        # Its entries in the heaps of ``Tenants`` while it is backlogged
        # (see there): one that is not the tenant's own is a dead one.
        self.entry: _Entry | None = None
        self.floor_entry: _FloorEntry | None = None

    def __repr__(self) -> str:
        return (
            f"<TenantState {self.name!r} weight={self.weight} limit={self.limit}"
            f" held={self.held} waiting={self.waiting} base={self.base}>"
        )

    def service(self, now: float) -> float:
        """The service counter at ``now``: slot-seconds over the weight."""
        held = self.held
        if not held:
            return self.base
        last = self.last
        if now <= last:
            return self.base
        return self.base + held * (now - last) / self.weight

    def fold(self, now: float) -> None:
        """Fold what accrued up to ``now`` into the base (``service(now)``)."""
        last = self.last
        if now > last:
            held = self.held
            if held:
                self.base = self.base + held * (now - last) / self.weight
            self.last = now

    def head(
        self, waiting: Mapping[Ticket, Lane], blocked: Collection[Lane]
    ) -> Ticket | None:
        """The oldest waiting ticket of a lane not in ``blocked``, or ``None``."""
        best: Ticket | None = None
        empty: list[Lane] | None = None
        for lane, queue in self.queues.items():
            while queue and waiting.get(queue[0], _GONE) != lane:
                heapq.heappop(queue)  # withdrawn, or moved to another lane
            if not queue:
                if empty is None:
                    empty = []
                empty.append(lane)
                continue
            first = queue[0]
            if (lane is None or lane not in blocked) and (best is None or first < best):
                best = first
        if empty is not None:
            for lane in empty:
                del self.queues[lane]
        return best


@final
class Tenants:
    """Every tenant's state on one provider, and the rule between them."""

    __slots__ = (
        "_aside",
        "_backlogged",
        "_dead",
        "_floors",
        "_last_left",
        "_placed",
        "_ready",
        "_states",
    )

    def __init__(self) -> None:
        self._states: dict[str | None, TenantState] = {}
        # The tenants with waiting tickets.
        self._backlogged: dict[str | None, TenantState] = {}
        self._last_left = 0.0
        self._dead = 0
        # The heaps (see the module's notes): the backlogged tenants by
        # counter; those below their cap by the choice's key; the tenants
        # set aside by a fill for a model held back; entries placed so far.
        self._floors: list[_FloorEntry] = []
        self._ready: list[_Entry] = []
        self._aside: list[TenantState] = []
        self._placed = 0

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
        if state.waiting:
            self._place(state, now)  # a lighter weight, a higher cap

    def restart(self, now: float) -> None:
        """Count service from ``now``: every counter, and the floor, start at 0."""
        self._last_left = 0.0
        self._floors.clear()
        self._ready.clear()
        self._aside.clear()
        for state in self._states.values():
            state.base, state.last = 0.0, now
            state.entry = state.floor_entry = None
        for state in self._backlogged.values():
            self._placed += 1
            state.floor_entry = (0.0, self._placed, state)
            self._floors.append(state.floor_entry)
            self._place(state, now)
        heapq.heapify(self._floors)

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

    def grant_at_once(self, ticket: Ticket, now: float) -> None:
        """``ticket`` is granted as it arrives, nobody being backlogged.

        What ``queue``, ``select`` and ``grant`` would do, in one step: its
        tenant joins at the floor (with nobody backlogged, the counter of
        the last to leave), is the only choice, takes the slot and leaves
        again at once, its counter the new floor. The caller has checked
        its cap.
        """
        assert not self._backlogged  # else the choice is select's
        name = ticket.tenant
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = TenantState(name, now)
        else:
            state.fold(now)
        state.base = max(state.base, self._last_left)
        state.held += 1
        # Its counter at ``now`` (folded up to it): the floor from now on.
        self._last_left = state.base

    def queue(self, ticket: Ticket, now: float, lane: Lane) -> None:
        """``ticket`` waits in ``lane``: in its tenant's queue, which may become backlogged."""
        name = ticket.tenant
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = TenantState(name, now)
        state.waiting += 1
        queues = state.queues
        queue = queues.get(lane)
        if queue is None:
            queues[lane] = [ticket]
        else:
            heapq.heappush(queue, ticket)
        if state.waiting == 1:
            self._join(state, now, ticket)
        else:
            entry = state.entry
            if entry is not None and ticket < entry[2]:
                self._place(state, now, ticket)  # its new head

    def _join(self, state: TenantState, now: float, head: Ticket) -> None:
        """``state`` becomes backlogged, ``head`` its one ticket: raise its counter to the floor."""
        floor = self._floor(now)
        if floor is None:
            floor = self._last_left
        state.fold(now)
        state.base = max(state.base, floor)
        backlogged = self._backlogged
        backlogged[state.name] = state
        floors = self._floors
        if len(floors) > 2 * len(backlogged) + _COMPACT_SLACK:
            _sweep(floors)
        self._placed += 1
        entry = state.floor_entry = (state.base, self._placed, state)
        heapq.heappush(floors, entry)
        self._place(state, now, head)

    def _floor(self, now: float) -> float | None:
        """The least counter of the backlogged at ``now``, or ``None``."""
        floors = self._floors
        while floors:
            entry = floors[0]
            state = entry[2]
            if state.floor_entry is not entry:
                heapq.heappop(floors)  # a dead entry
                continue
            counter = state.service(now)
            if counter == entry[0]:
                return counter
            self._placed += 1
            entry = state.floor_entry = (counter, self._placed, state)
            heapq.heapreplace(floors, entry)
        return None

    def _place(
        self, state: TenantState, now: float, head: Ticket | None = None
    ) -> None:
        """Keep backlogged ``state`` in the choice's heap with its key now.

        Its head there is ``head`` if given, else the least ticket of its
        queues, withdrawn or not: one at most its head.
        """
        held = state.held
        cap = state.limit
        if cap is not None and held >= cap:
            state.entry = None
            return
        ready = self._ready
        if len(ready) > 2 * len(self._backlogged) + _COMPACT_SLACK:
            _sweep(ready)
        if head is None:
            for queue in state.queues.values():
                if queue and (head is None or queue[0] < head):
                    head = queue[0]
            assert head is not None  # it waits: a queue holds a ticket
        placed = self._placed = self._placed + 1
        entry = state.entry = (
            state.service(now),
            held / state.weight,
            head,
            placed,
            state,
        )
        heapq.heappush(ready, entry)

    def _leave(self, state: TenantState, now: float) -> None:
        """``state`` stops being backlogged: its counter is the new floor."""
        backlogged = self._backlogged
        del backlogged[state.name]
        self._last_left = state.service(now)
        state.queues.clear()  # only withdrawn tickets are left
        state.entry = state.floor_entry = None
        if not backlogged:
            # Every entry left in the heaps is a dead one, and nobody is
            # left to set aside.
            self._floors.clear()
            self._ready.clear()
            self._aside.clear()

    def relane(
        self, ticket: Ticket, now: float, lane: Lane, waiting: Mapping[Ticket, Lane]
    ) -> None:
        """Waiting ``ticket`` moved to ``lane`` (``waiting`` says so already).

        Its tenant's head is the same ticket as before: its key stands.
        """
        state = self._states[ticket.tenant]
        queue = state.queues.get(lane)
        if queue is None:
            state.queues[lane] = [ticket]
        else:
            heapq.heappush(queue, ticket)
        self._dead += 1
        if self._dead > len(waiting) + _COMPACT_SLACK:
            self._rebuild(waiting)

    def withdraw(
        self, ticket: Ticket, now: float, waiting: Mapping[Ticket, Lane]
    ) -> None:
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

    def _rebuild(self, waiting: Mapping[Ticket, Lane]) -> None:
        for state in self._backlogged.values():
            state.queues.clear()
        states = self._states
        for ticket, lane in waiting.items():
            states[ticket.tenant].queues.setdefault(lane, []).append(ticket)
        for state in self._backlogged.values():
            for queue in state.queues.values():
                heapq.heapify(queue)
        self._dead = 0

    def release(self, ticket: Ticket, now: float) -> None:
        """Held ``ticket`` gave its slot back at ``now``."""
        state = self._states[ticket.tenant]
        state.fold(now)
        held = state.held = state.held - 1
        if state.waiting:
            entry = state.entry
            if entry is None or entry[1] > held / state.weight:
                # Its key may be below the one kept: less held for its
                # weight, or below its cap again.
                self._place(state, now)
        elif not held and not state.configured:
            del self._states[state.name]  # idle: forgotten (_drop_if_idle)

    def _drop_if_idle(self, state: TenantState) -> None:
        if not state.configured and not state.held and not state.waiting:
            del self._states[state.name]

    def select(
        self, now: float, waiting: Mapping[Ticket, Lane], blocked: Collection[Lane]
    ) -> tuple[TenantState, Ticket] | None:
        """The tenant and ticket the next free slot goes to, or ``None``.

        Among backlogged tenants below their cap with a head of a lane not
        in ``blocked``: the least ``(counter, held / weight, head)``.
        ``blocked``: the lanes held back so far in this fill, empty at its
        first choice.
        """
        if not blocked and self._aside:
            # A new fill: what the last one set aside is looked at again.
            aside, self._aside = self._aside, []
            backlogged = self._backlogged
            for state in aside:
                if backlogged.get(state.name) is state:
                    self._place(state, now)
        ready = self._ready
        while ready:
            entry = ready[0]
            state = entry[4]
            if state.entry is not entry:
                heapq.heappop(ready)  # a dead entry
                continue
            held = state.held
            cap = state.limit
            if cap is not None and held >= cap:
                heapq.heappop(ready)  # placed again when it goes below
                state.entry = None
                continue
            head = state.head(waiting, blocked)
            if head is None:
                # Every lane it waits in is held back in this fill.
                heapq.heappop(ready)
                state.entry = None
                self._aside.append(state)
                continue
            if len(self._backlogged) == 1:
                # The only tenant backlogged is the choice, whatever its key
                # now: the one kept, which it had, stays at most that.
                return state, head
            counter = state.service(now)
            share = held / state.weight
            if counter == entry[0] and share == entry[1] and head == entry[2]:
                return state, head
            # Its key grew since it was kept: keep it as it is now.
            placed = self._placed = self._placed + 1
            entry = state.entry = (counter, share, head, placed, state)
            heapq.heapreplace(ready, entry)
            if blocked:
                # Its head may be one only this fill passes over.
                self._aside.append(state)
            if ready[0] is entry:
                return state, head  # still the least, as it is now
        return None

    def grant(self, state: TenantState, ticket: Ticket, now: float, lane: Lane) -> None:
        """``select``'s choice, of ``lane``, is granted at ``now``."""
        heapq.heappop(state.queues[lane])
        state.fold(now)
        state.held += 1
        waiting = state.waiting = state.waiting - 1
        if not waiting:
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
