-- deliver.lua: add one delivery to the ready stream (after stream.lua).
--
-- KEYS[1]  P:ready
-- KEYS[2]  P:ready:bell  rung after the add (stream.lua's ring)
-- ARGV[1]  consumer group name
-- ARGV[2]  slot key
-- ARGV[3]  caller
-- ARGV[4]  enqueued_at, Unix ms
-- ARGV[5..] extra field/value pairs (`early`, `1` from `planner trigger --early`)
--
-- Returns {entry id, name the broken stream was moved to or ''}.
local fields = {'slot', ARGV[2], 'caller', ARGV[3], 'enqueued_at', ARGV[4]}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id, aside = add(KEYS[1], ARGV[1], 0, fields)
ring(KEYS[2])
return {id, aside}
