-- release.lua: give the leader lease up only if the caller still holds it.
--
-- KEYS[1]  P:leader
-- ARGV[1]  the caller's lease value "<id>:<epoch>"
--
-- Returns 1 when released, 0 when it was not ours (never delete another
-- leader's lease).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
