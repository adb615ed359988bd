-- End the pause and the backoff streak (Ledger.resume). ARGV, as
-- ResumeArgs.pack lays it out: channel, then the member of a group
-- resumed (empty or absent: the provider itself).
as_member(ARGV[2])
redis.call('HDEL', conf, 'pause_until')
redis.call('HSET', conf, 'streak', 0)
redis.call('DEL', grantno)
expire_idle(now)
redis.call('PUBLISH', ARGV[1], 'wake')
return 0
