"""The Lua scripts of the Redis backend, each with its contract at its top.

They live in Python strings rather than ``.lua`` files so that they ship with the package
whatever its data-file configuration. Every script runs on one thread's keys, which share
the thread's hash tag, so it is atomic on Redis Cluster too. Keys a script builds from
``ARGV`` (a namespace's keys, found in the namespace set) carry the same tag.

Replies: ``{1, x}`` on success; a refusal is ``{-1, fence}`` (stale token), ``{-3, 0}``
(unknown agentq thread) or ``{-4, ttl ms}`` (an unfenced write while a lease is held).
"""

from __future__ import annotations

from typing import Final

PRELUDE: Final = r"""--!df flags=allow-undeclared-keys
-- (Dragonfly's flag, a comment elsewhere: the scripts address keys built from a thread's
-- key prefix beside those in KEYS.)
-- Fencing, shared by every write: token '' is a writer outside a graph task.
local function refused(meta, lock, token)
  if token == '' then
    local ttl = redis.call('PTTL', lock)
    if ttl > 0 then
      return {-4, ttl}
    end
    return false
  end
  local fence = redis.call('HGET', meta, 'fence')
  if not fence then
    return {-3, 0}
  end
  if tonumber(fence) ~= tonumber(token) then
    return {-1, tonumber(fence)}
  end
  return false
end

-- Mirrors keys.escape() in Python: a namespace or id holds no ':' once escaped.
local function escape(s)
  return (string.gsub(s, '[%%:]', {['%'] = '%25', [':'] = '%3A'}))
end

-- One checkpoint as the client reads it: {id, record, refs, blobs, writes}.
local function row(base, ens, id)
  local record = redis.call('HGET', base .. 'cp:' .. ens, id)
  if not record then
    return false
  end
  local refs = redis.call('HGET', base .. 'refs:' .. ens, id) or ''
  local fields = {}
  if refs ~= '' then
    fields = cmsgpack.unpack(refs)
  end
  local blobs = {}
  if #fields > 0 then
    blobs = redis.call('HMGET', base .. 'blob:' .. ens, unpack(fields))
  end
  local writes = redis.call('HGETALL', base .. 'w:' .. ens .. ':' .. escape(id))
  return {id, record, refs, blobs, writes}
end

local function drop_checkpoint(base, ens, id, owned)
  redis.call('ZREM', base .. 'ids:' .. ens, id)
  redis.call('HDEL', base .. 'cp:' .. ens, id)
  redis.call('HDEL', base .. 'refs:' .. ens, id)
  local w = base .. 'w:' .. ens .. ':' .. escape(id)
  redis.call('DEL', w)
  redis.call('SREM', owned, w)
end

-- Deletes the namespace's blobs that no remaining checkpoint reads, and the namespace
-- itself once it holds no checkpoint.
local function collect(base, ens, owned)
  if redis.call('ZCARD', base .. 'ids:' .. ens) == 0 then
    for _, kind in ipairs({'ids:', 'cp:', 'refs:', 'blob:'}) do
      redis.call('DEL', base .. kind .. ens)
      redis.call('SREM', owned, base .. kind .. ens)
    end
    redis.call('SREM', base .. 'ns', ens)
    return
  end
  local used = {}
  for _, packed in ipairs(redis.call('HVALS', base .. 'refs:' .. ens)) do
    for _, f in ipairs(cmsgpack.unpack(packed)) do
      used[f] = true
    end
  end
  local blob = base .. 'blob:' .. ens
  for _, f in ipairs(redis.call('HKEYS', blob)) do
    if not used[f] then
      redis.call('HDEL', blob, f)
    end
  end
end
"""

PUT: Final = r"""
-- Stores one checkpoint and its new blobs.
-- KEYS[1] meta, [2] lock, [3] owned, [4] namespace set, [5] ids, [6] records, [7] refs,
-- [8] blobs, [9] the run's set (only with a run id).
-- ARGV[1] token or '', [2] escaped namespace, [3] checkpoint id, [4] record, [5] refs,
-- [6] '<escaped ns>:<id>' for the run's set, [7..] blob (field, value) pairs.
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('ZADD', KEYS[5], 0, ARGV[3])
redis.call('HSET', KEYS[6], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[7], ARGV[3], ARGV[5])
if #ARGV > 6 then
  redis.call('HSET', KEYS[8], unpack(ARGV, 7))
end
if #KEYS > 8 then
  redis.call('SADD', KEYS[9], ARGV[6])
end
-- Registered with the thread's keys, so deleting the agentq thread deletes these too.
redis.call('SADD', KEYS[3], unpack(KEYS, 4))
return {1, 0}
"""

