-- promote.lua: move due slots from the delayed set into the ready stream
-- (after stream.lua).
--
-- KEYS[1]  P:delayed  sorted set, member = slot key, score = due time (Unix ms)
-- KEYS[2]  P:ready    stream the workers consume
-- KEYS[3]  P:leader   the leader lease (string)
-- KEYS[4]  P:ready:bell  rung when anything moved (stream.lua's ring)
-- ARGV[1]  now, Unix ms: everything scored at or before it is due
-- ARGV[2]  batch size: at most this many per call (never unpack an unbounded
--          list: Lua's stack fails past ~8,000 values)
-- ARGV[3]  the caller's lease value "<id>:<epoch>"; "" = unfenced
-- ARGV[4]  consumer group name (recreated with a repaired stream)
-- ARGV[5]  '1': never promote past Redis's own clock (TIME), so a leader
--          whose clock runs ahead cannot promote a slot early; '0': trust
--          ARGV[1] (tests that drive time with an injected clock)
--
-- Returns {number of slots moved, name a broken stream was moved to or '',
-- the score of the delayed set's head after the move or ''}; the number is
-- -1 when ARGV[3] is not the current lease value: a leader paused past its
-- lease must not act on stale authority. The head comes back in the same
-- call, read in the same atomic step, so the leader needs no second round
-- trip to know when to look again.
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then
  return {-1, '', ''}
end
local now = tonumber(ARGV[1])
if ARGV[5] == '1' then
  local t = redis.call('TIME')
  local server = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if server < now then now = server end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local moved = ''
local enqueued_at = string.format('%.0f', now)
for _, slot in ipairs(due) do
  local _, aside = add(KEYS[2], ARGV[4], 0, {'slot', slot, 'caller', 'planner', 'enqueued_at', enqueued_at})
  if aside ~= '' then moved = aside end
end
-- The members just read are the set's lowest-ranked #due (a sorted set
-- orders by score, then member, as ZRANGEBYSCORE read them), and nothing
-- runs between the read and here: one removal by rank instead of a ZREM
-- per slot (promotion cost 30-40% less Redis CPU per slot; measured in
-- docs/benchmarks-archive.md, 2026-12-06).
if #due > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #due - 1) end
if #due > 0 then ring(KEYS[4]) end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#due, moved, head[2] or ''}
