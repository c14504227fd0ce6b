-- range.lua: read a page of a stream without its workers' group (after
-- cut.lua): the reconciler's look at P:ready, `planner dead list`.
--
-- KEYS[1]  the stream
-- ARGV[1]  'XRANGE' (oldest first) or 'XREVRANGE' (newest first)
-- ARGV[2]  from, ARGV[3] to (as the command takes them)
-- ARGV[4]  at most this many entries
-- ARGV[5]  bytes kept of each field name and value
-- ARGV[6]  field pairs kept of each entry
--
-- Returns {{id, {field, value, ...}, size when cut or 0}, ...} packed
-- (cut.lua says why).
local cmd = ARGV[1]
if cmd ~= 'XRANGE' and cmd ~= 'XREVRANGE' then
  return redis.error_reply('range.lua: XRANGE or XREVRANGE')
end
local r = redis.call(cmd, KEYS[1], ARGV[2], ARGV[3], 'COUNT', tonumber(ARGV[4]))
local max_bytes, max_fields = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
for _, e in ipairs(r) do
  local fields, size = cut(e[2], max_bytes, max_fields)
  out[#out + 1] = {e[1], fields, size}
end
return cmsgpack.pack(out)
