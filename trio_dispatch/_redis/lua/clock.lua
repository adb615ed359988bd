-- The time of every step: the Redis server's own clock, in milliseconds
-- (never a client's).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
