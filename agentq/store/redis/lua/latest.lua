--!df flags=allow-undeclared-keys
-- Reads the latest checkpoint, with its append-only logs, in one round trip.
-- KEYS[1]: latest.  ARGV[1]: checkpoint key prefix, [2]: the thread's key prefix.
-- Returns {n, snapshot bytes, field, items, field, items, ...}, or nil when nothing was
-- committed.
local n = redis.call('GET', KEYS[1])
if not n then
  return nil
end
local reply = {n, redis.call('GET', ARGV[1] .. n)}
-- Only a commit appends to a log, in the step that moves latest: at the latest step every
-- log is whole.
for _, field in ipairs(redis.call('SMEMBERS', ARGV[2] .. 'logs')) do
  reply[#reply + 1] = field
  reply[#reply + 1] = redis.call('LRANGE', ARGV[2] .. 'log:' .. field, 0, -1)
end
return reply
