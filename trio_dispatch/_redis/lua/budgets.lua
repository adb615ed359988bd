-- The budgets' rules (Bucket and Throttle of trio_dispatch/_policy/_budgets.py,
-- repeated for the whole fleet), composed between the prelude and step.lua,
-- the one script that charges, learns and grants (see _scripts.py).
-- Budgets, the provider's (``conf``, ``charge``, ``unans``) and each
-- model's (``m:<model>``, ``mc:<model>``, ``mu:<model>``), each a scope:
-- its buckets R and T, whether figures were learned, and the leases whose
-- answer started since figures were last learned from (``since``, with
-- ``newest``: see ``see``). A scope keeps the books of its grants (charges
-- and unanswered leases: ``books``, ``bk`` stored) from the moment the
-- pure core's ``Throttle`` would exist: a budget configured, the first
-- figures (usable or not), or the provider's first adaptive limit.
local FIELDS = {'r_cap', 'r_rate', 'r_lvl', 'r_at', 'r_cfg', 't_cap', 't_rate', 't_lvl',
  't_at', 't_cfg', 'learned', 'r_own', 't_own', 'a_dec', 'since', 'newest', 'bk'}
-- A model's scope reads two fields more: since when its model is idle
-- (absent while in use), and whether a budget was configured for it
-- (``kept``: never forgotten).
local MODEL_FIELDS = {unpack(FIELDS)}
MODEL_FIELDS[#MODEL_FIELDS + 1] = 'idle'
MODEL_FIELDS[#MODEL_FIELDS + 1] = 'kept'
local function new_scope(h, ch, un, f, o)
  local sc = {h = h, charge = ch, unans = un, since = {}, newest = f[o + 16] == '1',
    moved = false, res_r = 0, res_t = 0, learned = f[o + 11] == '1', wait = -1,
    books = f[o + 17] == '1'}
  if f[o + 15] then
    for id in string.gmatch(f[o + 15], '[^\n]+') do sc.since[#sc.since + 1] = id end
  end
  if f[o + 1] then sc.R = load_bucket(f[o + 1], f[o + 2], f[o + 3], f[o + 4], f[o + 5], f[o + 12]) end
  if f[o + 6] then sc.T = load_bucket(f[o + 6], f[o + 7], f[o + 8], f[o + 9], f[o + 10], f[o + 13]) end
  if sc.R or sc.T then sc.books = true end
  return sc
end
-- The answer of lease id started: the provider has counted it, and every
-- lease granted before it (``seen``). Whether it is the newest answer
-- (granted after every lease whose answer had started when figures were
-- last learned from: ``seen_l``), whose figures may raise a level:
-- ``newest``, as ``Throttle`` keeps it. And the leases whose answer
-- started since figures were last learned from, in order: all but the
-- last (whose figures come next) may have reached the server after it.
local function see(sc, id, answer)
  local number = redis.call('ZSCORE', sc.unans, id)
  if not number then return end
  redis.call('ZREM', sc.unans, id)
  sc.since[#sc.since + 1] = id
  sc.moved = true
  number = tonumber(number)
  sc.newest = answer and number > tonumber(redis.call('HGET', sc.h, 'seen_l') or '-1')
  if number > tonumber(redis.call('HGET', sc.h, 'seen') or '-1') then
    redis.call('HSET', sc.h, 'seen', number)
  end
end
local function forget_charge(sc, id)
  redis.call('HDEL', sc.charge, id)
  redis.call('ZREM', sc.unans, id)
  for k = 1, #sc.since do
    if sc.since[k] == id then
      table.remove(sc.since, k)
      sc.moved = true
      break
    end
  end
end
-- A usage report corrects a lease's charge in one scope; whether it gave
-- tokens back (a head held back may fit now).
local function use(sc, id, tokens)
  local T = sc.T
  local raw = redis.call('HGET', sc.charge, id)
  -- Granted before the scope kept books: not in them.
  if not raw then return false end
  -- Settled (a minus sign, '-0' too): the server's figures counted it;
  -- what the server gives back for it, its next figures will say.
  local settled = string.sub(raw, 1, 1) == '-'
  local before = math.abs(stored(raw, 0))
  -- One request's charge is at most the capacity, its usage too.
  if T then tokens = math.min(tokens, T.cap) end
  local gave = T ~= nil and tokens < before
  if T and tokens ~= before then
    local taken = tokens - before
    if settled then
      T.lvl = charged(T.lvl, math.max(0, taken), T.cap)
      T.own = charged(T.own, taken, T.cap)
    else
      take(T, taken)
    end
  end
  redis.call('HSET', sc.charge, id, (settled and '-' or '') .. num(tokens))
  see(sc, id, false)
  return gave
end
-- Learn from the figures of an answer (see SCHEMA.md), in a scope.
-- SLOWEST_REFILL: a learned budget refills whole in an hour at most.
local function learn(sc, b, limit_, remaining, reset, unseen)
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
    if sc.newest then
      ceiling = b.cap
      if b.cfg then ceiling = b.own end
    end
    b.lvl = math.min(ceiling, remaining - unseen)
    sc.learned = true
  elseif usable then
    sc.learned = true
  end
  return b
end
local function observe(sc, observed)
  -- Eight fields by position (figures_arg): for requests, then tokens,
  -- whether there are figures ('1') and the limit, remaining and reset.
  -- An empty one is nil, and #f cannot count past a nil, so the fields are
  -- numbered here.
  local f, k = {}, 0
  for part in string.gmatch(observed .. ',', '([^,]*),') do
    k = k + 1
    f[k] = tonumber(part)
  end
  if not sc.books then
    sc.books = true
    redis.call('HSET', sc.h, 'bk', 1)
  end
  local seen = redis.call('HGET', sc.h, 'seen')
  if seen then redis.call('HSET', sc.h, 'seen_l', seen) end
  local ids = redis.call('ZRANGEBYSCORE', sc.unans, seen or '-inf', '+inf')
  for k = 1, #sc.since - 1 do ids[#ids + 1] = sc.since[k] end
  if f[2] or f[3] then sc.R = learn(sc, sc.R, f[2], f[3], f[4], #ids) end
  -- Token figures, even with no usable field: the charges answered so
  -- far are settled by them all the same, as in Throttle.observe.
  if f[5] then
    local tokens = 0
    for _, id in ipairs(ids) do
      tokens = tokens + stored(redis.call('HGET', sc.charge, id), 0)
    end
    sc.T = learn(sc, sc.T, f[6], f[7], f[8], tokens)
    if sc.T and sc.newest then
      -- The charges of the leases answered so far are in these figures,
      -- whatever they are (0 too): settled.
      local held_ids = redis.call('HKEYS', sc.charge)
      if #held_ids > 0 then
        local charges = redis.call('HMGET', sc.charge, unpack(held_ids))
        local open = redis.call('ZMSCORE', sc.unans, unpack(held_ids))
        for k, id in ipairs(held_ids) do
          local raw = charges[k]
          if not open[k] and not (raw and string.sub(raw, 1, 1) == '-') then
            redis.call('HSET', sc.charge, id, '-' .. num(stored(raw, 0)))
          end
        end
      end
    end
  end
  settle(sc.R)
  settle(sc.T)
  -- Learned from: the next figures start afresh, as Throttle.observe.
  sc.since = {}
  sc.newest = false
  sc.moved = true
end
-- What a scope's budgets lack for a cost, beside what the entries of other
-- processes ahead of it keep (reserved): 0 when it fits, else the
-- milliseconds until it does (kept as the scope's ``wait``).
local function lacks(sc, cost)
  local R, T = sc.R, sc.T
  local wait = 0
  if R then
    local missing = 1 - (R.lvl - sc.res_r)
    if missing > 1e-9 then wait = math.max(wait, missing / R.rate) end
  end
  if T and cost > 0 then
    local amount = math.min(cost, T.cap)
    local missing = amount - (T.lvl - sc.res_t)
    if missing > 1e-9 * math.max(1, amount) then wait = math.max(wait, missing / T.rate) end
  end
  if wait > 0 then
    wait = math.ceil(math.min(wait, 1e15))
    if sc.wait < 0 or wait < sc.wait then sc.wait = wait end
  end
  return wait
end
local function reserve(sc, cost)
  sc.res_r = sc.res_r + 1
  if sc.T then sc.res_t = sc.res_t + math.min(cost, sc.T.cap) end
end
-- A scope's charge for a grant.
local function charge_to(sc, id, cost)
  if sc.R then take(sc.R, 1) end
  -- One request's charge is at most the capacity.
  if sc.T then cost = math.min(cost, sc.T.cap) end
  if sc.T and cost > 0 then take(sc.T, cost) end
  -- A scope's leases are those it charged (0 too): their books.
  redis.call('HSET', sc.charge, id, num(cost))
  redis.call('ZADD', sc.unans, now, id)
end
-- A scope's budgets written back, and as the step answers them:
-- requests per minute, level, capacity, then the same for tokens, whether
-- figures were learned, then whether each is configured ('1').
local function write_scope(sc)
  local fields, shown = {}, {}
  for _, pair in ipairs({{'r', sc.R}, {'t', sc.T}}) do
    local k, b = pair[1], pair[2]
    if b then
      for _, kv in ipairs({{'_cap', num(b.cap)}, {'_rate', num(b.rate)}, {'_lvl', num(b.lvl)},
          {'_own', num(b.own)}, {'_at', now}, {'_cfg', b.cfg and 1 or 0}}) do
        fields[#fields + 1] = k .. kv[1]
        fields[#fields + 1] = kv[2]
      end
      shown[#shown + 1] = num(b.rate * 60000) .. ',' .. num(b.lvl) .. ',' .. num(b.cap)
    else
      shown[#shown + 1] = ',,'
    end
  end
  if sc.learned then fields[#fields + 1] = 'learned'; fields[#fields + 1] = 1 end
  if sc.moved then
    if #sc.since > 0 or sc.newest then
      fields[#fields + 1] = 'since'; fields[#fields + 1] = table.concat(sc.since, '\n')
      fields[#fields + 1] = 'newest'; fields[#fields + 1] = sc.newest and 1 or 0
    else
      redis.call('HDEL', sc.h, 'since', 'newest')
    end
  end
  if #fields > 0 then redis.call('HSET', sc.h, unpack(fields)) end
  return shown[1] .. ',' .. shown[2] .. ',' .. (sc.learned and 1 or 0) .. ','
    .. (sc.R and sc.R.cfg and 1 or 0) .. ',' .. (sc.T and sc.T.cfg and 1 or 0)
end
-- Whether a bucket is full, within the slack of Bucket.need (as is_full);
-- no bucket is.
local function full(b)
  return b == nil or b.cap - b.lvl <= 1e-9 * math.max(1, b.cap)
end
-- A learned model's scope, idle for ``FORGET_AFTER`` and full again, is
-- forgotten (as _budgets.forgets).
local function forgets(sc)
  return sc.idle ~= nil and now - sc.idle >= FORGET_AFTER and full(sc.R) and full(sc.T)
end
-- When Redis forgets a learned model's keys: the instant it may be
-- forgotten, if idle (its buckets full by then); in use, once it has been
-- left alone so long that its buckets would be full whatever they hold (a
-- level refills from minus to plus the capacity in two hours at most:
-- SLOWEST_REFILL) and idle for FORGET_AFTER.
local function forget_at(sc)
  if sc.idle == nil then return now + FORGET_AFTER + 2 * 3600000 end
  local at = sc.idle + FORGET_AFTER
  for _, b in ipairs({sc.R or false, sc.T or false}) do
    if b and b.lvl < b.cap then at = math.max(at, now + (b.cap - b.lvl) / b.rate) end
  end
  return math.ceil(at)
end
