-- cut.lua: how every script hands a stream entry's fields to a worker.
-- Prepended (by mod.rs) to each script that returns entries (take.lua,
-- reclaim.lua, range.lua), so one rule bounds them all.
--
-- Those scripts return their entries packed in one MessagePack string
-- (`cmsgpack.pack`), not as nested replies, which cost the worker's Redis
-- client a quarter of a record-only slot's instructions (the figures:
-- DESIGN 4.4). The worker reads it back in packed.rs.
--
-- Anyone with redis-cli can write an entry of any size (one 64 MiB field
-- took a worker from 14 MB to 146 MB before it was cut). The cut happens
-- here, inside Redis, so an entry's bytes never reach a worker's memory
-- whole: each name and value is cut to `max_bytes`, and at most
-- `max_fields` name/value pairs are returned. An entry that was cut comes
-- back with its full size in bytes, which the worker turns into a defect
-- (`failed/bad_message`, dead-lettered); an intact one with 0.

-- Returns the cut field list and the entry's size in bytes when anything
-- was cut, else 0. `flat` is the entry's [name, value, ...] list (false
-- for an entry deleted while pending: no fields).
local function cut(flat, max_bytes, max_fields)
  if type(flat) ~= 'table' then return {}, 0 end
  local size, over = 0, #flat > max_fields * 2
  for _, v in ipairs(flat) do
    size = size + #v
    if #v > max_bytes then over = true end
  end
  -- An intact entry (every entry slotgate writes) goes back as Redis gave
  -- it, not copied: a read costs Redis CPU per entry, and the copy was
  -- about a sixth of it (take.lua over 20,000 entries, 2026-12-06).
  if not over then return flat, 0 end
  local out = {}
  for i, v in ipairs(flat) do
    if i <= max_fields * 2 then out[#out + 1] = string.sub(v, 1, max_bytes) end
  end
  return out, size
end
