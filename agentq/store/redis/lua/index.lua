--!df flags=allow-undeclared-keys
-- Puts a thread's entries in the global indexes as a thread script returned them (Redis
-- Cluster only): in the status index of its status and no other, in the due index at its
-- due time or not at all. Idempotent, so a resent operation repairs what a lost call
-- left. Entries older than those applied last for the thread (two callers' second calls
-- crossing) change nothing; the same ones again are put back as they were (undoing a
-- sweeper's hold on the due time: a retrying thread sent early is due at its retry time).
-- KEYS[1]: due index, [2]: hash thread id -> index_seq of the entries applied last.
-- ARGV[1]: status-index prefix; ARGV[2..6]: the ops (thread_id, status or '-' for a
-- deleted thread, status-index score, due time or 'clear' or 'keep', index_seq).
-- Returns 1 if applied, 0 if older than what is there.
local id, status, due = ARGV[2], ARGV[3], ARGV[5]
if status == '-' then
  -- A delete's entries arriving after the id was made again (a newer life, counted from
  -- its later creation) leave that life's entries alone.
  if tonumber(ARGV[6]) < tonumber(redis.call('HGET', KEYS[2], id) or '-1') then
    return 0
  end
  for _, each in pairs(STATUS) do
    redis.call('ZREM', ARGV[1] .. each, id)
  end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return 1
end
local seq = tonumber(ARGV[6])
local applied = tonumber(redis.call('HGET', KEYS[2], id) or '-1')
if seq < applied then
  return 0
end
redis.call('HSET', KEYS[2], id, seq)
for _, each in pairs(STATUS) do
  if each ~= status then
    redis.call('ZREM', ARGV[1] .. each, id)
  end
end
redis.call('ZADD', ARGV[1] .. status, ARGV[4], id)
if due == 'clear' then
  redis.call('ZREM', KEYS[1], id)
elseif due ~= 'keep' then
  redis.call('ZADD', KEYS[1], due, id)
end
return 1
