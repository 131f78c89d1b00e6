--!df flags=allow-undeclared-keys
-- Settles a pending effect record as an operator found it, then queues the thread again.
-- KEYS[1]: meta, [2]: lock, [3]: effect record (none for 'apart'), [4]: the thread's set
-- of owned keys ('own' only), [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] start grace in seconds, [4] '1' when
-- the effect did not run (the record goes) else '0', [5] the result (msgpack) it recorded,
-- [6] the request's id, [7] the record: 'own' (the thread's), 'shared' (a global one) or
-- 'apart' (a global one on Redis Cluster, in another slot: settle_shared.lua settled it
-- just before, this only checks and queues the thread), [8] the key prefix of threads
-- ('<prefix>thread:'), [9..] the statuses it may be settled in.
-- A shared record is refused while the thread that claimed it (its 'thread' field) holds
-- its lease: that thread may still be running the call, and records it itself.
-- Returns {1, meta as a flat HGETALL list, ops}, also to the same request resent after
-- its reply was lost; {THREAD_NOT_FOUND, 0, 0};
-- {LEASE_HELD, ms left, ops} for this thread's lease, {LEASE_HELD, {ms left, claimant},
-- ops} for the claimant's; {STATUS_REFUSED, current status, ops}; {NOT_CLAIMED, 0, ops}
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
if not listed_from(9, status) then
  return {REFUSAL.STATUS_REFUSED, status, sync(meta, ARGV[2])}
end
local record = ARGV[7] ~= 'apart' and KEYS[3]
if record then
  local state = redis.call('HGET', record, 'state')
  if not state then
    return {REFUSAL.NOT_CLAIMED, 0, sync(meta, ARGV[2])}
  end
  if state ~= 'pending' then
    return {REFUSAL.NOT_HOLDER, tonumber(redis.call('HGET', record, 'token')), sync(meta, ARGV[2])}
  end
  local claimant = ARGV[7] == 'shared' and redis.call('HGET', record, 'thread')
  if claimant then
    local held = redis.call('PTTL', ARGV[8] .. '{' .. claimant .. '}:lock')
    if held > 0 then
      return {REFUSAL.LEASE_HELD, {held, claimant}, sync(meta, ARGV[2])}
    end
  end
end
-- A new fence: a worker frozen with the old token cannot record over this.
local fence = redis.call('HINCRBY', meta, 'fence', 1)
if record and ARGV[4] == '1' then
  redis.call('DEL', record)
  if ARGV[7] == 'own' then
    redis.call('SREM', KEYS[4], record)
  end
elseif record then
  redis.call('HSET', record, 'state', 'done', 'token', fence, 'result', ARGV[5])
  redis.call('HDEL', record, 'claim')
  if ARGV[7] == 'shared' then
    -- Its token is this thread's now, and tokens count per thread.
    redis.call('HSET', record, 'thread', ARGV[2])
  end
end
local now = now_seconds()
redis.call('HSET', meta, 'status', STATUS.QUEUED, 'attempts', 0, 'crashes', 0, 'updated_at',
  tostring(now), 'request', ARGV[6], 'reopened', 1)
redis.call('HDEL', meta, 'error', 'cancel')
local ops = index(meta, ARGV[2], status, STATUS.QUEUED, now + tonumber(ARGV[3]), now)
return {1, redis.call('HGETALL', meta), ops}
