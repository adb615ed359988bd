-- Store a limit (Ledger.set_limit). ARGV, as SetLimitArgs.pack lays it
-- out: the limit (as store_limit takes it), whether to overwrite one already
-- stored ('1') or only fill a gap ('0'), channel, then the member of a
-- group whose limit it is (empty or absent: the provider itself). Returns
-- the stored limit and, for an adaptive one, its bounds and signal.
as_member(ARGV[4])
if ARGV[2] == '1' then
  store_limit(ARGV[1])
  redis.call('PUBLISH', ARGV[3], 'wake')
elseif not stored_limit(redis.call('HGET', conf, 'limit')) then
  store_limit(ARGV[1])
end
local c = redis.call('HMGET', conf, 'limit', 'a_min', 'a_max', 'a_backoff', 'a_signal')
if c[2] then return {c[1], c[2] .. ',' .. c[3] .. ',' .. c[4] .. ',' .. (c[5] or '')} end
return {c[1] or '', ''}
