-- Settles a pending shared effect record on Redis Cluster, where it lives in another slot
-- than the thread it stopped: the caller checked the thread and the record's claimant just
-- before, and resolve_effect.lua checks the thread again and queues it just after.
-- KEYS[1]: the shared record.
-- ARGV[1]: the token and [2] the claim's id ('' for none) the record was read pending
-- under: a record claimed again since is left alone, its new claimant may be running the
-- call; [3] '1' when the effect did not run (the record goes) else '0', [4] the result
-- (msgpack) it recorded, [5] the token and [6] the thread it is then held under (the
-- thread's next fence: tokens count per thread), [7] the request's id.
-- Returns {1, 0, 0} settled, also to the same request resent after its reply was lost;
-- {NOT_CLAIMED, 0, 0} no record; {NOT_HOLDER, holder, 0} when it is done already or was
-- claimed again.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  if ARGV[3] == '1' then
    -- Gone, as asked: this request's own deletion, resent, or another person's.
    return {1, 0, 0}
  end
  return {REFUSAL.NOT_CLAIMED, 0, 0}
end
local holder = redis.call('HGET', KEYS[1], 'token')
if state == 'done' and redis.call('HGET', KEYS[1], 'request') == ARGV[7] then
  return {1, 0, 0}
end
if state ~= 'pending' or holder ~= ARGV[1] or (redis.call('HGET', KEYS[1], 'claim') or '') ~= ARGV[2] then
  return {REFUSAL.NOT_HOLDER, tonumber(holder), 0}
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'state', 'done', 'token', ARGV[5], 'result', ARGV[4], 'thread', ARGV[6],
    'request', ARGV[7])
  redis.call('HDEL', KEYS[1], 'claim')
end
return {1, 0, 0}
