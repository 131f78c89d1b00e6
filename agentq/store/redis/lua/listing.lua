--!df flags=allow-undeclared-keys
-- A page of threads for a list of them, with the status counts, in one round trip.
-- ARGV[1]: status-index prefix; [2], [3]: what comes before and after a thread id in its
-- meta key, [4]: after it in its lock key; [5]: offset, [6]: limit; [7]: the status
-- listed, '' for all; [8..]: every status, in the order the counts are returned.
-- Returns one cmsgpack string {counts, rows}: a parser reads one reply instead of
-- hundreds. Each row is {id, status, step, node, task, attempts, crashes, updated_at,
-- error, cancel, interrupt or result, lock}, false for what is absent. The pages of all
-- statuses are merged newest first, ties to the status named first in ARGV.
local prefix, before, after_meta, after_lock = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local offset, limit, wanted = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local last = offset + limit - 1

local counts, pages = {}, {}
for i = 8, #ARGV do
  local index = prefix .. ARGV[i]
  counts[#counts + 1] = redis.call('ZCARD', index)
  if wanted == '' and limit > 0 then
    pages[#pages + 1] = redis.call('ZREVRANGE', index, 0, last, 'WITHSCORES')
  end
end

local ids, first = {}, offset + 1
if wanted ~= '' then -- one index, in its own order: no scores to format and compare
  if limit > 0 then
    ids, first = redis.call('ZREVRANGE', prefix .. wanted, offset, last), 1
  end
else
  local heads = {}
  for p = 1, #pages do
    heads[p] = 1
  end
  while #ids <= last do
    local best, best_score = nil, nil
    for p = 1, #pages do
      local member = pages[p][heads[p]]
      if member then
        local score = tonumber(pages[p][heads[p] + 1])
        if best == nil or score > best_score then
          best, best_score = p, score
        end
      end
    end
    if best == nil then
      break
    end
    ids[#ids + 1] = pages[best][heads[best]]
    heads[best] = heads[best] + 2
  end
end

local rows = {}
for n = first, #ids do
  local id = ids[n]
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
    rows[#rows + 1] = {id, status, row[2], row[3], row[4], row[5], row[6], row[7], row[8],
      row[9], note, lock}
  end
end
return cmsgpack.pack({counts, rows})
