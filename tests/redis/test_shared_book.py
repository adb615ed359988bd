"""The pure bookkeeping of a provider shared through Redis, driven at random.

A model ledger stands in for Redis here (the scripts have their own tests
against a real server): it grants any subset of what a plan asks for, or
fails the round, before applying it or after (the answer lost). Whatever
happens, every ticket is in one state, the published waiters are the
oldest ``limit``, and everything a ticket had in the ledger is given back
when it leaves.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import QueueFull
from trio_dispatch._redis._book import SharedBook
from trio_dispatch._redis._ledger import lease_of
from trio_dispatch.messages._protocol import Ticket

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("round"), st.integers(0, 3)),
        st.tuples(st.just("lost_round"), st.integers(0, 3)),
        st.tuples(st.just("round_cancelled"), st.integers(0, 30)),
        st.tuples(st.just("fail"), st.integers(0, 0)),
        st.tuples(st.just("limit"), st.integers(1, 4)),
    ),
    max_size=60,
)


class ModelLedger:
    """The queue, the live leases, and every lease it ever gave."""

    def __init__(self) -> None:
        self.queue: set[str] = set()
        self.leases: set[str] = set()
        self.given: set[str] = set()

    def apply(
        self,
        book: SharedBook,
        limit: int,
        grant: int,
        *,
        renew: bool = True,
        lose: bool = False,
    ) -> list[Ticket]:
        """One round, as the step script runs it; ``lose`` loses its answer."""
        plan = book.plan(limit, renew=renew)
        for lease in plan.release:
            assert lease in self.given, "released a lease never granted"
            self.leases.discard(lease)
        for member in plan.withdraw:
            self.queue.discard(member)
            self.leases.discard(lease_of(member))
        held = []
        asking = set()
        for member in [m for m, _ in plan.enqueue] + plan.ask:
            if lease_of(member) in self.leases:
                held.append(member)
            else:
                self.queue.add(member)
                asking.add(member)
        assert asking <= self.queue
        granted = sorted(asking)[:grant]
        for member in granted:
            self.queue.remove(member)
            self.leases.add(lease_of(member))
            self.given.add(lease_of(member))
        if lose:
            book.failed(plan)
            return []
        return book.applied(plan, held + granted)


@given(operations)
def test_the_book_keeps_every_ticket_in_one_state_and_gives_everything_back(
    ops: list[tuple[str, int]],
) -> None:
    book = SharedBook("n", "p", max_waiting=8)
    ledger = ModelLedger()
    limit = 2
    seq = 0
    granted: set[Ticket] = set()
    gone: set[Ticket] = set()
    known: list[Ticket] = []
    for op, arg in ops:
        if op == "acquire":
            ticket = Ticket(float(arg), seq)
            seq += 1
            try:
                book.acquire(ticket, 100.0 + arg, 200.0)
            except QueueFull:
                assert book.waiting == 8
                continue
            known.append(ticket)
        elif op in {"release", "cancel"} and known:
            ticket = known[arg % len(known)]
            if op == "release":
                if ticket in book.waiters():
                    with pytest.raises(
                        RuntimeError,
                        match=r"^ticket .* is waiting, not holding a slot$",
                    ):
                        book.release(ticket)
                    continue
                book.release(ticket)
            else:
                book.cancel(ticket)
            gone.add(ticket)
            granted.discard(ticket)
        elif op == "round":
            before = book.waiting
            new = ledger.apply(book, limit, arg)
            assert not set(new) & gone
            granted |= set(new)
            # The published waiters are the oldest, as many as the limit
            # allowed less those just granted.
            published = book._published
            assert len(published) == min(limit, before) - len(new)
            assert published == set(book.waiters()[: len(published)])
        elif op == "lost_round":
            assert ledger.apply(book, limit, arg, renew=False, lose=True) == []
        elif op == "round_cancelled" and known:
            # A ticket leaves while the round is on its way to the ledger.
            plan = book.plan(limit, renew=False)
            victim = known[arg % len(known)]
            book.cancel(victim)
            gone.add(victim)
            granted.discard(victim)
            book.failed(plan)
        elif op == "fail":
            book.failed(book.plan(limit, renew=False))
        elif op == "limit":
            limit = arg
        waiters = book.waiters()
        assert waiters == sorted(waiters)
        assert not set(waiters) & book.holders()
        assert book.holders() == granted
        assert not (set(waiters) | book.holders()) & gone
        assert set(book._published) <= set(waiters)
    # Every lease the ledger holds is held, or queued for release, or was
    # granted by a lost answer to a ticket still waiting (it is granted
    # again) or whose withdrawal is queued.
    owners = {book.lease_id(t) for t in book.waiters() + sorted(book.holders())}
    owners |= {lease_of(m) for m in book._withdraw} | set(book._release)
    assert ledger.leases <= owners
    # Everything leaves; two rounds give every lease and entry back.
    for ticket in book.waiters() + sorted(book.holders()):
        book.cancel(ticket)
    ledger.apply(book, limit, 0)
    ledger.apply(book, limit, 0)
    assert ledger.leases == set()
    assert ledger.queue == set()
    assert not book.busy()


def test_only_the_oldest_waiters_up_to_the_limit_are_published() -> None:
    book = SharedBook("n", "p")
    for seq, start in enumerate([5.0, 3.0, 4.0]):
        book.acquire(Ticket(start, seq), start, 100.0)
    plan = book.plan(2, renew=False)
    assert plan.enqueued == [Ticket(3.0, 1), Ticket(4.0, 2)]
    # Members carry the arrival, made strictly increasing.
    m1, m2 = "0000000100000001:n:1", "0000000100000002:n:2"
    assert plan.enqueue == [(m1, 3.0), (m2, 4.0)]
    book.applied(plan, [])
    assert book.plan(2, renew=False).ask == [m1, m2]
    # An older turn arrives: it is published, the youngest withdrawn.
    book.acquire(Ticket(1.0, 3), 1.0, 101.0)
    again = book.plan(2, renew=False)
    assert again.enqueued == [Ticket(1.0, 3)]
    assert again.withdraw == [m2]
    assert again.ask == [m1]
    # A renewal sends every entry again, which asks too.
    book.applied(again, [])
    renewed = book.plan(2, renew=True)
    assert renewed.enqueue == [("0000000101000000:n:3", 1.0), (m1, 3.0)]
    assert renewed.ask == []


def test_a_grant_for_a_ticket_cancelled_meanwhile_is_given_back() -> None:
    book = SharedBook("n", "p")
    ticket = Ticket(1.0, 0)
    book.acquire(ticket, 1.0, 1.0)
    plan = book.plan(1, renew=False)
    [(member, _)] = plan.enqueue
    book.cancel(ticket)
    assert book.applied(plan, [member]) == []
    follow = book.plan(1, renew=False)
    assert (follow.release, follow.withdraw) == (["n:0"], [member])


def test_a_round_whose_answer_is_lost_is_sent_again_the_same() -> None:
    book = SharedBook("n", "p")
    ticket = Ticket(1.0, next(book.seq))
    book.acquire(ticket, 1.0, 1.0)
    lost = book.plan(1, renew=False)
    book.failed(lost)
    again = book.plan(1, renew=False)
    assert again.enqueue == lost.enqueue
    assert again.enqueued == [ticket]
    # The lost round had granted it: the ledger says so again.
    [(member, _)] = again.enqueue
    assert book.applied(again, [member]) == [ticket]
    assert book.holders() == {ticket}


def test_a_waiter_leaving_after_a_lost_answer_is_withdrawn() -> None:
    # Its entry may be in Redis, and granted: the withdrawal takes both.
    book = SharedBook("n", "p")
    ticket = Ticket(1.0, 0)
    book.acquire(ticket, 1.0, 1.0)
    lost = book.plan(1, renew=False)
    book.failed(lost)
    book.cancel(ticket)
    follow = book.plan(1, renew=False)
    assert follow.withdraw == [lost.enqueue[0][0]]
    assert (follow.enqueue, follow.ask) == ([], [])
    assert not book.busy()


def test_a_known_ticket_is_refused() -> None:
    book = SharedBook("n", "p")
    book.acquire(Ticket(1.0, 0), 1.0, 1.0)
    with pytest.raises(
        ValueError,
        match=r"^ticket Ticket\(rank=1\.0, seq=0, priority=0\) is already known$",
    ):
        book.acquire(Ticket(1.0, 0), 1.0, 1.0)
    assert book.waiting == 1
