-- Store the fleet's configured budgets (Ledger.set_budget). ARGV, as
-- SetBudgetArgs.pack lays it out: requests per minute, tokens per minute
-- (each empty: none configured), channel, and the model (empty: the
-- provider's budgets, over all its models). A configured budget replaces
-- the stored one of its kind, its level kept (at most the new capacity);
-- none configured turns a configured budget of that kind into a learned
-- one (which learning refills from the next figures), and leaves a learned
-- one alone. A model's budgets live in ``m:<model>`` (its charges and
-- unanswered leases in ``mc:<model>`` and ``mu:<model>``), and models are
-- counted from then on (``extend``).
local model = ARGV[4]
local h = conf
if model ~= '' then
  extend()
  h = prefix .. 'm:' .. model
end
for j, k in ipairs({'r', 't'}) do
  local per_minute = tonumber(ARGV[j])
  local c = redis.call('HMGET', h, k .. '_cap', k .. '_rate', k .. '_lvl',
    k .. '_at', k .. '_cfg')
  if per_minute then
    local lvl = per_minute
    local b = c[1] and load_bucket(c[1], c[2], c[3], c[4], c[5])
    if b then lvl = math.max(-per_minute, math.min(b.lvl, per_minute)) end
    redis.call('HSET', h, k .. '_cap', num(per_minute), k .. '_rate',
      num(per_minute / 60000), k .. '_lvl', num(lvl), k .. '_at', now, k .. '_cfg', 1,
      k .. '_own', num(lvl))
  elseif c[5] == '1' then
    redis.call('HDEL', h, k .. '_cap', k .. '_rate', k .. '_lvl', k .. '_at',
      k .. '_cfg', k .. '_own')
  end
end
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
expire_idle(now)
redis.call('PUBLISH', ARGV[3], 'wake')
return 0
