-- Cancels a thread: at once if nobody drives it, at the next step boundary if running.
-- KEYS[1]: meta, [due index].  ARGV[1]: status prefix or '', [2] thread id.
-- Returns {1, status afterwards, ops}, or {-3, 0, 0} for an unknown thread.
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then
  return {-3, 0, 0}
end
if status == 'done' or status == 'failed' or status == 'cancelled' then
  return {1, status, 0}
end
redis.call('HSET', meta, 'cancel', '1')
if status == 'running' then
  return {1, status, 0}
end
local now = now_seconds()
redis.call('HSET', meta, 'status', 'cancelled', 'updated_at', tostring(now))
return {1, 'cancelled', index(ARGV[2], status, 'cancelled', 'clear', now)}
