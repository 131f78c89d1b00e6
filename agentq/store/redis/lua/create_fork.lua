--!df flags=allow-undeclared-keys
-- Creates a thread from a copied snapshot, in status 'waiting'.
-- KEYS[1]: meta, [2]: latest, [3]: checkpoint n, [4]: set of owned keys, [due index].
-- ARGV[1]: status prefix or '', [2] new thread id, [3] snapshot bytes, [4] n, [5] node
-- ('' for none), [6] task name, [7] input (msgpack) or '', [8] the new thread's key
-- prefix, [9] the names of the append-only fields (msgpack; '' for none), [10] the send
-- options (msgpack; '' for none), [11] the request's id, [12] the fork's incarnation, [13]
-- how many append-only logs follow, each as (field, count, count items), then how many
-- artifacts follow, each as (sha256, bytes), then the LangGraph keys to write (msgpack
-- commands; '' for none).
-- Returns {1, meta as a flat HGETALL list, ops}, also to the same request resent after
-- its reply was lost, or {0, 0, ops} if the id is taken.
local meta = KEYS[1]
if redis.call('EXISTS', meta) == 1 then
  if applied(meta, ARGV[11]) then
    return {1, redis.call('HGETALL', meta), sync(meta, ARGV[2])}
  end
  return {0, 0, sync(meta, ARGV[2])}
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.WAITING, 'step', ARGV[4], 'task', ARGV[6], 'attempts', 0,
  'crashes', 0, 'fence', 0, 'first', ARGV[4], 'created_at', tostring(now),
  'updated_at', tostring(now), 'request', ARGV[11], 'incarnation', ARGV[12])
if ARGV[5] ~= '' then
  redis.call('HSET', meta, 'node', ARGV[5])
end
if ARGV[7] ~= '' then
  redis.call('HSET', meta, 'input', ARGV[7])
end
if ARGV[9] ~= '' then
  redis.call('HSET', meta, 'log_fields', ARGV[9])
end
if ARGV[10] ~= '' then
  redis.call('HSET', meta, 'options', ARGV[10])
end
local i = 14
for _ = 1, tonumber(ARGV[13]) do
  local field, count = ARGV[i], tonumber(ARGV[i + 1])
  for from = i + 2, i + 1 + count, 1000 do
    redis.call('RPUSH', ARGV[8] .. 'log:' .. field, unpack(ARGV, from, math.min(from + 999, i + 1 + count)))
  end
  redis.call('SADD', ARGV[8] .. 'logs', field)
  i = i + 2 + count
end
local artifacts = tonumber(ARGV[i])
for a = i + 1, i + 2 * artifacts, 2 do
  local key = ARGV[8] .. 'artifact:' .. ARGV[a]
  redis.call('SET', key, ARGV[a + 1])
  redis.call('SADD', KEYS[4], key)
end
local graph = ARGV[i + 1 + 2 * artifacts]
if graph ~= '' then
  -- Owned, so deleting or expiring the fork deletes them with it.
  for _, command in ipairs(cmsgpack.unpack(graph)) do
    redis.call(unpack(command))
    redis.call('SADD', KEYS[4], command[2])
  end
end
redis.call('SET', KEYS[2], ARGV[4])
redis.call('SET', KEYS[3], ARGV[3])
local ops = index(meta, ARGV[2], '', STATUS.WAITING, 'clear', now)
return {1, redis.call('HGETALL', meta), ops}
