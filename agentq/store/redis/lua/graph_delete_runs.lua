--!df flags=allow-undeclared-keys
-- Deletes the thread's LangGraph checkpoints written by the given runs, and the blobs no
-- remaining checkpoint reads.
-- KEYS[1] meta, [2] lock, [3] owned.
-- ARGV[1] token or '', [2] thread key base, [3..] escaped run ids.
-- Returns {1, 1} if the thread holds no LangGraph checkpoint any more, {1, 0} if it does,
-- or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local touched, seen = {}, {}
for i = 3, #ARGV do
  local runs = base .. 'run:' .. ARGV[i]
  for _, member in ipairs(redis.call('SMEMBERS', runs)) do
    local sep = string.find(member, ':', 1, true)
    local ens = string.sub(member, 1, sep - 1)
    drop_checkpoint(base, ens, string.sub(member, sep + 1), KEYS[3])
    if not seen[ens] then
      seen[ens] = true
      table.insert(touched, ens)
    end
  end
  redis.call('DEL', runs)
  redis.call('SREM', KEYS[3], runs)
end
for _, ens in ipairs(touched) do
  collect(base, ens, KEYS[3])
end
return {1, redis.call('SCARD', base .. 'ns') == 0 and 1 or 0}
