-- Makes due now the threads a claim took whose message the sweeper did not send.
-- KEYS[1]: due index.  ARGV: the thread ids.
-- Only brings a due time forward: a thread that left the index since (finished, waiting)
-- stays out of it. Returns the number of entries changed.
local now = now_seconds()
local changed = 0
for _, id in ipairs(ARGV) do
  local due = redis.call('ZSCORE', KEYS[1], id)
  if due and tonumber(due) > now then
    redis.call('ZADD', KEYS[1], now, id)
    changed = changed + 1
  end
end
return changed
