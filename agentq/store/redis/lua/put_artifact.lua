-- Stores an artifact's bytes and records the key as owned by the thread, if the thread
-- is still there: bytes stored for a deleted one would be owned by nothing.
-- KEYS[1]: artifact key, [2]: the thread's set of owned keys, [3]: its meta.
-- ARGV[1]: bytes.
-- Returns 1, or 0 when the thread does not exist.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], KEYS[1])
return 1
