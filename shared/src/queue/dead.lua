-- dead.lua: move a delivery to the dead-letter stream and acknowledge it,
-- in one step (after stream.lua).
--
-- KEYS[1]  P:dead    dead letters, capped (MAXLEN ~ ARGV[2])
-- KEYS[2]  P:ready
-- ARGV[1]  consumer group name
-- ARGV[2]  cap on P:dead's length (approximate: whole stream nodes are trimmed)
-- ARGV[3]  the entry id in P:ready
-- ARGV[4..] the dead letter's fields and values
--
-- Returns the name a broken P:dead was moved to, or ''.
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
local _, aside = add(KEYS[1], '', tonumber(ARGV[2]), fields)
redis.call('XACK', KEYS[2], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[2], ARGV[3])
return aside
