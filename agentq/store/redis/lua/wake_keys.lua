--!df flags=allow-undeclared-keys
-- For every active concurrency key: reclaims dead slots (a lease that expired, a reserved
-- thread that stopped) and wakes as many waiters as slots are free, due now.
-- KEYS[1]: the set of active keys, [due index].
-- ARGV[1]: status prefix, [2] thread key prefix, [3] concurrency key prefix.
-- Returns the woken thread ids.
local woken, now = {}, now_seconds()
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local base = ARGV[3] .. key .. '/'
  local holders, queue, state = base .. 'holders', base .. 'queue', base .. 'state'
  local cap = tonumber(redis.call('HGET', state, 'cap') or '1')
  local live = live_slots(holders, ARGV[2])
  for _, id in ipairs(wake(holders, queue, ARGV[2], cap, live, 0, now)) do
    woken[#woken + 1] = id
  end
  forget_if_idle(holders, queue, state, KEYS[1], key)
end
return woken
