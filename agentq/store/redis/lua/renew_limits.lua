-- Extends concurrency slots their holders still hold, on the server's clock.
-- KEYS: each slot's holders zset. ARGV: per slot its holder and ttl in ms.
-- A slot released or expired since stays gone. Returns the number renewed.
local now = now_seconds()
local renewed = 0
for i = 1, #KEYS do
  local holder, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i]) / 1000
  local expires = redis.call('ZSCORE', KEYS[i], holder)
  if expires and tonumber(expires) > now then
    redis.call('ZADD', KEYS[i], now + ttl, holder)
    renewed = renewed + 1
  end
end
return renewed
