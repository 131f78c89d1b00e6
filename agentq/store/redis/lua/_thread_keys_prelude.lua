-- Shared by the concurrency-key scripts (enter_key, leave_key, wake_keys, key_states).
-- A key's slots are a hash: thread id -> the lease token that owns the slot, or 'r' for
-- a slot reserved for a woken thread that has not entered yet. Its queue is a zset:
-- thread id -> the Unix time it was parked, strictly increasing per key (ties would fall
-- back to the ids' order). Thread keys are built as <thread prefix>{<id>}:<suffix>.

local function thread_key(tp, id, suffix)
  return tp .. '{' .. id .. '}:' .. suffix
end

-- Whether thread `id`'s slot entry is live: a token's while that lease lasts (so a
-- killed worker's slot dies with its lease), a reservation while the thread may start.
local function slot_live(tp, id, entry)
  if entry == 'r' then
    local status = redis.call('HGET', thread_key(tp, id, 'meta'), 'status')
    return status and LIVE[status] or false
  end
  local lock = redis.call('GET', thread_key(tp, id, 'lock'))
  return lock and string.sub(lock, 1, #entry + 1) == entry .. ':' or false
end

-- Drops the dead slots of `holders`; returns how many are live.
local function live_slots(holders, tp)
  local flat = redis.call('HGETALL', holders)
  local live = 0
  for i = 1, #flat, 2 do
    if slot_live(tp, flat[i], flat[i + 1]) then
      live = live + 1
    else
      redis.call('HDEL', holders, flat[i])
    end
  end
  return live
end

-- Wakes waiters, first parked first, while fewer than `cap` slots are live: each leaves
-- the queue with a reserved slot and, if parked, is due at `now + grace`. A waiter that
-- stopped meanwhile (deleted, or no longer live) is dropped. Returns the woken ids.
local function wake(holders, queue, tp, cap, live, grace, now)
  local woken = {}
  while live < cap do
    local first = redis.call('ZRANGE', queue, 0, 0)
    if #first == 0 then
      break
    end
    local id = first[1]
    redis.call('ZREM', queue, id)
    local meta = thread_key(tp, id, 'meta')
    local status = redis.call('HGET', meta, 'status')
    if status and LIVE[status] then
      redis.call('HSET', holders, id, 'r')
      redis.call('HDEL', meta, 'parked')
      live = live + 1
      if status == STATUS.QUEUED then
        index(meta, id, status, '', now + grace, now)
      end
      woken[#woken + 1] = id
    end
  end
  return woken
end

-- Forgets a key nobody holds or waits for.
local function forget_if_idle(holders, queue, state, active, key)
  if redis.call('HLEN', holders) == 0 and redis.call('ZCARD', queue) == 0 then
    redis.call('DEL', state)
    redis.call('SREM', active, key)
  end
end
