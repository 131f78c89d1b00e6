--!df flags=allow-undeclared-keys
-- Creates a thread as 'queued' unless it exists.
-- KEYS[1]: meta, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] task name, [4] input (msgpack, '' for
-- none), [5] start grace in seconds, [6] send options (msgpack, '' for none), [7] the id of
-- the task sending it ('' for none), [8] the thread's incarnation, [9] its entry node ('' for
-- none): where it is until its first checkpoint names the next.
-- Returns {created 0|1, meta as a flat HGETALL list, index ops}.
local meta = KEYS[1]
if redis.call('EXISTS', meta) == 1 then
  return {0, redis.call('HGETALL', meta), sync(meta, ARGV[2])}
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.QUEUED, 'step', -1, 'task', ARGV[3], 'attempts', 0,
  'crashes', 0, 'fence', 0, 'first', 0, 'created_at', tostring(now), 'updated_at', tostring(now),
  'incarnation', ARGV[8])
if ARGV[4] ~= '' then
  redis.call('HSET', meta, 'input', ARGV[4])
end
if ARGV[6] ~= '' then
  redis.call('HSET', meta, 'options', ARGV[6])
end
if ARGV[7] ~= '' then
  redis.call('HSET', meta, 'origin', ARGV[7])
end
if ARGV[9] ~= '' then
  redis.call('HSET', meta, 'node', ARGV[9])
end
local ops = index(meta, ARGV[2], '', STATUS.QUEUED, now + tonumber(ARGV[5]), now)
return {1, redis.call('HGETALL', meta), ops}
