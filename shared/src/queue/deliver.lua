-- deliver.lua: add one delivery to the ready stream (after stream.lua).
--
-- KEYS[1]  P:ready
-- ARGV[1]  consumer group name
-- ARGV[2]  slot key
-- ARGV[3]  caller
-- ARGV[4]  enqueued_at, Unix ms
--
-- Returns {entry id, name the broken stream was moved to or ''}.
local id, aside = add(KEYS[1], ARGV[1], 0,
  {'slot', ARGV[2], 'caller', ARGV[3], 'enqueued_at', ARGV[4]})
return {id, aside}
