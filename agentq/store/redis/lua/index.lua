--!df flags=allow-undeclared-keys
-- Applies the index changes a thread script returned (Redis Cluster only).
-- KEYS[1]: due index.  ARGV[1]: status-index prefix; ARGV[2..6]: the ops
-- (thread_id, old_status, new_status, due, now).  Returns 1.
apply_index(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]))
return 1
