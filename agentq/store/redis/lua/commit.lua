--!df flags=allow-undeclared-keys
-- Writes checkpoint n if the token is current and the latest step is n-1.
-- A small snapshot comes as ARGV[12] and is SET in place. A large one's bytes are kept out
-- of Lua: the caller SETs it to the staged key first, in the same MULTI, and passes
-- ARGV[12] = ''; this script moves it into place with RENAME, or deletes it on any
-- refusal. Every write here is also appended to the AOF, where with appendfsync always
-- its bytes cost time, and every redis.call costs more than its command: a step writes
-- nothing it does not have to, and reads the latest step from the meta, where the commit
-- that wrote it put it.
-- KEYS[1]: meta, [2]: latest, [3]: checkpoint n, [4]: lock, [5]: staged snapshot,
-- [due index].
-- ARGV[1]: status prefix or '', [2] token, [3] n, [4] status, [5] due in seconds ('' for
-- none, 'keep' to leave it), [6] '<token>:<owner>' to release or '', [7] keep_last,
-- [8] node ('' for none), [9] result (msgpack; '' leaves it as it is), [10] interrupt
-- (msgpack; '' removes it; with status 'waiting' and a due time, a wait that times out;
-- a thread asked to cancel is left 'cancelled' rather than 'waiting'),
-- [11] the names of the append-only fields (msgpack; '' for none), [12] the snapshot, or
-- '' when it is staged, [13] how many logs follow, each as (field, length before, count,
-- count items).
-- The thread id and key prefix are read from KEYS[1].
-- Returns {1, cancel requested 0|1, ops} (also for a resend that finds its own write);
-- {STALE_TOKEN, current fence, 0};
-- {STEP_CONFLICT, latest, 0}; {THREAD_NOT_FOUND, 0, 0}; {LOG_CONFLICT, field, 0} when a
-- log's length is not the one the checkpoint extends; an error reply for a key of another
-- type. A refusal or an error changes no key: it deletes the staged snapshot its own
-- transaction wrote.
local meta, staged, inline = KEYS[1], KEYS[5], ARGV[12]
local function drop_staged()
  if inline == '' then
    redis.call('DEL', staged)
  end
end
local function refuse(code, value)
  drop_staged()
  return {code, value, 0}
end
local current = redis.call('HMGET', meta, 'fence', 'first', 'cancel', 'status', 'attempts',
  'crashes', 'resume', 'node', 'interrupt', 'log_fields', 'error', 'timeout', 'timed_out',
  'step')
local fence = tonumber(current[1])
if not fence then
  return refuse(REFUSAL.THREAD_NOT_FOUND, 0)
end
if fence ~= tonumber(ARGV[2]) then
  return refuse(REFUSAL.STALE_TOKEN, fence)
end
local cancel = current[3] == '1' and 1 or 0
local status, due_in = ARGV[4], ARGV[5]
if status == STATUS.WAITING and cancel == 1 then
  -- As update_thread does: a thread asked to stop never waits, so no resume finds it.
  status, due_in = STATUS.CANCELLED, ''
end
local step = tonumber(ARGV[3])
local latest = tonumber(current[14] or '-1')
if latest == step then
  -- A client that resends after a lost reply finds its own write: report it as done. Only
  -- this rare case reads a staged snapshot's bytes into Lua.
  local same = redis.call('GET', KEYS[3]) == (inline ~= '' and inline or redis.call('GET', staged))
  if not same then
    return refuse(REFUSAL.STEP_CONFLICT, latest)
  end
  drop_staged()
  return {1, cancel, sync(meta, string.match(meta, '{([^}]*)}'))}
end
if latest ~= step - 1 then
  return refuse(REFUSAL.STEP_CONFLICT, latest)
