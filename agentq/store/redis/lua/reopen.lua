--!df flags=allow-undeclared-keys
-- Queues a thread again that nobody drives, if its status allows it.
-- KEYS[1]: meta, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] start grace in seconds, [4] resume
-- value (msgpack) or '' for none, [5] the request's id, [6..] the statuses it may be
-- reopened from.
-- Returns {1, meta as a flat HGETALL list, ops}, also to the same request resent after
-- its reply was lost; {THREAD_NOT_FOUND, 0, 0}; {STATUS_REFUSED, current status, ops}
-- when the status does not allow it.
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then
  return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
end
if applied(meta, ARGV[5]) then
  return {1, redis.call('HGETALL', meta), sync(meta, ARGV[2])}
end
if not listed_from(6, status) then
  return {REFUSAL.STATUS_REFUSED, status, sync(meta, ARGV[2])}
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.QUEUED, 'attempts', 0, 'crashes', 0, 'updated_at',
  tostring(now), 'request', ARGV[5], 'reopened', 1)
redis.call('HDEL', meta, 'error', 'cancel', 'interrupt')
-- A status write of the last driver, sent again after its reply was lost, is refused
-- rather than undo this.
redis.call('HINCRBY', meta, 'fence', 1)
if status == STATUS.WAITING then
  -- Answered before its timeout: the timeout never fires.
  redis.call('HDEL', meta, 'timeout', 'timeout_at')
end
if ARGV[4] ~= '' then
  redis.call('HSET', meta, 'resume', ARGV[4])
end
local ops = index(meta, ARGV[2], status, STATUS.QUEUED, now + tonumber(ARGV[3]), now)
return {1, redis.call('HGETALL', meta), ops}
