-- Claims an idempotency record.
-- KEYS[1]: effect record, [2]: meta (omitted for a shared record on Redis Cluster),
-- [3]: the thread's set of owned keys (thread-scoped records only).
-- ARGV[1]: token, [2]: '1' to take over a pending record, [3]: the claim's id ('' for
-- none): a pending record holding the same id is this very claim, resent; [4] the tool's
-- name; [5] for a shared record the claiming thread's id, kept for the operator who must
-- know whether that thread still runs the call ('' for a thread's own record).
-- Returns {1, token, 0} claimed; {2, token, result} done; {3, token, 0} unknown
-- outcome; {STALE_TOKEN, fence, 0}; {THREAD_NOT_FOUND, 0, 0}.
local refused = refuse_stale_effect(ARGV[1])
if refused then
  return refused
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'done' then
  return {2, tonumber(redis.call('HGET', KEYS[1], 'token')), redis.call('HGET', KEYS[1], 'result')}
end
if state == 'pending' and ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'claim') == ARGV[3]
    and redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  return {1, tonumber(ARGV[1]), 0}
end
if state == 'pending' and ARGV[2] ~= '1' then
  return {3, tonumber(redis.call('HGET', KEYS[1], 'token')), 0}
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'token', ARGV[1], 'claim', ARGV[3], 'tool', ARGV[4],
  'at', tostring(now_seconds()))
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'thread', ARGV[5])
end
if #KEYS >= 3 then
  redis.call('SADD', KEYS[3], KEYS[1])
end
return {1, tonumber(ARGV[1]), 0}
