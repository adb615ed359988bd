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

Budgets and the adaptive limit, fleet-wide (the pure core's rules, in
``_budgets``, applied here to the whole fleet):

* The budgets are two buckets in ``conf`` (``r_*`` for requests, ``t_*``
  for tokens): capacity, refill per millisecond, level, the server time of
  that level, whether it was configured (else learned), and a configured
  budget's own count (``*_own``), charged and refilled with the level but
  never moved by figures. Every step
  refills them to the server's ``TIME`` first, so no client's clock is in
  them. A configured ``Budget`` is written by each process that opens with
  one (the latest wins); the figures of answers (``observed``) set or
  lower the level and teach a learned bucket its capacity and rate, as
  ``Bucket.learn`` does: the newest answer's figures (the last of the
  step's ``answered`` leases, granted after every lease answered before
  it) set it, up to the capacity (a configured budget's own count), and
  other figures only lower it.
* ``qcost``: the estimated tokens of a queued member; ``charge``: the
  tokens a lease was charged (corrected by usage reports, which give back
  or take the difference; a charge the newest figures counted is stored
  negated, settled: its usage report gives nothing back, as in
  ``Throttle``); ``unans``: the leases whose answer has not started, a
  ZSET scored by the server time of their grant, and ``seen`` in
  ``conf``: the latest grant time of a lease whose answer started
  (``seen_l``: what it was when figures were last learned from).
  Learning counts as not yet seen by the provider only the leases granted
  since then (in the same millisecond too), and those whose answer started
  in the step but the last, as ``Throttle`` does.
* A grant walks the head of the queue in order and stops at the first
  entry the budgets cannot hold yet: nobody passes it, whichever process
  it belongs to. The entries of other processes ahead keep their cost
  (reserved) until their process asks, as they keep their slot. The step
  answers when the head will fit (``ready_in``), so that waiting processes
  run their next round then.
* An adaptive limit is the stored ``limit`` plus its bounds and value
  (``a_*`` in ``conf``): a success of a lease granted with the limit in use
  (``inuse``, a SET) adds to it in the releasing step, a new round of
  rate-limit reports multiplies it by the backoff in ``pause``; a report
  empties ``inuse``, since the slots held then are not successes.

What stays in Redis. Every key above but ``conf`` is bookkeeping: each
entry goes with what it tracks (a lease, a queue entry, a process), and
each script sets the keys to expire at the latest expiry of a live process
of the provider (every lease and entry expires with its process's own), so
a provider nobody uses leaves nothing behind. ``conf`` persists while it
holds a stored limit (``none`` included) or a configured budget, which
outlive every process; else (learned budgets, a pause, a backoff streak)
it expires with the rest, or at the end of its pause.

Numbers. The scripts apply the budgets' rule of ``_budgets``: one
request's charge, estimated or reported, is at most the bucket's capacity,
a charge takes the level down to 0 at most, and the level stays within
``[-capacity, capacity]``. Token counts enter as whole numbers up to
``MAX_TOKENS`` (exact in a double, Lua's only number); whole numbers leave
as digits (Lua's own ``tostring`` writes large ones with an exponent) and
others as 17 significant digits. A stored value that is not a finite
number, or is out of its range, is repaired by the next script that reads
it, never passed on.

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
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs
import coredis
from coredis.exceptions import NoScriptError

from ._budgets import MAX_TOKENS
from ._ratelimits import server_delay

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._budgets import AdaptiveLimit, Budget
    from ._ratelimits import RateLimitInfo

    Client: TypeAlias = coredis.Redis[str] | coredis.RedisCluster[str]
    """A client of one Redis server, or of a Redis Cluster."""

# Members of the queue: a 16-digit arrival, a colon, the lease id.
MEMBER_PREFIX: Final = 17


_PRELUDE = """
local leases, queue, qexp, conf, nodes, nwait, grantno, qcost, charge, unans, inuse =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
  KEYS[9], KEYS[10], KEYS[11]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers stored as text keep every bit of a double; whole numbers are
-- written out in digits (Lua's own tostring keeps 14 digits and writes
-- larger numbers with an exponent, which no integer parser takes).
local function num(x) return string.format('%.17g', x) end
local function whole(x) return string.format('%d', x) end
-- The most tokens one estimate or usage report counts for: exact in a
-- double, and more than any budget holds.
local MAX_TOKENS = @MAX_TOKENS@
-- A stored number, or ``default`` when it is missing or not a finite
-- number: a damaged value is repaired here, never passed on.
local function stored(x, default)
  local v = tonumber(x)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return default end
  return v
end
-- A count of tokens as a process sends it: a whole number from 0 to MAX_TOKENS.
local function tokens_of(x)
  return math.floor(math.max(0, math.min(MAX_TOKENS, stored(x, 0))))
end
-- Everything a lease leaves behind, once it is given back or expired.
local function forget_lease(id)
  redis.call('HDEL', grantno, id)
  redis.call('HDEL', charge, id)
  redis.call('ZREM', unans, id)
  redis.call('SREM', inuse, id)
end
-- The answer of lease id started: the provider has counted it, and every
-- lease granted before it (see ``seen`` above). Whether it is the newest
-- answer (granted after every lease whose answer had started when figures
-- were last learned from: ``seen_l``), whose figures may raise a level:
-- ``newest``, as ``Throttle`` keeps it.
local newest = false
-- The leases whose answer started in this step, in order: all but the last
-- (whose figures come with it) may have reached the server after it.
local since = {}
local function see(id, answer)
  local number = redis.call('ZSCORE', unans, id)
  if not number then return end
  redis.call('ZREM', unans, id)
  since[#since + 1] = id
  number = tonumber(number)
  newest = answer and number > tonumber(redis.call('HGET', conf, 'seen_l') or '-1')
  if number > tonumber(redis.call('HGET', conf, 'seen') or '-1') then
    redis.call('HSET', conf, 'seen', number)
  end
end
local function prune()
  local pruned = 0
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #gone > 0 then
    for _, id in ipairs(gone) do forget_lease(id) end
    pruned = pruned + redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  end
  gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now)
  if #gone > 0 then
    for _, m in ipairs(gone) do
      redis.call('ZREM', queue, m)
      redis.call('HDEL', qcost, m)
    end
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
  local u = stored(redis.call('HGET', conf, 'pause_until'), 0)
  if u > now then return u - now end
  if u > 0 then redis.call('HDEL', conf, 'pause_until') end
  return 0
end
-- A bucket's level and own count stay within [-capacity, capacity] (as
-- Bucket.level).
local function settle(b)
  if b then
    b.lvl = math.max(-b.cap, math.min(b.cap, b.lvl))
    b.own = math.max(-b.cap, math.min(b.cap, b.own))
  end
end
-- ``v`` less a charge of ``amount``: down to 0 at most (one request's
-- charge is at most the capacity, so no estimate or usage report makes a
-- budget wait longer than one full refill); a negative one gives back, up
-- to the capacity. As budgets' ``charged``.
local function charged(v, amount, cap)
  if amount > 0 then return math.max(math.min(v, 0), v - amount) end
  return math.min(cap, v - amount)
end
-- Charge a bucket's level and its own count, as Bucket.take.
local function take(b, amount)
  b.lvl = charged(b.lvl, amount, b.cap)
  b.own = charged(b.own, amount, b.cap)
end
-- A budget's bucket from its stored fields (capacity, refill per ms, level,
-- server time of the level, configured or learned, and a configured
-- budget's own count, which figures never move), refilled up to now;
-- ``nil`` if its capacity is not a usable number. A stored value out of
-- range is repaired: a rate that is not positive becomes the capacity a
-- minute, a level (or own count) outside [-capacity, capacity] is brought
-- back within, a time ahead of now becomes now.
local function load_bucket(cap, rate, lvl, at, cfg, own)
  local b = {cap = stored(cap, 0), rate = stored(rate, 0), lvl = stored(lvl, 0),
    at = stored(at, now), cfg = cfg == '1'}
  if b.cap <= 0 then return nil end
  if b.rate <= 0 then b.rate = b.cap / 60000 end
  b.own = stored(own, b.lvl)
  settle(b)
  if b.at > now then b.at = now end
  if now > b.at then
    if b.lvl < b.cap then b.lvl = math.min(b.cap, b.lvl + b.rate * (now - b.at)) end
    if b.own < b.cap then b.own = math.min(b.cap, b.own + b.rate * (now - b.at)) end
    b.at = now
  end
  return b
end
-- Bookkeeping expires once idle: the keys of leases, entries and
-- processes (and of what each of them left) at the latest expiry of a live
-- process, which every lease and entry of that process shares, or at
-- ``floor`` if that is later. ``conf`` persists while it holds a limit or
-- a configured budget (``kept``), else it goes with the rest, or at the
-- end of its pause.
local function expire_idle(floor, kept, pause_until)
  local last = redis.call('ZREVRANGE', nodes, 0, 0, 'WITHSCORES')[2]
  local at = math.max(floor, stored(last, 0))
  local when = whole(at)
  for _, k in ipairs({leases, queue, qexp, nodes, nwait, grantno, qcost, charge,
      unans, inuse}) do
    redis.call('PEXPIREAT', k, when)
  end
  if kept == nil then
    local c = redis.call('HMGET', conf, 'limit', 'r_cfg', 't_cfg', 'pause_until')
    kept = c[1] ~= false or c[2] == '1' or c[3] == '1'
    pause_until = c[4]
  end
  if not kept then
    redis.call('PEXPIREAT', conf, whole(math.max(at, stored(pause_until, 0))))
  end
end
-- The stored limit, or false if there is none or it is damaged (not 'none'
-- nor a positive count): then it is dropped, for the next limit sent to
-- replace it.
local function stored_limit(limit)
  if limit and limit ~= 'none' and not string.match(limit, '^[1-9]%d*$') then
    redis.call('HDEL', conf, 'limit')
    return false
  end
  return limit
end
-- A limit as a process sends it: 'none', 'N', or 'N,minimum,maximum,backoff'
-- for an adaptive limit starting at N. Stores it (``conf`` then persists);
-- returns the limit.
local function store_limit(spec)
  redis.call('PERSIST', conf)
  local value, low, high, backoff = string.match(spec, '^(%d+),(%d+),(%d+),(.+)$')
  if value then
    redis.call('HSET', conf, 'limit', value, 'a_min', low, 'a_max', high,
      'a_backoff', backoff, 'a_val', value, 'a_slow', 1)
    return value
  end
  redis.call('HSET', conf, 'limit', spec)
  redis.call('HDEL', conf, 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow')
  return spec
end
""".replace("@MAX_TOKENS@", str(MAX_TOKENS))

# ARGV: node, ttl (ms), this node's waiters, limit to store if none is
# (empty: none; as ``store_limit`` takes it), wake channel, the rate-limit
# figures to learn from (empty: none; else six comma-separated fields, each
# possibly empty: request limit, remaining, reset in seconds, then the
# same for tokens), then eight counted lists: lease ids given back without
# success; (lease id, tokens) pairs of usage reports; lease ids to release; members to withdraw; (member, start,
# tokens) triples to enqueue or renew; lease ids to renew; the members
# that ask for a grant (those enqueued ask too); lease ids whose answer
# started. Every server call
# counts on the grant's path: the step reads ``conf`` once, writes the
# budgets back only when there are some, and publishes only when another
# process waits.
_STEP = (
    _PRELUDE
    + """
local node, ttl, mywait, seed, channel, observed =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local i = 7
local changed = prune()
local c = redis.call('HMGET', conf, 'limit', 'pause_until', 'streak',
  'granted_at_report', 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow',
  'r_cap', 'r_rate', 'r_lvl', 'r_at', 'r_cfg',
  't_cap', 't_rate', 't_lvl', 't_at', 't_cfg', 'learned', 'r_own', 't_own')
local limit = stored_limit(c[1])
local pause_until = stored(c[2], 0)
local streak = stored(c[3], 0)
local at_report = stored(c[4], 0)
if not limit and seed ~= '' then
  limit = store_limit(seed)
  local a = redis.call('HMGET', conf, 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow')
  for j = 1, 5 do c[4 + j] = a[j] end
end
-- The adaptive limit, if the stored limit is one.
local adaptive = nil
if limit and c[5] then
  adaptive = {low = tonumber(c[5]), high = tonumber(c[6]),
    backoff = tonumber(c[7]), value = tonumber(c[8]), slow = c[9] == '1',
    moved = false}
end
-- The budgets: capacity, refill per ms, level, time of the level, and
-- whether it was configured (else learned); refilled up to now.
local function bucket(o)
  if not c[o] then return nil end
  return load_bucket(c[o], c[o + 1], c[o + 2], c[o + 3], c[o + 4], c[21 + (o - 10) / 5])
end
local R, T = bucket(10), bucket(15)
local learned = c[20] == '1'
local budgeted = R ~= nil or T ~= nil
local spoiled = {}
local n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  spoiled[id] = true
  redis.call('SREM', inuse, id)
end
-- Usage reports before the releases: a report and the release after it
-- may come in one step.
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id, tokens = ARGV[i], tokens_of(ARGV[i + 1]); i = i + 2
  if redis.call('ZSCORE', leases, id) then
    local before = stored(redis.call('HGET', charge, id), 0)
    -- Settled (negated): the server's figures counted it; what the server
    -- gives back for it, its next figures will say.
    local settled = before < 0
    if settled then before = -before end
    -- One request's charge is at most the capacity, its usage too.
    if T then tokens = math.min(tokens, T.cap) end
    if T and tokens ~= before then
      local taken = tokens - before
      if settled then
        T.lvl = charged(T.lvl, math.max(0, taken), T.cap)
        T.own = charged(T.own, taken, T.cap)
      else
        take(T, taken)
      end
      if tokens < before then changed = changed + 1 end
    end
    if settled then tokens = -tokens end
    redis.call('HSET', charge, id, num(tokens))
    see(id, false)
  end
end
local function adapt_up()
  local step = 1
  if not adaptive.slow then step = 1 / tonumber(limit) end
  adaptive.value = math.min(adaptive.high, adaptive.value + step)
  adaptive.moved = true
  local new = math.min(adaptive.high, math.max(adaptive.low, math.floor(adaptive.value)))
  if new ~= tonumber(limit) then
    limit = whole(new)
    changed = changed + 1
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  if redis.call('ZREM', leases, id) == 1 then
    changed = changed + 1
    local success = not spoiled[id]
    if streak > 0 then
      local g = tonumber(redis.call('HGET', grantno, id) or '0')
      if success and g > at_report then
        -- A success: the streak ends, and with it the grant numbers.
        redis.call('HSET', conf, 'streak', 0)
        redis.call('DEL', grantno)
        streak = 0
      end
    end
    local counted = redis.call('SREM', inuse, id) == 1
    forget_lease(id)
    if success and counted and adaptive then adapt_up() end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m = ARGV[i]; i = i + 1
  changed = changed + redis.call('ZREM', queue, m)
  redis.call('ZREM', qexp, m)
  redis.call('HDEL', qcost, m)
  -- Granted by a step whose answer was lost: nobody holds it.
  local id = string.sub(m, 18)
  if redis.call('ZREM', leases, id) == 1 then
    changed = changed + 1
    forget_lease(id)
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
  local m, start, tokens = ARGV[i], ARGV[i + 1], tokens_of(ARGV[i + 2]); i = i + 3
  if not held(m) then
    redis.call('ZADD', queue, start, m)
    redis.call('ZADD', qexp, now + ttl, m)
    if tokens > 0 then redis.call('HSET', qcost, m, whole(tokens)) end
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
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  see(ARGV[i], true); i = i + 1
end
-- Learn from the figures of an answer (see the ledger's notes).
-- SLOWEST_REFILL: a learned budget refills whole in an hour at most.
local function learn(b, limit_, remaining, reset, unseen)
  local usable = limit_ and limit_ > 0 and limit_ < 1e15
  if not b then
    if not usable then return nil end
    b = {cap = limit_, rate = limit_ / 60000, lvl = limit_, at = now, cfg = false,
      own = limit_}
  end
  if usable and not b.cfg then
    b.cap = limit_
    b.rate = limit_ / 60000
    if remaining and reset and reset > 0 and remaining < limit_ then
      local slower = (limit_ - remaining) / (reset * 1000)
      if slower < b.rate then b.rate = slower end
    end
    b.rate = math.max(b.rate, b.cap / 3600000)
    b.lvl = math.min(b.lvl, b.cap)
  end
  if remaining and remaining < 1e15 then
    -- The newest answer's figures set the level, up to the capacity (a
    -- configured budget: up to its own count); others only lower it.
    local ceiling = b.lvl
    if newest then
      ceiling = b.cap
      if b.cfg then ceiling = b.own end
    end
    b.lvl = math.min(ceiling, remaining - unseen)
    learned = true
  elseif usable then
    learned = true
  end
  return b
end
if observed ~= '' then
  -- Six fields by position: an empty one is nil, and #f cannot count
  -- past a nil, so the fields are numbered here.
  local f, k = {}, 0
  for part in string.gmatch(observed .. ',', '([^,]*),') do
    k = k + 1
    f[k] = tonumber(part)
  end
  local seen = redis.call('HGET', conf, 'seen')
  if seen then redis.call('HSET', conf, 'seen_l', seen) end
  local ids = redis.call('ZRANGEBYSCORE', unans, seen or '-inf', '+inf')
  for k = 1, #since - 1 do ids[#ids + 1] = since[k] end
  if f[1] or f[2] then R = learn(R, f[1], f[2], f[3], #ids) end
  if f[4] or f[5] then
    local tokens = 0
    for _, id in ipairs(ids) do
      tokens = tokens + stored(redis.call('HGET', charge, id), 0)
    end
    T = learn(T, f[4], f[5], f[6], tokens)
    if T and newest then
      -- The charges of the leases answered so far are in these figures.
      local held = redis.call('HGETALL', charge)
      for k = 1, #held, 2 do
        local c = tonumber(held[k + 1])
        if c > 0 and not redis.call('ZSCORE', unans, held[k]) then
          redis.call('HSET', charge, held[k], -c)
        end
      end
    end
  end
  settle(R)
  settle(T)
  budgeted = R ~= nil or T ~= nil
end
redis.call('ZADD', nodes, now + ttl, node)
local pause = 0
if pause_until > now then
  pause = pause_until - now
elseif pause_until > 0 then
  redis.call('HDEL', conf, 'pause_until')
end
local in_flight = redis.call('ZCARD', leases)
-- What the budgets lack for a cost, beside what the entries of other
-- processes ahead of it keep (reserved): 0 when it fits.
local reserved_r, reserved_t = 0, 0
local ready_in = -1
local function fits(cost)
  local wait = 0
  if R then
    local missing = 1 - (R.lvl - reserved_r)
    if missing > 1e-9 then wait = math.max(wait, missing / R.rate) end
  end
  if T and cost > 0 then
    local amount = math.min(cost, T.cap)
    local missing = amount - (T.lvl - reserved_t)
    if missing > 1e-9 * math.max(1, amount) then wait = math.max(wait, missing / T.rate) end
  end
  if wait > 0 then
    ready_in = math.ceil(math.min(wait, 1e15))
    return false
  end
  return true
end
local function grant(m, cost)
  local id = string.sub(m, 18)
  redis.call('ZREM', queue, m)
  redis.call('ZREM', qexp, m)
  redis.call('ZADD', leases, now + ttl, id)
  if streak > 0 then
    redis.call('HSET', grantno, id, redis.call('HINCRBY', conf, 'granted', 1))
  end
  if adaptive and 2 * (in_flight + 1) >= tonumber(limit) then
    redis.call('SADD', inuse, id)
  end
  -- Its estimate goes with its entry (read only when budgeted, but kept
  -- for a budget that may come while it waits).
  if cost > 0 or not budgeted then redis.call('HDEL', qcost, m) end
  if budgeted then
    if R then take(R, 1) end
    if cost > 0 then
      -- One request's charge is at most the capacity.
      if T then cost = math.min(cost, T.cap) end
      redis.call('HSET', charge, id, num(cost))
      if T then take(T, cost) end
    end
    redis.call('ZADD', unans, now, id)
  end
  granted[#granted + 1] = m
  in_flight = in_flight + 1
end
-- The first entries of the queue, oldest first, as far as the budgets go:
-- nobody passes an entry the budgets cannot hold yet.
local function grant_in_order(window)
  for _, m in ipairs(redis.call('ZRANGE', queue, 0, window - 1)) do
    local cost = 0
    if budgeted then
      cost = tokens_of(redis.call('HGET', qcost, m))
      if not fits(cost) then break end
    end
    if asking[m] then
      grant(m, cost)
    elseif budgeted then
      reserved_r = reserved_r + 1
      if T then reserved_t = reserved_t + math.min(cost, T.cap) end
    end
  end
end
if not limit or limit == 'none' then
  -- Unlimited: pauses do not apply, as in the local policy.
  if budgeted then
    grant_in_order(0)
  else
    for m, _ in pairs(asking) do
      if redis.call('ZSCORE', queue, m) then grant(m, 0) end
    end
    table.sort(granted)
  end
elseif pause == 0 then
  local free = tonumber(limit) - in_flight
  if free > 0 then grant_in_order(free) end
end
if adaptive and adaptive.moved then
  redis.call('HSET', conf, 'limit', limit, 'a_val', num(adaptive.value))
end
local budget = ''
if budgeted then
  local fields = {}
  local shown = {}
  for _, pair in ipairs({{'r', R}, {'t', T}}) do
    local b = pair[2]
    if b then
      fields[#fields + 1] = pair[1] .. '_cap'; fields[#fields + 1] = num(b.cap)
      fields[#fields + 1] = pair[1] .. '_rate'; fields[#fields + 1] = num(b.rate)
      fields[#fields + 1] = pair[1] .. '_lvl'; fields[#fields + 1] = num(b.lvl)
      fields[#fields + 1] = pair[1] .. '_own'; fields[#fields + 1] = num(b.own)
      fields[#fields + 1] = pair[1] .. '_at'; fields[#fields + 1] = now
      fields[#fields + 1] = pair[1] .. '_cfg'; fields[#fields + 1] = b.cfg and 1 or 0
      shown[#shown + 1] = num(b.rate * 60000) .. ',' .. num(b.lvl) .. ',' .. num(b.cap)
    else
      shown[#shown + 1] = ',,'
    end
  end
  if learned then fields[#fields + 1] = 'learned'; fields[#fields + 1] = 1 end
  redis.call('HSET', conf, unpack(fields))
  budget = shown[1] .. ',' .. shown[2] .. ',' .. (learned and 1 or 0) .. ',' .. whole(ready_in)
end
local spec = ''
if adaptive then
  spec = adaptive.low .. ',' .. adaptive.high .. ',' .. num(adaptive.backoff)
end
-- This process's waiters, less those this step granted (every grant of a
-- step goes to the process that sent it): the fleet's figure is exact
-- after the step, not one step late.
mywait = math.max(0, mywait - #granted)
redis.call('HSET', nwait, node, mywait)
local waiting = 0
for _, w in ipairs(redis.call('HVALS', nwait)) do waiting = waiting + stored(w, 0) end
-- Signed, so that the process that caused it need not wake for it, and
-- only when another process waits: nobody else has anything to do.
if changed > 0 and waiting > mywait then redis.call('PUBLISH', channel, node) end
expire_idle(now, (not not limit) or (R ~= nil and R.cfg) or (T ~= nil and T.cfg),
  pause_until)
return {granted, limit or '', in_flight, redis.call('ZCARD', queue), waiting, pause,
  now, budget, spec}
"""
)

# ARGV: the limit to store (as ``store_limit`` takes it), whether to
# overwrite one already stored (``1``) or only fill a gap (``0``), channel.
# Returns the stored limit and, for an adaptive one, its bounds.
_SET_LIMIT = (
    _PRELUDE
    + """
if ARGV[2] == '1' then
  store_limit(ARGV[1])
  redis.call('PUBLISH', ARGV[3], 'wake')
elseif not stored_limit(redis.call('HGET', conf, 'limit')) then
  store_limit(ARGV[1])
end
local c = redis.call('HMGET', conf, 'limit', 'a_min', 'a_max', 'a_backoff')
if c[2] then return {c[1], c[2] .. ',' .. c[3] .. ',' .. c[4]} end
return {c[1] or '', ''}
"""
)

# ARGV: requests per minute, tokens per minute (each empty: none
# configured), channel. A configured budget replaces the stored one of its
# kind, its level kept (at most the new capacity); none configured turns a
# configured budget of that kind into a learned one (which learning refills
# from the next figures), and leaves a learned one alone.
_SET_BUDGET = (
    _PRELUDE
    + """
for j, k in ipairs({'r', 't'}) do
  local per_minute = tonumber(ARGV[j])
  local c = redis.call('HMGET', conf, k .. '_cap', k .. '_rate', k .. '_lvl',
    k .. '_at', k .. '_cfg')
  if per_minute then
    local lvl = per_minute
    local b = c[1] and load_bucket(c[1], c[2], c[3], c[4], c[5])
    if b then lvl = math.max(-per_minute, math.min(b.lvl, per_minute)) end
    redis.call('HSET', conf, k .. '_cap', num(per_minute), k .. '_rate',
      num(per_minute / 60000), k .. '_lvl', num(lvl), k .. '_at', now, k .. '_cfg', 1,
      k .. '_own', num(lvl))
  elseif c[5] == '1' then
    redis.call('HDEL', conf, k .. '_cap', k .. '_rate', k .. '_lvl', k .. '_at',
      k .. '_cfg', k .. '_own')
  end
end
redis.call('PERSIST', conf)
expire_idle(now)
redis.call('PUBLISH', ARGV[3], 'wake')
return 0
"""
)

# ARGV: the server's delay in ms (empty: none), the default pause, the
# longest pause (ms). The backoff is the local policy's, kept fleet-wide,
# and so is the adaptive limit's decrease: once per round of reports.
_PAUSE = (
    _PRELUDE
    + """
local delay, default, longest = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local streak = stored(redis.call('HGET', conf, 'streak'), 0)
local granted = redis.call('HGET', conf, 'granted') or '0'
local step = tonumber(redis.call('HGET', conf, 'step') or default)
if streak == 0 or granted ~= redis.call('HGET', conf, 'granted_at_report') then
  if streak > 0 then step = math.min(2 * step, longest) else step = default end
  redis.call('HSET', conf, 'streak', streak + 1, 'step', step,
    'granted_at_report', granted)
  local a = redis.call('HMGET', conf, 'limit', 'a_min', 'a_max', 'a_backoff')
  if a[2] then
    local value = math.max(tonumber(a[2]), tonumber(a[1]) * tonumber(a[4]))
    local new = math.min(tonumber(a[3]), math.max(tonumber(a[2]), math.floor(value)))
    redis.call('HSET', conf, 'limit', whole(new), 'a_val', num(value), 'a_slow', 0)
  end
end
-- The slots held now are not successes when they end.
redis.call('DEL', inuse)
local seconds = step
if delay ~= '' then seconds = math.min(tonumber(delay), longest) end
local current = stored(redis.call('HGET', conf, 'pause_until'), 0)
if now + seconds > current then
  redis.call('HSET', conf, 'pause_until', whole(now + seconds))
end
expire_idle(now)
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
expire_idle(now)
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
_SET_BUDGET_SCRIPT: Final = _Script(_SET_BUDGET)

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
            "qcost",
            "charge",
            "unans",
            "inuse",
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
    budget: LedgerBudget | None = None
    adaptive: tuple[int, int, float] | None = None


@final
@attrs.frozen
class LedgerBudget:
    """A provider's fleet-wide budgets after one step.

    Attributes:
        requests_per_minute: The request budget's rate, or ``None``.
        requests_available: Requests its bucket holds, or ``None``.
        requests_capacity: The most its bucket holds, or ``None``.
        tokens_per_minute: The token budget's rate, or ``None``.
        tokens_available: Tokens its bucket holds, or ``None``.
        tokens_capacity: The most its bucket holds, or ``None``.
        learned: Whether figures of answers were learned.
        ready_in: Seconds until the head of the queue fits the budgets,
            if they hold it back (else ``None``).
    """

    requests_per_minute: float | None
    requests_available: float | None
    requests_capacity: float | None
    tokens_per_minute: float | None
    tokens_available: float | None
    tokens_capacity: float | None
    learned: bool
    ready_in: float | None


def _float(text: str) -> float | None:
    return None if text == "" else float(text)


def _budget_of(text: str) -> LedgerBudget | None:
    if not text:
        return None
    r_pm, r_lvl, r_cap, t_pm, t_lvl, t_cap, learned, ready_in = text.split(",")
    return LedgerBudget(
        requests_per_minute=_float(r_pm),
        requests_available=_float(r_lvl),
        requests_capacity=_float(r_cap),
        tokens_per_minute=_float(t_pm),
        tokens_available=_float(t_lvl),
        tokens_capacity=_float(t_cap),
        learned=learned == "1",
        ready_in=None if int(ready_in) < 0 else int(ready_in) / 1000,
    )


def _bounds_of(text: str) -> tuple[int, int, float] | None:
    if not text:
        return None
    low, high, backoff = text.split(",")
    return int(low), int(high), float(backoff)


def limit_spec(limit: int | AdaptiveLimit | None) -> str:
    """A limit as the scripts take it: ``none``, ``N``, or ``N,min,max,backoff``."""
    if limit is None:
        return "none"
    if isinstance(limit, int):
        return str(limit)
    return f"{limit.initial},{limit.minimum},{limit.maximum},{limit.backoff!r}"


def _figures(info: RateLimitInfo | None) -> str:
    """The figures of ``info`` that budgets learn from, as the step takes them."""
    if info is None:
        return ""
    parts: list[str] = []
    for quota in (info.requests, info.tokens):
        if quota is None:
            parts.extend(("", "", ""))
        else:
            parts.extend(
                "" if value is None else repr(value)
                for value in (quota.limit, quota.remaining, quota.reset)
            )
    return ",".join(parts)


def _tokens(tokens: int) -> int:
    """A count of tokens as the scripts take it: from 0 to ``MAX_TOKENS``."""
    return max(0, min(MAX_TOKENS, tokens))


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

    def __init__(self, client: Client, namespace: str, lease: float) -> None:
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
        client = self._client
        if isinstance(client, coredis.RedisCluster):
            # A cluster's pool lends a connection per node: coredis routes
            # the call to the node of the keys' slot.
            try:
                return await client.evalsha(script.sha, keys, args)
            except NoScriptError:
                await client.script_load(script.text)
                return await client.evalsha(script.sha, keys, args)
        connection = self._connection
        if connection is None or not connection.usable:
            pool = client.connection_pool
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
        seed: int | AdaptiveLimit | None = None,
        observed: RateLimitInfo | None = None,
        spoil: Sequence[str] = (),
        usage: Sequence[tuple[str, int]] = (),
        release: Sequence[str] = (),
        withdraw: Sequence[str] = (),
        enqueue: Sequence[tuple[str, float]] = (),
        costs: Mapping[str, int] | None = None,
        renew_leases: Sequence[str] = (),
        ask: Sequence[str] = (),
        answered: Sequence[str] = (),
    ) -> StepResult:
        """Apply one round of a process's changes, in order, atomically.

        Stores ``seed`` as the limit if none is stored; takes ``spoil``
        (lease ids given back without success: no adaptive increase, no end
        of a backoff streak) and ``usage`` (lease id and the tokens its
        request used: its charge is corrected); releases ``release`` (lease
        ids), withdraws ``withdraw`` (members, and their leases if they
        have any), enqueues or renews ``enqueue`` (member and wall-clock
        start; ``costs`` gives a member's estimated tokens), renews
        ``renew_leases`` (adding them back if they are gone), marks
        ``answered`` leases as counted by the provider, learns from
        ``observed``, then grants what it can of ``ask`` and of ``enqueue``.
        Sent twice, the same changes leave the same state.
        """
        keys, channel = self.names(provider)
        args: list[str | int | float] = [
            node,
            round(self.lease * 1000),
            waiting,
            "" if seed is None else limit_spec(seed),
            channel,
            _figures(observed),
            len(spoil),
            *spoil,
            len(usage),
        ]
        for lease_id, tokens in usage:
            args.extend((lease_id, _tokens(tokens)))
        args.append(len(release))
        args.extend(release)
        args.append(len(withdraw))
        args.extend(withdraw)
        args.append(len(enqueue))
        tokens_of = {} if costs is None else costs
        for member, start in enqueue:
            args.extend((member, repr(start), _tokens(tokens_of.get(member, 0))))
        args.append(len(renew_leases))
        args.extend(renew_leases)
        args.append(len(ask))
        args.extend(ask)
        args.append(len(answered))
        args.extend(answered)
        # A Lua script's answer is untyped; this one has a fixed shape.
        reply: Any = await self._run(_STEP_SCRIPT, keys, *args)
        granted, limit, in_flight, queued, waiting_all, pause, now, budget, spec = reply
        return StepResult(
            granted=list(granted),
            limit=_limit_of(limit),
            in_flight=int(in_flight),
            queued=int(queued),
            waiting=int(waiting_all),
            paused_for=int(pause) / 1000,
            server_time=int(now) / 1000,
            budget=_budget_of(budget),
            adaptive=_bounds_of(spec),
        )

    async def set_limit(
        self,
        provider: str,
        limit: int | AdaptiveLimit | None,
        *,
        overwrite: bool = True,
    ) -> int | None:
        """Store ``limit`` (``None``: unlimited); returns the stored limit.

        An ``AdaptiveLimit`` is stored at its ``initial`` value, with its
        bounds. With ``overwrite=False`` a limit already stored wins.
        """
        keys, channel = self.names(provider)
        stored = await self._run(
            _SET_LIMIT_SCRIPT,
            keys,
            limit_spec(limit),
            "1" if overwrite else "0",
            channel,
        )
        return _limit_of(stored[0])

    async def set_budget(self, provider: str, budget: Budget) -> None:
        """Store the fleet's configured budgets of ``provider`` (see ``_SET_BUDGET``)."""
        keys, channel = self.names(provider)
        await self._run(
            _SET_BUDGET_SCRIPT,
            keys,
            ""
            if budget.requests_per_minute is None
            else repr(float(budget.requests_per_minute)),
            ""
            if budget.tokens_per_minute is None
            else repr(float(budget.tokens_per_minute)),
            channel,
        )

    async def pause(
        self,
        provider: str,
        retry_after: float | None,
        *,
        default_pause: float,
        max_pause: float,
    ) -> float:
        """Pause the provider fleet-wide; returns the seconds left of the pause.

        A ``retry_after`` that is not positive names no delay
        (``server_delay``): the fleet backs off, as the local policy does.
        """
        delay = server_delay(retry_after)
        left = await self._run(
            _PAUSE_SCRIPT,
            self.names(provider)[0],
            # At least a millisecond: a positive delay never rounds to none.
            "" if delay is None else max(1, round(delay * 1000)),
            round(default_pause * 1000),
            round(max_pause * 1000),
        )
        return int(str(left)) / 1000

    async def resume(self, provider: str) -> None:
        """End the provider's pause and its backoff streak, fleet-wide."""
        keys, channel = self.names(provider)
        await self._run(_RESUME_SCRIPT, keys, channel)
