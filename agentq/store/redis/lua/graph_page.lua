--!df flags=allow-undeclared-keys
-- Reads up to ARGV[4] LangGraph checkpoints of a namespace, newest first.
-- KEYS[1] ids.
-- ARGV[1] thread key base, [2] escaped namespace, [3] only ids below this one ('' for
-- all), [4] limit.
-- Returns a list of rows (see row()).
local high = '+'
if ARGV[3] ~= '' then
  high = '(' .. ARGV[3]
end
local rows = {}
for _, id in ipairs(redis.call('ZREVRANGEBYLEX', KEYS[1], high, '-', 'LIMIT', 0, ARGV[4])) do
  local r = row(ARGV[1], ARGV[2], id)
  if r then
    table.insert(rows, r)
  end
end
return rows
