--!df flags=allow-undeclared-keys
-- Reads every active concurrency key without changing it.
-- KEYS[1]: the set of active keys.
-- ARGV[1]: '' (no index), [2] thread key prefix, [3] concurrency key prefix.
-- Returns {{key, cap, {live slot holders}, {waiter, parked at, ...}}, ...}.
local out = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local base = ARGV[3] .. key .. '/'
  local running = {}
  local flat = redis.call('HGETALL', base .. 'holders')
  for i = 1, #flat, 2 do
    if slot_live(ARGV[2], flat[i], flat[i + 1]) then
      running[#running + 1] = flat[i]
    end
  end
  local cap = redis.call('HGET', base .. 'state', 'cap') or '1'
  out[#out + 1] = {key, cap, running, redis.call('ZRANGE', base .. 'queue', 0, -1, 'WITHSCORES')}
end
return out
