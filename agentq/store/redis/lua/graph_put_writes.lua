-- Stores a task's pending writes for one LangGraph checkpoint.
-- KEYS[1] meta, [2] lock, [3] owned, [4] the checkpoint's writes hash, [5] its hash of
-- the writes other runs made, [6] the writing run's set (only with a run id).
-- ARGV[1] token or '', [2] '<escaped ns>:<id>', the checkpoint as its run's set names it,
-- [3] '%writes:<escaped ns>:<escaped id>', as another run's set names its writes to it
-- (no escaped namespace starts with '%w'), [4] the escaped run id or '', [5..] (field,
-- value, '1' to replace or '0' to keep a stored one).
-- Returns {1, {run's first}}: 1 where the run held nothing in the thread before (its index
-- entry may have gone with its data, deleted elsewhere), else 0; or a refusal (see
-- _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local run = ARGV[4]
local first = (run ~= '' and redis.call('SCARD', KEYS[6]) == 0) and 1 or 0
-- A run's writes to its own checkpoint go with the checkpoint; only those it makes to
-- another run's (the one it resumed from) are recorded for delete_for_runs.
local other = run ~= '' and redis.call('SISMEMBER', KEYS[6], ARGV[2]) == 0
local recorded = false
for i = 5, #ARGV, 3 do
  local stored = true
  if ARGV[i + 2] == '1' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  else
    stored = redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1]) == 1
  end
  if stored and other then
    redis.call('HSET', KEYS[5], ARGV[i], run)
    recorded = true
  elseif stored then
    redis.call('HDEL', KEYS[5], ARGV[i])
  end
end
redis.call('SADD', KEYS[3], KEYS[4])
if recorded then
  redis.call('SADD', KEYS[6], ARGV[3])
  redis.call('SADD', KEYS[3], KEYS[5], KEYS[6])
end
return {1, {first}}
