-- The thread's index entries as its meta stands, for index.lua to put in place (Redis
-- Cluster only): the sweeper's repair of a thread it found due but not to be run, whose
-- index entries an operation left behind its meta (its second call lost, and the
-- operation never sent again).
-- KEYS[1]: meta.  ARGV[1]: '', [2] thread id.
-- Returns {ops}; for a thread that does not exist, ops that remove it.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {index(KEYS[1], ARGV[2], '', '-', 'clear', 0)}
end
return {sync(KEYS[1], ARGV[2])}
