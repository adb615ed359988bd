"""The call through ``wrap_provider`` the current task is making, if any.

A provider given the dispatcher's own callbacks
(``on_rate_limits=dispatcher.observe_rate_limits``,
``on_rate_limit=dispatcher.report_rate_limit``) tells the dispatcher of an
answer before the wrapper reads it off the answer. ``CALL`` lets the
dispatcher note that on the call, so the wrapper does not tell it again.
Below the dispatcher and the integrations both, so neither imports the
other for it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final, Protocol, final


class _Held(Protocol):
    """What a call needs of its slot."""

    @property
    def provider(self) -> str: ...

    def answered(self) -> None: ...


@final
class WrappedCall:
    """A call through ``wrap_provider`` under way: its slot, and what was told.

    Set in ``CALL`` while the provider's stream opens and runs. The
    dispatcher's ``observe_rate_limits`` and ``report_rate_limit`` note here
    that the provider's own callbacks told them of this call's answer, so
    the wrapper does not tell them again.

    Attributes:
        dispatcher: The dispatcher whose slot the call holds.
        slot: The slot.
        observed: The answer's rate-limit figures reached the dispatcher.
        reported: The answer's rate limit (429, 529, 503) paused it.
    """

    __slots__ = ("_answered", "dispatcher", "observed", "reported", "slot")

    def __init__(self, dispatcher: object, slot: _Held) -> None:
        self.dispatcher = dispatcher
        self.slot = slot
        self.observed = False
        self.reported = False
        self._answered = False

    def concerns(self, dispatcher: object, provider: str) -> bool:
        """Whether this call is ``dispatcher``'s and ``provider``'s."""
        return dispatcher is self.dispatcher and provider == self.slot.provider

    def answered(self) -> None:
        """The call's answer started: its slot says so to the scheduler, once."""
        if not self._answered:
            self._answered = True
            self.slot.answered()


CALL: Final[ContextVar[WrappedCall | None]] = ContextVar(
    "trio_dispatch_call", default=None
)
"""The call through ``wrap_provider`` the current task is making, if any."""
