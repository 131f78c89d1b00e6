--!df flags=allow-undeclared-keys
-- Takes a thread's lease and hands out the next fencing token.
-- KEYS[1]: lock, [2]: meta, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] owner, [4] ttl in ms.
-- Returns {1, token, ops}; {LEASE_HELD, remaining ms, 0} while another owner holds it;
-- {THREAD_NOT_FOUND, 0, 0}; {RETRY_NOT_DUE, ms until its retry time, ops} for a retrying
-- thread sent early, whose due time goes back to its retry time (on Redis Cluster the
-- sweeper claimed it on another node's clock, and pushed it a start grace ahead).
local status = redis.call('HGET', KEYS[2], 'status')
if not status then
  return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
end
if status == STATUS.RETRYING then
  local at, now = tonumber(redis.call('HGET', KEYS[2], 'retry_at') or '0'), now_seconds()
  if at > now then
    return {REFUSAL.RETRY_NOT_DUE, math.ceil((at - now) * 1000), index(ARGV[2], '', '', at, now)}
  end
end
local current = redis.call('GET', KEYS[1])
if current then
  local sep = string.find(current, ':', 1, true)
  if string.sub(current, sep + 1) ~= ARGV[3] then
    return {REFUSAL.LEASE_HELD, redis.call('PTTL', KEYS[1]), 0}
  end
end
local token = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('SET', KEYS[1], token .. ':' .. ARGV[3], 'PX', ARGV[4])
local ops = 0
if LIVE[status] then
  local now = now_seconds()
  redis.call('HSET', KEYS[2], 'status', STATUS.RUNNING, 'updated_at', tostring(now))
  ops = index(ARGV[2], status, STATUS.RUNNING, now + tonumber(ARGV[4]) / 1000, now)
end
return {1, token, ops}
