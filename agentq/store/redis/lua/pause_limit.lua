-- Pauses a limit key until now + ARGV[1] ms, unless it is paused longer already.
-- KEYS[1]: the limit's state hash. Returns 1.
local until_at = now_seconds() + tonumber(ARGV[1]) / 1000
local paused = tonumber(redis.call('HGET', KEYS[1], 'paused') or '0')
if until_at > paused then
  redis.call('HSET', KEYS[1], 'paused', tostring(until_at))
end
return 1