PUT_WRITES: Final = r"""
-- Stores a task's pending writes for one checkpoint.
-- KEYS[1] meta, [2] lock, [3] owned, [4] the checkpoint's writes hash.
-- ARGV[1] token or '', [2..] (field, value, '1' to replace or '0' to keep a stored one).
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '1' then
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  else
    redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1])
  end
end
redis.call('SADD', KEYS[3], KEYS[4])
return {1, 0}
"""

GET: Final = r"""
-- Reads one checkpoint (or the namespace's latest) with its blobs and writes.
-- KEYS[1] ids. ARGV[1] thread key base, [2] escaped namespace, [3] id or '' for latest.
-- Returns a row (see row()) or nil.
local id = ARGV[3]
if id == '' then
  local top = redis.call('ZREVRANGE', KEYS[1], 0, 0)
  if #top == 0 then
    return false
  end
  id = top[1]
end
return row(ARGV[1], ARGV[2], id)
"""

PAGE: Final = r"""
-- Reads up to ARGV[4] checkpoints of a namespace, newest first, with ids below ARGV[3].
-- KEYS[1] ids. ARGV[1] thread key base, [2] escaped namespace, [3] id or '', [4] limit.
local high = '+'
if ARGV[3] ~= '' then
  high = '(' .. ARGV[3]
end
local rows = {}
for _, id in ipairs(redis.call('ZREVRANGEBYLEX', KEYS[1], high, '-', 'LIMIT', 0, ARGV[4])) do
  local r = row(ARGV[1], ARGV[2], id)
  if r then
    table.insert(rows, r)
  end
end
return rows
"""

DELETE: Final = r"""
-- Deletes every LangGraph key of the thread.
-- KEYS[1] meta, [2] lock, [3] owned. ARGV[1] token or '', [2] thread key base.
-- Returns {1, escaped run ids whose sets were deleted}.
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local runs = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if string.sub(key, 1, #base) == base then
    if string.sub(key, #base + 1, #base + 4) == 'run:' then
      table.insert(runs, string.sub(key, #base + 5))
    end
    redis.call('DEL', key)
    redis.call('SREM', KEYS[3], key)
  end
end
redis.call('DEL', base .. 'ns')
return {1, runs}
"""

DELETE_RUNS: Final = r"""
-- Deletes the thread's checkpoints written by the given runs, and blobs left unread.
-- KEYS[1] meta, [2] lock, [3] owned. ARGV[1] token or '', [2] thread key base,
-- [3..] escaped run ids.
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
local touched, seen = {}, {}
for i = 3, #ARGV do
  local runs = base .. 'run:' .. ARGV[i]
  for _, member in ipairs(redis.call('SMEMBERS', runs)) do
    local sep = string.find(member, ':', 1, true)
    local ens = string.sub(member, 1, sep - 1)
    drop_checkpoint(base, ens, string.sub(member, sep + 1), KEYS[3])
    if not seen[ens] then
      seen[ens] = true
      table.insert(touched, ens)
    end
  end
  redis.call('DEL', runs)
  redis.call('SREM', KEYS[3], runs)
end
for _, ens in ipairs(touched) do
  collect(base, ens, KEYS[3])
end
return {1, 0}
"""

KEEP_LATEST: Final = r"""
-- Keeps only the latest checkpoint of each namespace, its writes and the blobs it reads.
-- KEYS[1] meta, [2] lock, [3] owned, [4] namespace set. ARGV[1] token or '', [2] base.
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
local base = ARGV[2]
for _, ens in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  for _, id in ipairs(redis.call('ZRANGE', base .. 'ids:' .. ens, 0, -2)) do
    drop_checkpoint(base, ens, id, KEYS[3])
  end
  collect(base, ens, KEYS[3])
end
return {1, 0}
"""

RESTORE: Final = r"""
-- Writes a copied thread: applies commands to the target thread's own keys.
-- KEYS[1] meta, [2] lock, [3] owned. ARGV[1] token or '', [2] msgpack list of commands,
-- each {name, key, args...}; the client builds them from the source thread's keys.
local refusal = refused(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
for _, command in ipairs(cmsgpack.unpack(ARGV[2])) do
  redis.call(unpack(command))
  redis.call('SADD', KEYS[3], command[2])
end
return {1, 0}
"""

SCRIPTS: Final = {
    "put": PUT,
    "put_writes": PUT_WRITES,
    "get": GET,
    "page": PAGE,
    "delete": DELETE,
    "delete_runs": DELETE_RUNS,
    "keep_latest": KEEP_LATEST,
    "restore": RESTORE,
}
