-- prelude.lua: shared helpers, prepended to every script by store::Lua.
--
-- KEYS: none of its own. ARGV: takes the caller's deadline off the end (DEADLINE,
-- below). Returns: nothing, unless the call is late (the error `LATE`).
--
-- P              the namespace's hash-tagged prefix, e.g. "{muster}"; every key a
--                script computes starts with it, so it lands in the caller's slot.
-- EVENTS_MAXLEN  approximate length the event stream is trimmed to.
-- DEADLINE       the caller's deadline in Redis ms (G12). Store::eval appends it to
--                every call as the LAST argument; the prelude takes it off ARGV, so a
--                script sees exactly the ARGV its header documents. Past it the
--                script does nothing and fails with the error `LATE`: the node that
--                sent it has given up and answered its client with an error, so the
--                call must not take effect now that it arrives.
-- E.NAME         the error codes scripts return (store/codes.rs): E.NOT_FOUND, E.STALE,
--                ...; replaced by their values when a script is assembled (no table).
-- now_ms()       Redis server time in milliseconds (the one clock, G11), read once
--                per call: every step of a script sees the same instant.
-- int(n)         an integer-valued number as a string without exponent (tostring
--                and `..` switch to exponent notation above 1e14).
-- emit(...)      appends one event to the stream, in the caller's atomic step (G9).
local P = '__PREFIX__'
local EVENTS_MAXLEN = '__EVENTS_MAXLEN__'
local DEADLINE = tonumber(table.remove(ARGV))

local NOW
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

if not DEADLINE or now_ms() > DEADLINE then
  return redis.error_reply('LATE the call reached Redis after its deadline (Redis time ' .. string.format('%d', now_ms()) ..
    ', deadline ' .. tostring(DEADLINE) .. '): it was not applied')
end

local function int(n)
  return string.format('%d', n)
end

-- etype: event type ("task.claimed"); node: the acting node id or '';
-- data: the event's data as a table (encoded with cjson) or as JSON text (hot
-- paths build it by hand: cjson is slow); ...: subject field, value pairs
-- (task, queue, group, ...), strings. The event's time is the stream id's
-- millisecond part, which is Redis time.
-- The first event of a script call trims the stream (MAXLEN ~); later ones in the
-- same call skip it, which bounds the stream just as well at a fraction of the cost.
-- Returns the stream id.
local events_trimmed = false
local function emit(etype, node, data, ...)
  if type(data) == 'table' then data = cjson.encode(data) end
  if events_trimmed then
    return redis.call('XADD', P .. ':events', '*', 'type', etype, 'node', node or '', 'data', data or '{}', ...)
  end
  events_trimmed = true
  return redis.call('XADD', P .. ':events', 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'type', etype, 'node', node or '',
    'data', data or '{}', ...)
end
