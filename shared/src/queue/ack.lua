-- ack.lua: acknowledge entries and delete them from the stream, in one
-- step, so the stream holds only unfinished deliveries.
--
-- KEYS[1]  P:ready   the stream (one partition's)
-- ARGV[1]  consumer group name
-- ARGV[2…] entry ids
--
-- A script rather than MULTI so that it is one step on a Redis Cluster too
-- (both commands touch one key). Ids go in chunks: Lua's stack fails past
-- ~8,000 unpacked values.
local n = #ARGV
local i = 2
while i <= n do
  local last = math.min(i + 999, n)
  local ids = {}
  for j = i, last do ids[#ids + 1] = ARGV[j] end
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  i = last + 1
end
return 0
