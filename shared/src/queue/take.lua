-- take.lua: read new deliveries for one consumer (after cut.lua).
--
-- KEYS[1]  P:ready       the stream
-- KEYS[2]  P:ready:bell  rung by every script that adds to P:ready
-- ARGV[1]  consumer group name
-- ARGV[2]  this consumer's name
-- ARGV[3]  at most this many entries
-- ARGV[4]  bytes kept of each field name and value
-- ARGV[5]  field pairs kept of each entry
--
-- Returns {{{id, {field, value, ...}, size when cut or 0}, ...} packed
-- (cut.lua says why), the bell's last id or '0-0' (read only when no entry
-- was found)}. XREADGROUP does not block inside a script; the worker
-- blocks on the bell instead (XREAD from the id returned here), so what is
-- added after this read wakes it, and only the bell's tiny entry crosses
-- the wire while it waits.
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', tonumber(ARGV[3]), 'STREAMS', KEYS[1], '>')
local max_bytes, max_fields = tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
if r and r[1] then
  for _, e in ipairs(r[1][2]) do
    local fields, size = cut(e[2], max_bytes, max_fields)
    out[#out + 1] = {e[1], fields, size}
  end
end
-- The bell's id is needed only by a worker about to wait.
local last = '0-0'
if #out == 0 and redis.call('TYPE', KEYS[2])['ok'] == 'stream' then
  local b = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if b[1] then last = b[1][1] end
end
return {cmsgpack.pack(out), last}
