-- prelude.lua: shared helpers, first in every script's Redis function library
-- (store::Lua assembles the library and loads it with FUNCTION LOAD).
--
-- KEYS: none of its own. ARGV: takes the caller's deadline off the end (DEADLINE,
-- below). Returns: nothing, unless the call is late (the error `LATE`).
--
-- A script's file becomes the body of one function registered by its library, so
-- the prelude and the libraries run once, when the library is loaded, and every
-- call runs only `begin` and the script's own code. Library-level state that one
-- call changes is declared `local name = value -- @per-call`; the assembler resets
-- each such variable to its value at the start of every call (a call that failed
-- halfway must not leave it set for the next one).
--
-- KEYS, ARGV     the call's keys and arguments (set by each function before `begin`;
--                libraries may read them).
-- P              the hash-tagged prefix of the call's namespace (or shard of one),
--                e.g. "{muster}": the hash tag of KEYS[1], set at the start of every
--                call, so one library serves every namespace and shard on a server.
--                Every key a script computes starts with it, so it lands in the
--                caller's slot. Library constants built from it are `-- @per-call`.
-- EVENTS_MAXLEN  approximate length the event stream is trimmed to.
-- DEADLINE       the caller's deadline in Redis ms (G12). Store::eval appends it to
--                every call as the LAST argument; `begin` takes it off ARGV, so a
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
-- emit(...)      adds one event to the call's events, which reach the stream in the
--                caller's atomic step (G9): written when the call ends (events_flush).
-- emit_now(...)  the same, written at once; returns its stream id.
-- fence_epoch()  the fencing epoch, for the high bits of every token (G1, G10); on
--                a Redis Cluster it first raises it when a new master runs the call.
local KEYS, ARGV
local P = '{}'
local EVENTS_MAXLEN = '__EVENTS_MAXLEN__'
local DEADLINE
-- Whether the namespace is on a Redis Cluster (see fence_epoch).
local CLUSTER = __CLUSTER__

-- The hash tag a key starts with (P of a call whose KEYS[1] is the key).
local function tag_of(key)
  local tag = string.match(key or '', '^{[^}]+}')
  if not tag then error('muster: KEYS[1] (' .. tostring(key) .. ') does not start with a hash tag') end
  return tag
end

local NOW = nil -- @per-call
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

local function int(n)
  return string.format('%d', n)
end

