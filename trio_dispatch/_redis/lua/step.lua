-- One round of a process's changes, in order, atomically (Ledger.step).
-- ARGV, as Plan.pack (trio_dispatch/_redis/_scripts.py) lays it out: node,
-- ttl (ms), this node's waiters, the namespace's epoch as the process last
-- saw it (empty: none, unchecked), wake channel, whether a step of this
-- node may have been run without its answer reaching it ('1': then the
-- members it sends are looked up among the leases), then the seed: '0',
-- or '1' and the settings to store again (see ``restore``): the limit (as
-- store_limit takes it; empty: none), the provider's requests and tokens
-- per minute (each empty: none), a counted list of (model, requests,
-- tokens), one of (tenant, weight, cap) and a group's one of its members'
-- (name, then its own limit, rates and counted models as above); then a
-- counted list of
-- (model, figures) pairs: the rate-limit figures to learn from, the
-- provider's (model empty) or a model's (each eight comma-separated fields,
-- each possibly empty: whether requests have figures ('1'), their limit,
-- remaining and reset in seconds, then the same for tokens), then a
-- counted list of the verdicts of latency signals (whole numbers, each a
-- change of the limit, in the order the process's signal gave them), then
-- eight counted lists: lease ids given back without success; (lease id, tokens)
-- pairs of usage reports; lease ids to release; members to withdraw;
-- (member, start, tokens, tenant, model) to enqueue or renew (tenant and
-- model empty for none); lease ids to renew; the members that ask for a
-- grant (those enqueued ask too); lease ids whose answer started. Every
-- server call counts on the grant's path: the step reads conf once, writes
-- the budgets back only when there are some, publishes only when another
-- process waits, and touches tenants and models only once one was seen
-- (``xm``); it prunes only once something may have expired (``pa``),
-- refreshes the expiry of only the keys it gave a later member, queues
-- none of the entries it grants at once, and writes this node's waiters
-- only when their number moved.
local node, ttl, mywait, known, channel, recheck =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6] == '1'
local i = 7
local n
local seed = nil
-- A seed's own settings (``Seed._own``): its limit, budgets and models'.
local function read_seed()
  local s = {limit = ARGV[i], rates = {tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])},
    models = {}}
  i = i + 3
  n = tonumber(ARGV[i]); i = i + 1
  for j = 1, n do
    s.models[j] = {ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}; i = i + 3
  end
  return s
end
if ARGV[i] == '1' then
  i = i + 1
  seed = read_seed()
  seed.tenants, seed.members = {}, {}
  n = tonumber(ARGV[i]); i = i + 1
  for j = 1, n do
    seed.tenants[j] = {ARGV[i], ARGV[i + 1], ARGV[i + 2]}; i = i + 3
  end
  n = tonumber(ARGV[i]); i = i + 1
  for j = 1, n do
    local name = ARGV[i]; i = i + 1
    seed.members[j] = read_seed()
    seed.members[j].name = name
  end
else
  i = i + 1
end
local figures = {}
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  figures[j] = {ARGV[i], ARGV[i + 1]}; i = i + 2
end
local verdicts = {}
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  verdicts[j] = tonumber(ARGV[i]); i = i + 1
end
local CONF = {'limit', 'pause_until', 'streak',
  'granted_at_report', 'a_min', 'a_max', 'a_backoff', 'a_val', 'a_slow',
  'r_cap', 'r_rate', 'r_lvl', 'r_at', 'r_cfg',
  't_cap', 't_rate', 't_lvl', 't_at', 't_cfg', 'learned', 'r_own', 't_own', 'a_dec',
  'since', 'newest', 'bk', 'xm', 't_last', 'qm', 'pa', 'qc', 'ep', 'a_signal',
  'h_fail', 'h_out', 'h_half', 'h_probe', 'h_outs', 'af_hit', 'af_move'}
local c = redis.call('HMGET', conf, unpack(CONF))
-- The namespace's epoch (``ep`` in ``conf``): made by the first step with a
-- seed that finds none, so it changes only when Redis lost the namespace
-- (restarted empty, flushed, failed over to a replica that lacked it).
-- A step with a seed, finding an epoch other than the one its process
-- last saw (or none), stores again each setting of the seed the namespace
-- does not hold: only those, so that no change made since, by any
-- process, is undone; and wakes the others, so that each does the same
-- with its own. A step without a seed finding another epoch does nothing:
-- its process sends the same again with a seed.
local epoch = c[32] or ''
if seed and (epoch == '' or epoch ~= known) then
  local lost = epoch == '' or known ~= ''
  if epoch == '' then
    epoch = node .. '@' .. whole(now)
    redis.call('HSET', conf, 'ep', epoch)
  end
  if seed.limit ~= '' and not stored_limit(c[1]) then store_limit(seed.limit) end
  store_budget('', seed.rates, true)
  for _, m in ipairs(seed.models) do store_budget(m[1], {m[2], m[3]}, true) end
  -- A group's members' own, each under its prefix (``as_member``), by
  -- the same rule; then the group's own keys again.
  local names, home = {}, {leases, conf, grantno, charge, unans, inuse, mprefix}
  for _, s in ipairs(seed.members) do names[#names + 1] = s.name end
  for _, s in ipairs(seed.members) do
    as_member(s.name)
    if s.limit ~= '' and not stored_limit(redis.call('HGET', conf, 'limit'), conf) then
      store_limit(s.limit)
    end
    store_budget('', s.rates, true, names)
    for _, m in ipairs(s.models) do store_budget(m[1], {m[2], m[3]}, true, names) end
    leases, conf, grantno, charge, unans, inuse, mprefix = unpack(home)
  end
  for _, t in ipairs(seed.tenants) do
    if redis.call('HEXISTS', tconf, t[1]) == 0 then store_tenant(t[1], t[2], t[3]) end
  end
  if lost then redis.call('PUBLISH', channel, node) end
  c = redis.call('HMGET', conf, unpack(CONF))
elseif known ~= '' and epoch ~= known then
  return {epoch}
end
-- ``pa`` in ``conf``: no lease, entry or process expires before it (a bound
-- at most the earliest of their expiries, moved by the prune that finds
-- the earliest, lowered by any member added to expire sooner), so that a
-- step prunes only once something may have expired. ``qc``: some queued
-- member may have an estimate in ``qcost`` (none once the queue is empty).
local prune_at = stored(c[30], nil)
local prune_moved = false
local qc = c[31] ~= false
-- Whether this step gave a lease, or an entry, an expiry of now + ttl: only
-- then must the keys holding them outlive it (see the end).
local leases_grew, queue_grew = false, false

-- Where the counted lists start: enqueue, renew, ask (read ahead, for the
-- members a lost answer granted and for whether tenants or models appear).
local at_enqueue
do
  local k = i
  k = k + 1 + tonumber(ARGV[k])      -- spoil
  k = k + 1 + 2 * tonumber(ARGV[k])  -- usage
  k = k + 1 + tonumber(ARGV[k])      -- release
  k = k + 1 + tonumber(ARGV[k])      -- withdraw
  at_enqueue = k
end
-- A group's members, in their order, and its pools (read ahead, after the
-- counted lists): none for a provider, its own and only member. Then the
-- lanes of the entries enqueued (each its lane, a member's or a pool's
-- name or empty for any member, then the members it avoids, as
-- ``lane_text`` writes them), the member of each lease the process names
-- in this step, and the member of each of its figures and verdicts; then
-- the failures in a row that take a member out of service, its cooldown
-- (ms), the leases given back whose call failed before its answer, and
-- how long an entry waits for the member it prefers (ms; 0: affinity off).
local NAMES, POOLS, LANES, HOLD, FIGURES_ON, VERDICTS_ON = {}, {}, {}, {}, {}, {}
local THRESHOLD, COOLDOWN, FAILED, AFFINITY = math.huge, 0, {}, 0
do
  local k = at_enqueue
  k = k + 1 + 5 * tonumber(ARGV[k])  -- enqueue
  k = k + 1 + tonumber(ARGV[k])      -- renew
  k = k + 1 + tonumber(ARGV[k])      -- ask
  k = k + 1 + tonumber(ARGV[k])      -- answered
  for j = 1, tonumber(ARGV[k] or '0') do NAMES[j] = ARGV[k + j] end
  if #NAMES > 0 then
    k = k + 1 + #NAMES
    for _ = 1, tonumber(ARGV[k]) do
      local name, count = ARGV[k + 1], tonumber(ARGV[k + 2])
      POOLS[name] = {unpack(ARGV, k + 3, k + 2 + count)}
      k = k + 2 + count
    end
    k = k + 1
    for _ = 1, tonumber(ARGV[k]) do
      LANES[ARGV[k + 1]] = ARGV[k + 2]
      k = k + 2
    end
    k = k + 1
    for _ = 1, tonumber(ARGV[k]) do
      HOLD[ARGV[k + 1]] = ARGV[k + 2]
      k = k + 2
    end
    k = k + 1
    for j = 1, tonumber(ARGV[k]) do FIGURES_ON[j] = ARGV[k + j] end
    k = k + 1 + #FIGURES_ON
    for j = 1, tonumber(ARGV[k]) do VERDICTS_ON[j] = ARGV[k + j] end
    k = k + 1 + #VERDICTS_ON
    THRESHOLD, COOLDOWN = tonumber(ARGV[k]), tonumber(ARGV[k + 1])
    k = k + 2
    local nfailed = tonumber(ARGV[k])
    for j = 1, nfailed do FAILED[ARGV[k + j]] = true end
    AFFINITY = tonumber(ARGV[k + 1 + nfailed])
  end
