"""``PoolProvider``: the providers of a pool's members, for conversations over the pool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, final

from ._validation import check_provider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from ._provider import Provider
    from .messages import ChatRequest, StreamEvent


@final
class PoolProvider:
    """A pool's members' providers, one per member: a conversation over the pool.

    ``dispatcher.start_conversation(PoolProvider("gpt", {"key-a":
    OpenAIProvider(...), "key-b": OpenAIProvider(...)}))`` (and
    ``wrap_provider``) takes each call's slot of the pool ``"gpt"``
    (``open_dispatcher``'s ``pools``), and sends the call through the
    provider of the member granted: its key, its server. The answer's
    figures and pauses are that member's, and the conversation's next call
    prefers it (``affinity_wait``). Its ``model`` is its members' if they
    all name the same one, else ``None``.

    It streams only through a dispatcher: the member is known once the
    slot is granted.

    Raises:
        TypeError: ``pool`` is not a string, ``members`` not a mapping, or
            a member's provider has no ``stream``.
        ValueError: ``pool`` or a member's name is empty, or there is no
            member.
    """

    __slots__ = ("_members", "id", "model")

    def __init__(self, pool: str, members: Mapping[str, Provider]) -> None:
        check_provider(pool)
        if not isinstance(members, Mapping):
            raise TypeError(
                f"members must be a mapping of member names to providers, got"
                f" {type(members).__name__}"
            )
        if not members:
            raise ValueError(f"pool {pool!r} must have a member")
        for name, provider in members.items():
            check_provider(name)
            if not callable(getattr(provider, "stream", None)):
                raise TypeError(
                    f"the provider of member {name!r} must be a Provider, got"
                    f" {type(provider).__name__}"
                )
        self.id = pool
        self._members = dict(members)
        models = {getattr(provider, "model", None) for provider in members.values()}
        self.model = models.pop() if len(models) == 1 else None

    def __repr__(self) -> str:
        return f"<PoolProvider {self.id!r} members={sorted(self._members)!r}>"

    @property
    def members(self) -> dict[str, Provider]:
        """Each member's provider, by member (a copy)."""
        return dict(self._members)

    def member(self, name: str) -> Provider:
        """The provider of member ``name``.

        Raises:
            ValueError: ``name`` is not one of its members.
        """
        provider = self._members.get(name)
        if provider is None:
            raise ValueError(
                f"pool {self.id!r} was granted on {name!r}, which has no provider here"
            )
        return provider

    def stream(
        self, request: ChatRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamEvent]]:
        """Refused: a pool streams through a dispatcher, which chooses the member.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(
            f"pool {self.id!r} streams only through a dispatcher"
            " (start_conversation, wrap_provider), which grants the member"
        )
