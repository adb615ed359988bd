"""The pure bookkeeping of a provider shared through Redis, driven at random.

A model ledger stands in for Redis here (the scripts have their own tests
against a real server): it grants any subset of what a plan asks for, or
fails the round. Whatever happens, every ticket is in one state, the
published waiters are the oldest ``limit``, and everything a ticket had in
the ledger is given back exactly once when it leaves.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_dispatch import QueueFull
from trio_dispatch._shared_book import SharedBook
from trio_dispatch.messages._scheduling import Ticket

operations = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 30)),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("round"), st.integers(0, 3)),
        st.tuples(st.just("round_cancelled"), st.integers(0, 30)),
        st.tuples(st.just("fail"), st.integers(0, 0)),
        st.tuples(st.just("limit"), st.integers(1, 4)),
    ),
    max_size=60,
)


class ModelLedger:
    """Members it made, leases it gave, and what was handed back."""

    def __init__(self) -> None:
        self.seq = 0
        self.queue: set[str] = set()
        self.leases: set[str] = set()

    def apply(self, book: SharedBook, limit: int, grant: int) -> list[Ticket]:
        plan = book.plan(limit, renew=True)
        for lease in plan.release:
            assert lease in self.leases, "released a lease never granted"
            self.leases.remove(lease)
        for member in plan.withdraw:
            self.queue.discard(member)
        created = []
        for lease_id, _start in plan.enqueue:
            self.seq += 1
            member = f"{self.seq:016d}:{lease_id}"
            self.queue.add(member)
            created.append(member)
        assert set(plan.ask) <= self.queue
        asking = sorted(set(plan.ask) | set(created))[:grant]
        for member in asking:
            self.queue.remove(member)
            self.leases.add(member[17:])
        return book.applied(plan, created, asking)


@given(operations)
def test_the_book_keeps_every_ticket_in_one_state_and_gives_everything_back(
    ops: list[tuple[str, int]],
) -> None:
    book = SharedBook("n", max_waiting=8)
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
                book.acquire(ticket, 100.0 + arg)
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
            published = set(book._published)
            assert len(published) == min(limit, before) - len(new)
            assert published == set(book.waiters()[: len(published)])
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
    # Everything leaves; two rounds give every lease and entry back.
    for ticket in book.waiters() + sorted(book.holders()):
        book.cancel(ticket)
    ledger.apply(book, limit, 0)
    ledger.apply(book, limit, 0)
    assert ledger.leases == set()
    assert ledger.queue == set()
    assert not book.busy()


def test_only_the_oldest_waiters_up_to_the_limit_are_published() -> None:
    book = SharedBook("n")
    for seq, start in enumerate([5.0, 3.0, 4.0]):
        book.acquire(Ticket(start, seq), start)
    plan = book.plan(2, renew=False)
    assert plan.enqueued == [Ticket(3.0, 1), Ticket(4.0, 2)]
    book.applied(plan, ["m1", "m2"], [])
    # An older turn arrives: it is published, the youngest withdrawn.
    book.acquire(Ticket(1.0, 3), 1.0)
    again = book.plan(2, renew=True)
    assert again.enqueued == [Ticket(1.0, 3)]
    assert again.withdraw == ["m2"]
    assert again.ask == ["m1"]
    assert again.renew_entries == [("m1", 3.0)]


def test_a_grant_for_a_ticket_cancelled_meanwhile_is_given_back() -> None:
    book = SharedBook("n")
    ticket = Ticket(1.0, 0)
    book.acquire(ticket, 1.0)
    plan = book.plan(1, renew=False)
    book.cancel(ticket)
    member = "0000000000000001:n:0"
    assert book.applied(plan, [member], [member]) == []
    follow = book.plan(1, renew=False)
    assert (follow.release, follow.withdraw) == (["n:0"], [member])


def test_a_known_ticket_is_refused() -> None:
    book = SharedBook("n")
    book.acquire(Ticket(1.0, 0), 1.0)
    with pytest.raises(
        ValueError,
        match=r"^ticket Ticket\(rank=1\.0, seq=0, priority=0\) is already known$",
    ):
        book.acquire(Ticket(1.0, 0), 1.0)
    assert book.waiting == 1
