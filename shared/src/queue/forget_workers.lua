-- forget_workers.lua: forget heartbeats that are gone, so P:workers does
-- not grow with every worker id ever seen.
--
-- KEYS[1]  P:workers  hash: worker id -> last heartbeat (Unix ms)
-- ARGV[1]  now, Unix ms (the leader's clock, which also wrote the heartbeats)
-- ARGV[2]  limit, ms
--
-- A heartbeat older than the limit, or not a number, is removed.
-- Returns {heartbeats removed, id of every worker still live…}: the live
-- ids are what forget.lua must not remove from a stream group.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {0}
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local ws = redis.call('HGETALL', KEYS[1])
  for i = 1, #ws, 2 do
    local ms = tonumber(ws[i + 1])
    if not ms or now - ms > limit then
      redis.call('HDEL', KEYS[1], ws[i])
      out[1] = out[1] + 1
    else
      out[#out + 1] = ws[i]
    end
  end
end
return out
