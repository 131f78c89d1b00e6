-- Extends a lease still held under the same token and pushes the thread's due time.
-- KEYS[1]: lock, [2]: meta, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] '<token>:<owner>', [4] ttl in ms.
-- Returns {1, ops}, or {0, 0} when the lease was lost.
if redis.call('GET', KEYS[1]) ~= ARGV[3] then
  return {0, 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local ops = 0
if redis.call('HGET', KEYS[2], 'status') == STATUS.RUNNING then
  local now = now_seconds()
  ops = index(KEYS[2], ARGV[2], '', '', now + tonumber(ARGV[4]) / 1000, now)
end
return {1, ops}
