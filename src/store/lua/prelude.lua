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
local EVENTS_MAXLEN = __EVENTS_MAXLEN__

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

-- etype: event type ("task.claimed"); ts: Redis ms; node: the acting node id or '';
-- subjects: flat list of field, value pairs (task, queue, ...), values strings;
-- data: a table encoded as JSON into the `data` field, or nil.
-- Returns the stream id.
local function emit(etype, ts, node, subjects, data)
  local args = {P .. ':events', 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'type', etype, 'ts', int(ts), 'node', node or ''}
  for i = 1, #subjects do args[#args + 1] = subjects[i] end
  if data ~= nil then
    args[#args + 1] = 'data'
    args[#args + 1] = cjson.encode(data)
  end
  return redis.call('XADD', unpack(args))
end
