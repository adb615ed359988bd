"""One process's share of a provider shared through the ledger: pure bookkeeping.

A plain synchronous class with no I/O and no trio, the shared counterpart
of ``SlotPolicy``: the shared scheduler actor feeds it messages, asks it for
the next round's ``Plan`` to send to the ledger, and tells it what the
ledger answered. It decides which local waiters are published to the shared
queue (the oldest ``limit`` of them: no more can be granted in one round,
so the Redis queue stays small; once a ticket of a tenant or with a model
was seen, all of them: the ledger then counts a tenant's waiting requests,
whose first and last decide its counter, and a round may grant any
tenant's or pass a model the budgets hold back) and keeps the published
entries and the leases of this process.

Each waiter's queue member is made here, once, when it arrives, so a
round whose answer was lost (the ledger may have applied it, or not) is
simply sent again: the ledger's steps are idempotent. A waiter is *sent*
once a round has carried its entry (it may be in Redis from then on) and
*published* once an answer has confirmed it.

Invariants, after every call:

1. Every local ticket is in exactly one state: waiting (sent or not,
   published or not) or holding a lease. A ticket that leaves, by release
   or cancel, has its lease or its queue entry queued for release or
   withdrawal (a withdrawal gives back the lease a lost answer may have
   granted), so nothing it had in Redis outlives it (and what a failed
   round could not send is sent by the next).
2. The sent waiters are the oldest local waiters, at most ``limit`` (all,
   once a tenant or a model was seen); the published ones are among them.
3. A grant is delivered only to a ticket still waiting; a grant that
   arrives for a ticket cancelled meanwhile is queued for release at once.
"""

from __future__ import annotations

import bisect
import itertools
from typing import TYPE_CHECKING, final

from .._exceptions import queue_full
from ._ledger import lease_of, member_of
from ._scripts import Plan

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..messages._protocol import Ticket


