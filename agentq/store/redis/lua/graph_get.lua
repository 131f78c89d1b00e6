--!df flags=allow-undeclared-keys
-- Reads one LangGraph checkpoint (or the namespace's latest) with its blobs and writes.
-- KEYS[1] ids.
-- ARGV[1] thread key base, [2] escaped namespace, [3] checkpoint id or '' for the latest,
-- [4] msgpack list of the channels whose blobs to read, or '' for all of them.
-- Returns a row {id, record, refs, blobs, writes} (see row()), or nil.
local id = ARGV[3]
if id == '' then
  local top = redis.call('ZREVRANGE', KEYS[1], 0, 0)
  if #top == 0 then
    return false
  end
  id = top[1]
end
local wanted = nil
if ARGV[4] ~= '' then
  wanted = {}
  for _, channel in ipairs(cmsgpack.unpack(ARGV[4])) do
    wanted[channel] = true
  end
end
return row(ARGV[1], ARGV[2], id, wanted)
