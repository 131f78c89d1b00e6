-- Charges (or, negative, refunds) tokens to limit keys after a call's real usage is known.
-- KEYS: each limit's state hash. ARGV: per key its token interval (s per token) and the
-- tokens to add. A refund stops at a full budget: tok_tat never goes below now.
-- Returns 1.
local now = now_seconds()
for i = 1, #KEYS do
  local tok_i, delta = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if tok_i > 0 and delta ~= 0 then
    local tat = math.max(tonumber(redis.call('HGET', KEYS[i], 'tok_tat') or '0'), now)
    redis.call('HSET', KEYS[i], 'tok_tat', tostring(math.max(tat + tok_i * delta, now)))
  end
end
return 1