end
local base = string.sub(meta, 1, -5)
local logs = {}
local i = 14
for _ = 1, tonumber(ARGV[13]) do
  local log = {key = base .. 'log:' .. ARGV[i], field = ARGV[i], pushed = 0,
               before = tonumber(ARGV[i + 1]), first = i + 3, count = tonumber(ARGV[i + 2])}
  -- A log that grows is checked by the length RPUSH returns, below; one that does not
  -- is checked here.
  if log.count == 0 then
    local length = redis.pcall('LLEN', log.key)
    if type(length) == 'table' then
      drop_staged()
      return length
    end
    if length ~= log.before then
      return refuse(REFUSAL.LOG_CONFLICT, log.field)
    end
  end
  logs[#logs + 1] = log
  i = log.first + log.count
end
-- The snapshot goes first: only a script's first write can be refused (out of memory),
-- and a checkpoint n that already exists (the latest step is n-1) is left alone.
local placed
if inline == '' then
  placed = redis.call('RENAMENX', staged, KEYS[3]) == 1
else
  placed = redis.call('SET', KEYS[3], inline, 'NX')
end
if not placed then
  return refuse(REFUSAL.STEP_CONFLICT, latest)
end
-- Then each log's new items. A log that did not end where the checkpoint extends it (or
-- a key of another type) is refused, and what this script wrote goes again: Lua does not
-- roll back.
local function undo(reply)
  for _, log in ipairs(logs) do
    if log.pushed > 0 then
      local kept = log.length - log.pushed
      if kept == 0 then
        redis.call('DEL', log.key)
      else
        redis.call('LTRIM', log.key, 0, kept - 1)
      end
    end
    if log.added then
      redis.call('SREM', base .. 'logs', log.field)
    end
  end
  redis.call('DEL', KEYS[3])
  return reply
end
for _, log in ipairs(logs) do
  if log.before == 0 then
    local added = redis.pcall('SADD', base .. 'logs', log.field)
    if type(added) == 'table' then
      return undo(added)
    end
    log.added = added == 1
  end
  local last = log.first + log.count - 1
  -- unpack() is bounded by Lua's stack, so long appends go in slices.
  for from = log.first, last, 1000 do
    local upto = math.min(from + 999, last)
    local length = redis.pcall('RPUSH', log.key, unpack(ARGV, from, upto))
    if type(length) == 'table' then
      return undo(length)
    end
    log.pushed, log.length = log.pushed + upto - from + 1, length
  end
  if log.count > 0 and log.length ~= log.before + log.count then
    return undo({REFUSAL.LOG_CONFLICT, log.field, 0})
  end
end
local now = now_seconds()
-- One HSET and at most one HDEL, of the meta fields that change.
local set = {meta, 'updated_at', tostring(now), 'step', step}
local del = {meta}
if current[4] ~= status then
  set[#set + 1], set[#set + 2] = 'status', status
end
for j = 5, 6 do
  if current[j] and current[j] ~= '0' then
    set[#set + 1], set[#set + 2] = j == 5 and 'attempts' or 'crashes', 0
  end
end
if current[7] then
  del[#del + 1] = 'resume'
end
-- A committed step got past whatever error a retry or a failure left, and consumed the
-- timeout of an earlier wait.
for j, name in pairs({[11] = 'error', [12] = 'timeout', [13] = 'timed_out'}) do
  if current[j] then
    del[#del + 1] = name
  end
end
local first = tonumber(current[2] or '0')
local keep_from = step - tonumber(ARGV[7]) + 1
if keep_from > first then
  for s = first, keep_from - 1 do
    redis.call('DEL', base .. 'checkpoint:' .. s)
  end
  set[#set + 1], set[#set + 2] = 'first', keep_from
end
if ARGV[9] ~= '' then
  set[#set + 1], set[#set + 2] = 'result', ARGV[9]
end
-- Set when given and different, removed when not given.
for _, field in ipairs({{'node', ARGV[8], current[8]}, {'interrupt', ARGV[10], current[9]},
                        {'log_fields', ARGV[11], current[10]}}) do
  local name, value, was = field[1], field[2], field[3]
  if value ~= '' and value ~= was then
    set[#set + 1], set[#set + 2] = name, value
  elseif value == '' and was then
    del[#del + 1] = name
  end
end
if #del > 1 then
  redis.call('HDEL', unpack(del))
end
local due = 'clear'
if due_in == 'keep' then
  due = 'keep'
elseif due_in ~= '' then
  due = now + tonumber(due_in)
  if status == STATUS.WAITING then
    set[#set + 1], set[#set + 2] = 'timeout', due_in
    set[#set + 1], set[#set + 2] = 'timeout_at', string.format('%.17g', due)
  end
end
redis.call('HSET', unpack(set))
redis.call('SET', KEYS[2], step)
if ARGV[6] ~= '' and redis.call('GET', KEYS[4]) == ARGV[6] then
  redis.call('DEL', KEYS[4])
end
local thread_id = string.match(meta, '{([^}]*)}')
return {1, cancel, index(meta, thread_id, current[4], status, due, now)}
