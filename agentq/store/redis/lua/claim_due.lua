-- Takes the threads that are due now and pushes each one's due time ahead.
-- KEYS[1]: due index, [2]: the last claim (a list: its request id, then the ids taken).
-- ARGV[1]: hold in seconds, [2]: limit, [3]: this claim's request id.
-- Returns the thread ids taken. A claim sent again after its reply was lost returns
-- what its first run took: those threads are no longer due, and would otherwise wait
-- out the hold before any sweeper sent them.
if redis.call('LINDEX', KEYS[2], 0) == ARGV[3] then
  return redis.call('LRANGE', KEYS[2], 1, -1)
end
local now = now_seconds()
local hold = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then
  -- No write, none to fsync, for the sweeps that find nothing: a resend of this claim
  -- may take what became due since, as a new claim would.
  return ids
end
redis.call('DEL', KEYS[2])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], now + hold, id)
  redis.call('RPUSH', KEYS[2], id)
end
-- Kept as long as the hold: a resend later than that finds its threads due again anyway.
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], math.max(1, math.ceil(hold * 1000)))
return ids
