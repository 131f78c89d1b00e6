-- Reads every LangGraph key of a thread at once, for copying it under another thread id:
-- a put landing between reads of one key and the next would copy a checkpoint without
-- the values it reads.
-- KEYS[1]: the thread's set of owned keys.  ARGV[1]: the thread's LangGraph key base.
-- Returns {suffix after the base, kind ('hash', 'zset' or 'set'), members} per key that
-- holds any: a hash's fields and values flat, a zset's members, a set's members.
local base = ARGV[1]
local found = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if string.sub(key, 1, #base) == base then
    local kind = redis.call('TYPE', key)['ok']
    local members
    if kind == 'hash' then
      members = redis.call('HGETALL', key)
    elseif kind == 'zset' then
      members = redis.call('ZRANGE', key, 0, -1)
    elseif kind == 'set' then
      members = redis.call('SMEMBERS', key)
    end
    if members and #members > 0 then
      found[#found + 1] = {string.sub(key, #base + 1), kind, members}
    end
  end
end
return found
