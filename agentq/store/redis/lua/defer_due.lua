-- Spaces out the sends of a queued thread the sweeper has just sent again and no worker
-- took since (its fencing token is unchanged): queued for more than two holds, it is due
-- after as long as it has been queued, up to `cap` holds, rather than a hold from now.
-- KEYS[1]: meta (then the due index, on a single server).  ARGV[1]: status-index prefix
-- ('' on Redis Cluster), [2]: thread id, [3]: its fencing token when sent, [4]: the hold
-- in seconds, [5]: the cap in holds.
-- Returns {1 if deferred else 0, ops}.
local state = redis.call('HMGET', KEYS[1], 'status', 'fence', 'updated_at')
if state[1] ~= STATUS.QUEUED or not state[3] or tonumber(state[2] or '0') ~= tonumber(ARGV[3]) then
  return {0, 0}
end
local now = now_seconds()
local hold = tonumber(ARGV[4])
local queued_for = now - tonumber(state[3])
if queued_for <= 2 * hold then
  return {0, 0}
end
local delay = math.min(queued_for, tonumber(ARGV[5]) * hold)
return {1, index(KEYS[1], ARGV[2], state[1], '', now + delay, now)}
