-- forget.lua: forget stream consumers that are gone, so one partition's
-- group does not grow with every worker id ever seen.
--
-- KEYS[1]  P:ready   one partition's stream
-- ARGV[1]  consumer group name
-- ARGV[2]  limit, ms
-- ARGV[3…] ids of the workers whose heartbeat is fresh (forget_workers.lua)
--
-- A consumer is removed (XGROUP DELCONSUMER) when it holds nothing pending,
-- Redis saw it idle longer than the limit, and it is not a live worker.
-- Deleting a consumer that holds entries would orphan them, so the check
-- and the delete are one step (this script). The heartbeats live in
-- another key (on a Redis Cluster, another hash slot), so the live ids
-- come as arguments.
--
-- Returns the number of consumers removed.
local limit = tonumber(ARGV[2])
local live = {}
for i = 3, #ARGV do live[ARGV[i]] = true end
local consumers = 0
if redis.call('TYPE', KEYS[1])['ok'] == 'stream' then
  local cs = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
  if not cs['err'] then
    for _, c in ipairs(cs) do
      local info = {}
      for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
      if info['pending'] == 0 and info['idle'] > limit and not live[info['name']] then
        redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
        consumers = consumers + 1
      end
    end
  end
end
return consumers
