"""The ``Dispatcher`` an application gets, and ``wrap_provider``.

One class: limits, slots, turns, pauses, tenants, events and statistics,
and the two methods that make integrations (``transport()``,
``start_conversation()``). Its machinery (the backends, the settings, the
event hub, the nursery) is a ``Plumbing`` (``_plumbing``), which it owns
and hands to the integrations: they build on the plumbing and import
nothing of this module, so the imports point one way. The plumbing's own
members (``start_soon``, ``hold``...) are ``trio_dispatch.lowlevel``'s
(``lowlevel.plumbing(dispatcher)``); their old names here are deprecated.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final, overload

from .._conversations._conversation import start_conversation
from .._endpoint import Endpoint
from .._integrations._limited import LimitedProvider
from .._util import NoPublicConstructor
from .._validation import check_flag, check_provider
from ._plumbing import UNSET, run_plumbing

if TYPE_CHECKING:
    import contextlib
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
    from typing import Self

    import httpx
    import httpx2

    from .._conversations._conversation import Conversation
    from .._conversations._options import ConversationOptions
    from .._conversations._tools import Tool
    from .._integrations._transport import DispatchTransport
    from .._integrations._transport_legacy import LegacyDispatchTransport
    from .._observe._hub import (
        CallObserver,
        CallWatch,
        EventSink,
        EventSubscription,
    )
    from .._policy._budgets import AdaptiveLimit
    from .._policy._ratelimits import RateLimitInfo
    from .._provider import Provider
    from ..messages import ChatMessage
    from ..messages._limits import Tenant
    from ._plumbing import Plumbing
    from ._settings import Settings
    from ._slot import Slot
    from ._statistics import DispatcherStatistics
    from ._turn import Turn

    _MakeTransport = Callable[
        [Plumbing, str, bool, "dict[str, Endpoint] | None"],
        DispatchTransport | LegacyDispatchTransport,
    ]


@final
class Dispatcher(metaclass=NoPublicConstructor):
    """Per-provider concurrency limits, granted oldest turn first.

    Made by ``open_dispatcher``; valid inside its ``async with`` block. Each
    provider has its own scheduler actor, started when it is first limited or
    used. A provider without a limit is unlimited: its scheduler grants every
    request at once, but still counts the slots in use, so a limit set later
    counts them too (they finish; nothing new is granted above the limit).
    The scheduler of an unlimited provider stops when no slot is held and
    nothing waits, and starts again on the next request, so names used once
    (model ids, say) leave no task behind; its counters carry on.

    A provider is *known* once it is named in ``limits``, given a limit with
    ``set_limit``, or made unlimited on purpose with ``remove_limit`` (it
    stays known). A slot of any other provider is unlimited by accident, as
    a misspelt name would be: ``unknown_providers`` says what happens then.

    A dispatcher belongs to the trio run that opened it: used from another
    run (a ``trio.run`` in another thread), it raises ``RuntimeError`` at
    once, before anything reaches its own run (see ``check_run``). Other
    threads call into its run with ``trio.from_thread.run``.
    """

    __slots__ = ("_plumbing",)

    def __init__(self, plumbing: Plumbing) -> None:
        self._plumbing = plumbing

    def __repr__(self) -> str:
        plumbing = self._plumbing
        state = "closed" if plumbing.closed else "open"
        return f"<Dispatcher {state} limits={plumbing.limits()!r}>"

    @property
    def max_pause(self) -> float:
        """The longest pause (``open_dispatcher``'s ``max_pause``), in seconds.

        It also caps a conversation's retry wait.
        """
        return self._plumbing.max_pause

    @property
    def max_hold(self) -> float | None:
        """How long a slot may be held (``open_dispatcher``'s ``max_hold``), or ``None``."""
        return self._plumbing.max_hold

    @property
    def retry_grace(self) -> float:
        """How long a granted kept place waits for its retry (``open_dispatcher``'s ``retry_grace``)."""
        return self._plumbing.retry_grace

    @property
    def lease(self) -> float:
        """The lease of a slot shared through Redis, in seconds (``open_dispatcher``'s ``lease``)."""
        return self._plumbing.lease

    @property
    def closed(self) -> bool:
        """Whether the dispatcher has shut down."""
        return self._plumbing.closed

    def check_run(self) -> None:
        """Refuse a call made outside the trio run that opened the dispatcher.

        A dispatcher's tasks, channels and slots live in one trio run (one
        thread): a grant reaching a task of another run would corrupt both.
        So every way into the run checks first, before anything changes:
        entering a slot (and so ``wrap_provider``, ``transport()`` and
        conversations), ``turn()``, ``events()``, ``statistics()``, the
        limits, pauses and tenants, and starting or asking a conversation.
        Once closed, the dispatcher is inert: its methods say
        ``DispatcherClosed`` (or nothing) wherever they are called from.
        Integrations that reach the run by other ways than the
        dispatcher's methods, as a conversation's queue does, call the
        plumbing's (``lowlevel.plumbing(dispatcher).check_run``).

        Raises:
            RuntimeError: Called from another trio run, or from no trio run
                at all, while the dispatcher is open.
        """
        self._plumbing.check_run()

    def turn(
        self,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
        priority: int = 0,
        tenant: str | None = None,
    ) -> contextlib.AbstractContextManager[Turn]:
        """A turn, for a plain ``with``: every slot taken inside it is its call.

        Inside the block, ``slot()`` (and so ``wrap_provider``'s streams,
        conversations and anything else that takes a slot without naming
        them) uses the turn's ``conversation_id``, ``started_at``,
        ``priority`` and ``tenant`` where it is not given them: every LLM call of the turn
        keeps the place in line that the turn's start gave it. Tasks started
        inside the block belong to the turn too (trio copies the context at
        spawn). A turn entered inside another replaces it, whole, until its
        block ends. The turn is plain data, tied to no dispatcher: a slot of
        any dispatcher taken inside it carries it. Outside any turn, each
        request is its own turn (it starts when the slot is asked for, with
        priority 0).

        Args:
            conversation_id: Who asks, for every slot of the turn.
            started_at: When the turn began, on the trio clock; defaults to
                now.
            priority: The turn's priority class (see ``open_dispatcher``'s
                ``priority_aging``); higher goes first.
            tenant: The tenant every slot of the turn is taken for (see
                ``open_dispatcher``'s ``tenants``), or ``None`` for none.

        Returns:
            A context manager, entered once, whose value is the ``Turn``.

        Raises:
            TypeError: ``conversation_id`` not a string or ``None``,
                ``started_at`` not a number, ``priority`` not an int,
                ``tenant`` not a string or ``None``.
            ValueError: ``started_at`` not finite, ``priority`` out of
                range, ``tenant`` empty or longer than 256 characters.
        """
        return self._plumbing.turn(
            conversation_id=conversation_id,
            started_at=started_at,
            priority=priority,
            tenant=tenant,
        )

    def slot(
        self,
        provider: str,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
        priority: int | None = None,
        max_hold: float | None = UNSET,
        tokens: int | None = None,
        tenant: str | None = None,
        model: str | None = None,
        avoid: Iterable[str] | None = None,
    ) -> Slot:
        """A slot of ``provider``, to hold with ``async with``.

        Requests go in priority class first (higher first, with the aging
        of ``open_dispatcher``'s ``priority_aging``), then oldest turn, then
        arrival order. What is not given comes from the current ``turn()``,
        field by field; outside any turn the request is a turn of its own.

        Args:
            provider: The provider's name; if it has no limit, the slot is
                granted at once (it is still counted, for a limit set later).
            conversation_id: Who asks: kept on the slot and sent with the
                request to the scheduler. Defaults to the current turn's.
            started_at: When the request's turn began, on the trio clock:
                earlier goes first within a class. Defaults to the current
                turn's start, or now outside any turn.
            priority: The request's priority class, an int; higher goes
                first. Defaults to the current turn's, or 0.
            max_hold: Seconds the slot may be held before the body is
                cancelled and ``SlotHoldTimeout`` raised; defaults to the
                dispatcher's ``max_hold``. ``None`` for no bound. Applies to
                providers limited when the slot is granted.
            tokens: The request's estimated tokens (prompt and answer),
                charged to the provider's token budget when the slot is
                granted; correct it with ``Slot.report_usage``. ``None``
                charges none up front.
            tenant: The tenant the request is made for (see
                ``open_dispatcher``'s ``tenants``). Defaults to the current
                turn's, or none.
            model: The model the request asks for, or ``None``: its budget
                (``"provider/model"`` in ``open_dispatcher``'s
                ``budgets``, or learned from that model's answers) must
                hold it too, beside the provider's.
            avoid: For a pool, members not to grant the slot on: those
                the request's call already failed on (``Slot.failed()``),
                when it is sent again elsewhere. With ``started_at`` the
                failed slot's, it keeps its place in line. Ignored for a
                provider that is no pool.

        Raises:
            TypeError: An argument of the wrong type (``tenant`` or
                ``model`` not a string or ``None``, ``avoid`` a string...).
            ValueError: At once, if ``provider`` is unknown and the
                dispatcher's ``unknown_providers`` is ``"error"``; or a
                bad value (an empty ``tenant`` or ``model``, a ``tenant``
                longer than 256 characters...), or ``avoid`` naming every
                member of the pool.
            DispatcherClosed: On entering, if the dispatcher has closed or
                closes while waiting.
            QueueFull: On entering, if ``max_waiting`` requests already wait.
        """
        return self._plumbing.slot(
            provider,
            conversation_id=conversation_id,
            started_at=started_at,
            priority=priority,
            max_hold=max_hold,
            tokens=tokens,
            tenant=tenant,
            model=model,
            avoid=avoid,
        )

    def set_limit(self, provider: str, limit: int | AdaptiveLimit) -> None:
        """Limit ``provider`` to ``limit`` concurrent slots, now.

        A higher limit grants waiting requests at once; a lower one lets the
        current holders finish and grants nothing until fewer than ``limit``
        hold a slot. An ``AdaptiveLimit`` starts at its ``initial`` value
        and moves on its own; an int replaces it by a fixed limit.

        With ``redis_url``, the limit is stored in Redis for the whole
        fleet, an ``AdaptiveLimit`` too: every process then follows its
        value, which the fleet's successes and rate limits move.
        """
        self._plumbing.set_limit(provider, limit)

    def remove_limit(self, provider: str) -> None:
        """Lift the limit of ``provider``: waiters go through, nobody waits.

        Its scheduler keeps counting the slots in use (granting every request
        at once), so a limit set again later counts every holder and the
        provider never sees more than the new limit once they finish. The
        provider stays known (even one never limited): it is unlimited on
        purpose, so ``unknown_providers`` does not apply to it.
        """
        self._plumbing.remove_limit(provider)

    def limits(self) -> dict[str, int]:
        """The limits, provider by provider (a copy); an adaptive one's current value."""
        return self._plumbing.limits()

    def set_pool(self, pool: str, members: Sequence[str]) -> None:
        """Make ``pool`` a pool of ``members``, or change its members, now.

        ``slot(pool)`` then goes to whichever member can take it first, in
        the pool's one queue (see ``open_dispatcher``'s ``pools``). The
        requests already waiting for the pool keep their place, and go to
        the new members as they free up; those waiting for a member that
        leaves the pool (their conversation's) wait for any member now.
        Slots held on a member that leaves keep it until given back.

        A pool may take, at run time, members already pooled together
        (named in ``open_dispatcher``'s ``pools``, or in an earlier
        ``set_pool``), providers new to the dispatcher, which join as
        members at once (unlimited until ``set_limit``), and providers
        scheduled on their own so far, which join with their limit,
        adaptive limit, budgets (configured and learned), pause, the
        slots held on them and the requests waiting for them, in their
        place. Members of pools scheduled apart (no member in common) join
        their groups into one, each with all it holds and learned: its
        members' state (out of service too), its pools, the slots held
        and the requests waiting, in their place and order, and the
        member each conversation last had.

        A provider's tenants share one queue with the pool's: a tenant's
        cap and share count over the whole group of the pool's members
        from then on (see ``open_dispatcher``'s ``pools``).

        Raises:
            ValueError: ``pool`` is a provider's name (or a member's),
                ``members`` is empty or names one twice or names a pool;
                or the dispatcher has ``redis_url`` (a fleet's pools are
                declared to ``open_dispatcher``, the same in every
                process) or a backend factory of one's own, which
                schedules no pools (nothing changes).
            DispatcherClosed: The dispatcher has closed, or a scheduler
                it would take stopped.
        """
        self._plumbing.set_pool(pool, members)

    def remove_pool(self, pool: str) -> None:
        """Forget ``pool``: the requests waiting for it fail with ``PoolRemoved``.

        Its members stay, with their limits, slots and queue places.

        Raises:
            ValueError: There is no such pool, or the dispatcher has
                ``redis_url`` (a fleet's pools are fixed; nothing changes).
            DispatcherClosed: The dispatcher has closed.
        """
        self._plumbing.remove_pool(pool)

    def pools(self) -> dict[str, tuple[str, ...]]:
        """Each pool's members, by pool (a copy)."""
        return self._plumbing.pools()

    def observe_rate_limits(
        self, provider: str, info: RateLimitInfo, *, model: str | None = None
    ) -> None:
        """Learn from the rate-limit figures of one of ``provider``'s answers.

        Every answer that carries rate-limit headers, success or error,
        comes here: by itself for the calls made through the dispatcher
        (``wrap_provider``, conversations, ``transport()``), which read
        the figures off the answer; through a provider's
        ``on_rate_limits=`` for one used without a dispatcher's slot (a
        provider given both is counted once: an answer the dispatcher
        meters calls no callback of its provider). The figures pace the
        provider's budgets (see ``open_dispatcher``'s ``budgets`` and
        ``learn_budgets``). Synchronous, never blocks, and never raises for
        what ``info`` says. Subscribers to ``events()`` get each as a
        ``RateLimitsReceived``; the budgets ignore them with
        ``learn_budgets=False``. With ``redis_url``, the fleet's budgets in
        Redis learn them, with the scheduler's next exchange. Ignored once
        the dispatcher has closed.

        Providers count their limits per model (OpenAI's headers are a
        model's), so figures of an answer for ``model`` pace that model's
        budget, and figures of an answer for no known model (``None``)
        pace the provider's, over all its models. The calls made through
        the dispatcher name their model by themselves: our providers'
        ``model``, the ``model`` of a transport's JSON body, a slot's
        ``model``.

        Raises:
            TypeError: ``provider`` or ``model`` is not a string, or
                ``info`` not a ``RateLimitInfo``.
            ValueError: ``provider`` or ``model`` is empty.
        """
        self._plumbing.observe_rate_limits(provider, info, model=model)

    def set_tenant(self, tenant: str, settings: Tenant) -> None:
        """Give ``tenant`` its share ``settings`` (a ``Tenant``), now, everywhere.

        Every provider's scheduler applies it at once, and every one made
        later starts with it: a new weight counts from now on (the
        service received so far keeps its old weight), a higher cap grants
        waiting requests of the tenant at once, and a lower one lets its
        holders finish and grants it nothing more until it holds fewer
        slots than the cap. With ``redis_url``, the whole fleet follows it.

        Raises:
            TypeError: ``tenant`` is not a string, or ``settings`` not a
                ``Tenant``.
            ValueError: ``tenant`` is empty or longer than 256 characters.
            DispatcherClosed: The dispatcher has closed.
        """
        self._plumbing.set_tenant(tenant, settings)

    def remove_tenant(self, tenant: str) -> None:
        """Give ``tenant`` the defaults again (``Tenant()``: weight 1, no cap), now.

        Its requests go on, ranked with the default weight from now on.
        With ``redis_url``, the whole fleet follows it, whichever process
        configured it; a tenant configured nowhere keeps its defaults.

        Raises:
            TypeError: ``tenant`` is not a string.
            ValueError: ``tenant`` is empty or longer than 256 characters.
            DispatcherClosed: The dispatcher has closed.
        """
        self._plumbing.remove_tenant(tenant)

    def tenants(self) -> dict[str, Tenant]:
        """The tenants configured now, by name (a copy): ``tenants`` and ``set_tenant``'s.

        With ``redis_url``, the fleet's, the latest writer winning: a
        tenant set or removed in another process shows here once a round
        of a provider's scheduler has seen it (the change wakes them).
        """
        return self._plumbing.tenants()

    def report_rate_limit(
        self, provider: str, retry_after: float | None = None
    ) -> None:
        """Pause grants for ``provider`` after it answered 429, 529 or similar.

        Calls through the dispatcher (``wrap_provider``, conversations,
        ``transport()``) report their rate-limit answers by themselves; a
        provider's ``on_rate_limit=`` is for calls made without a slot (a
        provider given both reports an answer once: an answer the
        dispatcher meters calls no callback of its provider).

        Holders are not touched; nothing is granted until the pause ends.
        With ``retry_after`` (the server's ``Retry-After``, in seconds) the
        pause lasts that long. Without, or with ``0`` (a server's
        ``Retry-After: 0`` names no delay), it backs off: the dispatcher's
        ``default_pause`` for the first report of a streak, doubling with
        each later round up to ``max_pause``. A report opens a new round
        when a slot was granted since the previous report; reports with no
        grant between them (requests that were in flight together) share a
        round. A report with ``retry_after`` counts as a round too. The
        streak ends on a success, a slot granted after the latest report
        and given back with no report while it was held, or on ``resume``.

        No pause is longer than the dispatcher's ``max_pause``, and a later
        report can only extend a pause, never shorten it. Ignored for an
        unlimited provider and after the dispatcher has closed, since
        nothing waits there.
        """
        self._plumbing.report_rate_limit(provider, retry_after)

    def resume(self, provider: str) -> None:
        """End the pause of ``provider`` now, and its backoff streak.

        Waiting requests are granted at once, in ticket order, as slots
        allow. Nothing happens for a provider that is not paused or has
        never been used. With ``redis_url``, it ends the pause of the whole
        fleet, from any process (one that never used the provider too).

        Raises:
            DispatcherClosed: The dispatcher has closed.
        """
        self._plumbing.resume(provider)

    def events(self, *, buffer: int = 1024) -> EventSubscription:
        """Every event of every provider, from now on, to read in a block.

        ``async with dispatcher.events() as events: async for event in
        events`` yields a ``trio_dispatch.events`` value for each thing that
        happens to a slot or a provider while the block runs: ``Queued``,
        ``Granted`` (with the wait), ``Released`` (with the hold time),
        ``Withdrawn``, ``Refused``, ``Paused``, ``Resumed``,
        ``LimitChanged`` and ``RateLimitsReceived``. The iteration ends
        when the dispatcher closes, once the buffer is read.

        The schedulers never wait for the reader: they keep up to
        ``buffer`` events for it, and count the events they drop when the
        buffer is full in the subscription's ``dropped``. While nothing
        subscribes, no event is made at all.

        Args:
            buffer: The most events kept until read (a positive int).

        Raises:
            DispatcherClosed: On entering, if the dispatcher has closed.
        """
        return self._plumbing.events(buffer=buffer)

    def statistics(self) -> DispatcherStatistics:
        """A snapshot of every provider limited or used, unlimited ones too.

        It reflects everything done before the call: a ``set_limit``, a
        slot given back or asked for a moment ago shows at once, without
        waiting for the schedulers to run (each handles its queued messages
        first, synchronously, as it would itself).
        """
        return self._plumbing.statistics()

    @overload
    def transport(
        self,
        provider: str,
        *,
        inner: httpx.AsyncBaseTransport,
        server_priority: bool = False,
        endpoints: Mapping[str, Endpoint] | None = None,
    ) -> LegacyDispatchTransport: ...

    @overload
    def transport(
        self,
        provider: str,
        *,
        inner: httpx2.AsyncBaseTransport | None = None,
        server_priority: bool = False,
        endpoints: Mapping[str, Endpoint] | None = None,
    ) -> DispatchTransport: ...

    def transport(
        self,
        provider: str,
        *,
        inner: httpx2.AsyncBaseTransport | httpx.AsyncBaseTransport | None = None,
        server_priority: bool = False,
        endpoints: Mapping[str, Endpoint] | None = None,
    ) -> DispatchTransport | LegacyDispatchTransport:
        """An HTTP transport whose model calls each hold a slot of ``provider``.

        Give it to the client an SDK uses (``httpx2.AsyncClient(transport=
        dispatcher.transport("openai"))``), and make the SDK's calls inside
        ``turn()``: a call's place in line is its turn's start, so every
        call of an agent's turn, each retry too, goes before younger
        turns. Outside any turn, each request is a turn of its own, ranked
        when it asks: first come, first served per call.

        A model call (a ``POST`` whose path ends in ``/chat/completions``,
        ``/completions``, ``/responses``, ``/messages``, ``/complete`` or
        ``/embeddings``) takes a slot before its first byte is sent and gives it back when
        its response is closed: after the last byte, or when it is closed
        early, fails or is cancelled. Anything else (``GET /models``,
        files, batches, token counts) passes without a slot. A 429, 503 or
        529 answer to a model call pauses the provider (``Retry-After``,
        ``retry-after-ms``, see ``report_rate_limit``); the answer goes
        back to the caller unchanged. Inside a ``turn()``, such a call
        keeps the turn's place for its retry: a request with the turn's
        rank waits through the pause, and once granted holds the slot for
        the SDK's retry (made in the same turn, for the same model) at
        most ``retry_grace`` seconds (see ``open_dispatcher``); leaving
        the turn drops it at once. A call whose JSON body names a
        ``model`` takes its slot for that model (``slot(model=...)``): a
        budget ``"provider/model"`` must hold it too. Every answer's
        rate-limit headers (``x-ratelimit-*`` or
        ``anthropic-ratelimit-*``) go to ``observe_rate_limits``, for the
        call's model, and a call whose JSON body has
        ``messages`` is charged its estimated tokens (prompt and
        ``max_tokens``), not corrected from its usage, which only the SDK
        reads. The slot is the current turn's, as
        with ``slot()`` without ``started_at``. ``max_hold`` bounds a model
        call from its grant to its response's close: past it, the request
        or the read under way fails with ``SlotHoldTimeout``, a response
        that nobody reads is closed, and the slot goes back. A response
        dropped without being closed gives its slot back when it is
        garbage-collected, with a ``ResourceWarning`` naming the provider.

        Args:
            provider: The provider's name: whose slots the calls take.
            inner: The transport that sends the requests:
                ``httpx2.AsyncHTTPTransport()`` if ``None``. Given a legacy
                ``httpx.AsyncBaseTransport``, the result is one too.
            server_priority: For a self-hosted server that orders its own
                queue by a request's ``priority`` (vLLM started with
                ``--scheduling-policy priority``): each chat completion or
                completion whose JSON body has ``messages`` or ``prompt``
                and no ``priority`` of its own is sent with ``"priority"``,
                its slot's place in line (lower is older: its turn's start,
                less its class's credit, as Unix milliseconds; see
                ``lowlevel.Plumbing.wall_ms``), so that what the server
                queues keeps the dispatcher's order. Any other request is
                sent untouched. Off by default: turn it on only for a
                server in priority mode (vLLM out of it ignores the field;
                its older releases refuse every such request).
            endpoints: For a pool (``open_dispatcher``'s ``pools``), each
                member's ``Endpoint``, by member: a model call is sent to
                the base URL of the member its slot was granted on, with
                that member's key in its wire format's header
                (``Authorization: Bearer`` for OpenAI's, ``x-api-key`` for
                Anthropic's), whatever base URL and key the SDK's client
                was given; the answer's rate-limit figures and pauses are
                that member's. Anything else the SDK sends goes where its
                client points; ``None``: every call goes where the client
                points. A member without one (one that joins the pool
                later, ``set_pool``) is avoided by this transport's calls
                until ``set_endpoint(member, endpoint)`` on the transport
                returned gives it one.

        Raises:
            TypeError: ``provider`` is not a string, ``inner`` is not an
                httpx2 or httpx async transport, or ``server_priority`` is
                not a bool. Later, from a request of the other httpx's
                client (an ``httpx.AsyncClient`` given a transport made
                without ``inner``), before any slot.
            ValueError: ``provider`` is empty, or unknown while the
                dispatcher's ``unknown_providers`` is ``"error"``;
                ``endpoints`` names a provider that is no member, or none
                of the pool's members (of a provider that is no pool: not
                the provider itself).
        """
        check_provider(provider)
        check_flag(server_priority, "server_priority")
        routes = None if endpoints is None else self._endpoints(provider, endpoints)
        make = _transport_for(inner)
        self._plumbing.check_known(provider)
        return make(self._plumbing, provider, server_priority, routes)

    def _endpoints(
        self, provider: str, endpoints: Mapping[str, Endpoint]
    ) -> dict[str, Endpoint]:
        """``endpoints``, checked: one ``Endpoint`` for each member of ``provider``'s pool."""
        if not isinstance(endpoints, Mapping):
            raise TypeError(
                f"endpoints must be a mapping of members to Endpoint, got"
                f" {type(endpoints).__name__}"
            )
        routes = dict(endpoints)
        for member, endpoint in routes.items():
            check_provider(member)
            if not isinstance(endpoint, Endpoint):
                raise TypeError(
                    f"endpoints[{member!r}] must be an Endpoint, got"
                    f" {type(endpoint).__name__}"
                )
        pooled = self._plumbing.members(provider)
        members = (provider,) if pooled is None else pooled
        extra = set(routes) - set(members)
        if extra:
            raise ValueError(
                f"endpoints name providers that are not members of {provider!r}:"
                f" {sorted(extra)}; its members: {list(members)}"
            )
        if pooled is None and provider not in routes:
            raise ValueError(f"endpoints must name {provider!r}, which is no pool")
        # A pool's member without one is avoided; none with one is refused.
        self._plumbing.unroutable(provider, routes)
        return routes

    def start_conversation(
        self,
        provider: Provider,
        *,
        conversation_id: str | None = None,
        tools: Iterable[Tool] = (),
        system_prompt: str | None = None,
        options: ConversationOptions | None = None,
        history: Iterable[ChatMessage] = (),
        priority: int = 0,
        tenant: str | None = None,
    ) -> Conversation:
        """Start a conversation actor with ``provider`` in this dispatcher.

        Every LLM call it makes takes a slot of ``provider.id`` first (see
        ``Conversation``). The actor runs until ``Conversation.close()`` or
        until the dispatcher closes. Arguments are checked here, at once.

        Args:
            provider: Any ``Provider`` (an ``id`` and a ``stream`` method).
            conversation_id: Its name (``Conversation.id``, and the
                ``conversation_id`` of every slot it takes); a fresh
                unique one if not given.
            tools: The ``Tool`` values the model may call (distinct names).
            system_prompt: Sent as ``ChatRequest.system`` with every request;
                never part of the history.
            options: Retries, backoff, compaction, ``max_tokens``, the
                request options of its turns (``request_options``) and the
                jitter's seed, as a ``ConversationOptions``; ``None`` for the
                defaults.
            history: The messages to start from, oldest first: the
                ``history`` of an earlier conversation, or what
                ``load_history`` read back. Checked here: a tool call
                without its result, or a result without its call, is
                refused (see ``load_history``).
            priority: The priority class of its turns (an int, higher
                first): each turn runs in a ``turn()`` of this class.
            tenant: The tenant of its turns (see ``open_dispatcher``'s
                ``tenants``): each turn runs in a ``turn()`` of this
                tenant. Defaults to the tenant of the turn current here,
                at the call, or none.

        Raises:
            ValueError: ``provider.id`` is unknown and the dispatcher's
                ``unknown_providers`` is ``"error"``; or a bad argument.
            DispatcherClosed: The dispatcher has closed.
        """
        return start_conversation(
            self._plumbing,
            provider,
            conversation_id=conversation_id,
            tools=tools,
            system_prompt=system_prompt,
            options=options,
            history=history,
            priority=priority,
            tenant=tenant,
        )

    # The plumbing's members, here for one release: each says where it went.

    def start_soon(
        self, function: Callable[..., Awaitable[object]], *args: object, name: str
    ) -> None:
        """Deprecated: ``lowlevel.plumbing(dispatcher).start_soon``."""
        _moved("start_soon")
        self._plumbing.start_soon(function, *args, name=name)

    async def hold(
        self, provider: str, tokens: int = 0, model: str | None = None
    ) -> tuple[Slot, float]:
        """Deprecated: ``lowlevel.plumbing(dispatcher).hold``."""
        _moved("hold")
        return await self._plumbing.hold(provider, tokens, model)

    def hold_deadline(self, slot: Slot) -> float:
        """Deprecated: ``lowlevel.plumbing(dispatcher).hold_deadline``."""
        _moved("hold_deadline")
        return self._plumbing.hold_deadline(slot)

    def watch_call(self, provider: Provider) -> CallWatch | None:
        """Deprecated: ``lowlevel.plumbing(dispatcher).watch_call``."""
        _moved("watch_call")
        return self._plumbing.watch_call(provider)

    def check_known(self, provider: str) -> None:
        """Deprecated: ``lowlevel.plumbing(dispatcher).check_known``."""
        _moved("check_known")
        self._plumbing.check_known(provider)

    def default_max_tokens(self, provider: str, model: str | None = None) -> int:
        """Deprecated: ``lowlevel.plumbing(dispatcher).default_max_tokens``."""
        _moved("default_max_tokens")
        return self._plumbing.default_max_tokens(provider, model)

    def observe_events(self, sink: EventSink) -> None:
        """Deprecated: ``lowlevel.plumbing(dispatcher).observe_events``."""
        _moved("observe_events")
        self._plumbing.observe_events(sink)

    def observe_calls(self, observer: CallObserver) -> None:
        """Deprecated: ``lowlevel.plumbing(dispatcher).observe_calls``."""
        _moved("observe_calls")
        self._plumbing.observe_calls(observer)

    def calling(self, slot: Slot) -> _Calling:
        """Deprecated, and no longer needed: an answer's figures travel with it.

        Returns a context manager whose ``answered()`` says, once, that the
        call's answer started (``slot.answered()``); nothing is registered.
        """
        warnings.warn(
            "Dispatcher.calling is deprecated and no longer needed: the"
            " figures of an answer travel with it (call slot.answered() when"
            " the answer starts)",
            DeprecationWarning,
            stacklevel=2,
        )
        return _Calling(slot)


@final
class _Calling:
    """What the deprecated ``Dispatcher.calling`` gives: the slot's call, unregistered."""

    __slots__ = ("_started", "observed", "reported", "slot")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.observed = False
        self.reported = False
        self._started = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def answered(self) -> None:
        """The call's answer started: its slot says so to the scheduler, once."""
        if not self._started:
            self._started = True
            self.slot.answered()


def _moved(name: str) -> None:
    """Warn the caller of a deprecated ``Dispatcher`` member where it went."""
    warnings.warn(
        f"Dispatcher.{name} is deprecated: use"
        f" trio_dispatch.lowlevel.plumbing(dispatcher).{name}",
        DeprecationWarning,
        stacklevel=3,
    )


@asynccontextmanager
async def run_dispatcher(settings: Settings) -> AsyncIterator[Dispatcher]:
    """Run the plumbing of checked ``settings``: the ``Dispatcher`` that owns it."""
    async with run_plumbing(dict(settings.limits), settings) as running:
        yield Dispatcher._create(running)


def plumbing(dispatcher: Dispatcher) -> Plumbing:
    """The machinery of ``dispatcher``, for integrations, metrics and tests.

    Its backends, settings, event hub and nursery, with what integrations
    build on: ``start_soon``, ``hold``, ``hold_deadline``, ``check_known``,
    ``check_run``, ``default_max_tokens``, ``watch_call``,
    ``provider_statistics``,
    ``observe_events``, ``observe_calls``, beside everything ``Dispatcher``
    does (see ``Plumbing``).

    Raises:
        TypeError: ``dispatcher`` is not a ``Dispatcher``.
    """
    if not isinstance(dispatcher, Dispatcher):
        raise TypeError(f"dispatcher must be a Dispatcher, got {dispatcher!r}")
    return dispatcher._plumbing


def _transport_for(inner: object) -> _MakeTransport:
    """How to make a transport around ``inner``; TypeError if it is no transport.

    ``None`` is a new ``httpx2.AsyncHTTPTransport``, made only once the
    call's other checks have passed. httpx2 is imported only now, when a
    transport is asked for.
    """
    import httpx2  # noqa: PLC0415  # only when a transport is asked for

    from .._integrations._transport import DispatchTransport  # noqa: PLC0415  # imports httpx2

    if inner is None:
        return lambda dispatcher, provider, server_priority, endpoints: (
            DispatchTransport(
                dispatcher,
                provider,
                httpx2.AsyncHTTPTransport(),
                server_priority=server_priority,
                endpoints=endpoints,
            )
        )
    if isinstance(inner, httpx2.AsyncBaseTransport):
        checked = inner
        return lambda dispatcher, provider, server_priority, endpoints: (
            DispatchTransport(
                dispatcher,
                provider,
                checked,
                server_priority=server_priority,
                endpoints=endpoints,
            )
        )
    # An httpx transport exists only if httpx was imported: do not import it
    # just to say no.
    legacy = sys.modules.get("httpx")
    if legacy is not None and isinstance(inner, legacy.AsyncBaseTransport):
        from .._integrations._transport_legacy import LegacyDispatchTransport  # noqa: PLC0415

        old = inner
        return lambda dispatcher, provider, server_priority, endpoints: (
            LegacyDispatchTransport(
                dispatcher,
                provider,
                old,
                server_priority=server_priority,
                endpoints=endpoints,
            )
        )
    raise TypeError(
        "inner must be an httpx2.AsyncBaseTransport or an httpx.AsyncBaseTransport,"
        f" got {type(inner).__name__}"
    )


def wrap_provider(
    provider: Provider,
    dispatcher: Dispatcher,
    *,
    conversation_id: str | None = None,
    started_at: float | None = None,
) -> Provider:
    """Limit ``provider`` through ``dispatcher``.

    Args:
        provider: Any ``Provider``; its ``id`` names the limit.
        dispatcher: The dispatcher whose slots the streams take.
        conversation_id: Who asks: the ``conversation_id`` of every slot.
            ``None`` uses the current ``Dispatcher.turn()``'s when a stream
            is opened.
        started_at: When the turn began, on the trio clock: the priority
            of every stream opened through the result. ``None`` uses the
            start of the turn current when each stream is opened (its
            priority class too), or the time it is opened outside any
            turn.

    A ``provider`` with a ``model`` string (``OpenAIProvider``,
    ``AnthropicProvider``) takes its slots for that model (``slot(model=
    ...)``): a budget ``"provider/model"`` holds them, and the figures of
    their answers pace that model. A ``provider`` whose ``server_priority``
    is true (``OpenAIProvider(..., server_priority=True)``, for a
    self-hosted server that orders its queue by priority) has each request
    sent with its slot's place in line, as ``Dispatcher.transport(...,
    server_priority=True)`` sends it; so have a conversation's.

    Returns:
        A provider whose ``stream`` takes a slot before any byte is sent and
        gives it back after the last event or however the block is left.
        A provider with no limit takes a slot too (granted at once, and
        counted, so that a limit set later counts the streams running).
    """
    pipes = plumbing(dispatcher)
    pipes.check_pool_provider(provider)
    return LimitedProvider(
        provider,
        pipes,
        conversation_id=conversation_id,
        started_at=started_at,
    )
