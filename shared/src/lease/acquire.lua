-- acquire.lua: take the leader lease, unless it is held or the caller's
-- epoch is already stale.
--
-- KEYS[1]  P:leader
-- KEYS[2]  P:epoch   the last epoch any leader took (mirror of Postgres's)
-- ARGV[1]  the caller's lease value "<id>:<epoch>"
-- ARGV[2]  the caller's epoch, fresh from Postgres
-- ARGV[3]  time to live, ms
--
-- Returns 1 when taken, 0 when someone holds it, -1 when another leader
-- took a later epoch since the caller asked Postgres for its own: a
-- worker paused between the two steps must not come back as a leader
-- older than one that came after it. The check and the SET are one step.
-- P:epoch holding anything but a number counts as absent.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local seen = redis.pcall('GET', KEYS[2])
if type(seen) ~= 'string' then seen = nil end
seen = tonumber(seen)
if seen and seen >= tonumber(ARGV[2]) then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
return 1
