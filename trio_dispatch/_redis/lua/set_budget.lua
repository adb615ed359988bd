-- Store the fleet's configured budgets (Ledger.set_budget). ARGV, as
-- SetBudgetArgs.pack lays it out: requests per minute, tokens per minute
-- (each empty: none configured), channel, and the model (empty: the
-- provider's budgets, over all its models), then the member of a group
-- whose budgets they are (empty or absent: the provider itself), then the
-- group's members. See store_budget.
as_member(ARGV[5])
store_budget(ARGV[4], {tonumber(ARGV[1]), tonumber(ARGV[2])}, false, {unpack(ARGV, 6)})
expire_idle(now)
redis.call('PUBLISH', ARGV[3], 'wake')
return 0
