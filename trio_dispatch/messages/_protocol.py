"""The scheduling protocol between requesters and a provider's scheduler.

A requester sends ``Acquire`` with a fresh ``Ticket`` and a ``Reply`` to
answer on; the scheduler answers exactly once, through the reply: the
request is granted (``Reply.granted``) or refused with an error
(``Reply.refused``). The requester then sends ``Release`` when it is done
with the slot, or ``Cancel`` if it stopped waiting. ``SetLimit``, ``Pause``
and ``Resume`` come from the dispatcher, and so do ``Adapt`` (an adaptive
limit), ``SetTenant`` (a tenant's weight and cap), ``SetModelBudget`` (one
model's budget), ``ObserveRateLimits``
(an answer's rate-limit figures, for the budgets), ``ObserveLatency``
(how fast a call's tokens came, for a latency-signal adaptive limit),
``ObserveServerLoad`` (what the provider's server says of its load),
``Answered`` (a request's answer started), ``Failed`` (a request's call
failed before its answer: its slot goes back) and ``ReportUsage`` (a request's tokens, which
correct its estimate). All of them travel over one FIFO
memory channel per scheduler, so a ``Cancel`` can never overtake its
``Acquire``.

A scheduler of pooled providers (see ``open_dispatcher``'s ``pools``)
schedules several members, and pools of them, in one queue: a message that
concerns one member or pool of it comes wrapped in ``ForMember``, and
``SetPool`` and ``RemovePool`` change its pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, final

import attrs

from ._limits import check_model_budget, check_tenant

if TYPE_CHECKING:
    from .._policy._ratelimits import RateLimitInfo
    from .._server_load._load import ServerLoad
    from ._limits import AdaptiveLimit, Budget, Tenant


@final
class Ticket(NamedTuple):
    """The identity and place in line of one request for a slot.

    Tickets order by ``rank``, then by ``seq`` (the order the scheduler
    received them), so that a tuple's own comparison, done in C, is the
    grant order; ties are first come, first served. A ``NamedTuple`` rather
    than an attrs class because the scheduler keeps waiting tickets in a
    heap, and tuples compare in C.

    The rank is when the request's turn began, on the trio clock, minus the
    credit of its priority class: ``started_at - priority * priority_aging``
    (see ``open_dispatcher``). A request of class ``p`` ranks as if its turn
    had started ``p * priority_aging`` seconds earlier: within a class the
    oldest turn goes first, and a lower class passes a higher one once its
    turn is older by that many seconds per class between them. With
    priority 0 the rank is the turn's start.

    Attributes:
        rank: When the turn began, less the priority's credit.
        seq: The scheduler's count of tickets, unique per scheduler.
        priority: The request's priority class (higher first), carried for
            whoever reads the ticket; the order needs only ``rank``.
        tenant: The tenant the request is made for, or ``None`` (see
            ``Tenant``): the policy queues each tenant's tickets apart.
        model: The model the request asks for, or ``None``: a budget of
            that model (configured as ``"provider/model"``, or learned from
            its answers) must hold it too.
    """

    rank: float
    seq: int
    priority: int = 0
    tenant: str | None = None
    model: str | None = None

    def __repr__(self) -> str:
        shown = (
            f"Ticket(rank={self.rank!r}, seq={self.seq!r}, priority={self.priority!r}"
        )
        if self.tenant is not None:
            shown += f", tenant={self.tenant!r}"
        if self.model is not None:
            shown += f", model={self.model!r}"
        return shown + ")"


@final
@attrs.frozen
class Grant:
    """A grant as a value: ``ticket`` was granted at ``granted_at`` (trio clock).

    What a backend tells a ``Reply`` with ``granted(ticket, granted_at)``,
    kept as one value by whoever records it (a test's reply, say).
    """

    ticket: Ticket
    granted_at: float


class Reply(Protocol):
    """Where a backend sends its one answer to an ``Acquire``.

    ``Slot`` implements it. Its methods are called only by a backend (the
    scheduler of the slot's provider), from the backend's task or from the
    requester's own call to ``acquire``, ``release`` or ``cancel``; they
    must not block. A stray call from anywhere else would put a slot and
    its scheduler out of step. A reply whose requester already gave up
    ignores the call; the slot of a grant that finds nobody is returned by
    the requester's ``Cancel``.

    A backend that leases its slots (the Redis-shared scheduler) also calls
    ``lease_until(deadline)`` before the grant and at each renewal; a reply
    of a backend that does not lease may do nothing there.
    """

    def granted(self, ticket: Ticket, granted_at: float) -> None:
        """Deliver the slot of ``ticket``, granted at ``granted_at`` (trio clock).

        Plain arguments, no ``Grant`` value: this is every hand-off's path.
        """

    def refused(self, error: Exception) -> None:
        """Deliver a refusal; the requester holds nothing.

        A ``DispatchError`` when the dispatcher refuses (``QueueFull``,
        ``DispatcherClosed``); the policy's ``ValueError`` or
        ``RuntimeError`` when the request misused the protocol.
        """

    def lease_until(self, deadline: float) -> None:
        """The slot's lease is sure to live until ``deadline`` (trio clock).

        Called by a leasing backend before the grant and at each renewal.
        """


@final
@attrs.frozen
class Acquire:
    """Ask for a slot; the answer goes to ``reply``.

    ``tokens`` is the request's estimated cost for a token budget (0: none).
    ``avoid`` names members of a pool the request must not be granted on
    (those its call already failed on: a fallback); ignored but for a pool.
    """

    ticket: Ticket
    reply: Reply = attrs.field(eq=False, repr=False)
    conversation_id: str | None = None
    tokens: int = 0
    avoid: tuple[str, ...] = ()


@final
@attrs.frozen
class Release:
    """Give back the slot of a granted ticket. Idempotent."""

    ticket: Ticket


@final
@attrs.frozen
class Failed:
    """Give back the slot of a granted ticket whose call failed before its answer.

    A connection refused or reset, no first byte in time, a server error:
    no success, and one failure more in a row for the member it holds (see
    ``SlotPolicy.fail``). Idempotent, as ``Release``.
    """

    ticket: Ticket


@final
@attrs.frozen
class Cancel:
    """Stop waiting for a ticket; if it was already granted, release it."""

    ticket: Ticket


@final
@attrs.frozen
class SetLimit:
    """Change the provider's limit; ``None`` lifts it."""

    limit: int | None


@final
@attrs.frozen
class Adapt:
    """Give the provider an adaptive limit, starting at its ``initial`` value."""

    limit: AdaptiveLimit


@final
@attrs.frozen
class Pause:
    """A rate-limit answer arrived at ``reported_at`` (trio clock): pause grants.

    For ``retry_after`` seconds, the server's delay, or for the backoff when
    it is ``None``; at most ``max_pause`` (see ``SlotPolicy``). A later
    pause can extend it, never shorten it.
    """

    reported_at: float
    retry_after: float | None = None


@final
@attrs.frozen
class Resume:
    """End the pause and the backoff streak now."""


@final
@attrs.frozen
class ReportUsage:
    """The request of a held ticket used ``tokens`` in all: correct its charge."""

    ticket: Ticket
    tokens: int


@final
@attrs.frozen
class Answered:
    """The answer of a held ticket started: the provider has counted it."""

    ticket: Ticket


@final
@attrs.frozen
class ObserveLatency:
    """The call of a held ticket ended: how long its tokens took to come.

    For a latency-signal ``AdaptiveLimit``; other limits ignore it.

    Attributes:
        ticket: The held ticket.
        first_token: Seconds from the grant to the first token.
        between_tokens: Mean seconds between two tokens, or ``None`` for
            an answer of fewer than two.
        duration: Seconds from the grant to the answer's end.
        prompt_tokens: The prompt's size in tokens, estimated.
    """

    ticket: Ticket
    first_token: float
    between_tokens: float | None
    duration: float
    prompt_tokens: int


@final
@attrs.frozen
class ObserveServerLoad:
    """The provider's server said its load: ``load``, or ``None`` if reading it failed.

    What ``open_dispatcher``'s ``server_load`` reads; a policy keeps our
    requests out of the server's own queue with it (``_policy._server``).
    """

    load: ServerLoad | None


@final
@attrs.frozen
class ObserveRateLimits:
    """An answer that arrived at ``observed_at`` (trio clock) reported ``info``.

    ``model`` is the model the answer is for: its figures teach that
    model's budget; ``None``, the provider's (over all its models).
    """

    observed_at: float
    info: RateLimitInfo
    model: str | None = None


@final
@attrs.frozen
class SetTenant:
    """Give ``tenant`` its weight and cap on this provider; ``None``: the defaults.

    Raises:
        TypeError: ``tenant`` is not a string, or ``settings`` not a
            ``Tenant`` or ``None``.
        ValueError: ``tenant`` is empty or longer than 256 characters.
    """

    tenant: str
    settings: Tenant | None

    def __attrs_post_init__(self) -> None:
        check_tenant(self.tenant, self.settings)


@final
@attrs.frozen
class SetModelBudget:
    """Give ``model`` a budget of its own on this provider, beside the provider's.

    A request for ``model`` is granted only when both budgets hold it. The
    budget starts full; figures from the model's answers still lower it.

    Raises:
        TypeError: ``model`` is not a string or ``budget`` not a ``Budget``.
        ValueError: ``model`` is empty.
    """

    model: str
    budget: Budget

    def __attrs_post_init__(self) -> None:
        check_model_budget(self.model, self.budget)


@final
@attrs.frozen
class SetPool:
    """Make ``pool`` a pool of ``members`` (providers of this scheduler), or change them.

    The requests waiting for the pool keep their place; those that wait for
    a member no longer in it wait for any of its members.
    """

    pool: str
    members: tuple[str, ...]


@final
@attrs.frozen
class RemovePool:
    """Forget ``pool``; the requests waiting for it are refused (``PoolRemoved``)."""

    pool: str


@final
@attrs.frozen
class ForMember:
    """``message`` concerns ``member``, a provider or pool of a pooled scheduler.

    An ``Acquire`` for a member waits for it alone; one for a pool goes to
    whichever of its members can take it first. The others (a limit, a
    pause, a budget, an answer's figures) change that member alone.
    """

    member: str
    message: (
        Acquire
        | SetLimit
        | Adapt
        | Pause
        | Resume
        | ObserveRateLimits
        | ObserveServerLoad
        | SetModelBudget
    )


SchedulerMessage = (
    Acquire
    | Release
    | Cancel
    | Failed
    | SetLimit
    | Pause
    | Resume
    | Adapt
    | ReportUsage
    | Answered
    | ObserveLatency
    | ObserveServerLoad
    | ObserveRateLimits
    | SetTenant
    | SetModelBudget
    | ForMember
    | SetPool
    | RemovePool
)
"""Everything a scheduler actor reads from its inbox."""
