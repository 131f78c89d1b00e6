--!df flags=allow-undeclared-keys
-- Keeps only the latest LangGraph checkpoint of each namespace and the ones ARGV[3] names
-- for it, their writes and the blobs they read.
-- KEYS[1] meta, [2] lock, [3] owned, [4] namespace set.
-- ARGV[1] token or '', [2] thread key base, [3] msgpack map: escaped namespace -> ids.
-- Returns {1, 0}, or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local keep = cmsgpack.unpack(ARGV[3])
for _, ens in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  local kept = {}
  for _, id in ipairs(keep[ens] or {}) do
    kept[id] = true
  end
  for _, id in ipairs(redis.call('ZRANGE', base .. 'ids:' .. ens, 0, -2)) do
    if not kept[id] then
      drop_checkpoint(base, ens, id, KEYS[3])
    end
  end
  collect(base, ens, KEYS[3])
end
return {1, 0}
