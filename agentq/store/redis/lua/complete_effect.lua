-- Records an effect's result under the claim that ran it.
-- KEYS[1]: effect record, [2]: meta (omitted for a shared record on Redis Cluster).
-- ARGV[1]: token, [2]: result bytes, [3]: the thread completing a shared record ('' for
-- a thread's own): tokens count per thread, so another thread's claim may hold the same.
-- Returns {1, token, 0}; {STALE_TOKEN, fence, 0}; {THREAD_NOT_FOUND, 0, 0};
-- {NOT_CLAIMED, 0, 0} no record; {NOT_HOLDER, holder, 0} when not pending under this token.
local refused = refuse_stale_effect(ARGV[1])
if refused then
  return refused
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {REFUSAL.NOT_CLAIMED, 0, 0}
end
local holder = redis.call('HGET', KEYS[1], 'token')
local claimant = redis.call('HGET', KEYS[1], 'thread')
local mine = holder == ARGV[1] and (ARGV[3] == '' or not claimant or claimant == ARGV[3])
-- A client that resends after a lost reply finds its own write: report it as done.
if state == 'done' and mine and redis.call('HGET', KEYS[1], 'result') == ARGV[2] then
  return {1, tonumber(ARGV[1]), 0}
end
if state ~= 'pending' or not mine then
  return {REFUSAL.NOT_HOLDER, tonumber(holder), 0}
end
redis.call('HSET', KEYS[1], 'state', 'done', 'result', ARGV[2])
-- A done record is answered from its state; the claim's id only served while pending.
redis.call('HDEL', KEYS[1], 'claim')
return {1, tonumber(ARGV[1]), 0}
