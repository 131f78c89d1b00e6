-- Stores a task's pending writes for one LangGraph checkpoint.
-- KEYS[1] meta, [2] lock, [3] owned, [4] the checkpoint's writes hash.
-- ARGV[1] token or '', [2..] (field, value, '1' to replace or '0' to keep a stored one).
-- Returns {1, 0}, or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '1' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  else
    redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1])
  end
end
redis.call('SADD', KEYS[3], KEYS[4])
return {1, 0}
