-- On Redis Cluster, where a shared record lives in another slot than the thread: reads
-- the thread's copy of the record's outcome, or keeps one, under the thread's token.
-- KEYS[1]: meta, [2]: the thread's set of owned keys, [3]: the copy.
-- ARGV[1]: token, [2]: '' to read, else the token the outcome was recorded under, then
-- [3] the result (msgpack) to keep.
-- Returns {1, token, result} the copy; {0, 0, 0} none; {STALE_TOKEN, fence, 0};
-- {THREAD_NOT_FOUND, 0, 0}.
local refused = refuse_stale(KEYS[1], ARGV[1])
if refused then
  return refused
end
if ARGV[2] ~= '' then
  keep_shared_copy(KEYS[3], KEYS[2], ARGV[2], ARGV[3])
  return {1, tonumber(ARGV[2]), ARGV[3]}
end
local kept = redis.call('HMGET', KEYS[3], 'token', 'result')
if not kept[1] then
  return {0, 0, 0}
end
return {1, tonumber(kept[1]), kept[2]}
