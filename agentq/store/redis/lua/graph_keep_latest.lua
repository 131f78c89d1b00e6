--!df flags=allow-undeclared-keys
-- Keeps only the latest LangGraph checkpoint of each namespace, its writes and the blobs
-- it reads.
-- KEYS[1] meta, [2] lock, [3] owned, [4] namespace set.
-- ARGV[1] token or '', [2] thread key base.
-- Returns {1, 0}, or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
for _, ens in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  for _, id in ipairs(redis.call('ZRANGE', base .. 'ids:' .. ens, 0, -2)) do
    drop_checkpoint(base, ens, id, KEYS[3])
  end
  collect(base, ens, KEYS[3])
end
return {1, 0}
