-- Shared by every script that moves a thread between statuses or in the due index.
--
-- Convention for those scripts: ARGV[1] is the status-index key prefix and the due index
-- key is the last of KEYS, so the indexes change in the same atomic step. On Redis
-- Cluster the indexes live in another slot: the caller then passes ARGV[1] = '' and no
-- due key, and the script returns the thread's index entries ("ops") for index.lua to
-- apply next. Those ops are the thread's state, not its change: the due time is kept in
-- the meta ('due_at') beside the status and updated_at (the status index's score), and
-- every reply of a script that found the thread carries them, also the "already done"
-- and refused ones. So when the second call is lost (a lost reply, a failover of the
-- index node, a client crash) and the caller sends the operation again, the resend puts
-- the indexes where the meta says, whatever the first run left. Each change also counts
-- up 'index_seq', which index.lua keeps per thread, so an older state whose second call
-- arrives late never overwrites a newer one.
--
-- The status names (STATUS.RUNNING, ...) and the sets LIVE, IDLE and FINISHED come before
-- this prelude, generated from agentq.records, so no script spells a status set by hand.
--
-- A script that addresses keys it builds from a key prefix (checkpoints it prunes, logs,
-- the status indexes) beside those in KEYS starts with Dragonfly's line
-- `--!df flags=allow-undeclared-keys` (a comment elsewhere); the loader puts it first,
-- before this prelude. Scripts whose keys are all in KEYS go without it.

-- Every refusal reply is {REFUSAL.<name>, value, ...}: one meaning per code in every
-- script, the same names as agentq.store.redis.refusal.Refusal (a test keeps them equal).
local REFUSAL = {
  STALE_TOKEN = -1,
  STEP_CONFLICT = -2,
  THREAD_NOT_FOUND = -3,
  NOT_CLAIMED = -4,
  NOT_HOLDER = -5,
  STATUS_REFUSED = -6,
  LOG_CONFLICT = -7,
  RETRY_NOT_DUE = -8,
  LEASE_HELD = -9,
}

-- Whether `status` is one of ARGV[first], ARGV[first + 1], ...
local function listed_from(first, status)
  for i = first, #ARGV do
    if ARGV[i] == status then
      return true
    end
  end
  return false
end

-- Whether the operator's request `id` (reopen, resolve_effect, create_fork) is the one the
-- thread's meta last applied: sent again by the client after its reply was lost, it
-- answers as it did, rather than be refused by the state it left.
local function applied(meta, id)
  return redis.call('HGET', meta, 'request') == id
end

local function now_seconds()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- new_status: a status, '' for no change, '-' to leave the status indexes (deletion).
-- due: a Unix time, 'keep' or 'clear'.
local function apply_index(due_key, status_prefix, thread_id, old_status, new_status, due, now)
  if old_status and old_status ~= '' and new_status ~= '' and new_status ~= old_status then
    redis.call('ZREM', status_prefix .. old_status, thread_id)
  end
  if new_status ~= '' and new_status ~= '-' then
    redis.call('ZADD', status_prefix .. new_status, now, thread_id)
  end
  if due == 'clear' then
    redis.call('ZREM', due_key, thread_id)
  elseif due ~= 'keep' then
    redis.call('ZADD', due_key, due, thread_id)
  end
end

-- On Redis Cluster, the thread's index entries as its meta stands: {thread_id, status,
-- updated_at, due_at ('clear', a Unix time, or 'keep' for a thread written before
-- due_at was kept), index_seq}; 0 on a single server, whose indexes never lag, or for a
-- thread that does not exist.
local function sync(meta, thread_id)
  if ARGV[1] ~= '' then
    return 0
  end
  local state = redis.call('HMGET', meta, 'status', 'updated_at', 'due_at', 'index_seq')
  if not state[1] then
    return 0
  end
  return {thread_id, state[1], state[2], state[3] or 'keep', state[4] or '0'}
end

