-- Reads the latest checkpoint, with its append-only logs, in one round trip.
-- KEYS[1]: latest.  ARGV[1]: checkpoint key prefix, [2]: the thread's key prefix.
-- Returns {n, snapshot bytes, field, items, field, items, ...}, or nil when nothing was
-- committed.
local n = redis.call('GET', KEYS[1])
if not n then
  return nil
end
local reply = {n, redis.call('GET', ARGV[1] .. n)}
local lengths = redis.call('HGETALL', ARGV[2] .. 'logs')
for j = 1, #lengths, 2 do
  reply[#reply + 1] = lengths[j]
  reply[#reply + 1] = redis.call('LRANGE', ARGV[2] .. 'log:' .. lengths[j], 0,
    tonumber(lengths[j + 1]) - 1)
end
return reply
