-- The prelude of every ledger script (see trio_dispatch/_redis/_scripts.py, which
-- composes it, and trio_dispatch/_redis/SCHEMA.md, which describes the keys).
-- The clock (clock.lua: the server's TIME, in milliseconds) is put in place
-- of the marker below when the scripts are loaded.
local leases, queue, qexp, conf, nodes, nwait, grantno, qcost, charge, unans, inuse =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
  KEYS[9], KEYS[10], KEYS[11]
-- Tenants and models (see SCHEMA.md): the configured tenants, the
-- tenants' counters, the backlogged tenants, the tenant and model of the
-- queued members and of the leases, the models with a budget.
local tconf, tstate, tback, qmeta, lmeta, models =
  KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17]
-- The keys built here, under the same hash tag (so in the same slot): a
-- named tenant's queue (``q:<tenant>``; the tenant of no name queues in
-- ``queue``) and a model's budgets, charges and unanswered leases
-- (``m:<model>``, ``mc:<model>``, ``mu:<model>``).
local prefix = string.sub(leases, 1, #leases - 6)
-- The provider's own ``conf`` and leases, whatever member a script changes
-- (``as_member``): a group's fields (tenants counted) live there.
local home_conf, home_leases = conf, leases
-- Where a member's models' budgets live: the provider's prefix, or a
-- group's member's (``as_member``).
local mprefix = prefix
-- Once tenants and models are counted: how many entries and leases of
-- each model there are (the leases from before not counted: their model is
-- not known), so that a model's learned budget knows when it is idle.
local busy = prefix .. 'mb'
local function queue_of(tenant)
  if tenant == '' then return queue end
  return prefix .. 'q:' .. tenant
end
-- The key prefix of a group's member (see SCHEMA.md, Members), under the
-- group's hash tag.
local function member_prefix(name)
  return prefix .. '@' .. name .. ':'
end
-- A group's member's keys in place of the provider's, for the scripts
-- that change one member (``name`` empty or absent: the provider itself).
local function as_member(name)
  if name == nil or name == '' then return end
  local p = member_prefix(name)
  leases, conf, grantno, charge, unans, inuse, mprefix =
    p .. 'leases', p .. 'conf', p .. 'grantno', p .. 'charge', p .. 'unans', p .. 'inuse', p
end
--@CLOCK@
-- Numbers stored as text keep every bit of a double; whole numbers are
-- written out in digits (Lua's own tostring keeps 14 digits and writes
-- larger numbers with an exponent, which no integer parser takes).
local function num(x) return string.format('%.17g', x) end
local function whole(x) return string.format('%d', x) end
-- The most tokens one estimate or usage report counts for: exact in a
-- double, and more than any budget holds.
local MAX_TOKENS = @MAX_TOKENS@
-- Milliseconds a learned model budget outlives its model's last request,
-- at least (FORGET_AFTER, see _budgets).
local FORGET_AFTER = @FORGET_AFTER@
-- A stored number, or ``default`` when it is missing or not a finite
-- number: a damaged value is repaired here, never passed on.
local function stored(x, default)
  local v = tonumber(x)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return default end
  return v
end
-- A group's entries' lanes, by queue member (see SCHEMA.md, Members and
-- groups): each the member it prefers (empty: none), until when it waits
-- for that member alone (server ms; 0: it does not), its lane (a member's
-- or a pool's name; empty: any member) and the members it avoids, each
-- written as its length, a colon and the text, so that any text is a name.
local qlane = prefix .. 'qlane'
local function read_lane(text)
  local parts, pos = {}, 1
  while pos <= #text do
    local colon = string.find(text, ':', pos, true)
    if not colon then break end
    local len = tonumber(string.sub(text, pos, colon - 1)) or 0
    parts[#parts + 1] = string.sub(text, colon + 1, colon + len)
    pos = colon + len + 1
  end
  return {prefer = parts[1] or '', till = stored(parts[2], 0), lane = parts[3] or '',
    avoid = {unpack(parts, 4)}}
end
local function write_lane(r)
  local parts = {r.prefer, r.till > 0 and whole(r.till) or '', r.lane}
  for _, name in ipairs(r.avoid) do parts[#parts + 1] = name end
  for k, part in ipairs(parts) do parts[k] = #part .. ':' .. part end
  return table.concat(parts)
end
-- The entries waiting for member ``name`` alone stop waiting (it was
-- paused or taken out of service, as ``SlotPolicy`` rehomes them): they
-- wait in their lane from now on, ``name`` still tried first.
local function rehome(name)
  local rows = redis.call('HGETALL', qlane)
  for k = 1, #rows, 2 do
    local r = read_lane(rows[k + 1])
    if r.prefer == name and r.till > now then
      r.till = 0
      redis.call('HSET', qlane, rows[k], write_lane(r))
    end
  end
end
-- A count of tokens as a process sends it: a whole number from 0 to MAX_TOKENS.
local function tokens_of(x)
  return math.floor(math.max(0, math.min(MAX_TOKENS, stored(x, 0))))
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
local function expire_idle(floor, kept, pause_until, present)
  local last = redis.call('ZREVRANGE', nodes, 0, 0, 'WITHSCORES')[2]
  local at = math.max(floor, stored(last, 0))
  local when = whole(at)
  -- ``present``: the keys that may exist (a step knows; a key it leaves
  -- out is empty), else all of them.
  for _, k in ipairs(present or {leases, queue, qexp, nodes, nwait, grantno, qcost,
      charge, unans, inuse, tstate, tback, qmeta, lmeta, busy}) do
    redis.call('PEXPIREAT', k, when)
  end
  if kept == nil then
    local c = redis.call('HMGET', conf, 'limit', 'r_cfg', 't_cfg', 'pause_until', 'x_cfg')
    kept = c[1] ~= false or c[2] == '1' or c[3] == '1' or c[5] == '1'
    pause_until = c[4]
  end
  if not kept then
    redis.call('PEXPIREAT', conf, whole(math.max(at, stored(pause_until, 0))))
  end
end
-- Tenants are counted from the first time tenants or model budgets are
-- seen (a tenant configured, a member of a tenant queued, a model's budget
-- configured or its figures learned), as the pure core does: ``xm`` in
-- ``conf``, the server time it began. From then on the tenant of no name
-- ('') has a counter too, its holders counted from then (nothing kept the
-- times of their grants). Returns that time.
local function extend(members)
  local xm = redis.call('HGET', home_conf, 'xm')
  if xm then return tonumber(xm) end
  redis.call('HSET', home_conf, 'xm', now)
  local held = redis.call('ZCARD', home_leases)
  -- A group's: its members' leases.
  for _, name in ipairs(members or {}) do
    held = held + redis.call('ZCARD', member_prefix(name) .. 'leases')
  end
  local waiting = redis.call('ZCARD', queue)
  if held > 0 or waiting > 0 then
    redis.call('HSET', tstate, '', '0,' .. held .. ',' .. now)
  end
  if waiting > 0 then redis.call('SADD', tback, '') end
  -- The queued entries of each model count from now on (their model is in
  -- qmeta); the leases held now do not (nothing kept their model).
  local meta = redis.call('HGETALL', qmeta)
  for k = 2, #meta, 2 do
    local model = string.match(meta[k], '\n(.*)$')
    if model and model ~= '' then redis.call('HINCRBY', busy, model, 1) end
  end
  return now
end
-- A tenant's state as stored: its counter (slot-seconds over its weight)
-- as of ``last`` (server ms), its holders, and ``last``; accruing since by
-- ``held * (now - last) / weight`` and folded in at every grant, release,
-- weight change and raise (as the pure core's ``TenantState``).
local function tenant_state(text)
  local base, held, last = 0, 0, 0
  if text then
    local b, h, l = string.match(text, '^([^,]*),([^,]*),([^,]*)$')
    base, held, last = stored(b, 0), math.max(0, stored(h, 0)), stored(l, 0)
  end
  return base, held, last
end
local function tenant_text(base, held, last)
  return num(base) .. ',' .. whole(held) .. ',' .. whole(last)
end
-- A tenant's settings as stored: weight and cap (empty: none).
local function tenant_settings(text)
  if not text then return 1, nil end
  local w, cap = string.match(text, '^([^,]*),([^,]*)$')
  local weight = stored(w, 1)
  if weight <= 0 then weight = 1 end
  cap = tonumber(cap)
  if cap and cap < 1 then cap = nil end
  return weight, cap
end
-- The stored limit, or false if there is none or it is damaged (not 'none'
-- nor a positive count): then it is dropped from ``h`` (the member's
-- ``conf``; the provider's by default), for the next limit sent to
-- replace it.
local function stored_limit(limit, h)
  if limit and limit ~= 'none' and not string.match(limit, '^[1-9]%d*$') then
    redis.call('HDEL', h or conf, 'limit')
    return false
  end
  return limit
end
-- A limit as a process sends it: 'none', 'N', or
-- 'N,minimum,maximum,backoff,signal' for an adaptive limit starting at N
-- (signal 'latency', or empty for the rate-limit one). Stores it (``conf``
-- then persists); returns the limit.
local function store_limit(spec)
  redis.call('PERSIST', conf)
  local value, low, high, backoff, signal =
    string.match(spec, '^(%d+),(%d+),(%d+),([^,]+),?(.*)$')
  if value then
    -- The pure core's Throttle exists from its first adaptive limit on:
    -- the books of grants are kept from then (see step.lua's scopes).
    redis.call('HSET', conf, 'limit', value, 'a_min', low, 'a_max', high,
      'a_backoff', backoff, 'a_val', value, 'a_slow', 1, 'bk', 1)
    if signal == 'latency' then
      redis.call('HSET', conf, 'a_signal', signal)
    else
      redis.call('HDEL', conf, 'a_signal')
    end
    -- A new limit: no slot held now was granted with it in use.
    redis.call('DEL', inuse)
    return value
  end
  redis.call('DEL', inuse)
  redis.call('HSET', conf, 'limit', spec)
  redis.call('HDEL', conf, 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow', 'a_signal')
  return spec
end
-- Store the fleet's configured budgets of the provider (``model`` empty)
-- or of a model, ``rates`` its requests and tokens per minute (each nil:
-- none configured). A configured budget replaces the stored one of its
-- kind, its level kept (at most the new capacity); none configured turns
-- a configured budget of that kind into a learned one (which learning
-- refills from the next figures), and leaves a learned one alone. With
-- ``fill``, only the kinds configured in ``rates`` and not stored as
-- configured are written, and nothing else if there are none. A model's
-- budgets live in ``m:<model>`` (its charges and unanswered leases in
-- ``mc:<model>`` and ``mu:<model>``), and models are counted from then on
-- (``extend``).
local function store_budget(model, rates, fill, members)
  local h = conf
  if model ~= '' then h = mprefix .. 'm:' .. model end
  local wrote = false
  for j, k in ipairs({'r', 't'}) do
    local per_minute = rates[j]
    local c = redis.call('HMGET', h, k .. '_cap', k .. '_rate', k .. '_lvl',
      k .. '_at', k .. '_cfg')
    if fill and (not per_minute or c[5] == '1') then
      per_minute = nil
    elseif per_minute then
      local lvl = per_minute
      local b = c[1] and load_bucket(c[1], c[2], c[3], c[4], c[5])
      if b then lvl = math.max(-per_minute, math.min(b.lvl, per_minute)) end
      redis.call('HSET', h, k .. '_cap', num(per_minute), k .. '_rate',
        num(per_minute / 60000), k .. '_lvl', num(lvl), k .. '_at', now, k .. '_cfg', 1,
        k .. '_own', num(lvl))
      wrote = true
    elseif c[5] == '1' then
      redis.call('HDEL', h, k .. '_cap', k .. '_rate', k .. '_lvl', k .. '_at',
        k .. '_cfg', k .. '_own')
    end
  end
  if fill and not wrote then return end
  if model ~= '' then extend(members) end
  -- The books of grants are kept from now on, budget or not, as the pure
  -- core's Throttle keeps them once it exists (see step.lua's scopes).
  redis.call('HSET', h, 'bk', 1)
  if model ~= '' then
    -- Configured: never forgotten (a learned model's budgets are, once idle
    -- and full again: see step.lua's scopes).
    redis.call('HSET', h, 'kept', 1)
    redis.call('HDEL', h, 'idle')
    redis.call('SADD', models, model)
    redis.call('PERSIST', h)
  end
  redis.call('PERSIST', conf)
end
-- Store a tenant's settings: its weight (empty: back to the defaults, the
-- tenant is no longer configured) and its cap (empty: none). What the
-- tenant received so far is folded into its counter at the old weight; an
-- unconfigured tenant with nothing held or waiting is forgotten (it starts
-- again from the floor). Tenants are counted from now on if they were not
-- (``extend``; a group's ``members`` hold leases too), but for the
-- defaults where no tenant is counted: they change nothing, as in the pure
-- core (then it returns false).
local function store_tenant(t, weight, cap, members)
  if weight == '' and not redis.call('HGET', conf, 'xm') then return false end
  extend(members)
  local text = redis.call('HGET', tstate, t)
  if text then
    local base, held, last = tenant_state(text)
    local old = tenant_settings(redis.call('HGET', tconf, t))
    if held > 0 and now > last then base = base + held * (now - last) / 1000 / old end
    if now > last then last = now end
    if weight == '' and held == 0 and redis.call('ZCARD', queue_of(t)) == 0 then
      redis.call('HDEL', tstate, t)
    else
      redis.call('HSET', tstate, t, tenant_text(base, held, last))
    end
  end
  if weight == '' then
    redis.call('HDEL', tconf, t)
  else
    redis.call('HSET', tconf, t, weight .. ',' .. cap)
  end
  if redis.call('HLEN', tconf) > 0 then
    redis.call('HSET', conf, 'x_cfg', 1)
    redis.call('PERSIST', conf)
  else
    redis.call('HDEL', conf, 'x_cfg')
  end
  return true
end
