--!df flags=allow-undeclared-keys
-- Gives a thread a slot of its concurrency key, or parks it in the key's queue.
-- KEYS[1]: the key's slots hash, [2] its queue zset, [3] its state hash (cap, last),
-- [4] the set of active keys, [5] the thread's meta, [6] its lock, [due index].
-- ARGV[1]: status prefix, [2] thread key prefix, [3] thread id, [4] token, [5] owner,
-- [6] cap, [7] the key's name, [8] its limit hash (whose 'takes' counts entries),
-- [9] 'parked', [10] the queue's key name.
-- Returns {1, 0, 0} when seated; {1, position, ops} when parked (the thread is queued,
-- out of the due index, its lease released), also to the same call resent after its
-- reply was lost; {1, -1, 0} when its cancel was asked for (CANCEL_REQUESTED in
-- agentq.store.contract.thread_keys: neither seated nor parked); {STALE_TOKEN, fence, 0};
-- {STATUS_REFUSED, status, 0} unless the thread is running; {THREAD_NOT_FOUND, 0, 0}.
local holders, queue, state, active, meta, lock = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, token, cap = ARGV[3], ARGV[4], tonumber(ARGV[6])
local refused = refuse_stale(meta, token)
if refused then
  return refused
end
-- Only a thread about to run may wait: parking one that stopped would queue it again.
local status = redis.call('HGET', meta, 'status')
if status ~= STATUS.RUNNING then
  local parked = redis.call('ZRANK', queue, id)
  if status == STATUS.QUEUED and parked and redis.call('HGET', meta, 'parked') == ARGV[10] then
    -- Parked by this very call (the fence is still its token): redis-py sent it again.
    return {1, parked + 1, sync(meta, id)}
  end
  return {REFUSAL.STATUS_REFUSED, status, 0}
end
-- Asked to stop since its driver took the lease (cancel() only flags a running thread):
-- parked, it would wait in the queue for a turn it must not take. Its driver cancels it.
if redis.call('HGET', meta, 'cancel') == '1' then
  return {1, -1, 0}
end
-- Counted with the key's takes, so doctor sees a threads-only limit in use.
redis.call('HINCRBY', ARGV[8], 'takes', 1)
redis.call('HSET', state, 'cap', cap)
redis.call('SADD', active, ARGV[7])
-- A slot of this thread's (reserved, or its previous lease's) stays its own.
if redis.call('HEXISTS', holders, id) == 1 then
  redis.call('HSET', holders, id, token)
  return {1, 0, 0}
end
local free = cap - live_slots(holders, ARGV[2])
local rank = redis.call('ZRANK', queue, id)
if free > 0 and ((not rank and redis.call('ZCARD', queue) == 0) or (rank and rank < free)) then
  if rank then
    redis.call('ZREM', queue, id)
    redis.call('HDEL', meta, 'parked')
  end
  redis.call('HSET', holders, id, token)
  return {1, 0, 0}
end
if not rank then
  local last = tonumber(redis.call('HGET', state, 'last') or '0')
  local at = math.max(now_seconds(), last + 0.000001)
  redis.call('HSET', state, 'last', string.format('%.17g', at))
  redis.call('ZADD', queue, at, id)
  rank = redis.call('ZCARD', queue) - 1
end
local ops = update_thread(meta, lock, id, STATUS.QUEUED, '', token .. ':' .. ARGV[5], 9)
return {1, rank + 1, ops}
