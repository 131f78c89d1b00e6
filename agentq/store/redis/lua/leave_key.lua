--!df flags=allow-undeclared-keys
-- Gives back a thread's slot of its concurrency key and wakes the waiters it frees.
-- KEYS[1]: the key's slots hash, [2] its queue zset, [3] its state hash, [4] the set of
-- active keys, [due index].
-- ARGV[1]: status prefix, [2] thread key prefix, [3] thread id, [4] token, [5] start
-- grace in seconds, [6] the key's name, [7] its cap as declared now ('' keeps the one
-- stored).
-- Returns the woken thread ids.
local holders, queue, state, active = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('HGET', holders, ARGV[3]) == ARGV[4] then
  redis.call('HDEL', holders, ARGV[3])
end
-- The cap declared now: one a deploy raised frees slots that the cap stored by the last
-- thread entering would leave idle until the next sweep.
local cap = tonumber(ARGV[7])
if cap then
  redis.call('HSET', state, 'cap', cap)
else
  cap = tonumber(redis.call('HGET', state, 'cap') or '1')
end
local live = live_slots(holders, ARGV[2])
local woken = wake(holders, queue, ARGV[2], cap, live, tonumber(ARGV[5]), now_seconds())
forget_if_idle(holders, queue, state, active, ARGV[6])
return woken
