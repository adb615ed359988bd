-- One round of a process's changes, in order, atomically (Ledger.step).
-- ARGV, as StepArgs.pack (trio_dispatch/_scripts.py) lays it out: node,
-- ttl (ms), this node's waiters, the limit to store if none is (empty:
-- none; as store_limit takes it), wake channel, the rate-limit figures to
-- learn from (empty: none; else eight comma-separated fields, each possibly
-- empty: whether requests have figures ('1'), their limit, remaining and
-- reset in seconds, then the same for tokens), then eight counted lists: lease ids given back without success;
-- (lease id, tokens) pairs of usage reports; lease ids to release; members
-- to withdraw; (member, start, tokens) triples to enqueue or renew; lease
-- ids to renew; the members that ask for a grant (those enqueued ask too);
-- lease ids whose answer started. Every server call counts on the grant's
-- path: the step reads conf once, writes the budgets back only when there
-- are some, and publishes only when another process waits.
local node, ttl, mywait, seed, channel, observed =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local i = 7
local c = redis.call('HMGET', conf, 'limit', 'pause_until', 'streak',
  'granted_at_report', 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow',
  'r_cap', 'r_rate', 'r_lvl', 'r_at', 'r_cfg',
  't_cap', 't_rate', 't_lvl', 't_at', 't_cfg', 'learned', 'r_own', 't_own', 'a_dec',
  'since', 'newest')
load_seen(c[24], c[25])
-- What the leases may have left behind (see ``keeps``): a stored adaptive
-- limit, a budget, a streak.
keeps = {grantno = stored(c[3], 0) > 0, budget = c[10] ~= false or c[15] ~= false,
  inuse = c[5] ~= false}
local changed = prune()
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
  if keeps.inuse then redis.call('SREM', inuse, id) end
end
-- Usage reports before the releases: a report and the release after it
-- may come in one step.
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id, tokens = ARGV[i], tokens_of(ARGV[i + 1]); i = i + 2
  if redis.call('ZSCORE', leases, id) then
    local raw = redis.call('HGET', charge, id)
    -- Settled (a minus sign, '-0' too): the server's figures counted it;
    -- what the server gives back for it, its next figures will say.
    local settled = raw and string.sub(raw, 1, 1) == '-'
    local before = math.abs(stored(raw, 0))
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
    if settled then
      redis.call('HSET', charge, id, '-' .. num(tokens))
    else
      redis.call('HSET', charge, id, num(tokens))
    end
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
    local counted = keeps.inuse and redis.call('SREM', inuse, id) == 1
    forget_lease(id, true)
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
-- Which they are, asked for the members sent (enqueued or asking) in one
-- call per thousand: every server call counts on the grant's path.
local lost = {}
do
  local ids, k = {}, i
  for j = 1, tonumber(ARGV[k]) do ids[#ids + 1] = string.sub(ARGV[k + 1 + 3 * (j - 1)], 18) end
  k = k + 1 + 3 * tonumber(ARGV[k])
  k = k + 1 + tonumber(ARGV[k])
  for j = 1, tonumber(ARGV[k]) do ids[#ids + 1] = string.sub(ARGV[k + j], 18) end
  for first = 1, #ids, 1000 do
    local chunk = {unpack(ids, first, math.min(#ids, first + 999))}
    local scores = redis.call('ZMSCORE', leases, unpack(chunk))
    for j, id in ipairs(chunk) do
      if scores[j] then lost[id] = true end
    end
  end
end
local function held(m)
  local id = string.sub(m, 18)
  if lost[id] then
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
  -- Eight fields by position (figures_arg): for requests, then tokens,
  -- whether there are figures ('1') and the limit, remaining and reset.
  -- An empty one is nil, and #f cannot count past a nil, so the fields are
  -- numbered here.
  local f, k = {}, 0
  for part in string.gmatch(observed .. ',', '([^,]*),') do
    k = k + 1
    f[k] = tonumber(part)
  end
  local seen = redis.call('HGET', conf, 'seen')
  if seen then redis.call('HSET', conf, 'seen_l', seen) end
  local ids = redis.call('ZRANGEBYSCORE', unans, seen or '-inf', '+inf')
  for k = 1, #since - 1 do ids[#ids + 1] = since[k] end
  if f[2] or f[3] then R = learn(R, f[2], f[3], f[4], #ids) end
  -- Token figures, even with no usable field: the charges answered so
  -- far are settled by them all the same, as in Throttle.observe.
  if f[5] then
    local tokens = 0
    for _, id in ipairs(ids) do
      tokens = tokens + stored(redis.call('HGET', charge, id), 0)
    end
    T = learn(T, f[6], f[7], f[8], tokens)
    if T and newest then
      -- The charges of the leases answered so far are in these figures,
      -- whatever they are (0 too): settled.
      local held = redis.call('ZRANGE', leases, 0, -1)
      if #held > 0 then
        local charges = redis.call('HMGET', charge, unpack(held))
        local open = redis.call('ZMSCORE', unans, unpack(held))
        for k, id in ipairs(held) do
          local raw = charges[k]
          if not open[k] and not (raw and string.sub(raw, 1, 1) == '-') then
            redis.call('HSET', charge, id, '-' .. num(stored(raw, 0)))
          end
        end
      end
    end
  end
  settle(R)
  settle(T)
  budgeted = R ~= nil or T ~= nil
  -- Learned from: the next figures start afresh, as Throttle.observe.
  since = {}
  newest = false
  seen_moved = true
end
if seen_moved then
  if #since > 0 or newest then
    redis.call('HSET', conf, 'since', table.concat(since, '\n'), 'newest',
      newest and 1 or 0)
  else
    redis.call('HDEL', conf, 'since', 'newest')
  end
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
-- Leases granted by this step (not those a lost answer had granted).
local fresh = 0
-- Whether any queued member has an estimate (asked once, at the first grant).
local costly = nil
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
  if cost > 0 or not budgeted then
    if costly == nil then costly = redis.call('EXISTS', qcost) == 1 end
    if costly then redis.call('HDEL', qcost, m) end
  end
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
  fresh = fresh + 1
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
-- A grant since the adaptive limit's latest decrease: the next report
-- opens a round for it (see pause.lua).
if fresh > 0 and c[23] then redis.call('HDEL', conf, 'a_dec') end
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
-- Only the keys that may hold anything after the step (the others are
-- empty, so absent): every server call counts on the grant's path.
local queued = redis.call('ZCARD', queue)
local present = {nodes, nwait}
if in_flight > 0 then present[#present + 1] = leases end
if queued > 0 then
  present[#present + 1] = queue
  present[#present + 1] = qexp
  present[#present + 1] = qcost
end
if streak > 0 or keeps.grantno then present[#present + 1] = grantno end
if budgeted or keeps.budget then
  present[#present + 1] = charge
  present[#present + 1] = unans
end
if adaptive or keeps.inuse then present[#present + 1] = inuse end
expire_idle(now, (not not limit) or (R ~= nil and R.cfg) or (T ~= nil and T.cfg),
  pause_until, present)
return {granted, limit or '', in_flight, queued, waiting, pause, now, budget, spec}
