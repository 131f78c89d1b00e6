-- Deletes a lease if it is still held under the same token.
-- KEYS[1]: lock.  ARGV[1]: '<token>:<owner>'.  Returns 1 if released, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
