-- Drops a pending claim whose call was refused before it could take effect.
-- KEYS[1]: effect record, [2]: meta (omitted for a shared record on Redis Cluster),
-- [3]: the thread's set of owned keys (thread-scoped records only).
-- ARGV[1]: token, [2]: the claim's id.
-- Returns {1, token, 0} dropped, or already gone (a resend after a lost reply);
-- {STALE_TOKEN, fence, 0}; {THREAD_NOT_FOUND, 0, 0}; {NOT_HOLDER, holder, 0} when not this
-- claim pending under this token (a shared key's holder may be another thread).
local refused = refuse_stale_effect(ARGV[1])
if refused then
  return refused
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {1, tonumber(ARGV[1]), 0}
end
local holder = redis.call('HGET', KEYS[1], 'token')
if state ~= 'pending' or holder ~= ARGV[1] or redis.call('HGET', KEYS[1], 'claim') ~= ARGV[2] then
  return {REFUSAL.NOT_HOLDER, tonumber(holder), 0}
end
redis.call('DEL', KEYS[1])
if #KEYS >= 3 then
  redis.call('SREM', KEYS[3], KEYS[1])
end
return {1, tonumber(ARGV[1]), 0}
