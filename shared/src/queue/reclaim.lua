-- reclaim.lua: take over deliveries left idle by a dead or stuck consumer
-- (after cut.lua).
--
-- KEYS[1]  P:ready    the stream
-- ARGV[1]  consumer group name
-- ARGV[2]  this consumer's name
-- ARGV[3]  minimum idle time, ms (the visibility timeout)
-- ARGV[4]  at most this many entries
-- ARGV[5]  bytes kept of each field name and value
-- ARGV[6]  field pairs kept of each entry
--
-- Returns {{id, {field, value, ...}, delivery_count, size when cut or 0},
-- ...} packed (cut.lua says why): XAUTOCLAIM does not report delivery
-- counts, and dead-lettering needs them, so each claimed entry's count is
-- read back from XPENDING in the same atomic step. Fields are cut as
-- take.lua cuts them.
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', tonumber(ARGV[4]))
local max_bytes, max_fields = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
for _, e in ipairs(r[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  local n = 0
  if p[1] then n = p[1][4] end
  local fields, size = cut(e[2], max_bytes, max_fields)
  out[#out + 1] = {e[1], fields, n, size}
end
return cmsgpack.pack(out)
