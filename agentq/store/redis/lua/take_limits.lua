--!df flags=allow-undeclared-keys
-- Takes from rate limits and concurrency slots, all keys or none (GCRA on server TIME).
-- KEYS: for each limit its state hash then its holders zset.
-- ARGV[1] holder, [2] slot ttl in ms, [3] reserve within (s), then per limit 5 values:
-- request interval (s per request, 0 if none), request tolerance (s: burst times interval),
-- token interval (s per token, 0 if none), cost (tokens), concurrency (0 if none).
-- Hash fields: req_tat, tok_tat (Unix times), paused (Unix time), takes (granted so far).
-- Returns {taken (1 or 0), ms}: taken, starting in ms (a reservation when > 0); or not
-- taken, nothing written, and the ms until it could be.
-- A wait on the rate alone within ARGV[3] is reserved: the tats advance as for a take now,
-- so the next caller queues behind it rather than polling for the same free slot.
local now = now_seconds()
local n = #KEYS / 2
local reserve = tonumber(ARGV[3])
local wait = 0 -- on the rate, which a reservation may wait out
local blocked = 0 -- on a pause or a full cap, which it may not
local plans = {}
for i = 1, n do
  local state, holders = KEYS[2 * i - 1], KEYS[2 * i]
  local base = 3 + 5 * (i - 1)
  local req_i, req_tol = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local tok_i, cost = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  local slots = tonumber(ARGV[base + 5])
  local paused = tonumber(redis.call('HGET', state, 'paused') or '0')
  if paused > now then
    blocked = math.max(blocked, paused - now)
  end
  local plan = {}
  if req_i > 0 then
    local tat = math.max(tonumber(redis.call('HGET', state, 'req_tat') or '0'), now) + req_i
    if tat - now > req_tol + 1e-9 then
      wait = math.max(wait, tat - now - req_tol)
    end
    plan.req = tat
  end
  if tok_i > 0 then
    -- A minute's worth of tokens may go at once: the tolerance is 60 s less this cost.
    local tat = math.max(tonumber(redis.call('HGET', state, 'tok_tat') or '0'), now) + tok_i * cost
    if tat - now > 60 + 1e-9 then
      wait = math.max(wait, tat - now - 60)
    end
    plan.tok = tat
  end
  if slots > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    if redis.call('ZSCORE', holders, ARGV[1]) == false and redis.call('ZCARD', holders) >= slots then
      local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
      -- A holder usually gives its slot back long before it expires: look again soon.
      blocked = math.max(blocked, math.min(tonumber(first[2]) - now, 0.05))
    end
    plan.slot = true
  end
  plans[i] = plan
end
if blocked > 0 or wait > reserve + 1e-9 then
  return {0, math.max(1, math.ceil(math.max(wait, blocked) * 1000))}
end
for i = 1, n do
  local state, holders, plan = KEYS[2 * i - 1], KEYS[2 * i], plans[i]
  if plan.req then redis.call('HSET', state, 'req_tat', tostring(plan.req)) end
  if plan.tok then redis.call('HSET', state, 'tok_tat', tostring(plan.tok)) end
  redis.call('HINCRBY', state, 'takes', 1)
  if plan.slot then
    redis.call('ZADD', holders, now + tonumber(ARGV[2]) / 1000, ARGV[1])
  end
end
return {1, math.ceil(wait * 1000)}
