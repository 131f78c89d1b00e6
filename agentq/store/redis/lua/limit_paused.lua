-- Reads how long the longest pause of limit keys lasts, on the server's clock.
-- KEYS: each limit's state hash. Returns the milliseconds left, 0 when none is paused.
local now = now_seconds()
local until_at = now
for i = 1, #KEYS do
  local paused = tonumber(redis.call('HGET', KEYS[i], 'paused') or '0')
  if paused > until_at then
    until_at = paused
  end
end
return math.ceil((until_at - now) * 1000)
