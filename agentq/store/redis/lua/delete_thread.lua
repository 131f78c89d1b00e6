--!df flags=allow-undeclared-keys
-- Deletes a thread and every key it owns.
-- KEYS[1]: meta, [2]: latest, [3]: lock, [4]: set of owned keys, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] checkpoint key prefix, [4] '' or a
-- Unix time: then only delete if the thread is in one of ARGV[6..] and was last updated
-- before it; [5] the thread's key prefix; [6..] the statuses gc may delete.
-- Returns {1, graph, ops} if deleted, where graph lists the escaped ids of the LangGraph
-- runs it held checkpoints of, false if it held no LangGraph checkpoint; {0, {}, ops} if
-- absent (maybe deleted by this very request, whose reply was lost: its LangGraph index
-- entries may be left), {0, false, 0} if (with ARGV[4]) not deletable.
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then
  -- On Redis Cluster a resend finds the thread gone, and its entries maybe not (the first
  -- run's index call lost): they go now. A single server removed them with the thread.
  return {0, {}, ARGV[1] == '' and index(meta, ARGV[2], '', '-', 'clear', 0) or 0}
end
if ARGV[4] ~= '' then
  if not listed_from(6, status) or tonumber(redis.call('HGET', meta, 'updated_at')) >= tonumber(ARGV[4]) then
    return {0, false, 0}
  end
end
local parked = redis.call('HGET', meta, 'parked')
if parked then
  redis.call('ZREM', parked, ARGV[2])
end
local first = tonumber(redis.call('HGET', meta, 'first') or '0')
local latest = tonumber(redis.call('GET', KEYS[2]) or '-1')
for s = first, latest do
  redis.call('DEL', ARGV[3] .. s)
end
-- The LangGraph indexes live outside the thread's slot: the caller cleans them.
local graph, runs = ARGV[5] .. 'lg:', false
for _, key in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  if string.sub(key, 1, #graph) == graph then
    runs = runs or {}
    if string.sub(key, #graph + 1, #graph + 4) == 'run:' then
      table.insert(runs, string.sub(key, #graph + 5))
    end
  end
  redis.call('DEL', key)
end
for _, field in ipairs(redis.call('SMEMBERS', ARGV[5] .. 'logs')) do
  redis.call('DEL', ARGV[5] .. 'log:' .. field)
end
redis.call('DEL', ARGV[5] .. 'logs', ARGV[5] .. 'staged')
-- The index ops before the meta goes: they count on from its index_seq.
local ops = index(meta, ARGV[2], status, '-', 'clear', now_seconds())
redis.call('DEL', meta, KEYS[2], KEYS[3], KEYS[4])
return {1, runs, ops}