-- etype: event type ("task.claimed"); node: the acting node id or '';
-- data: the event's data as a table (encoded with cjson) or as JSON text (hot
-- paths build it by hand: cjson is slow); ...: subject field, value pairs
-- (task, queue, group, ...), strings. The event's time is the stream id's
-- millisecond part, which is Redis time.
-- An event is ONE field `e`: lines "<type>", "<node>", one "<subject>=<id>" per
-- subject, then the data (a JSON object, so it starts with `{`; it is last, so it
-- may hold anything). Subject ids are validated names, never holding a newline.
-- The subjects of nearly every event are written as one letter (EVENT_SUBJECTS:
-- t task, q queue, g group, w workflow; events::Event reads them back), so an
-- event is no longer than the fields it replaces.
-- One field instead of five or six costs Redis a third less per XADD and half
-- as much per entry read (XREAD by every node's tailer); events::Event parses it.
-- A call's events are written when it ends (`events_flush`, which the
-- assembler runs after every script's body, even one that failed): the
-- first as an entry of its own (`XADD ... *`, which trims the stream, MAXLEN ~),
-- the rest in entries of up to EVENTS_PER_ENTRY events, each entry a field
-- `e` per event. An entry of n events holds the ids (ms, s - n + 1) .. (ms, s)
-- of its id (ms, s): each event has a stream id of its own, ids grow event by
-- event, and a reader after any id (XREAD, XRANGE with `(`) gets the entry
-- that holds the events after it (events::entry_events numbers them; a
-- reader drops those at or before its position). The ids are the first
-- entry's, counted on: `*` gave it (ms, b), so nothing in the stream is at or
-- after (ms, b + 1), and the next `*` after (ms, b + k - 1) gives (ms, b + k)
-- or a later millisecond. A batch of 100 tasks writes 14 entries for its 100
-- events, not 100: a third of a task's commands were its XADDs.
-- The stream keeps about EVENTS_MAXLEN entries: at least as many events, at
-- most EVENTS_PER_ENTRY times as many when every call writes batches.
local EVENTS_PER_ENTRY = 8
-- The call's events not yet written: PENDING[1 .. npending] (the table is kept
-- from call to call, so a call builds none; what lies past npending is stale).
local PENDING = {}
local npending = 0 -- @per-call
local function events_flush()
  local k = npending
  if k == 0 then return nil end
  npending = 0
  local key = P .. ':events'
  local id = redis.call('XADD', key, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'e', PENDING[1])
  if k == 2 then
    -- The second alone: `*` gives it (ms, b + 1), the id the loop below
    -- would, without reading the first id back.
    return redis.call('XADD', key, '*', 'e', PENDING[2])
  end
  if k > 2 then
    local dash = string.find(id, '-', 1, true)
    local ms_dash, b = string.sub(id, 1, dash), tonumber(string.sub(id, dash + 1))
    local i = 2
    while i <= k do
      local last = math.min(i + EVENTS_PER_ENTRY - 1, k)
      local args = {key, ms_dash .. int(b + last - 1)}
      for j = i, last do
        args[#args + 1] = 'e'; args[#args + 1] = PENDING[j]
      end
      id = redis.call('XADD', unpack(args))
      i = last + 1
    end
  end
  return id
end
local EVENT_SUBJECTS = {task = 't', queue = 'q', group = 'g', workflow = 'w'}
-- Adds one event, a field `e` as emit builds it (or a caller that builds the
-- same form: tasks/lib's emit_task), to the call's events.
local function emit_entry(e)
  npending = npending + 1
  PENDING[npending] = e
end
local function emit(etype, node, data, ...)
  if type(data) == 'table' then data = cjson.encode(data) end
  local n = select('#', ...)
  local e
  if n == 4 then
    local k1, v1, k2, v2 = ...
    e = etype .. '\n' .. (node or '') .. '\n' .. (EVENT_SUBJECTS[k1] or k1) .. '=' .. v1 .. '\n' ..
      (EVENT_SUBJECTS[k2] or k2) .. '=' .. v2 .. '\n' .. (data or '{}')
  elseif n == 0 then
    e = etype .. '\n' .. (node or '') .. '\n' .. (data or '{}')
  else
    local parts, s = {etype, node or ''}, {...}
    for i = 1, n, 2 do parts[#parts + 1] = (EVENT_SUBJECTS[s[i]] or s[i]) .. '=' .. s[i + 1] end
    parts[#parts + 1] = data or '{}'
    e = table.concat(parts, '\n')
  end
  emit_entry(e)
end
-- emit, written at once: returns the event's stream id (the call's events
-- before it are written first, so the order holds).
local function emit_now(...)
  emit(...)
  return events_flush()
end

-- The epoch of the fencing tokens (P:epoch, absent: 1). Sentinel and coordinated
-- modes raise it when the node switches masters, before the new one serves a call
-- (failover/lua/epoch.lua); a Redis Cluster fails over on its own, unseen by the
-- nodes, so there the call itself checks which master it runs on: P:epoch:master
-- holds the CLUSTER MYID of the master that last raised the epoch, and a call on
-- another master (a promoted replica, or a new owner of the slot) raises it first,
-- in the same atomic step as the token it hands out. Every token after a failover
-- is then above every token before it, even those the new master never received.
-- The first call on a namespace records its master and raises the epoch too (it
-- cannot know what an earlier master handed out).
local function fence_epoch()
  local epoch = tonumber(redis.call('GET', P .. ':epoch') or '1')
  if not CLUSTER then return epoch end
  local me = redis.call('CLUSTER', 'MYID')
  local before = redis.call('GET', P .. ':epoch:master')
  if before == me then return epoch end
  epoch = epoch + 1
  redis.call('SET', P .. ':epoch', int(epoch))
  redis.call('SET', P .. ':epoch:master', me)
  if before then emit('redis.failover', '', {epoch = epoch, master = me, was = before}) end
  return epoch
end

-- xpcall's handler for a script's body: the error as it was raised.
local function the_error(e) return e end

-- The start of every call, after the per-call state is reset: takes the deadline
-- off ARGV and refuses a late call (G12). Returns the error reply to return, or nil.
local function begin()
  DEADLINE = tonumber(table.remove(ARGV))
  if not DEADLINE or now_ms() > DEADLINE then
    return redis.error_reply('LATE the call reached Redis after its deadline (Redis time ' .. string.format('%d', now_ms()) ..
      ', deadline ' .. tostring(DEADLINE) .. '): it was not applied')
  end
end
