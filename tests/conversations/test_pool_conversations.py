"""Conversations over a pool: each call through the provider of the member granted.

``ScriptedProvider``s play the members in memory, in virtual time; which
one answered each call is what each provider recorded.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_dispatch import (
    DispatcherStatistics,
    PoolProvider,
    TurnResult,
    open_dispatcher,
    wrap_provider,
)
from trio_dispatch.messages import ChatMessage, ChatRequest
from trio_dispatch.testing import FakeReply, FakeScript, Fault, ScriptedProvider

# Each answer takes 5 s to its first token: calls started together overlap.
SCRIPT = FakeScript(default=FakeReply(text="fine", time_to_first_token=5.0))


def members() -> tuple[ScriptedProvider, ScriptedProvider, PoolProvider]:
    a = ScriptedProvider(SCRIPT, id="key-a")
    b = ScriptedProvider(SCRIPT, id="key-b")
    return a, b, PoolProvider("gpt", {"key-a": a, "key-b": b})


async def test_each_call_goes_through_its_granted_members_provider(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b, pool = members()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        first = dispatcher.start_conversation(pool, conversation_id="first")
        second = dispatcher.start_conversation(pool, conversation_id="second")
        async with trio.open_nursery() as nursery:
            for conversation in (first, second):
                nursery.start_soon(conversation.ask, "hello")
                await trio.testing.wait_all_tasks_blocked()
        # Both free: one call on each member at once.
        assert (len(a.requests), len(b.requests)) == (1, 1)
        # Each conversation's next call goes back to its member.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.ask, "again")
            nursery.start_soon(second.ask, "again")
        stats = dispatcher.statistics()
    assert (len(a.requests), len(b.requests)) == (2, 2)
    assert stats.pools["gpt"].affinity_hits == 2
    assert [stats.providers[m].granted_total for m in ("key-a", "key-b")] == [2, 2]


def first_fails(fault: Fault) -> FakeScript:
    """A member's script: ``fault`` once, then answers."""
    return FakeScript(default=FakeReply(text="fine"), replies=(FakeReply(fault=fault),))


async def ask_over(
    script_a: FakeScript, script_b: FakeScript
) -> tuple[TurnResult, ScriptedProvider, ScriptedProvider, DispatcherStatistics]:
    """One question over a pool of members that play these scripts (1 slot each)."""
    a = ScriptedProvider(script_a, id="key-a")
    b = ScriptedProvider(script_b, id="key-b")
    pool = PoolProvider("gpt", {"key-a": a, "key-b": b})
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        result = await dispatcher.start_conversation(pool).ask("hello")
        return result, a, b, dispatcher.statistics()


