-- reclaim.lua: take over deliveries left idle by a dead or stuck consumer.
--
-- KEYS[1]  P:ready    the stream
-- ARGV[1]  consumer group name
-- ARGV[2]  this consumer's name
-- ARGV[3]  minimum idle time, ms (the visibility timeout)
-- ARGV[4]  at most this many entries
--
-- Returns a list of {id, {field, value, ...}, delivery_count}: XAUTOCLAIM
-- does not report delivery counts, and dead-lettering needs them, so each
-- claimed entry's count is read back from XPENDING in the same atomic step.
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', tonumber(ARGV[4]))
local out = {}
for _, e in ipairs(r[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  local n = 0
  if p[1] then n = p[1][4] end
  out[#out + 1] = {e[1], e[2], n}
end
return out
