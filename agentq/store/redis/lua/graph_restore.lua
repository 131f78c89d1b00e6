--!df flags=allow-undeclared-keys
-- Writes a copied LangGraph thread: applies commands to the target thread's own keys.
-- KEYS[1] meta, [2] lock, [3] owned (all the target's).
-- ARGV[1] token or '', [2] msgpack list of commands, each {name, key, args...}; the
-- client builds them from the source thread's keys.
-- Returns {1, 0}, or a refusal (see _graph_prelude.lua).
local refusal = refuse_graph_write(KEYS[1], KEYS[2], ARGV[1])
if refusal then
  return refusal
end
for _, command in ipairs(cmsgpack.unpack(ARGV[2])) do
  redis.call(unpack(command))
  redis.call('SADD', KEYS[3], command[2])
end
return {1, 0}