end
local pooled = #NAMES > 0

-- Tenants: counted once a tenant or a model's figures are seen (see
-- ``extend``). Before, a member with a model keeps it in ``qmeta`` (``qm``
-- in ``conf`` says some may), for when they are.
local xm = tonumber(c[27])
local qm = c[29] ~= false
if not xm then
  local seen_one = false
  for _, f in ipairs(figures) do
    if f[1] ~= '' then seen_one = true end
  end
  for j = 1, tonumber(ARGV[at_enqueue]) do
    local base = at_enqueue + 1 + 5 * (j - 1)
    if ARGV[base + 3] ~= '' then seen_one = true end
    if ARGV[base + 4] ~= '' and not qm then
      qm = true
      redis.call('HSET', conf, 'qm', 1)
    end
  end
  if seen_one then xm = extend(NAMES) end
end
local t_last = stored(c[28], 0)
local t_last_moved = false

-- The members whose slots the step grants (see SCHEMA.md, Members): each
-- keeps its own limit, pause, backoff, adaptive limit, budgets, models'
-- budgets and leases under its own keys, ``<prefix>conf`` and so on, and
-- its own settings as the step reads them (``c``). The provider is the
-- member whose prefix is the provider's: its ``conf`` also holds the
-- fields of the whole provider read above.
local function load_member(p, f)
  local M = {prefix = p, conf = p .. 'conf', leases = p .. 'leases',
    grantno = p .. 'grantno', charge = p .. 'charge', unans = p .. 'unans',
    inuse = p .. 'inuse', c = f, MS = {}, fresh = 0, forgotten = {}}
  M.P = new_scope(M.conf, M.charge, M.unans, f, 9)
  M.budgeted = M.P.R ~= nil or M.P.T ~= nil
  return M
end
local H = load_member(prefix, c)
H.name = ''
local MEMBERS, BY_NAME = {H}, {}
-- A group's: each member's keys under its own prefix, within the group's
-- hash tag; the pools, as lists of members. The group's own record keeps
-- only the fields of the whole group (``c``): it is no member.
if pooled then
  MEMBERS = {}
  for j, name in ipairs(NAMES) do
    local p = member_prefix(name)
    local M = load_member(p, redis.call('HMGET', p .. 'conf', unpack(CONF)))
    M.name = name
    MEMBERS[j] = M
    BY_NAME[name] = M
  end
  for name, names in pairs(POOLS) do
    local pool = {}
    for j, member in ipairs(names) do pool[j] = BY_NAME[member] end
    POOLS[name] = pool
  end
