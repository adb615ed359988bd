"""The machinery of a dispatcher: one backend per provider under one nursery.

``Plumbing`` holds what a dispatcher is made of: its nursery, its settings,
the backend of each provider limited or used (made by the backend factory
from a ``BackendSetup``, started in the nursery), the event hub, and the
state its slots read (a ``SlotHost``). It talks to each backend through the
``Backend`` protocol only, never asking which it has. The ``Dispatcher``
users get owns one and hands it to the integrations (the transport,
``wrap_provider``, conversations), which build on it and import nothing of
the ``Dispatcher``; ``trio_dispatch.lowlevel.plumbing(dispatcher)`` gives
it to any other. ``run_plumbing`` runs one for ``open_dispatcher``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import math
import sys
import time
from collections.abc import Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, cast, final

import attrs
import trio

from .._exceptions import DispatcherClosed, PoolUnreachable, UnknownProviderWarning
from .._groups import leaves
from .._observe._hub import (
    CallObserver,
    CallWatch,
    EventHub,
    EventSink,
    EventSubscription,
    RateLimitsReceived,
)
from .._observe._translator import Translator
from .._policy._budgets import AdaptiveLimit, check_limit_value
from .._policy._ratelimits import RateLimitInfo
from .._pool_provider import PoolProvider
from .._server_load._probe import poll_server_load
from .._util import NoPublicConstructor, warn_the_caller
from .._validation import (
    MAX_TENANT_NAME,
    check_count,
    check_instant,
    check_limit,
    check_optional_model,
    check_optional_seconds,
    check_optional_tenant,
    check_priority,
    check_provider,
    check_tenant_name,
)
from ..actors._scheduler import Handover, SchedulerActor
from ..messages._limits import DEFAULT_MAX_TOKENS
from ..messages._protocol import (
    Adapt,
    ObserveRateLimits,
    ObserveServerLoad,
    Pause,
    RemovePool,
    Resume,
    SetLimit,
    SetPool,
    SetTenant,
)
from ._pools import Group, MemberView, check_members, groups_of
from ._settings import check_tenant_settings
from ._setup import BackendSetup
from ._slot import Slot, SlotHost, acquire_unscoped
from ._statistics import DispatcherStatistics
from ._turn import CURRENT_TURN, Turn, TurnScope

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Collection,
        Mapping,
    )

    from .._policy._slots import MemberState
    from .._provider import Provider
    from .._redis._backend import SharedBackends
    from .._server_load._load import ServerLoad
    from ..messages._limits import Tenant
    from ..messages._protocol import SchedulerMessage
    from ._backend import Backend, ProviderStatistics
    from ._pools import GroupScheduler
    from ._settings import Settings

_logger = logging.getLogger("trio_dispatch")

UNSET: Any = object()
_make: Final = type.__call__
# Bound once: check_run runs at every slot's entry.
_current_trio_token: Final = trio.lowlevel.current_trio_token


@final
class Plumbing(metaclass=NoPublicConstructor):
    """The machinery of one dispatcher: backends, settings, hub and nursery.

    What integrations build on: ``lowlevel.plumbing(dispatcher)`` gives the
    dispatcher's own. Besides what ``Dispatcher`` does (each method of the
    same name does exactly that, and its docstring is there), it runs tasks
    in the dispatcher's nursery (``start_soon``), holds slots that any task
    gives back (``hold``), refuses unknown providers as ``slot()`` does
    (``check_known``), tells a request's default answer size
    (``default_max_tokens``), and hands every event and every LLM call to
    the metrics (``observe_events``, ``observe_calls``, ``watch_call``).
    """

    __slots__ = (
        "_backends",
        "_call_observers",
        "_carried",
        "_cleared",
        "_closed",
        "_groups",
        "_host",
        "_hub",
        "_known",
        "_new_backend",
        "_nursery",
        "_origin",
        "_settings",
        "_tenants",
        "_token",
    )

    def __init__(
        self,
        nursery: trio.Nursery,
        settings: Settings,
        new_backend: Callable[[BackendSetup], Backend],
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._nursery = nursery
        self._settings = settings
        # The trio run the dispatcher belongs to (see check_run).
        self._token = trio.lowlevel.current_trio_token()
        # The backend of every provider seen, and those whose task runs: a
        # backend stopped when idle keeps its state for its next run. Every
        # backend is made by new_backend, given what the dispatcher knows.
        self._new_backend = new_backend
        self._backends: dict[str, Backend] = {}
        # The tenants configured now (open_dispatcher's, then set_tenant's,
        # and with Redis the fleet's, as the schedulers learn them): every
        # backend is told of each when it is made.
        self._tenants: dict[str, Tenant] = dict(settings.tenants)
        # Known providers, and the names slot() lets through without a
        # look: the known ones and the unknown ones already allowed or
        # warned about.
        self._known: set[str] = set()
        self._cleared: set[str] = set()
        self._closed = False
        # The group of each pooled provider and of each pool (see _pools):
        # its members and pools share one scheduler, each name a view.
        self._groups = groups_of(settings.pools)
        self._known.update(self._groups)
        self._cleared.update(self._groups)
        # What the providers that left a scheduler of their own to join a
        # pool learned there, until their group's scheduler takes it on.
        self._carried: dict[str, MemberState] = {}
        # Where the schedulers emit their events (see events()), and who
        # is told of every LLM call (the OpenTelemetry metrics).
        self._hub = EventHub(settings.priority_aging)
        self._call_observers: tuple[CallObserver, ...] = ()
        # What the slots read: it owns the backends whose task runs and the
        # limits, which the methods here keep current.
        self._host = SlotHost(
            self._scheduler,
            settings.priority_aging,
            settings.lease,
            check_run=self.check_run,
        )
        # Where the trio clock stands on the shared wall clock (wall_ms):
        # read once, now, and kept, so that one instant always maps to one
        # number, however far a virtual clock jumps.
        self._origin = (trio.current_time(), round(wall_clock() * 1000))

    @property
    def max_pause(self) -> float:
        """``Dispatcher.max_pause``."""
        return self._settings.max_pause

    @property
    def max_hold(self) -> float | None:
        """``Dispatcher.max_hold``."""
        return self._settings.max_hold

    @property
    def retry_grace(self) -> float:
        """``Dispatcher.retry_grace``."""
        return self._settings.retry_grace

    @property
    def lease(self) -> float:
        """``Dispatcher.lease``."""
        return self._settings.lease

    def start_soon(
        self, function: Callable[..., Awaitable[object]], *args: object, name: str
    ) -> None:
        """Run ``function(*args)`` in the dispatcher's nursery, until it closes.

        Plumbing for integrations: a task that outlives the call that
        starts it (the transport's ``max_hold`` timer).
        """
        self.check_run()
        self._nursery.start_soon(function, *args, name=name)

    def wall_ms(self, instant: float) -> int:
        """``instant`` (trio clock) on the dispatcher's wall clock, in whole milliseconds.

        Unix time, as every process sharing a provider can read it: this
        host's clock, or with ``redis_url`` the Redis server's (as the
        fleet's queue places turns), whatever this host's clock says. The
        offset between the two clocks is read once, when the dispatcher
        opens, and kept: instants a second apart on the trio clock are
        1000 apart here, and one instant is always one number. What
        ``transport(..., server_priority=True)`` and a provider's
        ``server_priority`` send a self-hosted server as a request's place
        in line, comparable between processes.
        """
        start, wall = self._origin
        seconds = instant - start
        # Whole seconds apart, then the fraction: exact for any finite
        # instant, where seconds * 1000 could overflow to infinity.
        whole = math.floor(seconds)
        return wall + whole * 1000 + round((seconds - whole) * 1000)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Plumbing {state} limits={self._host.limits!r}>"

    @property
    def closed(self) -> bool:
        """``Dispatcher.closed``."""
        return self._closed

    def check_run(self) -> None:
        """``Dispatcher.check_run``."""
        if self._closed:
            return
        try:
            token = _current_trio_token()
        except RuntimeError:  # no trio run in this thread
            token = None
        if token is not self._token:
            raise RuntimeError(
                "the dispatcher belongs to another trio run: use it in the run"
                " that opened it (from another thread, through trio.from_thread.run)"
            )

    def turn(
        self,
        *,
        conversation_id: str | None = None,
        started_at: float | None = None,
        priority: int = 0,
        tenant: str | None = None,
    ) -> contextlib.AbstractContextManager[Turn]:
        """``Dispatcher.turn``."""
        self.check_run()
        if conversation_id is not None and not isinstance(conversation_id, str):
            raise TypeError(
                f"conversation_id must be a string or None, got {conversation_id!r}"
            )
        started_at = (
            trio.current_time()
            if started_at is None
            else check_instant(started_at, "started_at")
        )
        return TurnScope(
            Turn(
                conversation_id,
                started_at,
                check_priority(priority),
                check_optional_tenant(tenant),
            )
        )

    def slot(  # noqa: PLR0912  # every argument checked inline: the hot path
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
        """``Dispatcher.slot``."""
        if (
            avoid is None
            and conversation_id is None
            and started_at is None
            and priority is None
            and tenant is None
            and model is None
            and tokens is None
            and max_hold is UNSET
            and type(provider) is str
            and provider in self._cleared
        ):
            # Nothing given but a provider already checked, the common case:
            # everything from the current turn, nothing to check.
            host = self._host
            turn = CURRENT_TURN.get()
            if turn is None:
                # type.__call__ is what Slot._create does, without its
                # Python frame: this is the hot path of every request.
                fresh: Slot = _make(
                    Slot, host, provider, None, host.now(), 0, self._settings.max_hold
                )
                return fresh
            current: Slot = _make(
                Slot,
                host,
                provider,
                turn.conversation_id,
                turn.started_at,
                turn.priority,
                self._settings.max_hold,
                0,
                turn.tenant,
            )
            return current
        if type(provider) is not str or not provider:
            check_provider(provider)  # raises: the common case skips the call
        turn = (
            CURRENT_TURN.get()
            if conversation_id is None
            or started_at is None
            or priority is None
            or tenant is None
            else None
        )
        if conversation_id is None:
            if turn is not None:
                conversation_id = turn.conversation_id
        elif not isinstance(conversation_id, str):
            raise TypeError(
                f"conversation_id must be a string or None, got {conversation_id!r}"
            )
        if started_at is None:
            started_at = self._host.now() if turn is None else turn.started_at
        else:
            started_at = check_instant(started_at, "started_at")
        if priority is None:
            priority = 0 if turn is None else turn.priority
        else:
            priority = check_priority(priority)
        if tenant is None:
            if turn is not None:
                tenant = turn.tenant
        elif type(tenant) is not str or not 0 < len(tenant) <= MAX_TENANT_NAME:
            check_tenant_name(tenant)  # raises: the common case skips the call
        if model is not None and (type(model) is not str or not model):
            check_optional_model(model)  # raises
        if max_hold is UNSET:
            max_hold = self._settings.max_hold
        else:
            max_hold = check_optional_seconds(max_hold, "max_hold", positive=True)
        if tokens is not None:
            check_count(tokens, "tokens")
        if provider not in self._cleared:
            self._unknown(provider)
        avoided = () if avoid is None else self._avoided(provider, avoid)
        slot: Slot = _make(
            Slot,
            self._host,
            provider,
            conversation_id,
            started_at,
            priority,
            max_hold,
            tokens or 0,
            tenant,
            model,
        )
        slot.avoid = avoided
        return slot

    def _avoided(self, provider: str, avoid: Iterable[str]) -> tuple[str, ...]:
        """``avoid``, checked: member names; the pool ``provider`` must have another.

        Raises:
            TypeError: ``avoid`` is a string or not an iterable of strings.
            ValueError: A name empty, or ``avoid`` names every member of
                pool ``provider``: the request could go nowhere.
        """
        if isinstance(avoid, str) or not isinstance(avoid, Iterable):
            raise TypeError(
                f"avoid must be a list or tuple of member names, got {avoid!r}"
            )
        names = tuple(avoid)
        for name in names:
            check_provider(name)
        members = self.members(provider)
        if members is not None and set(members) <= set(names):
            raise ValueError(
                f"avoid names every member of pool {provider!r}: the request could"
                " go nowhere"
            )
        return names

    def members(self, provider: str) -> tuple[str, ...] | None:
        """Pool ``provider``'s members now, or ``None`` for a provider that is no pool."""
        group = self._groups.get(provider)
        return None if group is None else group.pools.get(provider)

    def unroutable(self, provider: str, routes: Collection[str]) -> tuple[str, ...]:
        """The members of pool ``provider`` not in ``routes``: an integration's requests avoid them.

        An integration that reaches each member its own way (a transport's
        ``endpoints``, a ``PoolProvider``'s providers) cannot send a call
        granted on a member that joined the pool after it was made; its
        slots are asked avoiding those. ``()`` for a provider that is no
        pool.

        Raises:
            PoolUnreachable: None of the pool's members is in ``routes``.
        """
        members = self.members(provider)
        if members is None:
            return ()
        missing = tuple(member for member in members if member not in routes)
        if len(missing) == len(members):
            raise PoolUnreachable(
                f"pool {provider!r} has no member this integration can reach:"
                f" its members are {_names(members)}, it reaches {_names(routes)}",
                pool=provider,
            )
        return missing

    def limited(self, provider: str) -> bool:
        """Whether ``provider`` has a limit, or is a pool with a limited member: pauses apply."""
        limits = self._host.limits
        if provider in limits:
            return True
        members = self.members(provider)
        return members is not None and any(member in limits for member in members)

    def members_left(self, provider: str, tried: Iterable[str]) -> bool:
        """Whether pool ``provider`` has a member not in ``tried``: a fallback may go there.

        ``False`` for a provider that is no pool.
        """
        members = self.members(provider)
        return members is not None and not set(members) <= set(tried)

    def slot_again(
        self, failed: Slot, avoid: tuple[str, ...], max_hold: float | None = UNSET
    ) -> Slot:
        """A slot for the request of ``failed`` again, on a member of its pool not in ``avoid``.

        A fallback (``failed``'s call failed on its member before its
        answer: ``avoid`` names the members it failed on, and those the
        caller cannot reach), or a grant on a member the caller cannot
        reach, given back. The new slot is the same request's (its turn's
        start, so its place in line, its priority, tenant, model and
        charge); ``max_hold`` as ``slot()`` takes it.
        """
        return self.slot(
            failed.provider,
            conversation_id=failed.conversation_id,
            started_at=failed.started_at,
            priority=failed.priority,
            max_hold=max_hold,
            tokens=failed.tokens,
            tenant=failed.tenant,
            model=failed.model,
            avoid=avoid,
        )

    async def hold_elsewhere(
        self, failed: Slot, avoid: tuple[str, ...]
    ) -> tuple[Slot, float]:
        """``hold()`` for the request of ``failed`` again (``slot_again``)."""
        slot = self.slot_again(failed, avoid, max_hold=None)
        await acquire_unscoped(slot)
        return slot, self.hold_deadline(slot)

    async def hold(
        self,
        provider: str,
        tokens: int = 0,
        model: str | None = None,
        avoid: tuple[str, ...] = (),
    ) -> tuple[Slot, float]:
        """A granted slot of ``provider`` that any task may give back.

        Plumbing for integrations (``transport()`` is built on it): for a
        hold that does not end where it began (an HTTP response is closed
        later, perhaps by another task), so it enters no cancel scope: give
        it back with ``Slot.release()``. Returns the slot and its
        ``max_hold`` deadline (trio clock; ``inf`` for none), which the
        holder enforces, as it follows the slot's lease (``Slot.lease_deadline``,
        ``Slot.follow_lease``). The turn is the current one (``slot()``
        with neither ``started_at`` nor ``conversation_id``), charged
        ``tokens``, for ``model`` (``None``: none known), never on the
        members of a pool in ``avoid``.
        """
        slot = self.slot(
            provider,
            max_hold=None,
            tokens=tokens,
            model=model,
            avoid=avoid or None,
        )
        # Granted without the timer's cancel scope, which only the entering
        # task could close (a lease deadline from Redis would arm one).
        await acquire_unscoped(slot)
        return slot, self.hold_deadline(slot)

    def hold_deadline(self, slot: Slot) -> float:
        """The ``max_hold`` deadline of a granted ``slot`` taken with ``hold()``.

        Its grant plus ``max_hold`` (trio clock), or ``inf`` for none.
        """
        max_hold = self._settings.max_hold
        limits = self._host.limits
        if max_hold is None or (
            slot.provider not in limits and slot.member not in limits
        ):
            return math.inf
        assert slot.granted_at is not None
        return slot.granted_at + max_hold

    def set_limit(self, provider: str, limit: int | AdaptiveLimit) -> None:
        """``Dispatcher.set_limit``."""
        check_provider(provider)
        check_limit_value(limit)
        self._check_open()
        self._not_a_pool(provider, "limit")
        self._tell(
            provider,
            Adapt(limit) if isinstance(limit, AdaptiveLimit) else SetLimit(limit),
        )
        self._host.limits[provider] = (
            limit.initial if isinstance(limit, AdaptiveLimit) else limit
        )
        self._known.add(provider)
        self._cleared.add(provider)

    def remove_limit(self, provider: str) -> None:
        """``Dispatcher.remove_limit``."""
        check_provider(provider)
        self._check_open()
        self._not_a_pool(provider, "limit")
        self._host.limits.pop(provider, None)
        self._tell(provider, SetLimit(None))
        self._known.add(provider)
        self._cleared.add(provider)

    def limits(self) -> dict[str, int]:
        """``Dispatcher.limits``."""
        # Current: the backends tell their limits' moves (learn_limit).
        return dict(self._host.limits)

    def observe_rate_limits(
        self, provider: str, info: RateLimitInfo, *, model: str | None = None
    ) -> None:
        """``Dispatcher.observe_rate_limits``."""
        check_provider(provider)
        if not isinstance(info, RateLimitInfo):
            raise TypeError(f"info must be a RateLimitInfo, got {info!r}")
        check_optional_model(model)
        if self._closed or info.empty:
            return
        # Before the event: a subscriber's channel belongs to this run.
        self.check_run()
        if self._hub.sinks:
            self._hub.emit(
                RateLimitsReceived(provider, trio.current_time(), info, model)
            )
        settings = self._settings
        if not settings.learn_budgets:
            return
        now = trio.current_time()
        with contextlib.suppress(DispatcherClosed):
            # Closed: its scheduler has stopped, and nothing waits there.
            self._tell(provider, ObserveRateLimits(now, info, model))

    def default_max_tokens(self, provider: str, model: str | None = None) -> int:
        """The answer charged for a request of ``provider`` without ``max_tokens``.

        Its budget's ``default_max_tokens``: the configured budget of
        ``model``'s (``"provider/model"``), else the provider's, else the
        default; what an integration's token estimate counts for such a
        request.
        """
        settings = self._settings
        models = settings.model_budgets.get(provider, {})
        budget = None if model is None else models.get(model)
        if budget is None:
            budget = settings.provider_budgets.get(provider)
        return DEFAULT_MAX_TOKENS if budget is None else budget.default_max_tokens

    def set_tenant(self, tenant: str, settings: Tenant) -> None:
        """``Dispatcher.set_tenant``."""
        check_tenant_name(tenant)
        checked = check_tenant_settings(settings)
        self._check_open()
        self._tenants[tenant] = checked
        self._tell_every(SetTenant(tenant, checked))

    def remove_tenant(self, tenant: str) -> None:
        """``Dispatcher.remove_tenant``."""
        check_tenant_name(tenant)
        self._check_open()
        self._tenants.pop(tenant, None)
        self._tell_every(SetTenant(tenant, None))

    def tenants(self) -> dict[str, Tenant]:
        """``Dispatcher.tenants``."""
        return dict(self._tenants)

    def report_rate_limit(
        self, provider: str, retry_after: float | None = None
    ) -> None:
        """``Dispatcher.report_rate_limit``."""
        check_provider(provider)
        seconds = check_optional_seconds(retry_after, "retry_after")
        self._not_a_pool(provider, "pause")
        if self._closed or provider not in self._host.limits:
            return
        with contextlib.suppress(DispatcherClosed):
            # Its scheduler has stopped (it crashed): there is nothing to pause.
            self._tell(provider, Pause(trio.current_time(), seconds))

    def resume(self, provider: str) -> None:
        """``Dispatcher.resume``."""
        check_provider(provider)
        self._check_open()
        self._not_a_pool(provider, "pause")
        self._tell(provider, Resume())

    def events(self, *, buffer: int = 1024) -> EventSubscription:
        """``Dispatcher.events``."""
        check_limit(buffer, "buffer")
        self.check_run()
        return EventSubscription._create(self._hub, buffer)

    def observe_events(self, sink: EventSink) -> None:
        """Hand every event of every provider to ``sink``, from now on, as it happens.

        Plumbing for metrics (``trio_dispatch.metrics``,
        ``trio_dispatch.otel``): ``sink.push(event)`` is called in the
        scheduler's task for each event ``events()`` would yield, without
        a buffer, so it must neither block nor raise; ``sink.close()`` is
        called once when the dispatcher closes (at once if it has).

        Raises:
            TypeError: ``sink`` has no ``push`` or no ``close`` method.
        """
        for method in ("push", "close"):
            if not callable(getattr(sink, method, None)):
                raise TypeError(f"sink must have a {method} method, got {sink!r}")
        self._hub.attach(sink)

    def observe_calls(self, observer: CallObserver) -> None:
        """Tell ``observer`` of every LLM call made through this dispatcher, from now on.

        Plumbing for metrics (``trio_dispatch.otel``): each call made
        through ``wrap_provider`` or a conversation ends with
        ``observer.call_ended(provider, duration, usage, error)``, in the
        caller's task; it must neither block nor raise.

        Raises:
            TypeError: ``observer`` has no ``call_ended`` method.
        """
        if not callable(getattr(observer, "call_ended", None)):
            raise TypeError(f"observer must have a call_ended method, got {observer!r}")
        self._call_observers = (*self._call_observers, observer)

    def watch_call(self, provider: Provider) -> CallWatch | None:
        """An LLM call to ``provider`` begins: a watch, if anything observes calls.

        Plumbing for integrations: the watch times the call for the
        metrics (OpenTelemetry); ``None`` when nothing observes calls.
        """
        observers = self._call_observers
        return None if not observers else CallWatch(provider, observers)

    def statistics(self) -> DispatcherStatistics:
        """``Dispatcher.statistics``."""
        # A backend handles its backlog first, which may grant.
        self.check_run()
        pools = {}
        for group in self._unique_groups():
            if group.actor is not None:
                pools.update(group.actor.pool_statistics())
        return DispatcherStatistics(
            providers={
                provider: backend.statistics()
                for provider, backend in self._backends.items()
                # A member whose join is still queued shows once it is handled.
                if provider not in pools
                and (type(backend) is not MemberView or backend.joined)
            },
            closed=self._closed,
            pools=pools,
        )

    def check_pool_provider(self, provider: object) -> None:
        """Refuse a ``PoolProvider`` of no pool, or naming a provider that is no member.

        A member it has no provider for (one that joined the pool after it
        was made) is avoided by its calls (``unroutable``).

        Raises:
            ValueError: Its ``id`` is not a pool, it names a provider that
                is not a member, or it has a provider for no member.
        """
        if type(provider) is not PoolProvider:
            return
        pool = provider.id
        members = self.members(pool)
        if members is None:
            raise ValueError(
                f"PoolProvider {pool!r} names no pool; pools: {_names(self.pools())}"
            )
        extra = set(provider.members) - set(members)
        if extra:
            raise ValueError(
                f"PoolProvider {pool!r} names providers that are not members of the"
                f" pool: {sorted(extra)}; its members: {list(members)}"
            )
        self.unroutable(pool, provider.members)

    def _not_a_pool(self, name: str, what: str) -> None:
        """Refuse a pool's name where a provider's is wanted: a pool has no ``what`` of its own."""
        group = self._groups.get(name)
        if group is not None and name in group.pools:
            raise ValueError(
                f"{name!r} is a pool: it has no {what} of its own; its members"
                f" have ({_names(group.pools[name])})"
            )

    def _unique_groups(self) -> list[Group]:
        """Every group once."""
        return list({id(group): group for group in self._groups.values()}.values())

    def pools(self) -> dict[str, tuple[str, ...]]:
        """``Dispatcher.pools``."""
        found: dict[str, tuple[str, ...]] = {}
        for group in self._unique_groups():
            found.update(group.pools)
        return found

    # Protected: between a scheduler's giving way and the group's taking
    # over, its waiting requests are in no scheduler's hands.
    @trio.lowlevel.enable_ki_protection
    def set_pool(self, pool: str, members: Iterable[str]) -> None:
        """``Dispatcher.set_pool``."""
        check_provider(pool)
        names = check_members(pool, members)
        self._check_open()
        group, fresh, others = self._pool_group(pool, names)
        handovers = self._hand_over(fresh, group)
        try:
            self._merge_groups(group, others)
            self._regroup(pool, names, group, fresh, handovers)
        except (trio.ClosedResourceError, DispatcherClosed):
            # The group's scheduler has stopped (it crashed): the requests
            # that were moving fail as its own did.
            for handover in handovers.values():
                for acquire in handover.waiting:
                    acquire.reply.refused(
                        DispatcherClosed(f"the scheduler of pool {pool!r} has stopped")
                    )
            raise DispatcherClosed(
                f"the scheduler of pool {pool!r} has stopped"
            ) from None

    def _regroup(
        self,
        pool: str,
        names: tuple[str, ...],
        group: Group,
        fresh: list[str],
        handovers: dict[str, Handover],
    ) -> None:
        """Pool ``pool`` of ``names`` in ``group``: its new members joined, their requests moved."""
        groups = self._groups
        group.members.extend(fresh)
        group.pools[pool] = names
        for name in [*names, pool]:
            groups[name] = group
            self._known.add(name)
            self._cleared.add(name)
        actor = _local(group.actor)
        if actor is not None:
            # Each joins with its holders and its waiting requests in place
            # before anything is granted on it; then the pool.
            for name in fresh:
                actor.add_member(self._setup(name), handovers.get(name))
            self._tell(pool, SetPool(pool, names))
        for name in fresh:
            if actor is not None or name in handovers:
                # Scheduled in the group at once: statistics() shows them
                # (and those scheduled on their own before, still).
                self._scheduler(name)
        if actor is None and handovers:
            # The group's scheduler, new, has each with its holders: its
            # waiting requests join now (nothing else waits there yet).
            made = _local(group.actor)
            assert made is not None  # made by _scheduler
            for handover in handovers.values():
                made.take_over(handover)

    def _pool_group(
        self, pool: str, names: tuple[str, ...]
    ) -> tuple[Group, list[str], list[Group]]:
        """The group pool ``pool`` of ``names`` goes in, its members new to any group, and the groups that merge into it.

        Members of groups scheduled apart join them into one: the group
        whose scheduler runs (the first, if several do; then the others
        give way to it), else the first.

        Raises:
            ValueError: Pools need the local scheduler; ``pool`` is a
                provider's name; ``names`` names a pool.
            DispatcherClosed: The scheduler of a group it would join has
                stopped (it crashed). Nothing changed.
        """
        settings = self._settings
        self._fleet_pools_fixed()
        if settings.new_backend is not None:
            raise ValueError(
                "pools need the local scheduler or the Redis one (redis_url), not a"
                " backend factory of one's own"
            )
        groups = self._groups
        known = groups.get(pool)
        if (
            pool in names
            or (known is None and (pool in self._known or pool in self._backends))
            or (known is not None and pool not in known.pools)
        ):
            raise ValueError(f"pool {pool!r} has the name of a provider")
        pooled = [
            name for name in names if name in groups and name in groups[name].pools
        ]
        if pooled:
            raise ValueError(f"pool {pool!r} names pools as members: {_names(pooled)}")
        joined = {id(known): known} if known is not None else {}
        for name in names:
            if name in groups:
                joined.setdefault(id(groups[name]), groups[name])
        found = list(joined.values())
        running = [each for each in found if each.actor is not None]
        group = (running or found or [Group()])[0]
        for each in running:
            actor = _local(each.actor)
            assert actor is not None  # running
            # The chosen group's scheduler takes the others in; theirs give way.
            _check_scheduler(
                actor, f"pools {_names(each.pools)}", gives_way=each is not group
            )
        others = [each for each in found if each is not group]
        return group, [name for name in names if name not in groups], others

    def _fleet_pools_fixed(self) -> None:
        """Refuse to change pools at run time with ``redis_url``.

        Raises:
            ValueError: The dispatcher shares its limits through Redis: a
                fleet's pools are one group in its ledger, declared the
                same to ``open_dispatcher(pools=...)`` in every process.
        """
        if self._settings.redis_url is not None:
            raise ValueError(
                "a fleet's pools are fixed: with redis_url, declare them to"
                " open_dispatcher(pools=...), the same in every process"
            )

    def _merge_groups(self, group: Group, others: list[Group]) -> None:
        """Each group of ``others`` joins ``group``: its members and pools, and its scheduler's requests.

        A group whose scheduler runs hands it all over (``give_way_whole``)
        to ``group``'s, whose scheduler runs too (``_pool_group`` chose
        it): what it learned, its holders, and its waiting requests, in
        their place. Its old views (a slot holds one) reach ``group``'s
        scheduler from now on.
        """
        actor = _local(group.actor)
        groups = self._groups
        for other in others:
            other.merged_into = group
            names = [*other.members, *other.pools]
            group.members.extend(other.members)
            group.pools.update(other.pools)
            for name in names:
                groups[name] = group
            moved = [name for name in names if self._backends.pop(name, None)]
            for name in moved:
                self._host.actors.pop(name, None)
            if actor is None:
                continue  # no scheduler runs: none is made yet
            gives_way = _local(other.actor)
            if gives_way is not None:
                handover = gives_way.give_way_whole(actor)
                limits = self._host.limits
                actor.merge(
                    handover, {name: limits.get(name) for name in other.members}
                )
            else:
                for name in other.members:
                    actor.add_member(self._setup(name))
                for pool, members in other.pools.items():
                    actor.send(SetPool(pool, members))
            for name in moved:
                # Scheduled in the group at once, as before.
                self._scheduler(name)

    def _hand_over(self, fresh: list[str], group: Group) -> dict[str, Handover]:
        """The providers of ``fresh`` scheduled on their own: each scheduler gives way to ``group``'s.

        With what it learned and holds (``carried``, for the group's
        policy) and its waiting requests, which wait there in their place.
        """
        apart = [name for name in fresh if name in self._backends]
        for name in apart:
            backend = self._backends[name]
            assert isinstance(backend, SchedulerActor)  # pools: local only
            _check_scheduler(backend, repr(name), gives_way=True)
        handovers: dict[str, Handover] = {}
        for name in apart:
            backend = self._backends.pop(name)
            assert isinstance(backend, SchedulerActor)  # checked above
            self._host.actors.pop(name, None)
            handover = handovers[name] = backend.give_way(MemberView(name, group))
            self._carried[name] = handover.state
        return handovers

    def remove_pool(self, pool: str) -> None:
        """``Dispatcher.remove_pool``."""
        check_provider(pool)
        self._check_open()
        group = self._groups.get(pool)
        if group is None or pool not in group.pools:
            raise ValueError(f"no pool {pool!r}; pools: {_names(self.pools())}")
        self._fleet_pools_fixed()
        del group.pools[pool]
        if group.actor is not None:
            self._tell(pool, RemovePool(pool))
        del self._groups[pool]
        self._known.discard(pool)
        self._cleared.discard(pool)
        self._backends.pop(pool, None)
        self._host.actors.pop(pool, None)

    def provider_statistics(self, provider: str) -> ProviderStatistics | None:
        """``statistics().providers.get(provider)``, the others left alone.

        For an integration that reads one provider (a conversation, its
        pause): only that provider's backend handles its backlog. ``None``
        for a provider never used.
        """
        self.check_run()
        backend = self._backends.get(provider)
        if backend is None or (type(backend) is MemberView and not backend.joined):
            return None
        return backend.statistics()

    def _unknown(self, provider: str) -> None:
        """Apply ``unknown_providers`` to a provider first seen unknown."""
        if self._settings.unknown_providers == "error":
            raise ValueError(
                f"provider {provider!r} has no limit;"
                f" known providers: {_names(self._known)}"
                f"{_did_you_mean(provider, self._known)}"
            )
        if self._settings.unknown_providers == "warn":
            message = (
                f"provider {provider!r} has no limit, so it runs unlimited;"
                f" limited providers: {_names(self._host.limits)}"
                f"{_did_you_mean(provider, self._host.limits)}"
            )
            # The warning first: turned into an error (python -W error), it
            # refuses this use, and the name stays unknown for the next.
            warn_the_caller(UnknownProviderWarning(message))
            _logger.warning("%s", message)
        self._cleared.add(provider)

    def _scheduler(self, provider: str) -> Backend:
        """The backend of ``provider``, made if there is none, its task running.

        Unlimited providers get one too (with no limit, it grants at once):
        it counts their slots in use, so a limit set later counts them. Its
        task stops when idle (see ``_serve``); the next call starts it again
        on the same backend.
        """
        self.check_run()
        actor = self._host.actors.get(provider)
        if actor is None:
            actor = self._backends.get(provider)
            if actor is None:
                group = self._groups.get(provider)
                actor = self._backends[provider] = (
                    self._new_backend(self._setup(provider))
                    if group is None
                    else self._view(provider, group)
                )
            self._host.actors[provider] = actor
            self._nursery.start_soon(
                self._serve, actor, name=f"trio_dispatch scheduler {provider!r}"
            )
        return actor

    def _view(self, name: str, group: Group) -> MemberView:
        """The backend of member or pool ``name`` of ``group``: the group's scheduler made first."""
        if group.actor is None:
            first, *others = group.members
            setup = attrs.evolve(
                self._setup(first),
                events=Translator(" | ".join(group.pools), self._hub),
                members=tuple(self._setup(other) for other in others),
                pools=dict(group.pools),
                affinity_wait=self._settings.affinity_wait,
                failure_threshold=self._settings.failure_threshold,
                failure_cooldown=self._settings.failure_cooldown,
            )
            # Settings refuse pools with a backend factory of one's own:
            # this is the local scheduler, or the shared one with redis_url.
            group.actor = cast("GroupScheduler", self._new_backend(setup))
        return MemberView(name, group)

    def _setup(self, provider: str) -> BackendSetup:
        """What a new backend of ``provider`` is told: everything known of it now.

        With what it learned under a scheduler of its own that gave way to
        its group's (``carried``), handed on once.
        """
        settings = self._settings
        return BackendSetup(
            carried=self._carried.pop(provider, None),
            provider=provider,
            limit=self._host.limits.get(provider),
            budget=settings.provider_budgets.get(provider),
            model_budgets=settings.model_budgets.get(provider, {}),
            tenants=dict(self._tenants),
            max_waiting=settings.max_waiting,
            default_pause=settings.default_pause,
            max_pause=settings.max_pause,
            learn_budgets=settings.learn_budgets,
            priority_aging=settings.priority_aging,
            events=Translator(provider, self._hub),
            clock=trio.current_time,
            learn_limit=self._learn_limit,
            learn_tenant=self._learn_tenant,
        )

    def _tell_every(self, message: SchedulerMessage) -> None:
        """Send ``message`` to every provider's backend (``_tell``), closed ones aside.

        Once to a group's scheduler, whichever of its views it goes through.
        """
        told: set[int] = set()
        for provider in list(self._backends):
            group = self._groups.get(provider)
            if group is not None:
                if id(group) in told:
                    continue
                told.add(id(group))
            with contextlib.suppress(DispatcherClosed):
                # Closed: its scheduler has stopped (it crashed).
                self._tell(provider, message)

    def _tell(self, provider: str, message: SchedulerMessage) -> None:
        """Send ``message`` to the backend of ``provider``, started if need be.

        Raises:
            DispatcherClosed: Its backend is closed.
        """
        backend = self._scheduler(provider)
        try:
            backend.send(message)
        except trio.ClosedResourceError:
            raise DispatcherClosed(
                f"the scheduler of {provider!r} has stopped"
            ) from None

    def _read_server_loads(self) -> None:
        """Read each ``server_load`` every ``server_load_interval``, for its scheduler."""
        settings = self._settings
        for provider, source in settings.server_load.items():
            self._known.add(provider)
            self._nursery.start_soon(
                functools.partial(
                    poll_server_load,
                    provider,
                    source,
                    functools.partial(self._server_load_read, provider),
                    every=settings.server_load_interval,
                ),
                name=f"trio_dispatch: the server load of {provider!r}",
            )

    def _server_load_read(self, provider: str, load: ServerLoad | None) -> None:
        with contextlib.suppress(DispatcherClosed):
            # Closed: its scheduler has stopped (it crashed).
            self._tell(provider, ObserveServerLoad(load))

    def _set_limits(self, limits: Mapping[str, int | AdaptiveLimit | None]) -> None:
        """The limits the dispatcher opens with: given, or stored in Redis.

        Stored ones (``None``: unlimited on purpose) are learned, not
        written: Redis has them already. Each provider is known, its
        backend started, so that a pause or a limit reaches it at once:
        once every limit is learned, so that a group's scheduler starts
        with all its members' limits.
        """
        for provider, limit in limits.items():
            if self._settings.redis_url is None:
                assert limit is not None
                self.set_limit(provider, limit)
                continue
            assert not isinstance(limit, AdaptiveLimit)
            self._learn_limit(provider, limit)
            self._known.add(provider)
            self._cleared.add(provider)
        if self._settings.redis_url is not None:
            for provider in limits:
                self._scheduler(provider)

    def _learn_limit(self, provider: str, limit: int | None) -> None:
        """A backend told its limit: an adaptive move, or the fleet's from Redis."""
        if limit is None:
            self._host.limits.pop(provider, None)
        else:
            self._host.limits[provider] = limit

    def _learn_tenant(self, tenant: str, settings: Tenant | None) -> None:
        """A shared scheduler learned the fleet's setting of ``tenant`` from Redis."""
        if settings is None:
            self._tenants.pop(tenant, None)
        else:
            self._tenants[tenant] = settings

    # Protected so that no KeyboardInterrupt comes between the actor's
    # decision to stop and its removal: a request in between would find a
    # closed inbox.
    @trio.lowlevel.enable_ki_protection
    async def _serve(self, actor: Backend) -> None:
        if await actor.run(stop_when_idle=True):
            # Idle and unlimited: it stopped with nothing held, waiting or
            # queued, in this same step, so no request was sent to it since.
            del self._host.actors[actor.provider]

    def check_known(self, provider: str) -> None:
        """Let ``provider`` through as ``slot()`` does, or refuse it at once.

        Plumbing for integrations that take slots later (``transport()``,
        ``start_conversation()``): ``unknown_providers`` applies to a
        provider never named in ``limits``, ``set_limit`` or
        ``remove_limit`` (a warning, or ``ValueError`` with ``"error"``).

        Raises:
            TypeError: ``provider`` is not a string.
            ValueError: ``provider`` is empty, or unknown while
                ``unknown_providers`` is ``"error"``.
        """
        check_provider(provider)
        if provider not in self._cleared:
            self._unknown(provider)

    def _check_open(self) -> None:
        """Open, and called from its run: before a change is made (``check_run``)."""
        if self._closed:
            raise DispatcherClosed("the dispatcher is closed")
        self.check_run()

    def _close(self) -> None:
        self._closed = True
        self._host.closed = True
        for backend in self._backends.values():
            backend.close()
        self._hub.close()
        self._nursery.cancel_scope.cancel()


@asynccontextmanager
async def run_plumbing(
    limits: dict[str, int | AdaptiveLimit], settings: Settings
) -> AsyncIterator[Plumbing]:
    """Run the plumbing of a dispatcher of checked ``limits`` and ``settings``.

    Raises:
        RuntimeError: Not in a trio run (under asyncio, or in no event loop).
    """
    if not trio.lowlevel.in_trio_run():
        raise RuntimeError(_not_under_trio())
    body_error: BaseException | None = None
    shared: SharedBackends | None = None
    try:
        async with trio.open_nursery() as nursery:
            if settings.redis_url is not None:
                # The shared connection first: its factory makes the Redis
                # backends, through the same route as any other.
                try:
                    shared, stored = await _open_shared(nursery, settings, limits)
                except BaseException as exc:
                    body_error = exc
                    nursery.cancel_scope.cancel()
                    raise
            dispatcher = Plumbing._create(
                nursery,
                settings,
                _factory(settings, shared),
                wall_clock=_wall_clock(shared),
            )
            dispatcher._set_limits(limits if shared is None else stored)
            dispatcher._read_server_loads()
            try:
                yield dispatcher
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                dispatcher._close()
                if shared is not None:
                    shared.close()
    except BaseExceptionGroup as group:
        # A group of one made only of what the body raised is the nursery's
        # wrapping of the body's exception: let it out as itself (trio may
        # have rebuilt a group the body raised, or trimmed the Cancelled it
        # absorbed from it, so compare leaves, not the group). Anything
        # else, such as an actor's crash, comes out in the group.
        if body_error is None or len(group.exceptions) != 1:
            raise
        only = group.exceptions[0]
        if not _identities(only) <= _identities(body_error):
            raise
        context = only.__context__
        try:
            raise only
        finally:
            only.__context__ = context
            del only, context


def _factory(
    settings: Settings, shared: SharedBackends | None
) -> Callable[[BackendSetup], Backend]:
    """The backend factory: the Redis one, the one given, or the local actor's."""
    if shared is not None:
        return shared
    if settings.new_backend is not None:
        return settings.new_backend
    return SchedulerActor.from_setup


def _wall_clock(shared: SharedBackends | None) -> Callable[[], float]:
    """The dispatcher's wall clock: this host's, or a fleet's Redis server's.

    The ledger reads the server's clock through the offset it measured
    before any turn was placed (``ServerClock``), the clock the fleet's
    queue orders turns by.
    """
    ledger = None if shared is None else shared.ledger
    return time.time if ledger is None else ledger.clock.now


async def _open_shared(
    nursery: trio.Nursery,
    settings: Settings,
    limits: Mapping[str, int | AdaptiveLimit],
) -> tuple[SharedBackends, dict[str, int | None]]:
    """The Redis backends' factory, once Redis is reached (``open_shared_backends``)."""
    from .._redis._backend import open_shared_backends  # noqa: PLC0415  # coredis only when asked for

    return await open_shared_backends(nursery, settings, limits)


def _not_under_trio() -> str:
    """Why a dispatcher cannot open here: asyncio runs, or no event loop does."""
    asyncio = sys.modules.get("asyncio")  # not running if never imported
    try:
        if asyncio is not None and asyncio.get_running_loop():
            return (
                "trio-dispatch runs under trio, not asyncio:"
                " open the dispatcher inside trio.run()"
            )
    except RuntimeError:  # no asyncio loop running in this thread
        pass
    return "trio-dispatch runs under trio: open the dispatcher inside trio.run()"


def _names(providers: Iterable[str]) -> str:
    """Provider names for a message: sorted, quoted, or ``none``."""
    return ", ".join(repr(name) for name in sorted(providers)) or "none"


def _did_you_mean(provider: str, names: Iterable[str]) -> str:
    """``"; did you mean 'openai'?"`` for a name close to ``provider``, or ``""``.

    Compared case-folded, so ``"OpenAI"`` finds ``"openai"`` and
    ``"opneai"`` does too; a name merely unlike every other finds nothing.
    """
    by_folded = {name.casefold(): name for name in sorted(names, reverse=True)}
    close = difflib.get_close_matches(
        provider.casefold(), by_folded, n=1, cutoff=_CLOSE_NAME
    )
    return f"; did you mean {by_folded[close[0]]!r}?" if close else ""


# difflib's similarity above which an unknown name is taken for a slip of
# the keyboard: "opneai" (0.83) and "OpenAI" (1.0) for "openai", not "gpt-x".
_CLOSE_NAME: Final = 0.8


def _identities(exc: BaseException) -> set[int]:
    """The identities of the exceptions in ``exc``, through any groups."""
    return {id(leaf) for leaf in leaves(exc)}


def _local(actor: GroupScheduler | None) -> SchedulerActor | None:
    """A group's scheduler where pools change at run time: the local one (a fleet's are fixed)."""
    assert actor is None or isinstance(actor, SchedulerActor)
    return actor


def _check_scheduler(actor: SchedulerActor, what: str, *, gives_way: bool) -> None:
    """Refuse a ``set_pool`` whose scheduler (of ``what``) has stopped, or must give way while busy.

    A scheduler that stopped (it crashed) takes nothing and gives nothing
    way; one cannot give way in the middle of a step (``set_pool`` called
    from an event sink while it handles). Checked before anything changes.

    Raises:
        DispatcherClosed: It has stopped.
        RuntimeError: It ``gives_way`` and is handling a message.
    """
    if actor.closed:
        raise DispatcherClosed(f"the scheduler of {what} has stopped")
    if gives_way and actor.handling:
        raise RuntimeError(
            f"set_pool cannot move the scheduler of {what} while it handles a"
            " message (set_pool was called from its event sink?): nothing changed;"
            " call it from a task"
        )
