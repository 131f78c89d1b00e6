--!df flags=allow-undeclared-keys
-- Cancels a thread: at once if nobody drives it, at the next step boundary if running
-- under a live lease.
-- KEYS[1]: meta, [2]: lock, [due index].  ARGV[1]: status prefix or '', [2] thread id.
-- Returns {1, status afterwards, ops}, or {THREAD_NOT_FOUND, 0, 0}.
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then
  return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
end
if FINISHED[status] then
  return {1, status, sync(meta, ARGV[2])}
end
redis.call('HSET', meta, 'cancel', '1')
if status == STATUS.RUNNING and redis.call('EXISTS', KEYS[2]) == 1 then
  return {1, status, sync(meta, ARGV[2])}
end
-- A thread parked on a concurrency key leaves its queue: it will never start.
local parked = redis.call('HGET', meta, 'parked')
if parked then
  redis.call('ZREM', parked, ARGV[2])
  redis.call('HDEL', meta, 'parked')
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.CANCELLED, 'updated_at', tostring(now))
redis.call('HINCRBY', meta, 'fence', 1)  -- as reopen.lua does
redis.call('HDEL', meta, 'timeout_at')
return {1, STATUS.CANCELLED, index(meta, ARGV[2], status, STATUS.CANCELLED, 'clear', now)}
