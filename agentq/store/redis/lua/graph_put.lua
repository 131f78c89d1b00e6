-- Stores one LangGraph checkpoint and its new blobs.
-- KEYS[1] meta, [2] lock, [3] owned, [4] namespace set, [5] ids, [6] records, [7] refs,
-- [8] blobs, [9] the run's set (only with a run id).
-- ARGV[1] token or '', [2] escaped namespace, [3] checkpoint id, [4] record, [5] refs,
-- [6] '<escaped ns>:<id>' for the run's set, [7] '1' to clear the thread's attempts and
-- lost workers (crashes) or '', [8..] blob (field, value) pairs.
-- Returns {1, {thread's first, run's first}}: 1 where the thread held no LangGraph
-- checkpoint, or none of the run, before this one (its index entries may have gone with
-- its data, deleted elsewhere), else 0; or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local first = {redis.call('SCARD', KEYS[4]) == 0 and 1 or 0,
  (#KEYS > 8 and redis.call('SCARD', KEYS[9]) == 0) and 1 or 0}
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[5], 0, ARGV[3])
redis.call('HSET', KEYS[6], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[7], ARGV[3], ARGV[5])
if #ARGV > 7 then
  redis.call('HSET', KEYS[8], unpack(ARGV, 8))
end
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[1], 'attempts', 0, 'crashes', 0)
end
if #KEYS > 8 then
  redis.call('SADD', KEYS[9], ARGV[6])
end
-- Registered with the thread's keys, so deleting the agentq thread deletes these too.
redis.call('SADD', KEYS[3], unpack(KEYS, 4))
return {1, first}
