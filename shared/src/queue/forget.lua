-- forget.lua: forget consumers and workers that are gone, so the group's
-- consumer list and P:workers do not grow with every worker id ever seen.
--
-- KEYS[1]  P:ready
-- KEYS[2]  P:workers  hash: worker id -> last heartbeat (Unix ms)
-- ARGV[1]  consumer group name
-- ARGV[2]  now, Unix ms (the leader's clock, which also wrote the heartbeats)
-- ARGV[3]  limit, ms
--
-- A consumer is removed (XGROUP DELCONSUMER) when it holds nothing pending,
-- Redis saw it idle longer than the limit, and its heartbeat is older than
-- the limit or absent. Deleting a consumer that holds entries would orphan
-- them, so the check and the delete are one step (this script). A heartbeat
-- older than the limit, or not a number, is removed from P:workers.
--
-- Returns {consumers removed, heartbeats removed}.
local now, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local function stale(hb)
  local ms = tonumber(hb)
  return not ms or now - ms > limit
end
local consumers = 0
if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
  local cs = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
  if not cs['err'] then
    for _, c in ipairs(cs) do
      local info = {}
      for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
      if info['pending'] == 0 and info['idle'] > limit then
        local hb = redis.pcall('HGET', KEYS[2], info['name'])
        if type(hb) ~= 'table' and stale(hb) then
          redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
          consumers = consumers + 1
        end
      end
    end
  end
end
local workers = 0
if redis.call('TYPE', KEYS[2])['ok'] == 'hash' then
  local ws = redis.call('HGETALL', KEYS[2])
  for i = 1, #ws, 2 do
    if stale(ws[i + 1]) then
      redis.call('HDEL', KEYS[2], ws[i])
      workers = workers + 1
    end
  end
end
return {consumers, workers}
