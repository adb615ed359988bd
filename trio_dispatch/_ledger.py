"""The shared ledger: one provider's leases, queue, limit and pause in Redis.

Design note. Every key of a provider lives under one hash tag,
``{<namespace>:<provider>}``, so the scripts below touch one Redis Cluster
slot, and each operation is one Lua script, atomic on the server:

* ``leases``: a ZSET of lease ids scored by their expiry, in the Redis
  server's own time (``TIME`` inside the script, never a client's clock).
  The state is this set of live leases, never a counter, so nothing can go
  negative or drift: an expired lease is pruned by the next script, a
  released one is removed by id (twice is harmless).
* ``queue``: a ZSET of published waiters scored by their turn's start on
  the wall clock; each member is the waiter's arrival (16 digits of
  microseconds on its process's wall clock, strictly increasing in each
  process), a colon and its lease id, so equal starts sort by arrival.
  ``qexp`` scores the same members by their expiry, renewed by their
  process: a vanished process's entries go with it.
* ``conf``: a HASH with the stored ``limit`` (``none`` for unlimited on
  purpose; absent when nobody stored one, which is unlimited too), the
  pause's end ``pause_until`` (server milliseconds), and the fleet-wide
  backoff of rate-limit reports (``streak``, ``step``, ``granted`` and
  ``granted_at_report``, as in the local policy).
* ``nodes`` and ``nwait``: each live process's expiry and its own count of
  waiters, for the fleet-wide ``waiting`` figure.
* ``grantno``: while a streak of rate-limit reports lasts, the number of
  each lease granted during it (``granted`` in ``conf`` counts them), which
  tells a success (a lease granted after the latest report) from a lease
  held across one; a lease without a number was granted before the streak.
  The numbers go when the streak ends, so that, outside a streak, a grant
  and a release cost nothing here.

A process makes its members itself, so every step is idempotent: the
answer of a step can be lost after the server ran it (the connection
dropped), and the process then sends the same changes again. Enqueuing a
member again renews it rather than adding a second one; a member whose
lease id is already among the leases was granted by a step whose answer
was lost, and is reported granted again; withdrawing a member gives back
its lease too, if such a step granted it.

A grant goes to the head of the queue within free capacity: with ``free``
slots, a process may take only those of its own entries among the first
``free`` of the queue, so the others in that window keep their capacity
until their process asks. Every limit change and resume publishes a
wake-up on the provider's channel, and so does every release, withdrawal
and expiry while another process has waiters (as the processes last
reported them: one that has not reported its waiters yet will ask in the
round that does); the message names the process whose round caused it
(``wake`` when nobody in particular), so that this process need not run a
round for its own changes.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final, final

import attrs
from coredis.exceptions import NoScriptError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import coredis

# Members of the queue: a 16-digit arrival, a colon, the lease id.
MEMBER_PREFIX: Final = 17

_PRELUDE = """
local leases, queue, qexp, conf, nodes, nwait, grantno =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function prune()
  local pruned = 0
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #gone > 0 then
    for _, id in ipairs(gone) do redis.call('HDEL', grantno, id) end
    pruned = pruned + redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  end
  gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now)
  if #gone > 0 then
    for _, m in ipairs(gone) do redis.call('ZREM', queue, m) end
    pruned = pruned + redis.call('ZREMRANGEBYSCORE', qexp, '-inf', now)
  end
  gone = redis.call('ZRANGEBYSCORE', nodes, '-inf', now)
  if #gone > 0 then
    for _, n in ipairs(gone) do redis.call('HDEL', nwait, n) end
    redis.call('ZREMRANGEBYSCORE', nodes, '-inf', now)
  end
  return pruned
end
local function paused_for()
  local u = tonumber(redis.call('HGET', conf, 'pause_until') or '0')
  if u > now then return u - now end
  if u > 0 then redis.call('HDEL', conf, 'pause_until') end
  return 0
end
"""

# ARGV: node, ttl (ms), this node's waiters, limit to store if none is
# (empty: none), wake channel, then four counted lists: lease ids to
# release; members to withdraw; (member, start) pairs to enqueue or renew;
# lease ids to renew; and the members that ask for a grant (those
# enqueued ask too). Every server call counts on the grant's path: the
# step reads ``conf`` once, and publishes only when another process waits.
_STEP = (
    _PRELUDE
    + """
local node, ttl, mywait, seed, channel =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local i = 6
local changed = prune()
local c = redis.call('HMGET', conf, 'limit', 'pause_until', 'streak',
  'granted_at_report')
local limit = c[1]
local pause_until = tonumber(c[2] or '0')
local streak = tonumber(c[3] or '0')
local at_report = tonumber(c[4] or '0')
if not limit and seed ~= '' then
  redis.call('HSET', conf, 'limit', seed)
  limit = seed
