"""The dispatcher's connection to Redis: one long-lived task holds the client.

``serve_ledger`` runs in the dispatcher's nursery. It opens the coredis
client (whose own tasks live inside it, so nothing the dispatcher's body
raises passes through them), checks that Redis answers (trying again,
for ``redis_connect_timeout``, while it does not), stores the limits
given to ``open_dispatcher`` where none is stored yet and its budgets
(which replace the fleet's configured ones; a key ``"provider/model"`` is
that model's), and reports the
ledger and the stored limits to the dispatcher. Then it listens for
wake-ups on the namespace's channels and hands each to the provider's
scheduler, until the dispatcher closes.

``redis_url`` may name a single server or any node of a Redis Cluster:
a first connection asks (``INFO cluster``), and a cluster gets coredis's
cluster client. Every exchange touches one provider's keys, which share a
hash tag, so one slot; wake-ups use classic pub/sub, which a cluster
delivers to subscribers on every node.

A pub/sub connection to a Redis that died may stay silent rather than fail,
so the schedulers tell the listener when they lose the ledger (``lost``),
and it subscribes again; on each new subscription every scheduler runs a
round, for what it may have missed.

Each subscription has a client of its own. A coredis pool never gets back
the place of a connection that died while lent out, as a subscription's
is: on the ledger's client, every lost subscription would shrink the pool
by one, until the scripts found no connection at all. A client per
subscription takes its pool with it (the first one connects as the
dispatcher opens, beside the ledger's). The ledger's client lends a
connection only for the time it takes to send a command, which the
ledger's calls count on: they share a connection that is back in the pool.
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import warnings
from typing import TYPE_CHECKING, Any, final

import coredis
import trio
from coredis.exceptions import ClusterDownError, ResponseError, TryAgainError
from coredis.retry import NoRetryPolicy

from .._dispatch._setup import fleet_groups, fleet_name
from .._exceptions import BackendUnavailable
from .._groups import leaves
from .._validation import redact_url
from ..messages._protocol import ForMember, SetModelBudget, SetTenant
from ._book import SharedBook
from ._ledger import Ledger, provider_of_channel
from ._scheduler import BACKEND_ERRORS, SharedSchedulerActor, new_node

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._dispatch._settings import Settings
    from .._dispatch._setup import BackendSetup
    from .._policy._budgets import AdaptiveLimit
    from ._ledger import Client


@final
class SharedBackends:
    """The factory of the shared schedulers, and the relay of wake-ups to them.

    ``open_shared_backends`` makes it once Redis is reached; the dispatcher
    calls it with each provider's ``BackendSetup``, as it calls any backend
    factory (``open_dispatcher_with``). ``close()`` lets the connection end
    once the schedulers are done with it.
    """

    __slots__ = ("_actors", "_closing", "ledger")

    def __init__(self) -> None:
        self._actors: dict[str, SharedSchedulerActor] = {}
        self._closing = trio.Event()
        self.ledger: Ledger | None = None

    def __call__(self, setup: BackendSetup) -> SharedSchedulerActor:
        """The shared scheduler of ``setup.provider`` (it stores its limit in Redis).

        The tenants and the models' budgets of ``setup`` are stored for the
        fleet by its first round; the provider's budget was stored as the
        connection opened.
        """
        ledger = self.ledger
        assert ledger is not None
        # A group of pools is one name in the ledger, the same in every
        # process of the fleet; its events name its pools, as a local one's.
        pooled = bool(setup.pools)
        members = (setup, *setup.members) if pooled else ()
        provider = fleet_name(setup.pools) if pooled else setup.provider
        events = setup.events.provider
        actor = SharedSchedulerActor(
            provider,
            SharedBook(
                new_node(), events, max_waiting=setup.max_waiting, pooled=pooled
            ),
            ledger,
            limit=setup.limit,
            default_pause=setup.default_pause,
            max_pause=setup.max_pause,
            on_limit=setup.learn_limit,
            on_tenant=setup.learn_tenant,
            hub=setup.events.hub,
            members={member.provider: member.limit for member in members},
            pools=setup.pools,
            events=events,
            affinity_wait=setup.affinity_wait,
            failure_threshold=setup.failure_threshold,
            failure_cooldown=setup.failure_cooldown,
        )
        for tenant, settings in setup.tenants.items():
            actor.send(SetTenant(tenant, settings))
        for member in members or (setup,):
            for model, budget in member.model_budgets.items():
                message = SetModelBudget(model, budget)
                actor.send(ForMember(member.provider, message) if pooled else message)
        self._actors[provider] = actor
        return actor

    def close(self) -> None:
        """The dispatcher closed: the connection ends once the schedulers are done."""
        self._closing.set()

    def wake(self, provider: str | None, message: str | None) -> None:
        """A wake-up for ``provider`` (``None``: all) came from Redis.

        ``message`` is the wake-up's, which says which processes it is for
        (``wakes``), or ``None`` when a subscription began.
        """
        if provider is None:
            actors = list(self._actors.values())
        else:
            actor = self._actors.get(provider)
            actors = [] if actor is None else [actor]
        for actor in actors:
            actor.wake(message)


async def open_shared_backends(
    nursery: trio.Nursery,
    settings: Settings,
    limits: Mapping[str, int | AdaptiveLimit],
) -> tuple[SharedBackends, dict[str, int | None]]:
    """Reach Redis, store ``limits`` where none is: the factory, and the limits stored.

    The connection is served in ``nursery`` (``serve_ledger``) until the
    factory's ``close()``.

    Raises:
        BackendUnavailable: Redis cannot be reached.
    """
    shared = SharedBackends()
    ledger, stored = await nursery.start(
        serve_ledger, settings, limits, shared.wake, shared._closing
    )
    shared.ledger = ledger
    return shared, stored


_FIRST_RETRY = 0.05
_LAST_RETRY = 1.0


async def serve_ledger(
    settings: Settings,
    limits: Mapping[str, int | AdaptiveLimit],
    wake: Callable[[str | None, str | None], None],
    closing: trio.Event,
    *,
    task_status: trio.TaskStatus[tuple[Ledger, dict[str, int | None]]],
) -> None:
    """Hold the client, report the ledger, then relay wake-ups until closing.

    The client lives in a shielded scope: the schedulers give their leases
    back as the dispatcher's nursery is cancelled, so the client (and the
    tasks coredis runs inside it) must outlive that cancellation. Once
    ``closing`` is set, it waits (briefly) for the schedulers to be done,
    then ends.

    Until it reports, a failure to reach Redis (a connection refused,
    reset or unanswered) is tried again from the start, after a growing,
    jittered delay, until ``redis_connect_timeout`` has passed. Each try is
    shielded but bounded (by a call's timeout and what is left of
    ``redis_connect_timeout``), and the delays between them are not, so a
    cancellation of the opening waits for one try at most. A refusal that
    trying again cannot mend (``_permanent``) ends the tries at once.

    Raises:
        BackendUnavailable: Before reporting, if Redis cannot be reached;
            its cause is the last error met.
    """
    url = settings.redis_url
    assert url is not None
    deadline = trio.current_time() + settings.redis_connect_timeout
    reported = False

    def report(value: tuple[Ledger, dict[str, int | None]]) -> None:
        nonlocal reported
        reported = True
        task_status.started(value)

    delay = _FIRST_RETRY
    cause: BaseException | None = None
    while True:
        with trio.CancelScope(shield=True) as held:
            try:
                await _serve(
                    settings,
                    limits,
                    wake,
                    closing,
                    held=held,
                    deadline=deadline,
                    report=report,
                )
            except BaseException as exc:
                error = None if reported else _unreachable(exc)
                if error is None:
                    raise
                if cause is None or not isinstance(error, trio.TooSlowError):
                    # A try cut short by the deadline says less than the
                    # error of the try before it.
                    cause = error
                now = trio.current_time()
                if now >= deadline or _permanent(error):
                    if isinstance(cause, trio.TooSlowError):
                        cause = TimeoutError(
                            f"no answer within {settings.redis_connect_timeout:g}"
                            " seconds"
                        )
                    raise BackendUnavailable(
                        f"cannot reach redis at {redact_url(url)}: {cause}"
                    ) from cause
        if reported:
            # Done: served until closing (``held`` cancelled), or not cut
            # off at all.
            return
        # Unshielded: a cancellation of the opening ends the tries here.
        await trio.sleep(min(random.uniform(delay / 2, delay), deadline - now))
        delay = min(2 * delay, _LAST_RETRY)


async def _serve(
    settings: Settings,
    limits: Mapping[str, int | AdaptiveLimit],
    wake: Callable[[str | None, str | None], None],
    closing: trio.Event,
    *,
    held: trio.CancelScope,
    deadline: float,
    report: Callable[[tuple[Ledger, dict[str, int | None]]], None],
) -> None:
    """One try of ``serve_ledger``: connect, store, report, relay until closing."""
    url = settings.redis_url
    assert url is not None
    # A call may take a third of the lease at most, so that a holder whose
    # renewal hangs learns it before its lease runs out.
    timeout = min(5.0, settings.lease / 3)
    with trio.fail_at(min(trio.current_time() + max(timeout, 1.0), deadline)):
        cluster = await _is_cluster(url, timeout)
    client = _open_client(url, timeout, cluster=cluster)
    listener = _open_client(url, timeout, cluster=cluster)
    async with client, listener:
        with trio.fail_at(min(trio.current_time() + max(timeout, 1.0), deadline)):
            await client.ping()
            # The first subscription's connection, made here: coredis
            # leaves a connection cancelled while it connects unclosed,
            # and a dispatcher may close at once.
            await listener.ping()
            ledger = Ledger(client, settings.namespace, settings.lease)
            # Turns are placed on the server's clock from the first one.
            await ledger.measure_clock()
            # A pool's member keeps its limit and budgets in its group's
            # keys, as a member (see SharedSchedulerActor).
            groups = fleet_groups(settings.pools)
            stored = {}
            for provider, limit in limits.items():
                group = groups.get(provider)
                stored[provider] = await ledger.set_limit(
                    provider if group is None else group[0],
                    limit,
                    overwrite=False,
                    member=None if group is None else provider,
                )
            for key, budget in settings.provider_budgets.items():
                # "provider/model": that model's own budget.
                provider, _, model = key.partition("/")
                group = groups.get(provider)
                if group is None:
                    await ledger.set_budget(provider, budget, model=model or None)
                else:
                    await ledger.set_budget(
                        group[0],
                        budget,
                        model=model or None,
                        member=provider,
                        members=group[1],
                    )
        report((ledger, stored))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_close_when_done, closing, ledger, held)
            await _listen(
                listener,
                functools.partial(_open_client, url, timeout, cluster=cluster),
                ledger,
                wake,
            )


def _unreachable(exc: BaseException) -> BaseException | None:
    """The error that kept Redis from being reached, if ``exc`` is only that.

    ``None`` if anything else is among what ``exc`` holds (a cancellation,
    a bug), which must go on as it is.
    """
    errors = list(leaves(exc))
    if not all(
        isinstance(error, (*BACKEND_ERRORS, trio.TooSlowError)) for error in errors
    ):
        return None
    # Any error but a timeout says more.
    return next((e for e in errors if not isinstance(e, trio.TooSlowError)), errors[0])


def _permanent(error: BaseException) -> bool:
    """Whether trying to reach Redis again cannot mend ``error``.

    Redis refused the connection's commands (a wrong password, a user not
    allowed, a database it does not have), but for a cluster that is
    moving its slots, or the host's name does not resolve (unless the
    resolver asks to try again). A connection refused, reset or
    unanswered, and a Redis still loading its data, may mend.
    """
    if isinstance(error, socket.gaierror):
        return error.errno != socket.EAI_AGAIN
    return isinstance(error, ResponseError) and not isinstance(
        error, (ClusterDownError, TryAgainError)
    )


async def _close_when_done(
    closing: trio.Event, ledger: Ledger, held: trio.CancelScope
) -> None:
    await closing.wait()
    # The schedulers give their leases back as they stop: keep the client
    # open for them, within a bound.
    with trio.move_on_after(2.0):
        if ledger.users:
            idle = trio.Event()
            ledger.on_idle = idle.set
            await idle.wait()
    held.cancel()


def _options(call_timeout: float) -> dict[str, Any]:
    # The retries are the schedulers' own (every exchange is idempotent,
    # and a failed one is sent again after a growing delay): none in coredis.
    return {
        "decode_responses": True,
        "retry_policy": NoRetryPolicy(),
        "connect_timeout": call_timeout,
        "stream_timeout": call_timeout,
    }


async def _is_cluster(url: str, call_timeout: float) -> bool:
    """Whether ``url`` names a node of a Redis Cluster."""
    async with coredis.Redis.from_url(url, **_options(call_timeout)) as probe:
        info = await probe.info("cluster")
    return bool(info.get("cluster_enabled"))


def _open_client(url: str, call_timeout: float, *, cluster: bool) -> Client:
    """A client of ``url``: coredis's cluster client for a cluster's node."""
    if cluster:
        with warnings.catch_warnings():
            # coredis 6.x warns about how its own from_url passes the node.
            warnings.filterwarnings(
                "ignore", "Use coredis.connection.TCPLocation", DeprecationWarning
            )
            clustered: coredis.RedisCluster[str] = coredis.RedisCluster.from_url(
                url, **_options(call_timeout)
            )
        return clustered
    single: coredis.Redis[str] = coredis.Redis.from_url(url, **_options(call_timeout))
    return single


async def _listen(
    first: Client,
    new_client: Callable[[], Client],
    ledger: Ledger,
    wake: Callable[[str | None, str | None], None],
) -> None:
    """Relay wake-ups: first on ``first`` (open), then each time on a new client."""
    pattern = "{" + ledger.namespace + ":*}:wake"
    delay = _FIRST_RETRY
    opening: contextlib.AbstractAsyncContextManager[Client]
    opening = contextlib.nullcontext(first)
    while True:
        with trio.CancelScope() as scope:
            ledger.on_lost = scope.cancel
            try:
                # No retries inside: a lost connection ends the
                # subscription, and the next one starts on a new client.
                async with (
                    opening as client,
                    client.pubsub(
                        patterns=[pattern], retry_policy=NoRetryPolicy()
                    ) as pubsub,
                ):
                    async for message in pubsub:
                        if message["type"] == "psubscribe":
                            delay = _FIRST_RETRY
                            # Wake-ups may have been missed meanwhile.
                            wake(None, None)
                        elif message["type"] == "pmessage":
                            provider = provider_of_channel(
                                ledger.namespace, _text(message["channel"])
                            )
                            if provider is not None:
                                wake(provider, _text(message["data"]))
            except BaseException as exc:
                # A lost connection ends this subscription; anything else,
                # a cancellation among it included, goes on without the
                # connection's errors.
                if isinstance(exc, BaseExceptionGroup):
                    rest = exc.split(BACKEND_ERRORS)[1]
                    if rest is not None:
                        raise rest from None
                elif not isinstance(exc, BACKEND_ERRORS):
                    raise
        ledger.on_lost = None
        opening = new_client()
        await trio.sleep(delay)
        delay = min(2 * delay, _LAST_RETRY)


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)