async def test_a_rate_limit_answer_pauses_its_member_and_the_call_goes_on_elsewhere(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limited = first_fails(Fault("rate_limit", retry_after=30.0))
    result, a, b, stats = await ask_over(limited, SCRIPT)
    assert result.text == "fine"
    assert result.retries == 0  # sent again elsewhere: no attempt spent
    # key-a answered 429 and rests for 30 s; the call went to key-b at once.
    assert (len(a.requests), len(b.requests)) == (1, 1)
    assert stats.providers["key-a"].paused
    assert trio.current_time() == 5.0  # key-b's answer, at once


async def test_a_server_error_sends_the_call_to_the_other_member_spending_no_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result, a, b, stats = await ask_over(first_fails(Fault("server_error")), SCRIPT)
    assert (result.text, result.retries) == ("fine", 0)
    assert (len(a.requests), len(b.requests)) == (1, 1)
    providers = stats.providers
    assert (providers["key-a"].failures, providers["key-b"].failures) == (1, 0)
    assert trio.current_time() == 5.0  # key-b's answer, at once


async def test_when_every_member_failed_the_conversation_retries_as_it_would(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failing = first_fails(Fault("server_error"))
    result, a, b, stats = await ask_over(failing, failing)
    # Both failed once: one attempt spent, then the second answered.
    assert (result.text, result.retries) == ("fine", 1)
    assert len(a.requests) + len(b.requests) == 3
    providers = stats.providers
    assert (providers["key-a"].failures, providers["key-b"].failures) in (
        (1, 0),
        (0, 1),
    )


async def test_wrap_provider_over_a_pool_streams_through_the_member_granted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b, pool = members()
    request = ChatRequest(messages=[ChatMessage(role="user", content="hi")])
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        limited = wrap_provider(pool, dispatcher)
        async with limited.stream(request) as events:
            assert [event async for event in events]
        assert (len(a.requests), len(b.requests)) == (1, 0)


async def test_a_pool_provider_must_match_its_pool() -> None:
    a, _, _ = members()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        with pytest.raises(
            ValueError,
            match=r"^PoolProvider 'gpt' names providers that are not members of the"
            r" pool: \['key-z'\]; its members: \['key-a', 'key-b'\]$",
        ):
            dispatcher.start_conversation(PoolProvider("gpt", {"key-a": a, "key-z": a}))
        # A member it has no provider for is avoided, not refused.
        dispatcher.start_conversation(PoolProvider("gpt", {"key-a": a}))
        with pytest.raises(ValueError, match=r"^PoolProvider 'other' names no pool"):
            wrap_provider(PoolProvider("other", {"key-a": a}), dispatcher)


def test_a_pool_provider_is_checked_and_streams_only_through_a_dispatcher() -> None:
    a, b, pool = members()
    assert pool.id == "gpt"
    assert pool.members == {"key-a": a, "key-b": b}
    assert repr(pool) == "<PoolProvider 'gpt' members=['key-a', 'key-b']>"
    request = ChatRequest(messages=[ChatMessage(role="user", content="hi")])
    with pytest.raises(RuntimeError, match=r"^pool 'gpt' streams only through"):
        pool.stream(request)
    with pytest.raises(ValueError, match=r"^pool 'gpt' must have a member$"):
        PoolProvider("gpt", {})
    with pytest.raises(TypeError, match=r"^the provider of member 'x' must be"):
        PoolProvider("gpt", {"x": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"^members must be a mapping"):
        PoolProvider("gpt", [a])  # type: ignore[arg-type]


async def test_a_member_that_joins_later_is_avoided_by_a_pool_provider_without_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b, pool = members()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        # key-c joins unlimited: the most free slots, but the conversation's
        # PoolProvider has no provider for it, so its calls never go there.
        dispatcher.set_pool("gpt", ("key-a", "key-b", "key-c"))
        conversation = dispatcher.start_conversation(pool)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(conversation.ask, "hello")
        assert dispatcher.statistics().providers["key-c"].granted_total == 0
    assert len(a.requests) + len(b.requests) == 3
    # One conversation asks one question at a time: three answers of 5 s.
    assert trio.current_time() == 15.0


async def test_a_waiting_call_granted_on_a_member_that_joined_goes_to_one_it_reaches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b, pool = members()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        conversations = [dispatcher.start_conversation(pool) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for conversation in conversations:
                nursery.start_soon(conversation.ask, "hello")
                await trio.testing.wait_all_tasks_blocked()
            # The third waits; key-c joins unlimited and is granted it at
            # once: no provider for it here, so it waits for key-a or key-b.
            dispatcher.set_pool("gpt", ("key-a", "key-b", "key-c"))
        stats = dispatcher.statistics().providers["key-c"]
    assert len(a.requests) + len(b.requests) == 3
    assert trio.current_time() == 10.0
    assert (stats.in_flight, stats.granted_total) == (0, 1)


async def test_a_pool_its_provider_cannot_reach_fails_the_turn_not_the_dispatcher(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from trio_dispatch import PoolUnreachable  # noqa: PLC0415

    a, _, pool = members()
    async with open_dispatcher(
        {"key-a": 1, "key-b": 1, "key-c": 1}, pools={"gpt": ("key-a", "key-b")}
    ) as dispatcher:
        conversation = dispatcher.start_conversation(pool)
        dispatcher.set_pool("gpt", ("key-c",))
        with pytest.raises(PoolUnreachable):
            await conversation.ask("hello")
        # The dispatcher and the conversation's provider go on.
        async with dispatcher.slot("key-a") as slot:
            assert slot.member == "key-a"
    assert a.requests == []
