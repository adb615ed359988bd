-- A rate-limit report pauses the fleet (Ledger.pause). ARGV, as
-- PauseArgs.pack lays it out: the server's delay in ms (empty: none), the
-- default pause, the longest pause (ms). The backoff is the local policy's,
-- kept fleet-wide, and so is the adaptive limit's decrease: once per round
-- of reports (a report after a grant since the latest decrease). Then the
-- member of a group paused (empty or absent: the provider itself).
local delay, default, longest = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
as_member(ARGV[4])
local streak = stored(redis.call('HGET', conf, 'streak'), 0)
local granted = redis.call('HGET', conf, 'granted') or '0'
local step = tonumber(redis.call('HGET', conf, 'step') or default)
if streak == 0 or granted ~= redis.call('HGET', conf, 'granted_at_report') then
  if streak > 0 then step = math.min(2 * step, longest) else step = default end
  redis.call('HSET', conf, 'streak', streak + 1, 'step', step,
    'granted_at_report', granted)
end
-- The adaptive limit decreases once per round of reports: at the first
-- report since a grant (``a_dec`` marks a decrease with no grant since; a
-- limit made adaptive meanwhile has not seen the round), as Throttle's
-- rate_limited.
local a = redis.call('HMGET', conf, 'limit', 'a_min', 'a_max', 'a_backoff', 'a_dec')
if a[2] and a[5] ~= '1' then
  local value = math.max(tonumber(a[2]), tonumber(a[1]) * tonumber(a[4]))
  local new = math.min(tonumber(a[3]), math.max(tonumber(a[2]), math.floor(value)))
  redis.call('HSET', conf, 'limit', whole(new), 'a_val', num(value), 'a_slow', 0,
    'a_dec', 1)
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
if ARGV[4] and ARGV[4] ~= '' then rehome(ARGV[4]) end
return paused_for()
