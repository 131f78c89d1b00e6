--!df flags=allow-undeclared-keys
-- Changes a thread's status and meta without a checkpoint, fenced by the token.
-- KEYS[1]: meta, [2]: lock, [due index].
-- ARGV[1]: status prefix or '', [2] thread id, [3] token, [4] status, [5] due in seconds
-- ('' for none), [6] '<token>:<owner>' to release or '', [7..] meta (field, value) pairs.
-- Returns {1, 0, ops}; {STALE_TOKEN, current fence, 0}; {THREAD_NOT_FOUND, 0, 0}.
local refused = refuse_stale(KEYS[1], ARGV[3])
if refused then
  return refused
end
local ops = update_thread(KEYS[1], KEYS[2], ARGV[2], ARGV[4], ARGV[5], ARGV[6], 7)
return {1, 0, ops}
