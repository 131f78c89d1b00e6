-- Takes or extends the sweeper lease.
-- KEYS[1]: the sweeper lease.  ARGV[1]: owner, [2]: ttl in ms.
-- Returns 1 if the owner holds it now, 0 while another owner does.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
