"""The actors' inbox."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch.actors._mailbox import Mailbox


async def test_fifo_and_whole_backlog_at_once() -> None:
    mailbox: Mailbox[int] = Mailbox()
    for n in range(5):
        mailbox.send_nowait(n)
    assert len(mailbox) == 5
    with trio.testing.assert_checkpoints():
        await mailbox.wait()
    assert list(mailbox.take_all()) == [0, 1, 2, 3, 4]
    assert len(mailbox) == 0


async def test_wait_parks_until_a_send_wakes_it() -> None:
    mailbox: Mailbox[str] = Mailbox()
    got: list[str] = []

    async def reader() -> None:
        await mailbox.wait()
        got.extend(mailbox.take_all())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        mailbox.send_nowait("a")
        mailbox.send_nowait("b")
    assert got == ["a", "b"]


async def test_close_wakes_the_reader_and_refuses_sends() -> None:
    mailbox: Mailbox[int] = Mailbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mailbox.wait)
        await trio.testing.wait_all_tasks_blocked()
        mailbox.close()
    assert mailbox.closed
    with pytest.raises(trio.ClosedResourceError, match=r"^the mailbox is closed$"):
        mailbox.send_nowait(1)
    with trio.testing.assert_checkpoints():
        await mailbox.wait()


async def test_a_cancelled_reader_can_wait_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    mailbox: Mailbox[int] = Mailbox()
    with trio.move_on_after(0.01):
        await mailbox.wait()
    mailbox.send_nowait(7)
    await mailbox.wait()
    assert list(mailbox.take_all()) == [7]


async def test_one_reader_at_a_time() -> None:
    mailbox: Mailbox[int] = Mailbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mailbox.wait)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(
            RuntimeError, match=r"^another task is already waiting on this mailbox$"
        ):
            await mailbox.wait()
        mailbox.send_nowait(1)