-- Moves the thread from old_status to new_status ('' for no change, '-' for deleted) and
-- sets its due time (see apply_index): at once on a single server; on Redis Cluster
-- through the meta, returning sync()'s ops (for a deleted thread, ops that remove it).
local function index(meta, thread_id, old_status, new_status, due, now)
  if ARGV[1] ~= '' then
    apply_index(KEYS[#KEYS], ARGV[1], thread_id, old_status or '', new_status, due, now)
    return 0
  end
  if new_status == '-' then
    -- Counted as one more change of the life being deleted, and from the server's clock
    -- in microseconds: the id made again meanwhile by another client (a thread sent again
    -- while gc deletes it) counts on from its creation's later time, and index.lua leaves
    -- that newer life's entries alone when this call arrives after them.
    local t = redis.call('TIME')
    local seq = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
    local kept = tonumber(redis.call('HGET', meta, 'index_seq') or '0')
    return {thread_id, '-', '0', 'clear', string.format('%.0f', math.max(seq, kept + 1))}
  end
  if due ~= 'keep' then
    redis.call('HSET', meta, 'due_at', due == 'clear' and due or string.format('%.17g', due))
  end
  if redis.call('HEXISTS', meta, 'index_seq') == 0 then
    -- Counted from the server's clock in microseconds, not from 1: a thread id deleted
    -- and created again must not start below what index.lua kept for its last life.
    local t = redis.call('TIME')
    redis.call('HSET', meta, 'index_seq', t[1] .. string.format('%06d', tonumber(t[2])))
  end
  redis.call('HINCRBY', meta, 'index_seq', 1)
  return sync(meta, thread_id)
end

-- A thread starting to wait for a human: with a timeout ('' for none) it is due at
-- `due`, when acquire.lua takes it out of the wait; a new question replaces any earlier
-- wait's timeout and its unanswered copy.
local function wait_for_human(meta, due_in, due)
  redis.call('HDEL', meta, 'timed_out')
  if due_in == '' then
    redis.call('HDEL', meta, 'timeout', 'timeout_at')
  else
    redis.call('HSET', meta, 'timeout', due_in, 'timeout_at', string.format('%.17g', due))
  end
end

-- Sets the status, then ARGV[first_field..] as (field, value) pairs ('' deletes the
-- field), releases the lease if it is still `release` ('' to keep it), and schedules the
-- thread `due_in` seconds from now ('' takes it out of the due index).
local function update_thread(meta, lock, thread_id, new_status, due_in, release, first_field)
  local now = now_seconds()
  local old_status = redis.call('HGET', meta, 'status')
  if new_status == STATUS.WAITING and redis.call('HGET', meta, 'cancel') == '1' then
    -- Asked to stop while the node that asks ran: its wait is the step boundary the
    -- cancel stops it at, in this same write, so no resume ever finds it waiting (a
    -- resume clears the request).
    new_status, due_in = STATUS.CANCELLED, ''
  end
  redis.call('HSET', meta, 'status', new_status, 'updated_at', tostring(now))
  for i = first_field, #ARGV, 2 do
    if ARGV[i + 1] == '' then
      redis.call('HDEL', meta, ARGV[i])
    else
      redis.call('HSET', meta, ARGV[i], ARGV[i + 1])
    end
  end
  if release ~= '' and redis.call('GET', lock) == release then
    redis.call('DEL', lock)
  end
  local due = 'clear'
  if due_in ~= '' then
    due = now + tonumber(due_in)
    if new_status == STATUS.RETRYING then
      -- acquire.lua refuses the thread until then, on this server's clock; every digit,
      -- as acquire.lua puts it back in the due index.
      redis.call('HSET', meta, 'retry_at', string.format('%.17g', due))
    end
  end
  if new_status == STATUS.WAITING then
    wait_for_human(meta, due_in, due)
  end
  return index(meta, thread_id, old_status, new_status, due, now)
end

-- Fencing check shared by every driver write: {code, fence} on refusal, nil when allowed.
local function refuse_stale(meta, token)
  local fence = tonumber(redis.call('HGET', meta, 'fence'))
  if not fence then
    return {REFUSAL.THREAD_NOT_FOUND, 0, 0}
  end
  if fence ~= tonumber(token) then
    return {REFUSAL.STALE_TOKEN, fence, 0}
  end
  return nil
end

-- The same for an effect script, whose KEYS[2] is the thread's meta, absent for a shared
-- record on Redis Cluster (the caller checks the token just before, in another slot).
local function refuse_stale_effect(token)
  if #KEYS >= 2 then
    return refuse_stale(KEYS[2], token)
  end
  return nil
end
