-- Writes checkpoint n if the token is current and the latest step is n-1.
-- KEYS[1]: meta, [2]: latest, [3]: checkpoint n, [4]: lock, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] token, [4] n, [5] snapshot bytes,
-- [6] status, [7] due in seconds ('' for none), [8] '<token>:<owner>' to release or '',
-- [9] checkpoint key prefix, [10] keep_last, [11] the thread's key prefix, [12] how many
-- append-only logs follow, each as (field, length before, count, count items); then
-- meta (field, value) pairs.
-- Returns {1, cancel requested 0|1, ops}; {-1, current fence, 0} for a stale token;
-- {-2, latest, 0} for a step conflict; {-3, 0, 0} for an unknown thread; {-7, field, 0}
-- when a log's length is not the one the checkpoint extends. A refusal writes nothing.
local meta = KEYS[1]
local refused = refuse_stale(meta, ARGV[3])
if refused then
  return refused
end
local step = tonumber(ARGV[4])
local latest = tonumber(redis.call('GET', KEYS[2]) or '-1')
-- A client that resends after a lost reply finds its own write: report it as done.
if latest == step and redis.call('GET', KEYS[3]) == ARGV[5] then
  return {1, redis.call('HGET', meta, 'cancel') == '1' and 1 or 0, 0}
end
if latest ~= step - 1 then
  return {-2, latest, 0}
end
local logs = {}
local i = 13
for _ = 1, tonumber(ARGV[12]) do
  local log = {key = ARGV[11] .. 'log:' .. ARGV[i], field = ARGV[i],
               before = tonumber(ARGV[i + 1]), first = i + 3, count = tonumber(ARGV[i + 2])}
  if redis.call('LLEN', log.key) ~= log.before then
    return {-7, log.field, 0}
  end
  logs[#logs + 1] = log
  i = log.first + log.count
end
for _, log in ipairs(logs) do
  -- unpack() is bounded by Lua's stack, so long appends go in slices.
  for from = log.first, log.first + log.count - 1, 1000 do
    redis.call('RPUSH', log.key, unpack(ARGV, from, math.min(from + 999, log.first + log.count - 1)))
  end
  redis.call('HSET', ARGV[11] .. 'logs', log.field, log.before + log.count)
end
redis.call('SET', KEYS[3], ARGV[5])
redis.call('SET', KEYS[2], step)
local first = tonumber(redis.call('HGET', meta, 'first') or '0')
local keep_from = step - tonumber(ARGV[10]) + 1
if keep_from > first then
  for s = first, keep_from - 1 do
    redis.call('DEL', ARGV[9] .. s)
  end
  redis.call('HSET', meta, 'first', keep_from)
end
local ops = update_thread(meta, KEYS[4], ARGV[2], ARGV[6], ARGV[7], ARGV[8], i)
local cancel = 0
if redis.call('HGET', meta, 'cancel') == '1' then
  cancel = 1
end
return {1, cancel, ops}
