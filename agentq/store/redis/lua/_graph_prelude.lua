-- Shared by the LangGraph scripts (graph_*.lua), loaded after _prelude.lua.
--
-- Every script runs on one thread's keys, which share the thread's hash tag, so it is
-- atomic on Redis Cluster too. Keys a script builds from ARGV (a namespace's keys, found
-- in the namespace set) carry the same tag. Replies: {1, x} on success; a refusal is
-- {STALE_TOKEN, fence, 0}, {THREAD_NOT_FOUND, 0, 0} (unknown agentq thread) or
-- {LEASE_HELD, ttl ms, 0} (an unfenced write while a lease is held).

-- Fencing for a LangGraph write: token '' is a writer outside a graph task, allowed only
-- while no graph task holds the lease; a token must be the thread's current fence.
local function refuse_graph_write(meta, lock, token)
  if token == '' then
    local ttl = redis.call('PTTL', lock)
    if ttl > 0 then
      return {REFUSAL.LEASE_HELD, ttl, 0}
    end
    return nil
  end
  return refuse_stale(meta, token)
end

-- Mirrors graph_keys.escape() in Python: a namespace or id holds no ':' once escaped.
local function escape(s)
  return (string.gsub(s, '[%%:]', {['%'] = '%25', [':'] = '%3A'}))
end

-- One checkpoint as the client reads it: {id, record, refs, blobs, writes}. With
-- ``wanted`` (a set of channel names), only those channels' blobs, and refs naming them.
local function row(base, ens, id, wanted)
  local record = redis.call('HGET', base .. 'cp:' .. ens, id)
  if not record then
    return false
  end
  local refs = redis.call('HGET', base .. 'refs:' .. ens, id) or ''
  local fields = {}
  if refs ~= '' then
    fields = cmsgpack.unpack(refs)
  end
  if wanted then
    local kept = {}
    for _, f in ipairs(fields) do
      if wanted[cmsgpack.unpack(f)[1]] then
        table.insert(kept, f)
      end
    end
    fields = kept
    refs = #kept > 0 and cmsgpack.pack(kept) or ''
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
  for _, kind in ipairs({'w:', 'wr:'}) do
    local key = base .. kind .. ens .. ':' .. escape(id)
    redis.call('DEL', key)
    redis.call('SREM', owned, key)
  end
end

-- Deletes the writes that the runs in ``runs`` (a set of escaped run ids) made to the
-- checkpoint, as its hash of other runs' writes records them.
local function drop_run_writes(base, ens, eid, runs, owned)
  local w, wr = base .. 'w:' .. ens .. ':' .. eid, base .. 'wr:' .. ens .. ':' .. eid
  local by = redis.call('HGETALL', wr)
  for i = 1, #by, 2 do
    if runs[by[i + 1]] then
      redis.call('HDEL', w, by[i])
      redis.call('HDEL', wr, by[i])
    end
  end
  for _, key in ipairs({w, wr}) do
    if redis.call('EXISTS', key) == 0 then
      redis.call('SREM', owned, key)
    end
  end
end

-- Deletes the namespace's blobs that no remaining checkpoint reads, and the namespace
-- itself once it holds no checkpoint; with the last namespace the owned set forgets the
-- namespace set too, or a saver's thread with no agentq thread would keep it for good.
local function collect(base, ens, owned)
  if redis.call('ZCARD', base .. 'ids:' .. ens) == 0 then
    for _, kind in ipairs({'ids:', 'cp:', 'refs:', 'blob:'}) do
      redis.call('DEL', base .. kind .. ens)
      redis.call('SREM', owned, base .. kind .. ens)
    end
    redis.call('SREM', base .. 'ns', ens)
    if redis.call('SCARD', base .. 'ns') == 0 then
      redis.call('SREM', owned, base .. 'ns')
    end
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
