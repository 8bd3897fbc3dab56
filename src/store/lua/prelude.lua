-- prelude.lua: shared helpers, prepended to every script by store::Lua.
--
-- P              the namespace's hash-tagged prefix, e.g. "{muster}"; every key a
--                script computes starts with it, so it lands in the caller's slot.
-- EVENTS_MAXLEN  approximate length the event stream is trimmed to.
-- now_ms()       Redis server time in milliseconds (the one clock, G11).
-- int(n)         an integer-valued number as a string without exponent (tostring
--                and `..` switch to exponent notation above 1e14).
-- emit(...)      appends one event to the stream, in the caller's atomic step (G9).
local P = '__PREFIX__'
local EVENTS_MAXLEN = '__EVENTS_MAXLEN__'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
