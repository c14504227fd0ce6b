-- mirror.lua: copy the leader's lease value into one partition's fence
-- key, which promote.lua checks (a partitioned layout only: there the
-- lease and a partition's keys are in different hash slots).
--
-- KEYS[1]  {P:p}:leader  the partition's copy of the lease
-- ARGV[1]  the leader's lease value "<id>:<epoch>", just acquired or renewed
-- ARGV[2]  time to live, ms (the lease's own)
--
-- A copy of a later epoch is never overwritten: a leader that renewed, was
-- paused and lost the lease must not fence out the leader after it.
-- Returns 1 when written, 0 when a later epoch holds the copy.
local function epoch(v)
  if type(v) ~= 'string' then return nil end
  return tonumber(string.match(v, ':(%d+)$'))
end
local held = redis.pcall('GET', KEYS[1])
local theirs, mine = epoch(held), epoch(ARGV[1])
if theirs and mine and theirs > mine then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