end
local n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  if redis.call('ZREM', leases, id) == 1 then
    changed = changed + 1
    if streak > 0 then
      local g = tonumber(redis.call('HGET', grantno, id) or '0')
      redis.call('HDEL', grantno, id)
      if g > at_report then
        -- A success: the streak ends, and with it the grant numbers.
        redis.call('HSET', conf, 'streak', 0)
        redis.call('DEL', grantno)
        streak = 0
      end
    end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m = ARGV[i]; i = i + 1
  changed = changed + redis.call('ZREM', queue, m)
  redis.call('ZREM', qexp, m)
  -- Granted by a step whose answer was lost: nobody holds it.
  local id = string.sub(m, 18)
  if redis.call('ZREM', leases, id) == 1 then
    changed = changed + 1
    redis.call('HDEL', grantno, id)
  end
end
local asking = {}
local granted = {}
-- Whether a step whose answer was lost granted m: then it is granted
-- again, the same lease renewed.
local function held(m)
  local id = string.sub(m, 18)
  if redis.call('ZSCORE', leases, id) then
    redis.call('ZADD', leases, now + ttl, id)
    granted[#granted + 1] = m
    return true
  end
  return false
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m, start = ARGV[i], ARGV[i + 1]; i = i + 2
  if not held(m) then
    redis.call('ZADD', queue, start, m)
    redis.call('ZADD', qexp, now + ttl, m)
    asking[m] = true
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  -- ZADD, not XX: after Redis restarted empty, holders register again.
  redis.call('ZADD', leases, now + ttl, ARGV[i]); i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m = ARGV[i]; i = i + 1
  if not held(m) then asking[m] = true end
end
redis.call('ZADD', nodes, now + ttl, node)
redis.call('HSET', nwait, node, mywait)
local pause = 0
if pause_until > now then
  pause = pause_until - now
elseif pause_until > 0 then
  redis.call('HDEL', conf, 'pause_until')
end
local in_flight = redis.call('ZCARD', leases)
local function grant(m)
  local id = string.sub(m, 18)
  redis.call('ZREM', queue, m)
  redis.call('ZREM', qexp, m)
  redis.call('ZADD', leases, now + ttl, id)
  if streak > 0 then
    redis.call('HSET', grantno, id, redis.call('HINCRBY', conf, 'granted', 1))
  end
  granted[#granted + 1] = m
  in_flight = in_flight + 1
end
if not limit or limit == 'none' then
  -- Unlimited: pauses do not apply, as in the local policy.
  for m, _ in pairs(asking) do
    if redis.call('ZSCORE', queue, m) then grant(m) end
  end
  table.sort(granted)
elseif pause == 0 then
  local free = tonumber(limit) - in_flight
  if free > 0 then
    for _, m in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
      if asking[m] then grant(m) end
    end
  end
end
local waiting = 0
for _, w in ipairs(redis.call('HVALS', nwait)) do waiting = waiting + tonumber(w) end
-- Signed, so that the process that caused it need not wake for it, and
-- only when another process waits: nobody else has anything to do.
if changed > 0 and waiting > mywait then redis.call('PUBLISH', channel, node) end
return {granted, limit or '', in_flight, redis.call('ZCARD', queue), waiting, pause,
  now}
"""
)

# ARGV: the limit to store (a positive integer, or ``none``), whether to
# overwrite one already stored (``1``) or only fill a gap (``0``), channel.
_SET_LIMIT = (
    _PRELUDE
    + """
if ARGV[2] == '1' then
  redis.call('HSET', conf, 'limit', ARGV[1])
  redis.call('PUBLISH', ARGV[3], 'wake')
else
  redis.call('HSETNX', conf, 'limit', ARGV[1])
end
return redis.call('HGET', conf, 'limit')
"""
)

# ARGV: the server's delay in ms (empty: none), the default pause, the
# longest pause (ms). The backoff is the local policy's, kept fleet-wide.
_PAUSE = (
    _PRELUDE
    + """
local delay, default, longest = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local streak = tonumber(redis.call('HGET', conf, 'streak') or '0')
local granted = redis.call('HGET', conf, 'granted') or '0'
local step = tonumber(redis.call('HGET', conf, 'step') or default)
if streak == 0 or granted ~= redis.call('HGET', conf, 'granted_at_report') then
  if streak > 0 then step = math.min(2 * step, longest) else step = default end
  redis.call('HSET', conf, 'streak', streak + 1, 'step', step,
    'granted_at_report', granted)
end
local seconds = step
if delay ~= '' then seconds = math.min(tonumber(delay), longest) end
local current = tonumber(redis.call('HGET', conf, 'pause_until') or '0')
if now + seconds > current then
  redis.call('HSET', conf, 'pause_until', now + seconds)
end
return paused_for()
"""
)

# ARGV: channel. Ends the pause and the streak.
_RESUME = (
    _PRELUDE
    + """
redis.call('HDEL', conf, 'pause_until')
redis.call('HSET', conf, 'streak', 0)
redis.call('DEL', grantno)
redis.call('PUBLISH', ARGV[1], 'wake')
return 0
"""
)


@final
class _Script:
    """A script's text and the digest by which Redis runs it."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


_STEP_SCRIPT: Final = _Script(_STEP)
_SET_LIMIT_SCRIPT: Final = _Script(_SET_LIMIT)
_PAUSE_SCRIPT: Final = _Script(_PAUSE)
_RESUME_SCRIPT: Final = _Script(_RESUME)

_EVALSHA: Final = b"EVALSHA"
_SCRIPT_LOAD: Final = b"SCRIPT LOAD"


def keys_of(namespace: str, provider: str) -> list[str]:
    """The keys of one provider, in the order the scripts take them."""
    tag = "{" + namespace + ":" + provider + "}"
    return [
        f"{tag}:{name}"
        for name in (
            "leases",
            "queue",
            "qexp",
            "conf",
            "nodes",
            "nwait",
            "grantno",
        )
    ]


def channel_of(namespace: str, provider: str) -> str:
    """The channel that carries a provider's wake-ups."""
    return "{" + namespace + ":" + provider + "}:wake"


def provider_of_channel(namespace: str, channel: str) -> str | None:
    """The provider a wake-up channel belongs to, or ``None`` if not ours."""
    head = "{" + namespace + ":"
    tail = "}:wake"
    if channel.startswith(head) and channel.endswith(tail):
        return channel[len(head) : -len(tail)]
    return None


def lease_of(member: str) -> str:
    """The lease id inside a queue member."""
    return member[MEMBER_PREFIX:]


def member_of(arrival: int, lease_id: str) -> str:
    """The queue member of a waiter that arrived at ``arrival`` (microseconds)."""
    return f"{arrival:016d}:{lease_id}"


@final
@attrs.frozen
class StepResult:
    """What one ``step`` did and saw, in the server's terms.

    Attributes:
        granted: The members granted a lease: those that a step whose
            answer was lost had granted, then the others in queue order.
        limit: The stored limit, or ``None`` when there is none or it is
            unlimited on purpose.
        in_flight: Live leases of the whole fleet.
        queued: Entries in the shared queue.
        waiting: Waiters of the whole fleet, as their processes report them.
        paused_for: Seconds left of the pause, or 0.
        server_time: The server's clock, in seconds.
    """

    granted: list[str]
    limit: int | None
    in_flight: int
    queued: int
    waiting: int
    paused_for: float
    server_time: float


def _limit_of(stored: object) -> int | None:
    if stored in (None, "", "none"):
        return None
    return int(str(stored))


@final
class Ledger:
    """The scripts of one namespace, bound to a coredis client.

    A script runs by its digest (``EVALSHA``) on a connection of the
    client's pool, straight through the connection's request: a step is on
    the path of every grant, and coredis's general command path (a command
    object wrapped for the retry and the answer's transformation, each
    copy serialising the arguments again, the pool's lock) cost about as
    much as the round trip itself. The ledger keeps the connection of its
    last call while it is usable, as coredis's own commands share one: it
    is back in the pool as soon as a command is sent, so the pool replaces
    it if it dies. Redis answers ``NOSCRIPT`` when it has lost the script
    (restarted empty, or its cache flushed): the script is loaded on the
    same connection and run once more.

    Args:
        client: A coredis client whose pool lends a connection only for
            the time it takes to send a command (no subscription, blocking
            command or transaction on it), since calls go on a connection
            that is back in the pool.
        namespace: The prefix of every key; processes that share it share
            their limits.
        lease: Seconds a lease or a queue entry lives without renewal.
    """

    __slots__ = (
        "_client",
        "_connection",
        "_names",
        "lease",
        "namespace",
        "on_idle",
        "on_lost",
        "users",
    )

    def __init__(
        self, client: coredis.Redis[str], namespace: str, lease: float
    ) -> None:
        self._client = client
        self._connection: coredis.BaseConnection | None = None
        self.namespace = namespace
        self.lease = lease
        # Each provider's keys and channel, made once: a step is on the
        # path of every grant.
        self._names: dict[str, tuple[list[str], str]] = {}
        # Set by whoever listens for wake-ups, to hear that Redis was lost.
        self.on_lost: Callable[[], object] | None = None
        # The schedulers using it, so that the client outlives their last
        # releases; on_idle is called when the last one is done.
        self.users = 0
        self.on_idle: Callable[[], object] | None = None

    def enter(self) -> None:
        """A scheduler starts using the ledger."""
        self.users += 1

    def leave(self) -> None:
        """A scheduler is done with the ledger, its last releases sent."""
        self.users -= 1
        if not self.users and self.on_idle is not None:
            self.on_idle()

    def names(self, provider: str) -> tuple[list[str], str]:
        """The keys and the wake-up channel of ``provider``."""
        names = self._names.get(provider)
        if names is None:
            names = self._names[provider] = (
                keys_of(self.namespace, provider),
                channel_of(self.namespace, provider),
            )
        return names

    def lost(self) -> None:
        """A call failed: whoever listens for wake-ups should subscribe again."""
        if self.on_lost is not None:
            self.on_lost()

    async def _run(
        self, script: _Script, keys: Sequence[str], *args: str | int | float
    ) -> Any:  # noqa: ANN401 (a Lua script's answer is untyped)
        """Run ``script`` on ``keys`` and ``args``; its answer, decoded."""
        connection = self._connection
        if connection is None or not connection.usable:
            pool = self._client.connection_pool
            connection = await pool.get_connection()
            # Back at once: requests share a connection (see the class).
            pool.release(connection)
            self._connection = connection
        try:
            return await connection.create_request(
                _EVALSHA, script.sha, len(keys), *keys, *args, decode=True
            )
        except NoScriptError:
            await connection.create_request(_SCRIPT_LOAD, script.text)
            return await connection.create_request(
                _EVALSHA, script.sha, len(keys), *keys, *args, decode=True
            )

    async def step(
        self,
        provider: str,
        node: str,
        *,
        waiting: int = 0,
        seed: int | None = None,
        release: Sequence[str] = (),
        withdraw: Sequence[str] = (),
        enqueue: Sequence[tuple[str, float]] = (),
        renew_leases: Sequence[str] = (),
        ask: Sequence[str] = (),
    ) -> StepResult:
        """Apply one round of a process's changes, in order, atomically.

        Releases ``release`` (lease ids), withdraws ``withdraw`` (members,
        and their leases if they have any), enqueues or renews ``enqueue``
        (member and wall-clock start), renews ``renew_leases`` (adding them
        back if they are gone), stores ``seed`` as the limit if none is
        stored, then grants what it can of ``ask`` and of ``enqueue``. Sent
        twice, the same changes leave the same state.
        """
        keys, channel = self.names(provider)
        args: list[str | int | float] = [
            node,
            round(self.lease * 1000),
            waiting,
            "" if seed is None else seed,
            channel,
        ]
        args.append(len(release))
        args.extend(release)
        args.append(len(withdraw))
        args.extend(withdraw)
        args.append(len(enqueue))
        for member, start in enqueue:
            args.extend((member, repr(start)))
        args.append(len(renew_leases))
        args.extend(renew_leases)
        args.append(len(ask))
        args.extend(ask)
        # A Lua script's answer is untyped; this one has a fixed shape.
        reply: Any = await self._run(_STEP_SCRIPT, keys, *args)
        granted, limit, in_flight, queued, waiting_all, pause, now = reply
        return StepResult(
            granted=list(granted),
            limit=_limit_of(limit),
            in_flight=int(in_flight),
            queued=int(queued),
            waiting=int(waiting_all),
            paused_for=int(pause) / 1000,
            server_time=int(now) / 1000,
        )

    async def set_limit(
        self, provider: str, limit: int | None, *, overwrite: bool = True
    ) -> int | None:
        """Store ``limit`` (``None``: unlimited); returns the stored limit.

        With ``overwrite=False`` a limit already stored wins.
        """
        keys, channel = self.names(provider)
        stored = await self._run(
            _SET_LIMIT_SCRIPT,
            keys,
            "none" if limit is None else limit,
            "1" if overwrite else "0",
            channel,
        )
        return _limit_of(stored)

    async def pause(
        self,
        provider: str,
        retry_after: float | None,
        *,
        default_pause: float,
        max_pause: float,
    ) -> float:
        """Pause the provider fleet-wide; returns the seconds left of the pause."""
        left = await self._run(
            _PAUSE_SCRIPT,
            self.names(provider)[0],
            "" if retry_after is None else round(retry_after * 1000),
            round(default_pause * 1000),
            round(max_pause * 1000),
        )
        return int(str(left)) / 1000

    async def resume(self, provider: str) -> None:
        """End the provider's pause and its backoff streak, fleet-wide."""
        keys, channel = self.names(provider)
        await self._run(_RESUME_SCRIPT, keys, channel)
