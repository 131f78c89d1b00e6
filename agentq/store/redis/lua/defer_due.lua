-- Pushes the due time of a thread the sweeper has just sent, unless a worker took it
-- since (its fencing token went up) or its status changed.
-- KEYS[1]: meta (then the due index, on a single server).  ARGV[1]: status-index prefix
-- ('' on Redis Cluster), [2]: thread id, [3]: the status it was sent in, [4]: its fencing
-- token then, [5]: seconds from now.
-- Returns {1 if deferred else 0, ops}.
local state = redis.call('HMGET', KEYS[1], 'status', 'fence')
if state[1] ~= ARGV[3] or tonumber(state[2] or '0') ~= tonumber(ARGV[4]) then
  return {0, 0}
end
local now = now_seconds()
return {1, index(KEYS[1], ARGV[2], state[1], '', now + tonumber(ARGV[5]), now)}
