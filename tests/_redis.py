"""Real redis-server processes for the shared-backend tests.

Each server runs on a free loopback port in its own directory, with no
persistence, so a test can kill it and start it again empty. ``Faults``
cuts one process off from it, or loses the answer of one of its steps.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import shutil
import socket
import struct
import subprocess
import time
import uuid
from typing import TYPE_CHECKING, Any

import coredis
import pytest
import trio
from coredis.exceptions import ConnectionError as RedisConnectionError
from hypothesis import HealthCheck, settings

from trio_dispatch import DispatcherClosed, open_dispatcher
from trio_dispatch._redis import _backend as _shared_backend
from trio_dispatch._redis._backend import SharedBackends
from trio_dispatch._redis._book import SharedBook
from trio_dispatch._redis._ledger import Ledger, StepResult, keys_of, member_of
from trio_dispatch._redis._scheduler import SharedSchedulerActor, new_node
from trio_dispatch._redis._scripts import Plan, load_scripts
from trio_dispatch.lowlevel import Acquire, Release, plumbing

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator
    from pathlib import Path

    from trio_dispatch import Dispatcher
    from trio_dispatch.messages._protocol import Ticket

REDIS_SERVER = shutil.which("redis-server")
# Debian's redis-server depends on redis-tools, which has redis-cli.
REDIS_CLI = shutil.which("redis-cli")

needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed"
)
needs_redis_cli = pytest.mark.skipif(
    REDIS_SERVER is None or REDIS_CLI is None,
    reason="redis-server or redis-cli is not installed",
)

# coredis (6.2 to 6.9 at least) leaves a connection's memory streams
# unclosed when connecting fails, and a cluster client's layout never
# closes its error stream; their ResourceWarning says nothing about this
# code. Tests that meet a refused connection ignore it, and the
# server's teardown collects the garbage under the test's warning filters;
# pyproject.toml ignores anyio's warning of it too, for garbage that a
# coverage tracer or a lingering reference lets a later test collect.
coredis_leaks = pytest.mark.filterwarnings(
    "ignore:Unclosed <MemoryObject(Send|Receive)Stream:ResourceWarning"
)


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 above it) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10_000 > 65_535:
            port = 10_000 + port % 40_000
        with contextlib.ExitStack() as probes:
            try:
                for candidate in (port, port + 10_000):
                    sock = probes.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One redis-server process that a test may kill and start again.

    With ``cluster``, a node of a Redis Cluster (see ``running_cluster``).
    """

    def __init__(
        self, directory: Path, *, cluster: bool = False, password: str | None = None
    ) -> None:
        self.directory = directory
        self.port = _cluster_port() if cluster else free_port()
        self.cluster = cluster
        # With a password, clients must AUTH (``requirepass``).
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                *(
                    ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                    if self.cluster
                    else []
                ),
                *([] if self.password is None else ["--requirepass", self.password]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # A readiness probe at startup, before any trio code runs.
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                # Without AUTH, a server with a password answers NOAUTH:
                # it is up all the same.
                if sock.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


async def lose_everything(server: RedisServer, how: str) -> None:
    """Empty ``server``: ``"restart"`` (killed, started again empty) or ``"flushall"``."""
    if how == "restart":
        server.kill()
        server.start()
        return
    assert how == "flushall", how
    async with coredis.Redis.from_url(server.url, decode_responses=True) as client:
        await client.flushall()


@contextlib.contextmanager
def running_cluster(directory: Path, nodes: int = 3) -> Iterator[list[RedisServer]]:
    """A Redis Cluster of ``nodes`` masters, every slot covered, no replicas."""
    assert REDIS_CLI is not None
    servers = []
    try:
        for n in range(nodes):
            (directory / str(n)).mkdir()
            server = RedisServer(directory / str(n), cluster=True)
            servers.append(server)
            server.start()
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *(f"127.0.0.1:{server.port}" for server in servers),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not all(_cluster_ok(server.port) for server in servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come up")
            time.sleep(0.05)
        yield servers
    finally:
        for server in servers:
            server.kill()
        gc.collect()


def _cluster_ok(port: int) -> bool:
    answer = subprocess.run(
        [REDIS_CLI or "redis-cli", "-p", str(port), "cluster", "info"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    return "cluster_state:ok" in answer


class LossyLink:
    """A TCP proxy on loopback to a port: it resets its first ``resets`` connections.

    Each of those is reset (RST) once its first chunk arrives, as a lossy
    link resets a connection; every later connection passes traffic both
    ways. ``connections`` counts the connections accepted.
    """

    def __init__(self, target: int, resets: float) -> None:
        self.target = target
        self.resets = resets
        self.connections = 0
        self.port = 0

    def url(self, path: str = "/0") -> str:
        return f"redis://127.0.0.1:{self.port}{path}"

    async def handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        if self.connections <= self.resets:
            with contextlib.suppress(trio.BrokenResourceError):
                await client.receive_some()
            # Linger 0: closing sends RST, not FIN.
            client.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            await client.aclose()
            return
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.target)
        except OSError:
            await client.aclose()
            return
        async with client, upstream, trio.open_nursery() as nursery:
            nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
            nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


async def _pump(
    source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while data := await source.receive_some():
            await sink.send_all(data)
    done.cancel()


@contextlib.asynccontextmanager
async def open_lossy_link(target: int, resets: float) -> AsyncIterator[LossyLink]:
    """A ``LossyLink`` to ``target`` on a free loopback port, for the block."""
    link = LossyLink(target, resets)
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, link.handle, 0, host="127.0.0.1")
        )
        link.port = listener.socket.getsockname()[1]
        yield link
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def skewed_clocks(skews: Iterable[float]) -> Iterator[None]:
    """The next dispatchers opened read wall clocks ``skews`` seconds off, in turn.

    Each dispatcher's ledger is made with a wall clock of its own, as if
    it ran on a host whose clock is that far ahead (behind, if negative).
    """
    offsets = iter(skews)

    def make(*args: Any, **kwargs: Any) -> Ledger:  # noqa: ANN401  # passed through
        skew = next(offsets)
        return Ledger(*args, wall_clock=lambda: time.time() + skew, **kwargs)

    # The ledgers serve_ledger makes: a test's seam.
    names = vars(_shared_backend)
    made = names["Ledger"]
    names["Ledger"] = make
    try:
        yield
    finally:
        names["Ledger"] = made


async def grant_split(url: str, skew: float, grants: int) -> tuple[int, int]:
    """Two dispatchers take turns at one slot: the grants of each, ``grants`` in all.

    Both open on one namespace of ``url`` (two processes, as far as the
    fleet can tell); the second's wall clock runs ``skew`` seconds ahead.
    Each has one task that takes the slot of ``p`` (limit 1) in a turn of
    its own, holds it for 5 ms, gives it back and asks again at once: the
    oldest turn waiting is always the other's.
    """
    counts = [0, 0]
    done = trio.Event()

    async def take_turns(dispatcher: Dispatcher, index: int) -> None:
        while True:
            async with dispatcher.slot("p"):
                counts[index] += 1
                if sum(counts) >= grants:
                    done.set()
                await trio.sleep(0.005)

    namespace = uuid.uuid4().hex
    with skewed_clocks([0.0, skew]):
        async with (
            open_dispatcher({"p": 1}, redis_url=url, namespace=namespace) as one,
            open_dispatcher({"p": 1}, redis_url=url, namespace=namespace) as two,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(take_turns, one, 0)
            nursery.start_soon(take_turns, two, 1)
            with trio.fail_after(30):
                await done.wait()
            nursery.cancel_scope.cancel()
    return counts[0], counts[1]


@contextlib.contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        gc.collect()


class Faults:
    """Steps that fail, per process (its book's node), in place of ``Ledger.step``.

    A node in ``down`` cannot reach Redis (a partition: the others can); a
    node in ``lose_next`` loses the answer of its next step that enqueues,
    after Redis ran it (kept in ``lost``).
    """

    def __init__(self) -> None:
        self.lose_next: set[str] = set()
        self.down: set[str] = set()
        self.lost: list[StepResult] = []

    @classmethod
    def install(cls, monkeypatch: pytest.MonkeyPatch) -> Faults:
        """Patch ``Ledger.step`` for the test; returns the switches."""
        faults = cls()
        step = Ledger.step

        async def faulty(
            self: Ledger,
            provider: str,
            node: str,
            plan: Plan | None = None,
            **round_: Any,  # noqa: ANN401  # passed through
        ) -> StepResult:
            changes = Plan() if plan is None else plan
            if node in faults.lose_next and changes.enqueue:
                # Redis runs the script; its answer never reaches the process.
                faults.lose_next.discard(node)
                faults.lost.append(await step(self, provider, node, changes, **round_))
                raise RedisConnectionError("connection closed by server")
            if node in faults.down:
                raise RedisConnectionError("connection refused")
            return await step(self, provider, node, changes, **round_)

        monkeypatch.setattr(Ledger, "step", faulty)
        return faults


def node_of(dispatcher: Dispatcher, provider: str = "p") -> str:
    """The node name of a dispatcher's share of ``provider``."""
    actor = plumbing(dispatcher)._backends[provider]
    assert isinstance(actor, SharedSchedulerActor)
    return actor.book.node


def crash(dispatcher: Dispatcher, dead: set[Ledger]) -> None:
    """Cut ``dispatcher`` off from Redis for good, as if its process died.

    ``dead`` is the ``dead_ledgers`` fixture's set: every script a ledger
    in it runs fails.
    """
    # The maker of its backends holds the ledger they share.
    shared = plumbing(dispatcher)._new_backend
    assert isinstance(shared, SharedBackends)
    ledger = shared.ledger
    assert ledger is not None
    dead.add(ledger)


async def wait_until_drained(
    client: coredis.Redis[str], namespace: str, lease: float, *, crashed: bool
) -> None:
    """Wait until the ledger of provider ``p`` holds nothing at all.

    Live processes give everything back at once (well within half a
    lease); what crashed ones held or queued expires after a lease. A step
    prunes what has expired and reports what is left; then every key of
    per-lease and per-entry bookkeeping must be empty too.
    """
    probe = Ledger(client, namespace, lease)
    with trio.fail_after(lease * 2 + 2 if crashed else lease / 2):
        while True:
            seen = await probe.step("p", "probe")
            if seen.in_flight == seen.queued == 0:
                break
            await trio.sleep(0.02)
    keys = keys_of(namespace, "p")
    # The tenants' configuration (tconf) and the index of models with a
    # budget (models) are settings, not bookkeeping.
    names = (
        *("leases", "queue", "qexp", "grantno", "qcost", "charge", "unans", "inuse"),
        *("tstate", "tback", "qmeta", "lmeta"),
    )
    leftovers = {
        name: await client.exists([key])
        for name, key in zip(names, (*keys[:3], *keys[6:11], *keys[12:16]), strict=True)
    }
    assert leftovers == dict.fromkeys(leftovers, 0)


class FleetRequest:
    """One request of a random interleaving over a fleet of dispatchers.

    ``tokens`` is its estimate, ``used`` the usage it reports at the end.
    """

    def __init__(self, node: int, tokens: int = 0, used: int = 0) -> None:
        self.node = node
        self.tokens = tokens
        self.used = used
        self.scope = trio.CancelScope()
        self.release = trio.Event()
        self.state = "waiting"


async def end_all(
    requests: list[FleetRequest], *, lease: float, cancel_waiting: bool = False
) -> None:
    """Let every holder go as soon as granted, until every request has ended.

    With ``cancel_waiting``, the waiters still waiting after half a second
    (held back by a budget for longer than an example lasts) are cancelled.
    """
    await trio.sleep(0.1)
    with trio.fail_after(lease * 3 + 5):
        if cancel_waiting:
            for _ in range(50):
                for request in requests:
                    if request.state == "holding":
                        request.release.set()
                await trio.sleep(0.01)
            for request in requests:
                if request.state == "waiting":
                    request.scope.cancel()
        while any(r.state in {"waiting", "holding"} for r in requests):
            for request in requests:
                if request.state == "holding":
                    request.release.set()
            await trio.sleep(0.01)


_arrivals = iter(range(1_000_000, 9_000_000))


def next_member(lease_id: str) -> str:
    """A queue member for ``lease_id``, arriving after every earlier one."""
    return member_of(next(_arrivals), lease_id)


def fleet_examples(count: int) -> settings:
    """Hypothesis settings for examples that open a fleet on a real Redis.

    Time is real there, so examples are few, and none has a deadline; the
    module-scoped server is shared by every example (each on a namespace of
    its own).
    """
    return settings(
        max_examples=count,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


# The scripts with the server's clock replaced by one the test sets (a key
# beside the provider's, in milliseconds), for exact service counters.
SET_CLOCK = "local now = tonumber(redis.call('GET', KEYS[1] .. ':clock'))\n"


class FleetReply:
    """A requester's end of a grant, for a fleet run on shared schedulers."""

    def __init__(self, fleet: Fleet, node: int, ticket: Ticket) -> None:
        self.fleet = fleet
        self.node = node
        self.ticket = ticket
        self.done = trio.Event()
        self.error: Exception | None = None
        self.lease_deadline: float | None = None

    def granted(self, ticket: Ticket, granted_at: float) -> None:
        self.fleet.grants.append(self)
        self.done.set()

    def refused(self, error: Exception) -> None:
        # The fleet closed while it waited (any other error is a bug).
        assert isinstance(error, DispatcherClosed), error
        self.error = error

    def lease_until(self, deadline: float) -> None:
        self.lease_deadline = deadline


class Fleet:
    """Shared schedulers of one provider on one namespace of a real Redis.

    "Nodes", as processes would run them, with a clock the test sets.

    Wake-ups are the test's (``settle``), not a subscription's, so every
    node runs its rounds when the test says: grants are exact.
    """

    def __init__(
        self, ledger: Ledger, client: coredis.Redis[str], base_ms: int
    ) -> None:
        self.ledger = ledger
        self.client = client
        self.base_ms = base_ms
        self.ms = 0
        self.nodes: list[SharedSchedulerActor] = []
        self.grants: list[FleetReply] = []

    async def clock(self, ms: int) -> None:
        """Set the ledger's clock to ``ms`` after the start."""
        self.ms = ms
        key = self.ledger.names("p")[0][0] + ":clock"
        await self.client.set(key, str(self.base_ms + ms))

    def acquire(
        self,
        node: int,
        *,
        older: float = 0.0,
        tenant: str | None = None,
        model: str | None = None,
    ) -> FleetReply:
        """A request on ``node`` whose turn started ``older`` seconds ago."""
        actor = self.nodes[node]
        ticket = actor.ticket(trio.current_time() - older, 0, tenant, model)
        reply = FleetReply(self, node, ticket)
        actor.send(Acquire(ticket, reply))
        return reply

    def release(self, reply: FleetReply) -> None:
        self.nodes[reply.node].send(Release(reply.ticket))

    async def pause(self) -> None:
        """Grant nothing until ``resume``: requests queue on every node meanwhile."""
        await self.ledger.pause("p", 3600.0, default_pause=1.0, max_pause=3600.0)

    async def resume(self, grants: int) -> None:
        """Once every node published its requests, resume; wait for ``grants``."""
        await self.settle()
        await self.ledger.resume("p")
        await self.settle(grants)
        await self.settle()

    async def view(self) -> StepResult:
        """The ledger's figures now, as a step of a process of no requests sees them."""
        return await self.ledger.step("p", "probe")

    async def settle(self, grants: int | None = None) -> None:
        """Wake every node until ``grants`` were made in all (or a quiet spell)."""
        with trio.fail_after(10):
            quiet = 0
            while (grants is None or len(self.grants) < grants) and quiet < 20:
                before = len(self.grants)
                for actor in self.nodes:
                    actor.wake()
                await trio.sleep(0.01)
                quiet = (
                    0 if len(self.grants) > before or grants is not None else quiet + 1
                )


@contextlib.asynccontextmanager
async def open_fleet(url: str, nodes: int, limit: int) -> AsyncIterator[Fleet]:
    """``nodes`` shared schedulers of provider ``p`` at ``limit``, on a new namespace.

    Leases live an hour, on the test's clock too: nothing expires.
    """
    async with coredis.Redis.from_url(url, decode_responses=True) as client:
        base_ms = math.ceil((await client.time()).timestamp() * 1000)
        ledger = Ledger(
            client, uuid.uuid4().hex, 3600.0, scripts=load_scripts(SET_CLOCK)
        )
        fleet = Fleet(ledger, client, base_ms)
        await fleet.clock(0)
        async with trio.open_nursery() as nursery:
            for _ in range(nodes):
                actor = SharedSchedulerActor(
                    "p",
                    SharedBook(new_node(), "p"),
                    ledger,
                    limit=limit,
                    default_pause=1.0,
                    max_pause=8.0,
                    on_limit=lambda provider, limit: None,
                )
                fleet.nodes.append(actor)
                nursery.start_soon(actor.run)
            yield fleet
            for actor in fleet.nodes:
                actor.close()
