-- unmirror.lua: remove a partition's copy of the lease, only if it is the
-- caller's (never delete another leader's copy).
--
-- KEYS[1]  {P:p}:leader
-- ARGV[1]  the caller's lease value "<id>:<epoch>"
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
