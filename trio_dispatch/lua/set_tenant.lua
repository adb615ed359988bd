-- Store a tenant's settings (Ledger.set_tenant). ARGV, as SetTenantArgs.pack
-- lays it out: the tenant, its weight (empty: back to the defaults, the
-- tenant is no longer configured), its cap (empty: none), channel. The
-- latest writer wins. What the tenant received so far is folded into its
-- counter at the old weight; an unconfigured tenant with nothing held or
-- waiting is forgotten (it starts again from the floor). Tenants are
-- counted from now on if they were not (``extend``), but for the defaults
-- where no tenant is counted: they change nothing, as in the pure core.
local t, weight, cap, chan = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if weight == '' and not redis.call('HGET', conf, 'xm') then return 0 end
extend()
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
expire_idle(now)
redis.call('PUBLISH', chan, 'wake')
return 0
