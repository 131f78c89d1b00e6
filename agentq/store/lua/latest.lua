-- Reads the latest checkpoint in one round trip.
-- KEYS[1]: latest.  ARGV[1]: checkpoint key prefix.
-- Returns {n, snapshot bytes}, or nil when nothing was committed.
local n = redis.call('GET', KEYS[1])
if not n then
  return nil
end
return {n, redis.call('GET', ARGV[1] .. n)}
