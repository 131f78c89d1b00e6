-- Stores an artifact's bytes and records the key as owned by the thread.
-- KEYS[1]: artifact key, [2]: the thread's set of owned keys.  ARGV[1]: bytes.
-- Returns 1.
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], KEYS[1])
return 1
