-- Store a tenant's settings (Ledger.set_tenant). ARGV, as SetTenantArgs.pack
-- lays it out: the tenant, its weight (empty: back to the defaults, the
-- tenant is no longer configured), its cap (empty: none), channel, then a
-- group's members. The latest writer wins. See store_tenant.
if not store_tenant(ARGV[1], ARGV[2], ARGV[3], {unpack(ARGV, 5)}) then return 0 end
expire_idle(now)
redis.call('PUBLISH', ARGV[4], 'wake')
return 0
