-- ensure.lua: make sure the ready stream can be used (after stream.lua):
-- move it aside when it is broken, and create the stream and the consumer
-- group from id 0 when missing, so nothing added after a flush is skipped.
--
-- KEYS[1]  P:ready
-- ARGV[1]  consumer group name
--
-- Returns the name a broken stream was moved to, or ''.
local aside = repair(KEYS[1], ARGV[1])
local r = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
if type(r) == 'table' and r['err'] and not string.find(r['err'], 'BUSYGROUP', 1, true) then
  return redis.error_reply(r['err'])
end
return aside
