-- stream.lua: how every script adds to a stream. Prepended (by mod.rs) to
-- each script that writes P:ready or P:dead, so one rule repairs them all.
--
-- Redis refuses every `XADD *` on a stream whose last id is the last
-- possible one (someone added `18446744073709551615-18446744073709551615`
-- by hand), and every stream command on a key of another type. Such a key
-- would stop all deliveries for good, so the first writer to find it moves
-- it aside to `<key>:broken:<unix ms>` (kept for inspection), recreates the
-- stream and its consumer group, copies back every entry but the one at the
-- last id (each delivery gets its recorded outcome; the reconciler only
-- re-delivers planned slots, not copies), and adds again. The check and the move are
-- one step (this script), so only the key that is broken right now moves.

local LAST_ID = '18446744073709551615-18446744073709551615'

-- Whether `key` exists and can no longer be added to.
local function is_broken(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then return false end
  if t ~= 'stream' then return true end
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] == LAST_ID end
  end
  return false
end

-- Copies every entry of the stream `from` but the one at the last id into
-- `to` (new and empty), under its own id: a delivery queued behind the entry
-- that broke the stream is handed out again, and the executor knows an
-- entry id it has already recorded. In pages, so a long stream does not
-- build one huge reply.
local function copy_entries(from, to)
  local start = '-'
  while true do
    local page = redis.call('XRANGE', from, start, '+', 'COUNT', 500)
    if #page == 0 then return end
    for _, e in ipairs(page) do
      local id = e[1]
      if id == LAST_ID then return end
      local cmd = {'XADD', to, id}
      for _, v in ipairs(e[2]) do cmd[#cmd + 1] = v end
      redis.call(unpack(cmd))
      start = '(' .. id
    end
  end
end

-- Moves a broken `key` aside and recreates it (with `group`, when not ''),
-- with the entries it held (see `copy_entries`); the aside copy is kept for
-- inspection. Returns the name it was moved to, or '' when it was not broken.
local function repair(key, group)
  if not is_broken(key) then return '' end
  local was_stream = redis.call('TYPE', key)['ok'] == 'stream'
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local aside = key .. ':broken:' .. string.format('%.0f', ms)
  while redis.call('EXISTS', aside) == 1 do
    ms = ms + 1
    aside = key .. ':broken:' .. string.format('%.0f', ms)
  end
  redis.call('RENAME', key, aside)
  if group ~= '' then
    redis.call('XGROUP', 'CREATE', key, group, '0', 'MKSTREAM')
  end
  if was_stream then
    copy_entries(aside, key)
  end
  return aside
end

-- XADD `key` (MAXLEN ~ `cap` when cap > 0) '*' `fields`..., repairing a
-- broken key first when Redis refuses. Returns the new id and the name the
-- broken key was moved to ('' when none). Any other refusal (OOM, ...) is
-- raised as it is: moving a healthy stream aside would lose its pending list.
local function add(key, group, cap, fields)
  -- The fields are passed straight through (no command table built and
  -- copied per entry: promotion adds one entry per slot).
  local function xadd(call)
    if cap > 0 then return call('XADD', key, 'MAXLEN', '~', cap, '*', unpack(fields)) end
    return call('XADD', key, '*', unpack(fields))
  end
  local r = xadd(redis.pcall)
  if type(r) == 'table' and r['err'] then
    local aside = repair(key, group)
    return xadd(redis.call), aside
  end
  return r, ''
end

-- Rings P:ready:bell (a stream of one entry) after adding to P:ready:
-- workers block on it (take.lua) instead of on P:ready itself, so that a
-- waiting worker is woken at once without being handed an entry's bytes.
-- A bell broken by hand is left alone: workers then find new deliveries
-- within their read timeout (1 s), as they do for an entry added with
-- redis-cli, which rings nothing.
local function ring(bell)
  redis.pcall('XADD', bell, 'MAXLEN', '1', '*', 'rung', '1')
end