end
-- The models' scopes, loaded when first needed; only those that keep
-- books are used, or one about to (``create``: its first figures). Only
-- the models of this step's entries and leases are loaded: a step costs
-- the same however many models are idle. A learned one found forgotten
-- (``forgets``) goes, with its books; its next figures start it afresh.
-- Each member has its own, under its prefix.
local forgotten = {}
local function scope_of(M, model, create)
  local MS = M.MS
  local sc = MS[model]
  if sc == nil then
    local p = M.prefix
    local h, ch, un = p .. 'm:' .. model, p .. 'mc:' .. model, p .. 'mu:' .. model
    local f = redis.call('HMGET', h, unpack(MODEL_FIELDS))
    sc = new_scope(h, ch, un, f, 0)
    sc.kept = f[19] == '1' or (sc.R ~= nil and sc.R.cfg) or (sc.T ~= nil and sc.T.cfg)
    sc.idle = stored(f[18], nil)
    if sc.books and not sc.kept and forgets(sc) then
      redis.call('DEL', h, ch, un)
      forgotten[#forgotten + 1] = model
      M.forgotten[#M.forgotten + 1] = model
      sc = new_scope(h, ch, un, {}, 0)
    end
    sc.model = model
    MS[model] = sc
  end
  if sc.books or create then return sc end
  return nil
end
-- An entry or lease of a model more (1) or less (-1): a model that goes
-- idle, or in use again, moves when its learned budget is forgotten.
local function busy_moved(model, delta)
  local n = redis.call('HINCRBY', busy, model, delta)
  if n <= 0 then redis.call('HDEL', busy, model) end
  if n <= 0 or n == delta then
    for _, M in ipairs(MEMBERS) do
      local sc = scope_of(M, model)
      if sc then
        if n <= 0 then sc.idle = now else sc.idle = nil end
        sc.idle_moved = true
      end
    end
  end
end

-- Tenants (xm only): each one's state, loaded when first needed, and the
-- backlogged ones (``tback``; the tenant of no name is '').
local TS = {}
local BL = {}
local function tenant(t)
  local s = TS[t]
  if s then return s end
  local base, held, last = tenant_state(redis.call('HGET', tstate, t))
  local w, cap, cfg = 1, nil, false
  if t ~= '' then
    local text = redis.call('HGET', tconf, t)
    if text then
      w, cap = tenant_settings(text)
      cfg = true
    end
  end
  s = {name = t, base = base, held = held, last = last, w = w, cap = cap,
    cfg = cfg, waiting = redis.call('ZCARD', queue_of(t)), dirty = false}
  TS[t] = s
  return s
end
-- The counter now: c_t = base + held * (now - last) / weight, in seconds
-- (the same expression, in the same order, as the pure core's).
local function counter(s)
  if s.held == 0 or now <= s.last then return s.base end
  return s.base + s.held * (now - s.last) / 1000 / s.w
end
local function fold(s)
  if now > s.last then
    s.base = counter(s)
    s.last = now
    s.dirty = true
  end
end
-- A tenant's waiting count moves: one that becomes backlogged is raised to
-- the floor (the least counter of the others backlogged, or the counter of
-- the tenant that last stopped being backlogged), one that stops leaves
-- its counter there.
local function waiting_moved(s, delta)
  local before = s.waiting
  s.waiting = before + delta
  if before == 0 and s.waiting > 0 then
    local floor = nil
    for name, _ in pairs(BL) do
      if name ~= s.name then
        local v = counter(tenant(name))
        if floor == nil or v < floor then floor = v end
      end
    end
    if floor == nil then floor = t_last end
    fold(s)
    if s.base < floor then
      s.base = floor
      s.dirty = true
    end
    BL[s.name] = true
    redis.call('SADD', tback, s.name)
  elseif before > 0 and s.waiting <= 0 then
    s.waiting = 0
    t_last, t_last_moved = counter(s), true
    BL[s.name] = nil
    redis.call('SREM', tback, s.name)
  end
end
-- The tenant and model of a lease, from ``lmeta``; a lease without one was
-- granted to the tenant of no name before tenants were counted.
local function lease_meta(id)
  local text = redis.call('HGET', lmeta, id)
  if not text then return '', '' end
  local t, model = string.match(text, '^(.*)\n(.*)$')
  return t or '', model or ''
end
-- The tenant and model of a queued member.
local META = {}
local function member_meta(m)
  local meta = META[m]
  if meta then return meta[1], meta[2] end
  local text = redis.call('HGET', qmeta, m)
  local t, model = '', ''
  if text then t, model = string.match(text, '^(.*)\n(.*)$') end
  META[m] = {t or '', model or ''}
  return t or '', model or ''
end
-- A queued member out of its queue, its tenant's count and its metadata
-- (not ``qexp`` nor ``qcost``); 1 if it was queued, else 0.
local function unqueue(m)
  if pooled then redis.call('HDEL', qlane, m) end
  if not xm then
    if qm then redis.call('HDEL', qmeta, m) end
    return redis.call('ZREM', queue, m)
  end
  local t, model = member_meta(m)
  local gone = redis.call('ZREM', queue_of(t), m)
  if gone == 1 then
    waiting_moved(tenant(t), -1)
    if model ~= '' then busy_moved(model, -1) end
  end
  redis.call('HDEL', qmeta, m)
  return gone
end
-- The budgets of a lease's model on its member, if it has any (only once
-- tenants count).
local function model_scope(M, id)
  if not xm then return nil end
  local _, model = lease_meta(id)
  return model ~= '' and scope_of(M, model) or nil
end
if xm then
  for _, name in ipairs(redis.call('SMEMBERS', tback)) do
    BL[name] = true
  end
  for name, _ in pairs(BL) do tenant(name) end
end

-- Everything a lease leaves behind, once it is given back or expired.
-- A step tells which of their keys may hold anything (``keeps``): grant
-- numbers only during a streak, charges and unanswered leases only with a
-- budget, the leases in use only with an adaptive limit (each is emptied
-- when that ends); with tenants, its tenant's count and service.
for _, M in ipairs(MEMBERS) do
  M.keeps = {grantno = stored(M.c[3], 0) > 0, budget = M.P.books, inuse = M.c[5] ~= false}
end
local function forget_lease(M, id, inuse_done)
  local keeps = M.keeps
  if keeps.grantno then redis.call('HDEL', M.grantno, id) end
  if keeps.budget then forget_charge(M.P, id) end
  if keeps.inuse and not inuse_done then redis.call('SREM', M.inuse, id) end
  if xm then
    local t, model = lease_meta(id)
    redis.call('HDEL', lmeta, id)
    local s = tenant(t)
    if s.held > 0 then
      -- Its service so far stays the tenant's.
      fold(s)
      s.held = s.held - 1
      s.dirty = true
    end
    if model ~= '' then
      local sc = scope_of(M, model)
      if sc then forget_charge(sc, id) end
      busy_moved(model, -1)
    end
  end
end
local function prune()
  if prune_at ~= nil and prune_at > now then return 0 end
  local pruned = 0
  local gone
  for _, M in ipairs(MEMBERS) do
    gone = redis.call('ZRANGEBYSCORE', M.leases, '-inf', now)
    if #gone > 0 then
      for _, id in ipairs(gone) do forget_lease(M, id) end
      pruned = pruned + redis.call('ZREMRANGEBYSCORE', M.leases, '-inf', now)
    end
  end
  gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now)
  if #gone > 0 then
    for _, m in ipairs(gone) do
      unqueue(m)
      if qc then redis.call('HDEL', qcost, m) end
    end
    pruned = pruned + redis.call('ZREMRANGEBYSCORE', qexp, '-inf', now)
  end
  gone = redis.call('ZRANGEBYSCORE', nodes, '-inf', now)
  if #gone > 0 then
    for _, nd in ipairs(gone) do redis.call('HDEL', nwait, nd) end
    redis.call('ZREMRANGEBYSCORE', nodes, '-inf', now)
  end
  -- Nothing left expires before the earliest of what is left.
  prune_at = math.huge
  local ks = {qexp, nodes}
  for _, M in ipairs(MEMBERS) do ks[#ks + 1] = M.leases end
  for _, k in ipairs(ks) do
    local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')[2]
    if first then prune_at = math.min(prune_at, tonumber(first)) end
  end
  prune_moved = true
  return pruned
end

local changed = prune()
-- Of those changes, the slots given back (the rest changed the queue, the
-- limit or the budgets).
local freed = 0
-- Each member's limit, pause, backoff streak and adaptive limit (if its
-- stored limit is one).
for _, M in ipairs(MEMBERS) do
  local f = M.c
  M.limit = stored_limit(f[1], M.conf)
  M.pause_until = stored(f[2], 0)
  M.streak = stored(f[3], 0)
  M.at_report = stored(f[4], 0)
  if M.limit and f[5] then
    M.adaptive = {low = tonumber(f[5]), high = tonumber(f[6]),
      backoff = tonumber(f[7]), value = tonumber(f[8]), slow = f[9] == '1',
      latency = f[33] == 'latency', moved = false}
    M.P.books = true
  end
end
-- A group's members' health, the pure core's (``SlotPolicy.fail``): its
-- failures in a row, the end of its cooldown out of service, whether it is
-- half-open and its probe's lease, its outages. A cooldown that has run
-- out leaves it half-open: its next grant is its probe, and it takes
-- nothing more until that ends; a probe that succeeds puts it back in
-- service, one that fails out again. Alone, a member is never out.
if pooled then
  for _, M in ipairs(MEMBERS) do
    local f = M.c
    M.fails, M.out, M.half = stored(f[34], 0), stored(f[35], nil), f[36] == '1'
    M.probe, M.outs, M.health_moved = f[37] or nil, stored(f[38], 0), false
    M.hits, M.moves = stored(f[39], 0), stored(f[40], 0)
    if M.out and now >= M.out then
      M.out, M.half, M.health_moved = nil, true, true
    end
  end
end
local function out_of_service(M)
  M.out, M.half, M.outs, M.health_moved = now + COOLDOWN, false, M.outs + 1, true
  changed = changed + 1
  rehome(M.name)
end
-- Lease ``id`` of member M given back: ``success``, its call got its
-- answer; a failed one (``FAILED``) counts, or ends a probe.
local function health_released(M, id, success)
  if FAILED[id] then
    if M.half then
      if M.probe == id and #MEMBERS > 1 then out_of_service(M) end
    elseif not M.out then
      M.fails, M.health_moved = M.fails + 1, true
      if M.fails >= THRESHOLD and #MEMBERS > 1 then out_of_service(M) end
    end
  elseif success and M.fails > 0 then
    M.fails, M.health_moved = 0, true
  end
  if M.probe == id then
    M.probe, M.health_moved = nil, true
    if success then M.fails, M.half = 0, false end
  end
end
-- A member's adaptive limit as its value now says: its limit moved is a
-- change of the step.
local function adapted(M)
  local adaptive = M.adaptive
  adaptive.moved = true
  local new = math.min(adaptive.high, math.max(adaptive.low, math.floor(adaptive.value)))
  if new ~= tonumber(M.limit) then
    M.limit = whole(new)
    changed = changed + 1
  end
end
-- The verdicts of the processes' latency signals, each applied as
-- Adaptive.move does: a rise doubles the whole limit during the slow start,
-- else adds the change; a fall ends the slow start; within the bounds. Only
-- a latency-signal adaptive limit moves by them.
-- (A group's verdicts and figures are each for the member named.)
local function named(names, j)
  if not pooled then return H end
  return BY_NAME[names[j] or '']
end
for j, change in ipairs(verdicts) do
  local M = named(VERDICTS_ON, j)
  local adaptive = M and M.adaptive
  if adaptive and adaptive.latency then
    local current = math.min(adaptive.high, math.max(adaptive.low,
      math.floor(adaptive.value)))
    if change and change ~= 0 then
      if change > 0 then
        local step = change
        if adaptive.slow then step = current end
        adaptive.value = math.min(adaptive.high, current + step)
      else
        adaptive.slow = false
        adaptive.value = math.max(adaptive.low, current + change)
      end
      adapted(M)
    end
  end
end
-- The member whose lease ``id`` is: the provider itself, or the member of
-- a group's lease its process named (none: it is not known, and the
-- change for it is dropped).
local function holder_of(id)
  if not pooled then return H end
  return BY_NAME[HOLD[id] or '']
end
-- The members an entry of lane ``r`` may take, as the pure core's
-- ``_lane`` and ``_candidates`` read it: ``nil`` for a member's own lane;
-- else its pool's (any member's, the empty name) members, less those it
-- avoids if any other is left, in the pool's order (a fresh list), and
-- the names of those it avoids among them (none if it avoids them all).
local function lane_members(r)
  local pool = MEMBERS
  if r.lane ~= '' then
    pool = POOLS[r.lane]
    if not pool then return nil, {} end
  end
  local avoiding = {}
  for _, name in ipairs(r.avoid) do avoiding[name] = true end
  local kept, avoided = {}, {}
  for _, M in ipairs(pool) do
    if avoiding[M.name] then
      avoided[#avoided + 1] = M.name
    else
      kept[#kept + 1] = M
    end
  end
  if #kept == 0 then
    return {unpack(pool)}, {}
  end
  return kept, avoided
end
-- A group's new entry's lane, as ``SlotPolicy._lane`` places it: the
-- member it prefers counts only with affinity on, in a pool's (or any
-- member's) lane of two members or more (those it avoids left out) with
-- that member among them; it waits for that member alone for
-- ``AFFINITY``, unless that member is paused, out of service or
-- half-open (then it is only tried first).
local PLACED = {}
local function placed(text)
  local r = read_lane(text)
  if r.prefer == '' then return text end
  local P = BY_NAME[r.prefer]
  local choices = {}
  if P and AFFINITY > 0 then choices = lane_members(r) or {} end
  local among = false
  for _, M in ipairs(choices) do
    if M == P then among = true end
  end
  if #choices < 2 or not among then
    r.prefer = ''
  elseif P.pause_until > now or P.out or P.half then
    r.till = 0
  else
    r.till = now + AFFINITY
  end
  return write_lane(r)
end
local spoiled = {}
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  spoiled[id] = true
  local M = holder_of(id)
  if M and M.keeps.inuse then redis.call('SREM', M.inuse, id) end
end
-- Usage reports before the releases: a report and the release after it
-- may come in one step.
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id, tokens = ARGV[i], tokens_of(ARGV[i + 1]); i = i + 2
  local M = holder_of(id)
  if M and redis.call('ZSCORE', M.leases, id) then
    if use(M.P, id, tokens) then changed = changed + 1 end
    local sc = model_scope(M, id)
    if sc and use(sc, id, tokens) then changed = changed + 1 end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  local M = holder_of(id)
  if M and redis.call('ZREM', M.leases, id) == 1 then
    changed = changed + 1
    freed = freed + 1
    local success = not spoiled[id]
    if M.streak > 0 then
      local g = tonumber(redis.call('HGET', M.grantno, id) or '0')
      if success and g > M.at_report then
        -- A success: the streak ends, and with it the grant numbers.
        redis.call('HSET', M.conf, 'streak', 0)
        redis.call('DEL', M.grantno)
        M.streak = 0
      end
    end
    local counted = M.keeps.inuse and redis.call('SREM', M.inuse, id) == 1
    forget_lease(M, id, true)
    if pooled then health_released(M, id, success) end
    -- A latency signal's limit moves by its verdicts alone.
    local a = M.adaptive
    if success and counted and a and not a.latency then
      if a.slow then
        a.value = math.min(a.high, a.value + 1)
      else
        a.value = math.min(a.high, a.value + 1 / tonumber(M.limit))
      end
      adapted(M)
    end
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m = ARGV[i]; i = i + 1
  changed = changed + unqueue(m)
  redis.call('ZREM', qexp, m)
  if qc then redis.call('HDEL', qcost, m) end
  -- Granted by a step whose answer was lost: nobody holds it.
  local id = string.sub(m, 18)
  for _, M in ipairs(MEMBERS) do
    if redis.call('ZREM', M.leases, id) == 1 then
      changed = changed + 1
      forget_lease(M, id)
    end
  end
end
local asking = {}
local granted = {}
-- The member of each grant, in the same order.
local granted_on = {}
-- Whether a step whose answer was lost granted m: then it is granted
-- again, the same lease renewed.
-- Which they are, asked for the members sent (enqueued or asking) in one
-- call per thousand: every server call counts on the grant's path. Only
-- a node whose step may have run without its answer reaching it asks
-- (``recheck``): else none of its members can hold a lease.
local lost = {}
-- Entries enqueued by this step with no tenant counted: written to the
-- queue (and ``qexp``) only if the step does not grant them at once (see
-- ``in_order``), as most are under contention, which saves four writes a
-- grant.
local newcomers, newcomer = {}, {}
local function place_newcomers()
  for _, e in ipairs(newcomers) do
    if not e.granted then
      redis.call('ZADD', queue, e.start, e.m)
      redis.call('ZADD', qexp, now + ttl, e.m)
      queue_grew = true
    end
  end
  newcomers = {}
end
if recheck then
  local ids, k = {}, at_enqueue
  for j = 1, tonumber(ARGV[k]) do ids[#ids + 1] = string.sub(ARGV[k + 1 + 5 * (j - 1)], 18) end
  k = k + 1 + 5 * tonumber(ARGV[k])
  k = k + 1 + tonumber(ARGV[k])
  for j = 1, tonumber(ARGV[k]) do ids[#ids + 1] = string.sub(ARGV[k + j], 18) end
  for first = 1, #ids, 1000 do
    local chunk = {unpack(ids, first, math.min(#ids, first + 999))}
    for _, M in ipairs(MEMBERS) do
      local scores = redis.call('ZMSCORE', M.leases, unpack(chunk))
      for j, id in ipairs(chunk) do
        if scores[j] then lost[id] = M end
      end
    end
  end
end
local function held(m)
  local id = string.sub(m, 18)
  local M = lost[id]
  if M then
    redis.call('ZADD', M.leases, now + ttl, id)
    leases_grew = true
    granted[#granted + 1] = m
    granted_on[#granted_on + 1] = M.name
    return true
  end
  return false
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m, start, tokens = ARGV[i], ARGV[i + 1], tokens_of(ARGV[i + 2])
  local t, model = ARGV[i + 3], ARGV[i + 4]
  i = i + 5
  if not held(m) then
    if pooled then
      -- Placed once: its first step's placement stands while it waits.
      local text = placed(LANES[m] or '')
      if redis.call('HSETNX', qlane, m, text) == 1 then PLACED[m] = text end
    end
    if xm then
      local s = tenant(t)
      local added = redis.call('ZADD', queue_of(t), start, m)
      META[m] = {t, model}
      if t ~= '' or model ~= '' then redis.call('HSET', qmeta, m, t .. '\n' .. model) end
      if added == 1 then
        waiting_moved(s, 1)
        if model ~= '' then busy_moved(model, 1) end
      end
      redis.call('ZADD', qexp, now + ttl, m)
      queue_grew = true
    else
      local e = newcomer[m]
      if e == nil then
        e = {m = m}
        newcomer[m] = e
        newcomers[#newcomers + 1] = e
      end
      e.start, e.score = start, tonumber(start)
      -- Not a number: refused, as Redis refuses it.
      if e.score == nil or e.score ~= e.score then redis.call('ZADD', queue, start, m) end
      if model ~= '' then redis.call('HSET', qmeta, m, '\n' .. model) end
    end
    if tokens > 0 then
      redis.call('HSET', qcost, m, whole(tokens))
      if not qc then
        qc = true
        redis.call('HSET', conf, 'qc', 1)
      end
    end
    asking[m] = true
  end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  -- ZADD, not XX: after Redis restarted empty, holders register again.
  local M = holder_of(ARGV[i])
  if M then
    redis.call('ZADD', M.leases, now + ttl, ARGV[i])
    leases_grew = true
  end
  i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local m = ARGV[i]; i = i + 1
  if not held(m) then asking[m] = true end
end
n = tonumber(ARGV[i]); i = i + 1
for j = 1, n do
  local id = ARGV[i]; i = i + 1
  local M = holder_of(id)
  if M then
    see(M.P, id, true)
    local sc = model_scope(M, id)
    if sc then see(sc, id, true) end
  end
end
for j, pair in ipairs(figures) do
  local M = named(FIGURES_ON, j)
  if M == nil then
    -- A member the group does not have: nothing to learn.
  elseif pair[1] == '' then
    observe(M.P, pair[2])
    M.budgeted = M.P.R ~= nil or M.P.T ~= nil
  else
    local sc = scope_of(M, pair[1], true)
    if not sc.books and not sc.kept and not redis.call('HGET', busy, pair[1]) then
      -- Learned now, its model idle: it is forgotten from now on.
      sc.idle, sc.idle_moved = now, true
    end
    observe(sc, pair[2])
  end
end
-- Each member's pause left and slots held; ``fresh``: its leases granted
-- by this step (not those a lost answer had granted).
for _, M in ipairs(MEMBERS) do
  M.pause = 0
  if M.pause_until > now then
    M.pause = M.pause_until - now
  elseif M.pause_until > 0 then
    redis.call('HDEL', M.conf, 'pause_until')
  end
  M.in_flight = redis.call('ZCARD', M.leases)
  -- A probe whose lease expired (its process vanished) ends, no success.
  if M.probe and not redis.call('ZSCORE', M.leases, M.probe) then
    M.probe, M.health_moved = nil, true
  end
end
-- Whether any queued member has an estimate (asked once, at the first grant).
local costly = nil
-- ``unqueued``: a newcomer, never written to the queue.
local function grant(M, m, cost, s, model, unqueued)
  local id = string.sub(m, 18)
  if s then
    redis.call('ZREM', queue_of(s.name), m)
  else
    if not unqueued then redis.call('ZREM', queue, m) end
    if qm then redis.call('HDEL', qmeta, m) end
  end
  if not unqueued then redis.call('ZREM', qexp, m) end
  if pooled then redis.call('HDEL', qlane, m) end
  redis.call('ZADD', M.leases, now + ttl, id)
  leases_grew = true
  if M.half then M.probe, M.health_moved = id, true end
  if M.streak > 0 then
    redis.call('HSET', M.grantno, id, redis.call('HINCRBY', M.conf, 'granted', 1))
  end
  if M.adaptive and 2 * (M.in_flight + 1) >= tonumber(M.limit) then
    redis.call('SADD', M.inuse, id)
  end
  local sc = model and model ~= '' and scope_of(M, model)
  -- Its estimate goes with its entry (read only when books are kept, but
  -- kept for books that may start while it waits).
  local P = M.P
  if cost > 0 or not (P.books or sc) then
    if costly == nil then costly = qc and redis.call('EXISTS', qcost) == 1 end
    if costly then redis.call('HDEL', qcost, m) end
  end
  if P.books then charge_to(P, id, cost) end
  if sc then charge_to(sc, id, cost) end
  if s then
    if s.name ~= '' or model ~= '' then redis.call('HDEL', qmeta, m) end
    redis.call('HSET', lmeta, id, s.name .. '\n' .. model)
    fold(s)
    s.held = s.held + 1
    s.dirty = true
    s.removed = (s.removed or 0) + 1
    waiting_moved(s, -1)
  end
  granted[#granted + 1] = m
  granted_on[#granted_on + 1] = M.name
  M.fresh = M.fresh + 1
  M.in_flight = M.in_flight + 1
end
-- The first entries of the queue, oldest first, as far as the budgets go:
-- nobody passes an entry the budgets cannot hold yet.
-- Without budgets, the processes of the entries left in the window (that
-- only their process can take) are the ones a slot given back here is for
-- (``targets``; nil: unknown, or an entry whose process cannot be told).
local targets = nil
-- Whether entry a comes before entry b in the queue: by score, then by
-- member byte by byte (as Redis orders a sorted set; Lua's own string
-- comparison follows the server's locale).
local function before_text(x, y)
  for k = 1, math.min(#x, #y) do
    local p, q = string.byte(x, k), string.byte(y, k)
    if p ~= q then return p < q end
  end
  return #x < #y
end
local function before(a, b)
  if a.score ~= b.score then return a.score < b.score end
  return before_text(a.m, b.m)
end
-- The first ``window`` entries of the queue as it would be with the
-- newcomers placed. One read there (a renewal) is placed first instead,
-- and the queue read again.
local function in_order(window)
  local out = {}
  local got = redis.call('ZRANGE', queue, 0, window - 1, 'WITHSCORES')
  for k = 1, #got, 2 do
    if newcomer[got[k]] and #newcomers > 0 then
      place_newcomers()
      return in_order(window)
    end
    out[#out + 1] = {m = got[k], score = tonumber(got[k + 1])}
  end
  if #newcomers == 0 then return out end
  for _, e in ipairs(newcomers) do out[#out + 1] = e end
  table.sort(out, before)
  -- A member is always sent with the same start: one queued beyond the
  -- window already stays beyond it.
  for k = #out, window + 1, -1 do out[k] = nil end
  return out
end
local function grant_in_order(M, window)
  local others = {}
  local P, budgeted = M.P, M.budgeted
  for _, e in ipairs(in_order(window)) do
    local m = e.m
    local cost = 0
    if P.books then
      cost = tokens_of(redis.call('HGET', qcost, m))
      if budgeted and lacks(P, cost) > 0 then break end
    end
    if e.start then
      grant(M, m, cost, nil, nil, true)
      e.granted = true
    elseif asking[m] then
      grant(M, m, cost)
    elseif budgeted then
      reserve(P, cost)
    else
      others[#others + 1] = m
    end
  end
  if budgeted then return end
  targets = {}
  local seen = {}
  for _, m in ipairs(others) do
    -- A member is its arrival, a colon and its lease id, which is its
    -- process's node, a colon and a number.
    local nd = string.match(m, '^%d+:(.*):[^:]*$')
    if nd == nil then
      targets = nil
      return
    end
    if not seen[nd] and nd ~= node then
      seen[nd] = true
      targets[#targets + 1] = nd
    end
  end
end
-- With tenants: for each free slot, the backlogged tenant not at its cap
-- with the least (counter, holders / weight, head), whose head its model
-- lets pass, gets it for its head. The provider's budgets holding a head
-- back stop the fill (nobody passes); a model's block only that model's
-- members for the rest of the fill. Entries of other processes chosen keep
-- their slot (and budget) until their process asks, and count as held
-- meanwhile.
local CHUNK = 32
-- A tenant's oldest entry not taken in this fill and not of a lane held
-- back (``key_of``: an entry's lane, its model for a provider): its entries
-- are read in chunks (growing), in queue order.
local function queued_head(s, blocked, key_of)
  while true do
    local e = s.buf[s.k]
    if e == nil then
      if s.done then return nil end
      local from = #s.buf - s.removed
      -- Chunks of 4 first, up to CHUNK: most steps grant one or two.
      local size = s.size or 4
      s.size = math.min(CHUNK, 2 * size)
      local got = redis.call('ZRANGE', queue_of(s.name), from, from + size - 1, 'WITHSCORES')
      if #got < 2 * size then s.done = true end
      if #got == 0 then return nil end
      local unknown = {}
      for k = 1, #got, 2 do
        local m = got[k]
        -- Before tenants are counted (a group's queue), no model matters.
        if not META[m] then
          if xm then unknown[#unknown + 1] = m else META[m] = {'', ''} end
        end
      end
      if #unknown > 0 then
        local texts = redis.call('HMGET', qmeta, unpack(unknown))
        for k, m in ipairs(unknown) do
          local t, model = '', ''
          if texts[k] then t, model = string.match(texts[k], '^(.*)\n(.*)$') end
          META[m] = {t or '', model or ''}
        end
      end
      for k = 1, #got, 2 do
        s.buf[#s.buf + 1] = {m = got[k], score = tonumber(got[k + 1]),
          model = META[got[k]][2]}
      end
    else
      if e.key == nil then e.key = key_of(e) end
      if e.taken or blocked[e.key] then
        s.k = s.k + 1
      else
        return e
      end
    end
  end
end
-- A tenant's reading of its queue starts afresh for a fill.
local function unread(s)
  s.buf, s.k, s.vh, s.removed, s.done, s.size = {}, 1, 0, 0, false, nil
end
-- The tenant the next slot goes to and its head: below its cap, the least
-- (counter, holders / weight, head).
local function choose(cands, blocked, key_of)
  local best, be, k1, k2 = nil, nil, 0, 0
  for _, s in ipairs(cands) do
    local h = s.held + s.vh
    if not (s.cap and h >= s.cap) then
      local e = queued_head(s, blocked, key_of)
      if e then
        local v = counter(s)
        local share = h / s.w
        if best == nil or v < k1 or (v == k1 and (share < k2 or (share == k2 and
            (e.score < be.score or (e.score == be.score and e.m < be.m))))) then
          best, be, k1, k2 = s, e, v, share
        end
      end
    end
  end
  return best, be
end
local function model_of(e) return e.model end
local function grant_fairly(M, free)
  local P, budgeted = M.P, M.budgeted
  local cands = {}
  for name, _ in pairs(BL) do
    local s = tenant(name)
    unread(s)
    cands[#cands + 1] = s
  end
  local blocked = {}
  while free > 0 do
    local best, be = choose(cands, blocked, model_of)
    if not best then break end
    local m, model = be.m, be.model
    local sc = model ~= '' and scope_of(M, model)
    local cost = 0
    if P.books or sc then cost = tokens_of(redis.call('HGET', qcost, m)) end
    if budgeted and lacks(P, cost) > 0 then break end
    if sc and lacks(sc, cost) > 0 then
      blocked[model] = true
    else
      be.taken = true
      if asking[m] then
        grant(M, m, cost, best, model)
      else
        best.vh = best.vh + 1
        if budgeted then reserve(P, cost) end
        if sc then reserve(sc, cost) end
      end
      free = free - 1
    end
  end
end
-- A group's grants, as the pure core's fill makes them: the entries in
-- queue order, each to the first member of its lane with room (a free
-- slot, not paused; unlimited, always), tried as ``_candidates`` orders
-- them; an entry none of them has room for waits, and those after it go
-- on. Entries of other processes so chosen keep their slot on their
-- member (``reserved``) until their process asks, and count as held for
-- the rest of the step.
local function free_of(M)
  local limit = M.limit
  if not limit or limit == 'none' then return math.huge end
  return tonumber(limit) - M.in_flight - M.reserved
end
-- A half-open member's one slot is its probe's: held, or kept in this step
-- for another process's entry (``probe_kept``).
local function has_room(M)
  if M.out or (M.half and (M.probe or M.probe_kept)) then return false end
  local limit = M.limit
  if not limit or limit == 'none' then return true end
  return M.pause == 0 and tonumber(limit) - M.in_flight - M.reserved > 0
end
-- An entry's lane, as stored (``read_lane``; placed by this step, as it
-- placed it).
local function lane_of(m)
  return read_lane(PLACED[m] or redis.call('HGET', qlane, m) or '')
end
-- The members that may take an entry of a lane, in the order they are
-- tried: a member's lane, that member; a pool's (or any member's, the
-- empty name), its members with the most free slots first, ties in the
-- pool's order, but those it avoids if any other is left; a half-open
-- member awaiting its probe before all (``_member_key``); the member it
-- prefers first, and alone while it waits for it.
local function candidates(r)
  local preferred = BY_NAME[r.prefer]
  if preferred and r.till > now then return {preferred} end
  local kept = lane_members(r)
  if not kept then return {BY_NAME[r.lane]} end
  local rank, key = {}, {}
  for k, M in ipairs(kept) do
    rank[M] = k
    if M.half and not (M.probe or M.probe_kept) then
      key[M] = math.huge
    else
      key[M] = free_of(M)
    end
  end
  table.sort(kept, function(a, b)
    local x, y = key[a], key[b]
    if x ~= y then return x > y end
    return rank[a] < rank[b]
  end)
  if preferred and rank[preferred] then
    for k, M in ipairs(kept) do
      if M == preferred then
        table.remove(kept, k)
        table.insert(kept, 1, preferred)
        break
      end
    end
  end
  return kept
end
-- A lane's key, as the pure core's ``Lane``: the entry's model, and the
-- member it waits for alone, or its lane's name and the members it avoids
-- (only if that leaves any).
local function lane_key(r, model)
  if BY_NAME[r.prefer] and r.till > now then
    return model .. '\n' .. #r.prefer .. ':' .. r.prefer
  end
  local key = model .. '\n' .. #r.lane .. ':' .. r.lane
  if #r.avoid > 0 then
    local _, avoided = lane_members(r)
    if #avoided > 0 then
      table.sort(avoided, before_text)
      key = key .. '\n' .. table.concat(avoided, '\n')
    end
  end
  return key
end
local function group_key(e)
  e.lane = lane_of(e.m)
  return lane_key(e.lane, e.model)
end
-- A group's grants, as the pure core's fill makes them (``_fill`` and
-- ``_placer``): for each choice, the backlogged tenant below its cap with
-- the least (counter, holders / weight, head), its head its oldest entry
-- of a lane not held back in this step (before tenants are counted, the
-- queue's oldest such entry); that entry goes to the first member of its
-- lane (``candidates``) with room whose budgets hold it. A member whose
-- own budgets cannot is shut for the rest of the step (nobody passes on it
-- what they hold back), one whose budget of the entry's model cannot is
-- passed over for that model, unless the entry goes to another member,
-- which opens them again; an entry no member takes holds its lane back for
-- the rest of the step. Entries of other processes so chosen keep their slot
-- (and budget) on their member until their process asks, and count as
-- held meanwhile.
local function grant_pooled()
  local open, books = 0, false
  for _, M in ipairs(MEMBERS) do
    M.reserved, M.shut, M.passed = 0, false, {}
    if has_room(M) then open = open + 1 end
    if M.P.books then books = true end
  end
  if open == 0 then return end
  place_newcomers()
  local cands = {}
  if xm then
    for name, _ in pairs(BL) do cands[#cands + 1] = tenant(name) end
  else
    -- Before tenants are counted: the queue, as one tenant's.
    cands[1] = {name = '', base = 0, last = 0, held = 0, w = 1}
  end
  for _, s in ipairs(cands) do unread(s) end
  local blocked = {}
  while open > 0 do
    local best, be = choose(cands, blocked, group_key)
    if not best then break end
    local m, r, model = be.m, be.lane, be.model
    local cost = 0
    if books or model ~= '' then cost = tokens_of(redis.call('HGET', qcost, m)) end
    local taker, closed, passed, sc = nil, nil, nil, nil
    for _, M in ipairs(candidates(r)) do
      if not M.shut and has_room(M) then
        if M.budgeted and lacks(M.P, cost) > 0 then
          M.shut = true
          open = open - 1
          closed = closed or {}
          closed[#closed + 1] = M
        elseif not (model ~= '' and M.passed[model]) then
          -- Its model's budget on this member: one that cannot hold it
          -- passes this member over for the model (``held_back``).
          sc = model ~= '' and scope_of(M, model) or nil
          if sc and lacks(sc, cost) > 0 then
            M.passed[model] = true
            passed = passed or {}
            passed[#passed + 1] = M
          else
            taker = M
            break
          end
        end
      end
    end
    if taker then
      if closed then
        for _, M in ipairs(closed) do
          M.shut = false
          open = open + 1
        end
      end
      for _, M in ipairs(passed or {}) do M.passed[model] = nil end
      be.taken = true
      if asking[m] then
        if xm then
          grant(taker, m, cost, best, be.model)
        else
          grant(taker, m, cost)
          best.removed = best.removed + 1
        end
        -- Affinity counted as ``SlotPolicy._take`` counts it.
        local preferred = BY_NAME[r.prefer]
        if preferred == taker then
          taker.hits, taker.health_moved = taker.hits + 1, true
        elseif preferred then
          preferred.moves, preferred.health_moved = preferred.moves + 1, true
        end
      else
        best.vh = best.vh + 1
        taker.reserved = taker.reserved + 1
        if taker.half then taker.probe_kept = true end
        if taker.budgeted then reserve(taker.P, cost) end
        if sc then reserve(sc, cost) end
      end
      if not has_room(taker) then open = open - 1 end
    else
      blocked[be.key] = true
    end
  end
end
local limit = H.limit
if pooled then
  grant_pooled()
elseif not limit or limit == 'none' then
  place_newcomers()
  -- Unlimited: pauses do not apply, as in the local policy.
  if xm then
    grant_fairly(H, math.huge)
  elseif H.P.books then
    grant_in_order(H, 0)
  else
    -- Only its own entries, in queue order (start, then arrival), as the
    -- pure core grants them.
    local order = {}
    for m, _ in pairs(asking) do
      local score = redis.call('ZSCORE', queue, m)
      if score then order[#order + 1] = {m = m, score = tonumber(score)} end
    end
    table.sort(order, before)
    for _, e in ipairs(order) do grant(H, e.m, 0) end
  end
elseif H.pause == 0 then
  local free = tonumber(limit) - H.in_flight
  if free > 0 then
    if xm then grant_fairly(H, free) else grant_in_order(H, free) end
  end
end
place_newcomers()
-- Each member's state written back: a grant since its adaptive limit's
-- latest decrease (the next report opens a round for it: see pause.lua),
-- its adaptive limit moved, its budgets (``budget``: as the step answers
-- them).
for _, M in ipairs(MEMBERS) do
  if M.fresh > 0 and M.c[23] then redis.call('HDEL', M.conf, 'a_dec') end
  local a = M.adaptive
  if a and a.moved then
    redis.call('HSET', M.conf, 'limit', M.limit, 'a_val', num(a.value),
      'a_slow', a.slow and 1 or 0)
  end
  if M.health_moved then
    redis.call('HSET', M.conf, 'h_fail', M.fails, 'h_half', M.half and 1 or 0,
      'h_outs', M.outs, 'af_hit', M.hits, 'af_move', M.moves)
    if M.out then redis.call('HSET', M.conf, 'h_out', whole(M.out))
    else redis.call('HDEL', M.conf, 'h_out') end
    if M.probe then redis.call('HSET', M.conf, 'h_probe', M.probe)
    else redis.call('HDEL', M.conf, 'h_probe') end
  end
  M.budget = ''
  if M.budgeted then
    M.budget = write_scope(M.P) .. ',' .. whole(M.P.wait)
  elseif M.P.moved then
    write_scope(M.P)
  end
end
-- This process's waiters, less those this step granted (every grant of a
-- step goes to the process that sent it): the fleet's figure is exact
-- after the step, not one step late.
mywait = math.max(0, mywait - #granted)
local waiting, mine = mywait, nil
local rows = redis.call('HGETALL', nwait)
for k = 1, #rows, 2 do
  if rows[k] == node then
    mine = rows[k + 1]
  else
    waiting = waiting + stored(rows[k + 1], 0)
  end
end
if mine ~= whole(mywait) then redis.call('HSET', nwait, node, whole(mywait)) end
-- A process's first step (its node not known yet) sees the configured
-- models' budgets too, which its rounds may not meet for a while.
if xm and mine == nil then
  for _, model in ipairs(redis.call('SMEMBERS', models)) do
    local kept = false
    for _, M in ipairs(MEMBERS) do
      local sc = scope_of(M, model)
      if sc and sc.kept then kept = true end
    end
    if not kept then redis.call('SREM', models, model) end
  end
end
-- The budgets of the models this step met: each model's figures, with
-- when its held-back head fits (-1: none), and how long a learned model's
-- has been idle (ms; empty while it is in use, and for a configured one).
-- A learned model's keys expire when it may be forgotten (``forget_at``);
-- a configured model's budgets persist, its books go with the fleet's. A
-- group's each member's (``model_rows`` of each).
local model_rows = {}
local model_keys = {}
for _, M in ipairs(MEMBERS) do
  M.model_rows = pooled and {} or model_rows
end
for _, M in ipairs(xm and MEMBERS or {}) do
  local rows = M.model_rows
  for model, sc in pairs(M.MS) do
    if sc.books then
      local shown = write_scope(sc)
      if sc.idle_moved then
        if sc.idle then
          redis.call('HSET', sc.h, 'idle', whole(sc.idle))
        else
          redis.call('HDEL', sc.h, 'idle')
        end
      end
      local idle = ''
      if not sc.kept and sc.idle then idle = whole(now - sc.idle) end
      if sc.R or sc.T then
        rows[#rows + 1] = model
        rows[#rows + 1] = shown .. ',' .. whole(sc.wait)
        rows[#rows + 1] = idle
      end
      if sc.kept then
        model_keys[#model_keys + 1] = sc.charge
        model_keys[#model_keys + 1] = sc.unans
      else
        local when = whole(forget_at(sc))
        for _, k in ipairs({sc.h, sc.charge, sc.unans}) do
          redis.call('PEXPIREAT', k, when)
        end
      end
    end
  end
end
-- An adaptive limit's bounds, backoff and signal, as the step answers
-- them (empty: its limit is none).
local function spec_of(M)
  local a = M.adaptive
  if not a then return '' end
  return a.low .. ',' .. a.high .. ',' .. num(a.backoff) .. ',' .. (M.c[33] or '')
end
local spec = spec_of(H)
-- The tenants: each one's state written back (an unconfigured one with
-- nothing held or waiting is forgotten: it starts again from the floor),
-- and as the step answers them: name, weight, cap, held, queued, counter,
-- whether it is configured ('1').
local tenant_rows = {}
local queued = 0
if xm then
  for name, s in pairs(TS) do
    if not s.cfg and s.held <= 0 and s.waiting <= 0 then
      redis.call('HDEL', tstate, name)
    elseif s.dirty then
      redis.call('HSET', tstate, name, tenant_text(s.base, s.held, s.last))
    end
  end
  if t_last_moved then redis.call('HSET', conf, 't_last', num(t_last)) end
  for name, _ in pairs(BL) do queued = queued + TS[name].waiting end
  local configured = redis.call('HGETALL', tconf)
  for k = 1, #configured, 2 do tenant(configured[k]) end
  for _, name in ipairs(redis.call('HKEYS', tstate)) do tenant(name) end
  for name, s in pairs(TS) do
    if name ~= '' and (s.cfg or s.held > 0 or s.waiting > 0) then
      tenant_rows[#tenant_rows + 1] = name
      tenant_rows[#tenant_rows + 1] = num(s.w)
      tenant_rows[#tenant_rows + 1] = s.cap and whole(s.cap) or ''
      tenant_rows[#tenant_rows + 1] = whole(s.held)
      tenant_rows[#tenant_rows + 1] = whole(s.waiting)
      tenant_rows[#tenant_rows + 1] = num(counter(s))
      tenant_rows[#tenant_rows + 1] = s.cfg and '1' or '0'
    end
  end
else
  queued = redis.call('ZCARD', queue)
end
-- Signed, so that the process that caused it need not wake for it, and
-- only when another process waits: nobody else has anything to do. When
-- slots given back were the only change, and no budget or tenant decides
-- who takes them, it names the processes whose entries can take them
-- ('>' and their nodes, space-separated), if any: the others would run a
-- round to find nothing to take.
if changed > 0 and waiting > mywait then
  if changed == freed and targets then
    if #targets > 0 then
      redis.call('PUBLISH', channel, '>' .. table.concat(targets, ' '))
    end
  else
    redis.call('PUBLISH', channel, node)
  end
end
-- The process lives until now + ttl, which covers every lease and entry
-- it added or renewed here: renewed when it added or renewed any (at
-- least every third of a lease while it holds or waits), when it is not
-- known yet, and when the step pruned (and may write conf). A step that
-- did none of this changes no expiry, and leaves each key's as it was.
local touched = leases_grew or queue_grew or mine == nil or prune_moved
if touched then
  redis.call('ZADD', nodes, now + ttl, node)
  -- The earliest expiry bound too.
  if prune_at == nil or now + ttl < prune_at then
    prune_at = now + ttl
    prune_moved = true
  end
end
if prune_moved then redis.call('HSET', conf, 'pa', whole(prune_at)) end
-- An empty queue holds no estimate.
if qc and queued == 0 then redis.call('HDEL', conf, 'qc') end
-- The keys whose members' latest expiry this step moved, or which it may
-- have made (each expires with the latest process, so after every member:
-- a key that gained no later member keeps the expiry that covers its
-- members), and those of the bookkeeping of tenants, budgets and backoff
-- that may hold anything: every server call counts on the grant's path.
-- That bookkeeping is renewed at every step, and the leases and the queue
-- with it: a prune gives it back lease by lease and entry by entry, which
-- it cannot do for the leases or the queue expired before it as a whole.
local tied = qm or xm
for _, M in ipairs(MEMBERS) do
  local keeps = M.keeps
  tied = tied or M.streak > 0 or keeps.grantno or M.P.books or M.adaptive or keeps.inuse
end
local present = {}
if touched then
  present[#present + 1] = nodes
  present[#present + 1] = nwait
end
for _, M in ipairs(MEMBERS) do
  local keeps = M.keeps
  if leases_grew or (tied and M.in_flight > 0) then present[#present + 1] = M.leases end
  if M.streak > 0 or keeps.grantno then present[#present + 1] = M.grantno end
  if M.P.books then
    present[#present + 1] = M.charge
    present[#present + 1] = M.unans
  end
  if M.adaptive or keeps.inuse then present[#present + 1] = M.inuse end
end
if queue_grew or (tied and queued > 0) then
  present[#present + 1] = queue
  present[#present + 1] = qexp
  if qc then present[#present + 1] = qcost end
end
if qm and not xm then present[#present + 1] = qmeta end
if pooled and (queue_grew or queued > 0) then present[#present + 1] = qlane end
if xm then
  for _, k in ipairs({tstate, tback, qmeta, lmeta, busy}) do present[#present + 1] = k end
  for name, _ in pairs(BL) do
    if name ~= '' then present[#present + 1] = queue_of(name) end
  end
  for _, k in ipairs(model_keys) do present[#present + 1] = k end
end
-- Whether a provider's or member's ``conf`` persists: while it holds a
-- limit or a configured budget.
local function keeps_conf(M)
  local B = M.P
  return (not not M.limit) or (B.R ~= nil and B.R.cfg) or (B.T ~= nil and B.T.cfg)
end
-- A group's member's ``conf`` as a provider's: it persists while it keeps
-- it, else it goes with the rest, or at the end of its pause or cooldown
-- (renewed at every step: any may write it). The group's own ``conf``
-- (its epoch, its tenants' counting) persists while any member's does,
-- and else lasts as long as the longest of theirs: a group whose epoch
-- went while its members' settings stayed would seem lost to every
-- process.
local members_kept, members_until = false, 0
if pooled then
  local at = nil
  for _, M in ipairs(MEMBERS) do
    if keeps_conf(M) then
      members_kept = true
    else
      if at == nil then
        at = math.max(now, stored(redis.call('ZREVRANGE', nodes, 0, 0, 'WITHSCORES')[2], 0))
      end
      local ends = math.max(M.pause_until, M.out or 0)
      members_until = math.max(members_until, ends)
      redis.call('PEXPIREAT', M.conf, whole(math.max(at, ends)))
    end
  end
end
if #present > 0 then
  expire_idle(now, keeps_conf(H) or members_kept
    or (xm ~= nil and redis.call('HLEN', tconf) > 0),
    math.max(stored(H.pause_until, 0), members_until), present)
end
-- A group's answer: the whole group's leases, then each member's name,
-- limit, leases, pause left, budgets, failures in a row, cooldown left
-- (empty: in service), whether half-open, outages, affinity hits and
-- moves, its models' budgets the step met and those it forgot, its
-- adaptive limit (``spec_of``), and the member of each grant.
local member_rows = {}
if pooled then
  H.in_flight, H.pause, H.budget = 0, 0, ''
  for _, M in ipairs(MEMBERS) do
    H.in_flight = H.in_flight + M.in_flight
    member_rows[#member_rows + 1] = M.name
    member_rows[#member_rows + 1] = M.limit or ''
    member_rows[#member_rows + 1] = M.in_flight
    member_rows[#member_rows + 1] = M.pause
    member_rows[#member_rows + 1] = M.budget
    member_rows[#member_rows + 1] = M.fails
    member_rows[#member_rows + 1] = M.out and whole(M.out - now) or ''
    member_rows[#member_rows + 1] = M.half and 1 or 0
    member_rows[#member_rows + 1] = M.outs
    member_rows[#member_rows + 1] = M.hits
    member_rows[#member_rows + 1] = M.moves
    member_rows[#member_rows + 1] = M.model_rows
    member_rows[#member_rows + 1] = M.forgotten
    member_rows[#member_rows + 1] = spec_of(M)
  end
end
return {granted, H.limit or '', H.in_flight, queued, waiting, H.pause, now, H.budget, spec,
  tenant_rows, model_rows, xm and 1 or 0, epoch, forgotten, member_rows, granted_on}
