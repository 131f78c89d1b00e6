--!df flags=allow-undeclared-keys
-- Deletes the thread's LangGraph checkpoints written by the given runs with their writes,
-- the writes those runs made to other runs' checkpoints, and the blobs no remaining
-- checkpoint reads; once no checkpoint is left, every LangGraph key of the thread.
-- KEYS[1] meta, [2] lock, [3] owned.
-- ARGV[1] token or '', [2] thread key base, [3..] escaped run ids.
-- Returns {1, {0}} if the thread still holds LangGraph checkpoints, {1, {1, escaped run
-- ids of the other runs' sets deleted with its last ones...}} if it does not, or a refusal
-- (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local deleted = {}
for i = 3, #ARGV do
  deleted[ARGV[i]] = true
end
local touched, seen = {}, {}
for i = 3, #ARGV do
  local runs = base .. 'run:' .. ARGV[i]
  for _, member in ipairs(redis.call('SMEMBERS', runs)) do
    local writes = string.sub(member, 1, 8) == '%writes:'
    if writes then
      member = string.sub(member, 9)
    end
    local sep = string.find(member, ':', 1, true)
    local ens = string.sub(member, 1, sep - 1)
    if writes then
      drop_run_writes(base, ens, string.sub(member, sep + 1), deleted, KEYS[3])
    else
      drop_checkpoint(base, ens, string.sub(member, sep + 1), KEYS[3])
      if not seen[ens] then
        seen[ens] = true
        table.insert(touched, ens)
      end
    end
  end
  redis.call('DEL', runs)
  redis.call('SREM', KEYS[3], runs)
end
for _, ens in ipairs(touched) do
  collect(base, ens, KEYS[3])
end
if redis.call('SCARD', base .. 'ns') > 0 then
  return {1, {0}}
end
-- What is left names checkpoints that are gone: other runs' sets (their writes went with
-- the checkpoints they were made to, or their checkpoints with a prune).
local emptied = {1}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if string.sub(key, 1, #base) == base then
    if string.sub(key, #base + 1, #base + 4) == 'run:' then
      table.insert(emptied, string.sub(key, #base + 5))
    end
    redis.call('DEL', key)
    redis.call('SREM', KEYS[3], key)
  end
end
return {1, emptied}
