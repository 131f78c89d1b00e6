--!df flags=allow-undeclared-keys
-- Reads one LangGraph checkpoint (or the namespace's latest) with its blobs and writes.
-- KEYS[1] ids.
-- ARGV[1] thread key base, [2] escaped namespace, [3] checkpoint id or '' for the latest.
-- Returns a row {id, record, refs, blobs, writes} (see row()), or nil.
local id = ARGV[3]
if id == '' then
  local top = redis.call('ZREVRANGE', KEYS[1], 0, 0)
  if #top == 0 then
    return false
  end
  id = top[1]
end
return row(ARGV[1], ARGV[2], id)
