--!df flags=allow-undeclared-keys
-- A page of threads for a list of them, with the status counts, in one round trip.
-- KEYS[1]: a status index (they share one slot: it routes the call on Redis Cluster).
-- ARGV[1]: status-index prefix; [2], [3]: what comes before and after a thread id in its
-- meta key ('' for both: the page's ids alone, on Redis Cluster, where the metas live in
-- other slots), [4]: after it in its lock key; [5], [6]: the score and id of the entry
-- the page goes on after ('' for the first page); [7]: limit; [8]: the status listed, ''
-- for all; [9..]: every status, in the order the counts are returned.
-- Returns one cmsgpack string {counts, rows}: a parser reads one reply instead of
-- hundreds. Each row is {id, score, status, step, node, task, attempts, crashes,
-- updated_at, error, cancel, interrupt or result, lock}, false for what is absent, or
-- {id, score} for ids alone. Entries come newest first: by score, then by id, both
-- descending, as ZREVRANGE orders one index; the pages of all statuses are merged so.
local prefix, before, after_meta, after_lock = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local after_score, after_id = ARGV[5], ARGV[6]
local limit, wanted = tonumber(ARGV[7]), ARGV[8]

-- Whether id a sorts before id b as a sorted set orders equal scores: by bytes (Lua's own
-- `<` follows the server's locale).
local function sorts_before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- The first `limit` entries of one index after the cursor, as ZREVRANGE WITHSCORES gives
-- them: from the cursor's rank while its thread still stands there (O(log n)), else from
-- its score, since that thread moved on or was deleted.
local function page(index)
  if after_score == '' then
    return redis.call('ZREVRANGE', index, 0, limit - 1, 'WITHSCORES')
  end
  if redis.call('ZSCORE', index, after_id) == after_score then
    local rank = redis.call('ZREVRANK', index, after_id)
    return redis.call('ZREVRANGE', index, rank + 1, rank + limit, 'WITHSCORES')
  end
  local found = {}
  local ties = redis.call('ZREVRANGEBYSCORE', index, after_score, after_score, 'WITHSCORES')
  for i = 1, #ties, 2 do
    if sorts_before(ties[i], after_id) and #found < 2 * limit then
      found[#found + 1], found[#found + 2] = ties[i], ties[i + 1]
    end
  end
  local left = limit - #found / 2
  if left > 0 then
    local below = redis.call('ZREVRANGEBYSCORE', index, '(' .. after_score, '-inf',
      'WITHSCORES', 'LIMIT', 0, left)
    for i = 1, #below do
      found[#found + 1] = below[i]
    end
  end
  return found
end

local counts, pages = {}, {}
for i = 9, #ARGV do
  local index = prefix .. ARGV[i]
  counts[#counts + 1] = redis.call('ZCARD', index)
  if limit > 0 and (wanted == '' or wanted == ARGV[i]) then
    pages[#pages + 1] = page(index)
  end
end

-- Merged newest first; `entries` holds id, score pairs. One index is in order already.
local entries, heads = {}, {}
if #pages == 1 then
  entries = pages[1]
end
for p = 1, #pages do
  heads[p] = 1
end
while #pages > 1 and #entries < 2 * limit do
  local best, best_score, best_id = nil, nil, nil
  for p = 1, #pages do
    local id = pages[p][heads[p]]
    if id then
      local score = tonumber(pages[p][heads[p] + 1])
      if best == nil or score > best_score
          or (score == best_score and sorts_before(best_id, id)) then
        best, best_score, best_id = p, score, id
      end
    end
  end
  if best == nil then
    break
  end
  entries[#entries + 1], entries[#entries + 2] = best_id, pages[best][heads[best] + 1]
  heads[best] = heads[best] + 2
end

local rows = {}
for n = 1, #entries, 2 do
  local id, score = entries[n], entries[n + 1]
  if before == '' then
    rows[#rows + 1] = {id, score}
  else
    local meta = before .. id .. after_meta
    local row = redis.call('HMGET', meta, 'status', 'step', 'node', 'task', 'attempts',
      'crashes', 'updated_at', 'error', 'cancel')
    local status = row[1]
    if status then -- deleted since the index was read: not listed
      local note, lock = false, false
      if status == STATUS.WAITING then
        note = redis.call('HGET', meta, 'interrupt')
      elseif status == STATUS.DONE then
        note = redis.call('HGET', meta, 'result')
      elseif status == STATUS.RUNNING then
        lock = redis.call('GET', before .. id .. after_lock)
      end
      rows[#rows + 1] = {id, score, status, row[2], row[3], row[4], row[5], row[6], row[7],
        row[8], row[9], note, lock}
    end
  end
end
return cmsgpack.pack({counts, rows})
