--!df flags=allow-undeclared-keys
-- Takes a thread's lease and hands out the next fencing token.
-- KEYS[1]: lock, [2]: meta, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] owner, [4] ttl in ms, [5] '1' for a
-- driver about to run it: only a thread that runs by itself (live, or waiting with a
-- timeout) is leased, and one running under no lease of this owner has its lost worker
-- counted in 'crashes', the new token kept in 'lost_token'.
-- A waiting thread whose timeout passed becomes running, its question copied to
-- 'timed_out' for the node that runs next; before then it is refused like an early retry.
-- Returns {1, token, the meta as HGETALL gives it, 1 if it counted a lost worker else 0,
-- ops}; {0, 0, the meta, 0, ops} for a thread ARGV[5] leaves unleased;
-- {LEASE_HELD, remaining ms, 0} while another owner holds it; {THREAD_NOT_FOUND, 0, 0};
-- {RETRY_NOT_DUE, ms until its retry time, ops} for a retrying thread sent early, whose
-- due time goes back to its retry time (on Redis Cluster the sweeper claimed it on
-- another node's clock, and pushed it a start grace ahead).
local status, retry_at, timeout_at = unpack(redis.call('HMGET', KEYS[2], 'status', 'retry_at',
  'timeout_at'))
if not status then
  return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
end
local timed_out = status == STATUS.WAITING and timeout_at
if ARGV[5] == '1' and not (LIVE[status] or timed_out) then
  return {0, 0, redis.call('HGETALL', KEYS[2]), 0, sync(KEYS[2], ARGV[2])}
end
local at = (status == STATUS.RETRYING and retry_at) or (timed_out and timeout_at)
if at then
  local now = now_seconds()
  at = tonumber(at)
  if at > now then
    -- On a single server the due time goes back by hand; on Cluster its meta holds it.
    local ops = ARGV[1] == '' and sync(KEYS[2], ARGV[2]) or index(KEYS[2], ARGV[2], '', '', at, now)
    return {REFUSAL.RETRY_NOT_DUE, math.ceil((at - now) * 1000), ops}
  end
end
local current = redis.call('GET', KEYS[1])
local held
if current then
  local sep = string.find(current, ':', 1, true)
  if string.sub(current, sep + 1) ~= ARGV[3] then
    return {REFUSAL.LEASE_HELD, redis.call('PTTL', KEYS[1]), 0}
  end
  held = string.sub(current, 1, sep - 1)
end
local token = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('SET', KEYS[1], token .. ':' .. ARGV[3], 'PX', ARGV[4])
local ops = 0
if timed_out then
  -- msgpack's nil for a question asked with no payload, stored as no field.
  local asked = redis.call('HGET', KEYS[2], 'interrupt') or '\192'
  redis.call('HSET', KEYS[2], 'timed_out', asked)
  redis.call('HDEL', KEYS[2], 'timeout_at')
end
if LIVE[status] or timed_out then
  local now = now_seconds()
  redis.call('HSET', KEYS[2], 'status', STATUS.RUNNING, 'updated_at', tostring(now))
  ops = index(KEYS[2], ARGV[2], status, STATUS.RUNNING, now + tonumber(ARGV[4]) / 1000, now)
end
local lost = 0
if ARGV[5] == '1' and status == STATUS.RUNNING then
  if not current then
    -- Its worker was lost at this step.
    redis.call('HINCRBY', KEYS[2], 'crashes', 1)
    lost = 1
  elseif redis.call('HGET', KEYS[2], 'lost_token') == held then
    -- Asked again after a lost reply: this owner finds the lease of the take that
    -- counted the lost worker, and says so again without counting it twice.
    lost = 1
  end
  if lost == 1 then
    redis.call('HSET', KEYS[2], 'lost_token', token)
  end
end
return {1, token, redis.call('HGETALL', KEYS[2]), lost, ops}
