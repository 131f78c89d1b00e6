-- Names the task that carries a thread's canvas on: the first caller, kept in the meta's
-- 'canvas_taker'. KEYS[1]: meta.  ARGV[1]: the caller's task id.
-- Returns 1 if the caller is that task (first, or asking again), else 0; 0 for a thread
-- that does not exist.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSETNX', KEYS[1], 'canvas_taker', ARGV[1])
return redis.call('HGET', KEYS[1], 'canvas_taker') == ARGV[1] and 1 or 0
