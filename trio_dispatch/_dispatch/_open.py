"""``open_dispatcher``: its keywords checked at the call, then the dispatcher run.

The user's entry point and the backend author's (``open_dispatcher_with``,
in ``trio_dispatch.lowlevel``): both make one ``Settings`` of their
arguments, which checks itself before anything starts, and run the
dispatcher core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs

from .._policy._slots import (
    DEFAULT_AFFINITY_WAIT,
    DEFAULT_FAILURE_COOLDOWN,
    DEFAULT_FAILURE_THRESHOLD,
)
from .._util import AsyncWithOnly
from ._dispatcher import run_dispatcher
from ._settings import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_NAMESPACE,
    Settings,
    UnknownProviders,
)

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable, Mapping, Sequence

    from .._policy._budgets import AdaptiveLimit, Budget
    from .._server_load._probe import ServerLoadSource
    from ..messages._limits import Tenant
    from ._backend import Backend
    from ._dispatcher import Dispatcher
    from ._setup import BackendSetup


def open_dispatcher(
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    *,
    budgets: Mapping[str, Budget] | None = None,
    learn_budgets: bool = True,
    default_pause: float = 1.0,
    max_pause: float = 60.0,
    max_hold: float | None = None,
    retry_grace: float = 2.0,
    max_waiting: int | None = None,
    unknown_providers: UnknownProviders = "warn",
    redis_url: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    lease: float = DEFAULT_LEASE,
    redis_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    priority_aging: float = 60.0,
    tenants: Mapping[str, Tenant] | None = None,
    server_load: Mapping[str, ServerLoadSource] | None = None,
    server_load_interval: float = 1.0,
    pools: Mapping[str, Sequence[str]] | None = None,
    affinity_wait: float = DEFAULT_AFFINITY_WAIT,
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
    failure_cooldown: float = DEFAULT_FAILURE_COOLDOWN,
) -> contextlib.AbstractAsyncContextManager[Dispatcher]:
    """Run a dispatcher for the duration of an ``async with`` block.

    Arguments are checked here, at the call, before anything starts.

    Args:
        limits: Provider name to its concurrency limit: an int from 1 to
            100000 (the one bound of every limit, the admin API's too), or
            an ``AdaptiveLimit`` that finds its own value between its
            bounds. Providers not named are unlimited until ``set_limit``.
        budgets: Provider name to its ``Budget``: requests and tokens per
            minute. A slot is granted when a slot is free and the budget
            holds the request: 1 request and its estimated tokens (the
            prompt's estimate plus ``max_tokens``, or the budget's
            ``default_max_tokens``), charged at grant time and corrected
            by the usage the answer reports. Grants stay oldest first: a
            request waiting for its tokens holds back the younger ones
            behind it, however small. Budgets apply to unlimited providers
            too. A key ``"provider/model"`` (split at the first ``/``,
            both parts non-empty) is one model's own budget: a request for
            that model (``slot(model=...)``, the ``model`` of a
            transport's JSON body, or our providers' ``model``) needs both
            its provider's budget, if any, and its model's; a request held
            back by its model's budget holds back only the younger requests
            of that model, and requests for other models go on. With
            ``redis_url``, the budgets live in Redis for the whole fleet,
            and a process's ``Budget`` replaces the fleet's configured one
            of its kinds when it opens.
        learn_budgets: Pace every provider by the rate-limit figures its
            answers report (``Dispatcher.observe_rate_limits``), so that a
            fleet that configured no budget stays below the provider's
            limits; with a ``budgets`` entry, the figures only lower what
            is left. The figures of an answer for a known model pace that
            model, as providers count their limits per model; those of an
            answer for no known model pace the provider. ``False`` ignores
            the figures.
        default_pause: Seconds a rate-limit report that names no
            ``retry_after`` pauses a provider, the first time: consecutive
            reports without a success between them double the pause, up to
            ``max_pause``, and a success starts again from here (see
            ``Dispatcher.report_rate_limit``). Non-negative, and at most
            ``max_pause``, else ``ValueError``.
        max_pause: The longest pause a rate-limit report causes, in seconds
            (positive): a longer ``Retry-After`` is cut to it, as the
            official OpenAI and Anthropic SDKs ignore server delays beyond
            a minute or two. A conversation's backoff for an unlimited
            provider honours ``Retry-After`` up to it as well.
        max_hold: Seconds a slot may be held before its body is cancelled
            and ``SlotHoldTimeout`` raised; ``None`` for no bound.
        retry_grace: Seconds a slot granted to a kept place waits for its
            call's retry (non-negative; ``0`` keeps no place). A model call
            of the transport (``Dispatcher.transport``) made inside a
            ``turn()`` and answered 429, 503 or 529 keeps its turn's place
            in line for the retry the SDK sends after its own sleep: the
            place waits in the queue through the pause like any request,
            and once granted is held for the retry at most this long, then
            given back (at once when the turn's block ends). The slot's
            ``max_hold`` counts from that grant.
        max_waiting: At most this many requests wait per provider; one more
            gets ``QueueFull`` at once. ``None`` for no bound.
        unknown_providers: What a slot of an unknown provider (one never
            named in ``limits``, ``set_limit`` or ``remove_limit``, such as
            a misspelt name) does: ``"allow"`` runs it unlimited quietly,
            ``"warn"`` does too but, once per name, issues an
            ``UnknownProviderWarning`` and logs a warning on the
            ``"trio_dispatch"`` logger, naming the limited providers, and
            ``"error"`` refuses it at once with ``ValueError`` at
            ``dispatcher.slot()`` (and ``transport``,
            ``start_conversation``).
        redis_url: Share the limits (adaptive ones too), the budgets, the
            oldest-first order and the pauses with every process that uses the same Redis and ``namespace``
            (``redis://[[user]:password@]host[:port][/db]``, ``rediss://``
            for TLS, or ``unix://path``; a single server or any node of a
            Redis Cluster); needs the ``redis`` extra (without it,
            ``ModuleNotFoundError`` says which to install). Its credentials
            (the userinfo, and query parameters such as ``password``) never
            show in an error, a log line or a repr. A limit
            in ``limits`` is stored only if the fleet has none stored for
            that provider: a stored limit, written by ``set_limit`` or
            ``remove_limit`` in any process, wins, and survives restarts.
            ``None`` (the default) keeps everything in this process.
        namespace: The prefix of every key in Redis: processes with the same
            namespace share their limits. Not empty, and without ``:``,
            ``{`` or ``}``. Only with ``redis_url``: given without it, even
            as the default ``"trio-dispatch"``, it is a ``ValueError``.
        lease: Seconds the slots and queued requests of a process that
            vanished stay taken (positive, finite). Holders renew every
            third of it; a holder whose lease went unrenewed this long is
            stopped with ``LeaseLost`` (see below). Only with
            ``redis_url``, as ``namespace``.
        redis_connect_timeout: Seconds ``open_dispatcher`` keeps trying to
            reach Redis (positive, finite; 10 by default): a connection
            refused, reset or unanswered while the dispatcher opens is
            tried again after a growing, jittered delay (from 0.05 s,
            doubling, at most a second), until this long has passed since
            the first try; then ``BackendUnavailable``, whose cause is the
            last error. A refusal that trying again cannot mend (a wrong
            password, a user not allowed, a database Redis does not have,
            a host name that does not resolve) fails at once. Only with
            ``redis_url``, as ``namespace``.
        priority_aging: Seconds of turn age that make up for one priority
            class (positive, finite). Requests go by class first (higher
            first), then oldest turn, then arrival: a request of class ``p``
            ranks as if its turn had started ``p * priority_aging`` seconds
            earlier, and equal ranks go first come, first served. So a
            lower class is never starved: a waiting request is passed only
            by requests of its class or a lower one whose turns began
            before its own, and by requests of a class ``k`` higher whose
            turns began less than ``k * priority_aging`` seconds after its
            own, finitely many. A class's lead is that time credit and no
            more: when waits grow far beyond it (sustained overload) the
            classes mix, oldest turn first; set it above the waits a higher
            class should be spared.
        tenants: Tenant name (a string of 1 to 256 characters) to its
            ``Tenant``: a share ``weight`` and an optional cap ``limit`` on
            its slots of each provider. Requests name their tenant with
            ``turn(tenant=...)``, ``slot(tenant=...)`` or
            ``start_conversation(tenant=...)``. Between tenants with
            requests waiting, a provider's next free slot goes to the one
            that has received the least service (slot-seconds) for its
            weight; a tenant that starts waiting starts from the least
            service of those already waiting, so idle time is not banked.
            Within a tenant, requests go as always (class, oldest turn,
            arrival). A tenant at its cap waits while the others go on.
            Tenants not named here, and requests of no tenant, have the
            defaults (``Tenant()``: weight 1, no cap); without any tenant
            anywhere, the order is exactly the one above. Change them at
            run time with ``Dispatcher.set_tenant``. With ``redis_url``,
            the shares hold across the fleet.
        server_load: Provider name to where its server's own load is read
            from: a ``ServerMetrics`` (the server's Prometheus ``/metrics``:
            vLLM's, llama.cpp's ``llama-server``'s, SGLang's or TGI's) or
            an async callable returning a ``ServerLoad``. For servers that
            queue instead of refusing: read every ``server_load_interval``
            seconds, it keeps our requests out of the server's own queue,
            where the server, not the dispatcher, would choose who goes
            next. No grant while requests wait there; and once the
            server's slots are learned (from a reading with a queue: the
            server runs all it can then), none beyond them (the others'
            requests running at the latest reading, plus the slots we
            hold now). The provider's limit still applies.
            A reading that fails (a server that stops answering, a
            callable that raises) is logged and ignored: the limit alone
            applies until one succeeds. ``statistics()`` shows the latest
            reading (``ProviderStatistics.server_load``) and the slots
            learned. Not with ``redis_url`` yet.
        server_load_interval: Seconds between two readings of each
            ``server_load`` (positive).
        pools: Pool name to its members: providers (API keys, accounts,
            replicas) that serve one model. ``slot(pool)`` is granted on
            whichever member can take the request first: one with a free
            slot under its own limit, its budgets and its model's holding
            the request, not paused. The pool has one queue, in ticket
            order (the oldest turn first, priority classes and tenants as
            for a provider), across its members; a request asked of a
            member directly (``slot("key-a")``) takes its place in that
            same queue. Among members that can take a request, the one
            with the most free slots goes first (ties in the pool's
            order). Each member keeps its own limit, budgets learned from
            its own answers, pauses and adaptive limit, and shows in
            ``statistics().providers``; ``Slot.member`` names the member
            granted. A pool's name cannot be a provider's. Pools that
            share a member are scheduled in one queue. Change them at run
            time with ``Dispatcher.set_pool`` and ``remove_pool``. With
            ``redis_url``, the pools are the fleet's (one queue, each
            member's limits, budgets, pauses and health fleet-wide):
            every process declares the same ones here, and they cannot
            change at run time.
        affinity_wait: Seconds a pooled request waits for the member its
            conversation's previous call was granted on (where the prompt
            cache is: caches live per key and per server) while another
            member could take it, before it goes to any member; ``0``
            turns affinity off. Conversations are told apart by their
            ``conversation_id``. So with affinity on, the order is exact
            but for this: a request waiting for its member may be passed,
            on the other members, by younger requests, for at most
            ``affinity_wait`` seconds. ``statistics()`` counts the hits
            and the moves, per member and per pool.
        failure_threshold: A pool's member whose calls failed this many
            times in a row before their answer started (a connection
            refused or reset, no first byte in time, a 5xx but 503) is out
            of service: it takes no request for ``failure_cooldown``
            seconds, then one (half-open) until that one gets its answer,
            then its full share again. Rate limits are no failures (they
            pause the member). When every member a request may take is
            out, it waits. ``transport()`` and conversations over a pool
            send a call that failed so again at once on another member,
            in its place in line, spending none of the SDK's or the
            conversation's attempts. ``statistics()``, ``ServiceChanged``
            events, Prometheus and the admin API show it. A provider alone
            is never out of service.
        failure_cooldown: Seconds a member out of service takes nothing,
            before its probe.

    Raises:
        BackendUnavailable: ``redis_url`` cannot be reached within
            ``redis_connect_timeout``, or refuses the connection (on
            entering).
        RuntimeError: On entering, outside a trio run (under asyncio, or
            in no event loop at all).
        TypeError: Used with a plain ``with`` or ``await``; and
            ``AttributeError`` for a dispatcher's attribute looked up on
            the result before ``async with``: each says to use ``async
            with open_dispatcher(...) as dispatcher``.
        LeaseLost: From a slot of a limited provider (on leaving it), if its
            lease in Redis went ``lease`` seconds without renewal.

    When the block ends, the schedulers stop: every request still waiting,
    wherever its task lives, and every later ``slot`` gets
    ``DispatcherClosed``. Slots held outside the block stay usable; giving
    them back does nothing. An exception from the block comes out as itself.

    With ``redis_url``, every provider, named or not, is scheduled through
    Redis (an unknown one runs unlimited until the fleet stores a limit
    for it), and:

    * the oldest turn of the whole fleet goes first, by the same rank as
      in one process (the turn's start less its class's credit; the fleet
      should share one ``priority_aging``): ranks are compared on the Redis
      server's clock, which each process reads through its own clock's
      offset to it, measured on its exchanges with Redis, so hosts whose
      clocks disagree still take their turns in order, to within about a
      round trip to Redis; each process publishes
      only its own oldest waiters, at most the limit, so a younger waiter
      of another process can pass an older one that is not published yet
      for the time of one exchange with Redis;
    * a rate-limit report pauses the provider for the fleet, on the Redis
      server's clock, with the backoff of ``report_rate_limit`` kept
      fleet-wide (a round opens when any process was granted a slot since
      the previous report; a success anywhere ends the streak);
    * budgets and adaptive limits are the fleet's too: a provider has one
      request bucket and one token bucket in Redis, refilled on the Redis
      server's clock and charged by every grant of every process; a
      ``Budget`` given to any process configures them (the latest process
      to open with one wins), and the rate-limit figures any process
      observes teach them. An ``AdaptiveLimit`` is stored like any limit,
      and its value rises with successes and falls with rounds of
      rate-limit reports anywhere in the fleet;
    * while Redis cannot be reached nothing new is granted (there is no
      local fallback: the ledger alone knows what the fleet holds);
      holders keep their slots, waiters keep waiting (their own deadlines
      apply), ``statistics()`` shows ``backend_up=False``, and the
      schedulers reconnect with a growing delay (at most a second, and
      a sixth of ``lease``);
    * if Redis restarts empty, each holder registers its slot again at its
      process's next exchange with Redis (at once after a failed one, else
      within a third of ``lease``): until then the fleet may be granted up
      to one limit too many, never more;
    * a process that vanishes holds its slots and its queued requests for
      at most ``lease`` seconds;
    * a process cut off from Redis (a partition, a loop blocked) keeps its
      slots only while their leases are sure to live: once ``lease``
      seconds have passed since the start of the last exchange that
      granted or renewed a slot of a limited provider, the body holding it
      is cancelled, and leaving the slot raises ``LeaseLost`` (the slot is
      given back), so that this process stops before the fleet may grant
      that slot again. An outage that ends within half a lease costs
      holders nothing (renewals come every third of ``lease``, retries at
      least every sixth): their leases are renewed at the first exchange
      that reaches Redis.
      The bound is kept on the process's clock against the Redis server's,
      so it assumes they run at the same rate (not that they agree).
    """
    settings = Settings(
        limits=limits,
        budgets=budgets,
        learn_budgets=learn_budgets,
        default_pause=default_pause,
        max_pause=max_pause,
        max_hold=max_hold,
        retry_grace=retry_grace,
        max_waiting=max_waiting,
        unknown_providers=unknown_providers,
        redis_url=redis_url,
        namespace=namespace,
        lease=lease,
        redis_connect_timeout=redis_connect_timeout,
        priority_aging=priority_aging,
        tenants=tenants,
        server_load=server_load or {},
        server_load_interval=server_load_interval,
        pools=pools or {},
        affinity_wait=affinity_wait,
        failure_threshold=failure_threshold,
        failure_cooldown=failure_cooldown,
    )
    return AsyncWithOnly(
        run_dispatcher(settings),
        "open_dispatcher() is an async context manager:"
        " use `async with open_dispatcher(...) as dispatcher`",
    )


# What a backend shares is its own business: open_dispatcher_with takes
# open_dispatcher's other keywords.
_SHARING: Final = ("redis_url", "namespace", "lease", "redis_connect_timeout")
_OPTIONS: Final = frozenset(
    field.alias
    for field in attrs.fields(Settings)
    if field.init and field.alias not in {"new_backend", "limits", *_SHARING}
)


def open_dispatcher_with(
    new_backend: Callable[[BackendSetup], Backend],
    limits: Mapping[str, int | AdaptiveLimit] | None = None,
    **options: Any,  # noqa: ANN401  # open_dispatcher's keywords, checked there
) -> contextlib.AbstractAsyncContextManager[Dispatcher]:
    """``open_dispatcher`` whose providers are scheduled by backends of your own.

    ``new_backend(setup)`` is called once per provider, when it is first
    limited or used, with a ``BackendSetup``: everything the dispatcher
    knows of the provider (its limit, budgets, tenants, ``max_waiting``,
    pauses, where its events go, the clock). It returns the provider's
    ``Backend``, which must honour all of it (``setup.policy()`` builds a
    ``SlotPolicy`` that does); the dispatcher runs the backend's ``run``
    in its nursery and talks to it through the protocol only. The
    dispatcher's own backends are made the same way
    (``SchedulerActor.from_setup``). ``options`` are ``open_dispatcher``'s keywords, checked the same
    way, but for ``redis_url``, ``namespace``, ``lease`` and
    ``redis_connect_timeout``: what a backend shares is its own business.

    Raises:
        TypeError: ``new_backend`` is not callable, or an option is unknown
            or one of those four.
    """
    for name in options:
        if name in _SHARING:
            raise TypeError(f"open_dispatcher_with() takes no {name}")
        if name not in _OPTIONS:
            raise TypeError(
                f"open_dispatcher_with() got an unexpected keyword argument {name!r}"
            )
    settings = Settings(new_backend=new_backend, limits=limits, **options)
    return AsyncWithOnly(
        run_dispatcher(settings),
        "open_dispatcher_with() is an async context manager:"
        " use `async with open_dispatcher_with(...) as dispatcher`",
    )
