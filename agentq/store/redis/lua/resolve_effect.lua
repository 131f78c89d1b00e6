--!df flags=allow-undeclared-keys
-- Settles a pending effect record as an operator found it, then queues the thread again.
-- KEYS[1]: meta, [2]: lock, [3]: effect record, [4]: the thread's set of owned keys,
-- [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] start grace in seconds, [4] '1' when
-- the effect did not run (the record goes) else '0', [5] the result (msgpack) it recorded,
-- [6] the request's id, [7..] the statuses it may be settled in.
-- Returns {1, meta as a flat HGETALL list, ops}, also to the same request resent after
-- its reply was lost; {THREAD_NOT_FOUND, 0, 0};
-- {LEASE_HELD, ms left, ops}; {STATUS_REFUSED, current status, ops}; {NOT_CLAIMED, 0, ops}
-- no record; {NOT_HOLDER, holder, ops} when the record is done already.
local meta = KEYS[1]
local status = redis.call('HGET', meta, 'status')
if not status then
  return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
end
if applied(meta, ARGV[6]) then
  return {1, redis.call('HGETALL', meta), sync(meta, ARGV[2])}
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then
  return {REFUSAL.LEASE_HELD, ttl, sync(meta, ARGV[2])}
end
if not listed_from(7, status) then
  return {REFUSAL.STATUS_REFUSED, status, sync(meta, ARGV[2])}
end
local state = redis.call('HGET', KEYS[3], 'state')
if not state then
  return {REFUSAL.NOT_CLAIMED, 0, sync(meta, ARGV[2])}
end
if state ~= 'pending' then
  return {REFUSAL.NOT_HOLDER, tonumber(redis.call('HGET', KEYS[3], 'token')), sync(meta, ARGV[2])}
end
-- A new fence: a worker frozen with the old token cannot record over this.
local fence = redis.call('HINCRBY', meta, 'fence', 1)
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[3])
  redis.call('SREM', KEYS[4], KEYS[3])
else
  redis.call('HSET', KEYS[3], 'state', 'done', 'token', fence, 'result', ARGV[5])
  redis.call('HDEL', KEYS[3], 'claim')
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.QUEUED, 'attempts', 0, 'crashes', 0, 'updated_at',
  tostring(now), 'request', ARGV[6])
redis.call('HDEL', meta, 'error', 'cancel')
local ops = index(meta, ARGV[2], status, STATUS.QUEUED, now + tonumber(ARGV[3]), now)
return {1, redis.call('HGETALL', meta), ops}
