-- renew.lua: extend the leader lease only if the caller still holds it.
--
-- KEYS[1]  P:leader
-- ARGV[1]  the caller's lease value "<id>:<epoch>"
-- ARGV[2]  time to live, ms
--
-- Returns 1 when renewed, 0 when the lease is held by someone else or gone.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
