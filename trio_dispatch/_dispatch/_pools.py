"""Pools: several providers (members) serving one model, in one queue.

``open_dispatcher(limits, pools={"gpt": ("key-a", "key-b")})`` names a pool
over providers. The providers that pools join (directly, or through a
member two pools share) are a *group*: one local scheduler, whose policy
has every member of the group (each with its own limit, budgets, pause and
adaptive limit) and every pool of it, so that one queue orders them all
(``SlotPolicy``'s module notes say how). Each member and each pool is
still a backend of its own name to the dispatcher: a ``MemberView``, which
hands the group's scheduler what concerns it in a ``ForMember`` and reads
its own statistics there. A group's scheduler runs once, whichever view
the dispatcher starts first; the others wait for the dispatcher to close.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, final

import trio

from .._validation import check_provider
from ..messages._protocol import (
    Acquire,
    Adapt,
    ForMember,
    ObserveRateLimits,
    ObserveServerLoad,
    Pause,
    Resume,
    SetLimit,
    SetModelBudget,
)

if TYPE_CHECKING:
    from .._policy._slots import PoolStatistics
    from ..messages._protocol import SchedulerMessage, Ticket
    from ._backend import ProviderStatistics

#: The messages a view hands its group's scheduler as its own, in a ``ForMember``.
_FOR_MEMBER = (
    Acquire,
    SetLimit,
    Adapt,
    Pause,
    Resume,
    ObserveRateLimits,
    ObserveServerLoad,
    SetModelBudget,
)


def check_pools(pools: object, name: str = "pools") -> dict[str, tuple[str, ...]]:
    """Pool names to their members: each a non-empty sequence of distinct provider names.

    Raises:
        TypeError: Not a mapping, or a pool's members not a list or tuple
            of strings.
        ValueError: A name empty, a pool without members or naming one
            twice.
    """
    if not isinstance(pools, Mapping):
        raise TypeError(
            f"{name} must be a mapping of pool names to their members, got {pools!r}"
        )
    checked: dict[str, tuple[str, ...]] = {}
    for pool, members in pools.items():
        check_provider(pool)
        checked[pool] = check_members(pool, members)
    return checked


def check_members(pool: str, members: object) -> tuple[str, ...]:
    """``pool``'s members: a non-empty list or tuple of distinct provider names."""
    if isinstance(members, str) or not isinstance(members, Iterable):
        raise TypeError(
            f"the members of pool {pool!r} must be a list or tuple of provider"
            f" names, got {members!r}"
        )
    names = tuple(members)
    for member in names:
        check_provider(member)
    if not names:
        raise ValueError(f"pool {pool!r} must have a member")
    if len(set(names)) != len(names):
        raise ValueError(f"pool {pool!r} names a member twice")
    return names


class GroupScheduler(Protocol):
    """A group's scheduler, as its views use it: the local one, or the shared one (``redis_url``)."""

    def knows(self, name: str) -> bool: ...
    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket: ...
    def send(self, message: SchedulerMessage) -> None: ...
    def member_of(self, ticket: Ticket) -> str | None: ...
    def member_statistics(self, member: str) -> ProviderStatistics: ...
    def pool_statistics(self) -> dict[str, PoolStatistics]: ...
    def close(self) -> None: ...
    async def run(self, *, stop_when_idle: bool = False) -> bool: ...


@final
class Group:
    """Providers scheduled together, because pools join them, and those pools.

    Attributes:
        members: The providers, in the order they were first named.
        pools: The pools over them, by name.
        actor: Their scheduler, once made.
        running: Whether a view runs the scheduler's task.
        merged_into: The group it merged into, whose scheduler its views
            reach from then on; ``None`` while it has not.
    """

    __slots__ = ("actor", "members", "merged_into", "pools", "running")

    def __init__(self) -> None:
        self.members: list[str] = []
        self.pools: dict[str, tuple[str, ...]] = {}
        self.actor: GroupScheduler | None = None
        self.running = False
        self.merged_into: Group | None = None

    def __repr__(self) -> str:
        return f"<Group members={self.members!r} pools={self.pools!r}>"

    def final(self) -> Group:
        """The group that schedules this one's members now: itself, or the one it merged into, in turn."""
        group = self
        while group.merged_into is not None:
            group = group.merged_into
        return group


def groups_of(pools: Mapping[str, tuple[str, ...]]) -> dict[str, Group]:
    """The group of each provider and pool of ``pools``, by name.

    Pools that share a member are one group (and so, in turn, pools that
    share a member with one of those).
    """
    found: dict[str, Group] = {}
    for pool, members in pools.items():
        joined = {id(found[name]): found[name] for name in members if name in found}
        group = Group()
        for other in joined.values():
            for name in other.members:
                if name not in group.members:
                    group.members.append(name)
            group.pools.update(other.pools)
        for name in members:
            if name not in group.members:
                group.members.append(name)
        group.pools[pool] = members
        for name in [*group.members, *group.pools]:
            found[name] = group
    return found


@final
class MemberView:
    """The backend of one member or pool of a group: its part of the group's scheduler.

    What the dispatcher holds for the name, as for any provider: messages
    that concern the name (a request, a limit, a pause, a budget, an
    answer's figures) reach the scheduler in a ``ForMember``, the others
    (release, cancel, a tenant...) as they are; ``statistics()`` is the
    member's own.
    """

    __slots__ = ("group", "provider")

    def __init__(self, provider: str, group: Group) -> None:
        self.provider = provider
        self.group = group

    def __repr__(self) -> str:
        return f"<MemberView {self.provider!r} of {self.group!r}>"

    @property
    def actor(self) -> GroupScheduler:
        """The group's scheduler: once its group merged into another, that one's."""
        group = self.group
        if group.merged_into is not None:
            # Its group merged (maybe into one that merged in turn): the
            # view follows, once, to the group that schedules it now.
            group = self.group = group.final()
        actor = group.actor
        assert actor is not None  # made with the group's first view
        return actor

    @property
    def joined(self) -> bool:
        """Whether its scheduler has its member or pool yet: its join may still be queued."""
        return self.actor.knows(self.provider)

    def ticket(
        self,
        rank: float,
        priority: int = 0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> Ticket:
        """A fresh ticket of the group's scheduler."""
        return self.actor.ticket(rank, priority, tenant, model)

    def send(self, message: SchedulerMessage) -> None:
        """Hand the group's scheduler ``message``, for this member or pool if it concerns one."""
        if isinstance(message, _FOR_MEMBER):
            self.actor.send(ForMember(self.provider, message))
        else:
            self.actor.send(message)

    def member_of(self, ticket: Ticket) -> str | None:
        """The member on which ``ticket`` holds its slot, or ``None`` if it holds none."""
        return self.actor.member_of(ticket)

    def statistics(self) -> ProviderStatistics:
        """The member's snapshot; a pool's as a provider's (``statistics().pools`` has its own)."""
        return self.actor.member_statistics(self.provider)

    def close(self) -> None:
        """Close the group's scheduler: every member and pool of it closes."""
        self.actor.close()

    async def run(
        self, *, stop_when_idle: bool = False
    ) -> bool:  # a group never stops when idle
        """Run the group's scheduler, or, if another view runs it, wait until the dispatcher closes.

        A group's scheduler never stops when idle: its members share it.
        A view of a group that merged into another runs nothing.
        """
        group = self.group
        if group.merged_into is not None:
            return False  # the group it merged into runs its scheduler
        if group.running:
            await trio.sleep_forever()
        group.running = True
        try:
            return await self.actor.run()
        finally:
            group.running = False