@final
class SharedBook:
    """The local waiters, published entries and leases of one provider.

    Args:
        node: This process's unique name for the provider; lease ids are
            ``<node>:<seq>``, with ``seq`` from ``seq``, which the
            scheduler's tickets take theirs from (schedulers come and go,
            the book stays, and lease ids are never reused).
        provider: The provider's name, for ``QueueFull``.
        max_waiting: At most this many local tickets wait (not yet
            granted); one more is refused with ``QueueFull``.
        pooled: The provider is a group of members (``Ledger.step``'s
            ``members``): each waiter has a lane, every waiter is published
            (a round may grant any lane's), and each lease is named with
            its member.
    """

    __slots__ = (
        "_answered",
        "_costs",
        "_entries",
        "_failed",
        "_grouped",
        "_holders",
        "_lanes",
        "_last_arrival",
        "_max_waiting",
        "_members",
        "_on",
        "_order",
        "_published",
        "_release",
        "_sent",
        "_spoil",
        "_unanswered",
        "_usage",
        "_withdraw",
        "granted_total",
        "node",
        "peak_in_flight",
        "peak_waiting",
        "provider",
        "rejected_total",
        "released_total",
        "seq",
        "withdrawn_total",
    )

    def __init__(
        self,
        node: str,
        provider: str,
        *,
        max_waiting: int | None = None,
        pooled: bool = False,
    ) -> None:
        self.node = node
        self.provider = provider
        self._max_waiting = max_waiting
        self.seq = itertools.count()
        # Waiting tickets, sorted, and their queue member and turn's start
        # on the server's clock.
        self._order: list[Ticket] = []
        self._entries: dict[Ticket, tuple[str, float]] = {}
        # The estimated tokens of waiting tickets' members, if any.
        self._costs: dict[str, int] = {}
        self._last_arrival = 0
        # Whether a ticket of a tenant or with a model was seen, or every
        # waiter is published anyway (a group's).
        self._grouped = pooled
        # A group's: each waiter's lane by its member, each lease's member.
        self._lanes: dict[str, str] | None = {} if pooled else None
        self._on: dict[str, str] = {}
        # Sent waiters, by ticket and by member; the published among them.
        self._sent: dict[Ticket, str] = {}
        self._members: dict[str, Ticket] = {}
        self._published: set[Ticket] = set()
        self._holders: dict[Ticket, str] = {}
        self._release: list[str] = []
        self._withdraw: list[str] = []
        # For the next round: leases given back without success, the latest
        # usage reported of each lease, leases whose answer started.
        self._spoil: list[str] = []
        self._failed: list[str] = []
        self._usage: dict[str, int] = {}
        self._answered: list[str] = []
        # A round went unanswered since the last answered one.
        self._unanswered = False
        self.granted_total = 0
        self.released_total = 0
        self.withdrawn_total = 0
        self.rejected_total = 0
        self.peak_in_flight = 0
        self.peak_waiting = 0

    def __repr__(self) -> str:
        return (
            f"<SharedBook node={self.node!r} holding={len(self._holders)}"
            f" waiting={len(self._order)} published={len(self._published)}>"
        )

    @property
    def in_flight(self) -> int:
        """Leases this process holds."""
        return len(self._holders)

    @property
    def waiting(self) -> int:
        """Local tickets waiting for a lease."""
        return len(self._order)

    @property
    def published(self) -> int:
        """Local waiters whose entry in the shared queue is confirmed."""
        return len(self._published)

    def busy(self) -> bool:
        """Whether anything is held, waiting, or left to send to the ledger."""
        return bool(self._order or self._holders or self._release or self._withdraw)

    def unsent(self) -> bool:
        """Whether releases or withdrawals wait for the next round."""
        return bool(self._release or self._withdraw)

    def group(self) -> bool:
        """The fleet counts tenants: publish every waiter from now on.

        Returns whether waiters are left to publish now.
        """
        if self._grouped:
            return False
        self._grouped = True
        return len(self._sent) < len(self._order)

    def lease_id(self, ticket: Ticket) -> str:
        """The lease id of a local ticket."""
        return f"{self.node}:{ticket.seq}"

    def waiters(self) -> list[Ticket]:
        """The waiting tickets, oldest first."""
        return list(self._order)

    def holders(self) -> frozenset[Ticket]:
        """The tickets holding a lease."""
        return frozenset(self._holders)

    def holds(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` holds a lease."""
        return ticket in self._holders

    def member_of(self, ticket: Ticket) -> str | None:
        """A group's: the member ``ticket`` holds its lease on (``None``: it holds none)."""
        lease = self._holders.get(ticket)
        return None if lease is None else self._on.get(lease)

    def acquire(
        self,
        ticket: Ticket,
        start: float,
        arrival: float,
        tokens: int = 0,
        *,
        lane: str = "",
    ) -> None:
        """Queue ``ticket``, whose turn began at ``start``, arriving at ``arrival``.

        Both are seconds on the Redis server's clock, as this process
        reads it (``ServerClock``). Arrivals break ties between equal
        starts; in one book they are made strictly increasing. ``tokens``
        is the request's estimated cost for a token budget; ``lane``, a
        group's waiter's lane (``lane_text``).

        Raises:
            ValueError: The ticket is already known.
            QueueFull: ``max_waiting`` tickets already wait. Nothing changed.
        """
        if ticket in self._entries or ticket in self._holders:
            raise ValueError(f"ticket {ticket!r} is already known")
        if self._max_waiting is not None and len(self._order) >= self._max_waiting:
            self.rejected_total += 1
            raise queue_full(self.provider, len(self._order), self._max_waiting)
        bisect.insort(self._order, ticket)
        if ticket.tenant is not None or ticket.model is not None:
            self._grouped = True
        micros = max(round(arrival * 1_000_000), self._last_arrival + 1)
        self._last_arrival = micros
        member = member_of(micros, self.lease_id(ticket))
        self._entries[ticket] = (member, start)
        if tokens:
            self._costs[member] = tokens
        if self._lanes is not None:
            self._lanes[member] = lane
        self.peak_waiting = max(self.peak_waiting, len(self._order))

    def release(self, ticket: Ticket) -> None:
        """Give back a lease; does nothing for an unknown or finished ticket.

        Raises:
            RuntimeError: The ticket is still waiting; cancel it instead.
        """
        if ticket in self._entries:
            raise RuntimeError(f"ticket {ticket!r} is waiting, not holding a slot")
        self._drop_lease(ticket)

    def cancel(self, ticket: Ticket) -> None:
        """Withdraw a waiting ticket, or give back its lease if it has one.

        A lease given back by a cancel is not a success (for the adaptive
        limit and the backoff): the request was cancelled or never sent.
        """
        if ticket in self._entries:
            self._remove_waiter(ticket)
            self.withdrawn_total += 1
            return
        lease = self._holders.get(ticket)
        if lease is not None:
            self._spoil.append(lease)
        self._drop_lease(ticket)

    def fail(self, ticket: Ticket) -> None:
        """A holder's call failed before its answer started: its lease goes back.

        Not a success, as for ``cancel``; a group's member counts it for
        its health. Nothing for a ticket that holds no lease.
        """
        lease = self._holders.get(ticket)
        if lease is None:
            return
        if self._lanes is not None:
            self._failed.append(lease)
        self.cancel(ticket)

    def report_usage(self, ticket: Ticket, tokens: int) -> None:
        """A holder's request used ``tokens``; sent with the next round."""
        lease = self._holders.get(ticket)
        if lease is not None:
            self._usage[lease] = tokens

    def answered(self, ticket: Ticket) -> None:
        """A holder's answer started; sent with the next round."""
        lease = self._holders.get(ticket)
        if lease is not None:
            self._answered.append(lease)

    def plan(self, limit: int | None, *, renew: bool) -> Plan:
        """The next round: what to send, publish, renew and ask for.

        The releases and withdrawals are taken out of the book: hand them
        back with ``failed`` if the round does not reach the ledger.
        """
        grouped = limit is None or self._grouped
        wanted = self._order if grouped else self._order[:limit]
        target = set(wanted)
        # An older waiter arrived (an older turn's retry): the youngest
        # sent ones leave the queue to make room for it.
        for ticket in [t for t in self._sent if t not in target]:
            self._unsend(ticket)
        published = self._published
        # Renewing an entry is sending it again.
        enqueued = wanted if renew else [t for t in wanted if t not in published]
        entries = self._entries
        for ticket in enqueued:
            member = entries[ticket][0]
            self._sent[ticket] = member
            self._members[member] = ticket
        costs = self._costs
        enqueue = [entries[t] for t in enqueued]
        renew_leases = list(self._holders.values()) if renew else []
        lanes = self._lanes
        holders: dict[str, str] = {}
        if lanes is not None:
            on = self._on
            for lease in itertools.chain(
                self._spoil, self._usage, self._release, renew_leases, self._answered
            ):
                holders[lease] = on[lease]
        plan = Plan(
            release=self._release,
            withdraw=self._withdraw,
            enqueue=enqueue,
            renew_leases=renew_leases,
            ask=[] if renew else [self._sent[t] for t in wanted if t in published],
            enqueued=enqueued,
            costs={m: costs[m] for m, _ in enqueue if m in costs} if costs else {},
            meta={
                entries[t][0]: (t.tenant, t.model)
                for t in enqueued
                if t.tenant is not None or t.model is not None
            }
            if self._grouped
            else {},
            spoil=self._spoil,
            usage=list(self._usage.items()),
            answered=self._answered,
            recheck=self._unanswered,
            lanes={} if lanes is None else {m: lanes[m] for m, _ in enqueue},
            holders=holders,
            failed=self._failed,
        )
        self._release = []
        self._withdraw = []
        self._spoil = []
        self._failed = []
        self._usage = {}
        self._answered = []
        return plan

    def failed(self, plan: Plan) -> None:
        """The round's answer did not come: keep its releases for the next.

        The ledger may have applied it or not; the next round sends the
        same again (its entries stay sent, unconfirmed).
        """
        self._release = plan.release + self._release
        self._withdraw = plan.withdraw + self._withdraw
        self._spoil = plan.spoil + self._spoil
        self._failed = plan.failed + self._failed
        # A report made since the plan is newer than the plan's.
        self._usage = dict(plan.usage) | self._usage
        self._answered = plan.answered + self._answered
        self._unanswered = True

    def applied(
        self, plan: Plan, granted: list[str], on: Sequence[str] = ()
    ) -> list[Ticket]:
        """The ledger applied ``plan``: returns the tickets granted, in order.

        ``granted`` are the members granted a lease; ``on``, a group's:
        the member of each.
        """
        # It reported what any unanswered round before it granted.
        self._unanswered = False
        members = self._on
        if self._lanes is not None:
            for lease in plan.release:
                members.pop(lease, None)
            for member, name in zip(granted, on, strict=True):
                members[lease_of(member)] = name
        sent = self._sent
        for ticket in plan.enqueued:
            # Unless it left while the round was on its way (then its
            # withdrawal is queued).
            if ticket in sent:
                self._published.add(ticket)
        grants: list[Ticket] = []
        for member in granted:
            owner = self._members.pop(member, None)
            if owner is None:
                # Its ticket left while the round was on its way.
                self._release.append(lease_of(member))
                continue
            del sent[owner]
            self._published.discard(owner)
            self._order.remove(owner)
            del self._entries[owner]
            self._costs.pop(member, None)
            if self._lanes is not None:
                del self._lanes[member]
            self._holders[owner] = lease_of(member)
            grants.append(owner)
        self.granted_total += len(grants)
        self.peak_in_flight = max(self.peak_in_flight, len(self._holders))
        return grants

    def _remove_waiter(self, ticket: Ticket) -> None:
        index = bisect.bisect_left(self._order, ticket)
        del self._order[index]
        member = self._entries.pop(ticket)[0]
        self._costs.pop(member, None)
        if self._lanes is not None:
            del self._lanes[member]
        if ticket in self._sent:
            self._unsend(ticket)

    def _unsend(self, ticket: Ticket) -> None:
        # Its entry may be in Redis, and granted by a round whose answer
        # was lost: the withdrawal takes both back.
        member = self._sent.pop(ticket)
        del self._members[member]
        self._published.discard(ticket)
        self._withdraw.append(member)

    def _drop_lease(self, ticket: Ticket) -> None:
        lease = self._holders.pop(ticket, None)
        if lease is not None:
            self._release.append(lease)
            self.released_total += 1
