-- Takes the threads that are due now and pushes each one's due time ahead.
-- KEYS[1]: due index.  ARGV[1]: hold in seconds, [2]: limit.
-- Returns the thread ids taken.
local now = now_seconds()
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
end
return ids
