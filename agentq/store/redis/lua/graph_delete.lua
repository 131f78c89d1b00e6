--!df flags=allow-undeclared-keys
-- Deletes every LangGraph key of the thread.
-- KEYS[1] meta, [2] lock, [3] owned.
-- ARGV[1] token or '', [2] thread key base.
-- Returns {1, escaped run ids whose sets were deleted}, or a refusal (see
-- _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local runs = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if string.sub(key, 1, #base) == base then
    if string.sub(key, #base + 1, #base + 4) == 'run:' then
      table.insert(runs, string.sub(key, #base + 5))
    end
    redis.call('DEL', key)
    redis.call('SREM', KEYS[3], key)
  end
end
redis.call('DEL', base .. 'ns')
return {1, runs}
