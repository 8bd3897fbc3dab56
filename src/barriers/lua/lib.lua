-- lib.lua: barrier helpers shared by the barrier scripts (prepended after the prelude
-- and nodes' liveness.lua).
--
--@include nodes/liveness
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Key layout (P is the hash-tagged prefix; b a barrier name, r a round id, both
-- validated [A-Za-z0-9._-]{1,128}):
--   P:barriers                 set    configured barrier names (bounded by max_barriers)
--   P:barrier:<b>              hash   config: parts (",n1,n2,"), n, max_missing, timeout_ms,
--                                     updated_at, updated_by
--   P:barrier:<b>:rounds       zset   round id -> opened_at (Redis ms): every stored round, for
--                                     listing; TTL at least timeout + retention
--   P:barrier:<b>:open         zset   undecided round id -> deadline (Redis ms); at most
--                                     max_open_rounds; TTL at least timeout + retention
--   P:barrier:<b>:decided      zset   decided round id -> decided_at (Redis ms); at most
--                                     rounds_kept; TTL at least retention
--   P:barrier:<b>:r:<r>        hash   one round, TTL timeout + retention (retention once decided):
--                                     parts, n, max_missing, timeout_ms, opened_at, deadline,
--                                     opened_id (stream id of its barrier.round_opened event: tells
--                                     this incarnation of round r from a later one), arrived
--                                     (count), a:<node> = arrival ms, l:<node> = late arrival ms,
--                                     verdict, decided_at, reason
--   P:barriers:deadlines       zset   "<b>/<r>" -> deadline (Redis ms), open rounds only
--   P:barrier:<b>:hold         hash   etcd-style hold: holder, held_at; TTL
--   P:barriers:holds           zset   held barrier name -> when its hold lifts itself (Redis ms);
--                                     entries past it are dropped by the next hold; TTL at least
--                                     the longest hold
--   P:dbarrier:<b>             hash   DoubleBarrier: count, created_at, ready_at, cycle; idle TTL
--   P:dbarrier:<b>:in          zset   DoubleBarrier entrants: node -> entered_at; idle TTL
--   P:dbarriers                zset   DoubleBarrier name -> last activity (trimmed by idle TTL)
local DEADLINES = P .. ':barriers:deadlines' -- @per-call
local DBARRIERS = P .. ':dbarriers' -- @per-call
-- The API's upper bound on timeout_ms (routes.rs): no round key outlives
-- opened_at + MAX_TIMEOUT_MS + retention.
local MAX_TIMEOUT_MS = 86400000

local function round_key(b, r) return P .. ':barrier:' .. b .. ':r:' .. r end
local function rounds_key(b) return P .. ':barrier:' .. b .. ':rounds' end
local function open_key(b) return P .. ':barrier:' .. b .. ':open' end
local function decided_key(b) return P .. ':barrier:' .. b .. ':decided' end
local function db_key(b) return P .. ':dbarrier:' .. b end
local function db_in_key(b) return P .. ':dbarrier:' .. b .. ':in' end

-- Gives key a TTL of at least ms: never shortens it (other members may need longer),
-- and sets one on a key that has none.
local function ttl_at_least(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then redis.call('PEXPIRE', key, ms) end
end

-- A JSON array of strings that need no escaping (validated ids).
local function json_list(items)
  if #items == 0 then return '[]' end
  return '["' .. table.concat(items, '","') .. '"]'
end

-- The participants of a round, from its ",a,b," snapshot.
local function split_parts(parts)
  local out = {}
  for id in string.gmatch(parts, '[^,]+') do out[#out + 1] = id end
  return out
end

-- Forgets decided round o of barrier b: its index entries, and its key unless that
-- holds an undecided round (a later incarnation of o, opened after the entry was made).
local function drop_decided(b, o)
  redis.call('ZREM', decided_key(b), o)
  redis.call('ZREM', rounds_key(b), o)
  local ok = round_key(b, o)
  if redis.call('EXISTS', ok) == 0 or redis.call('HEXISTS', ok, 'verdict') == 1 then redis.call('DEL', ok) end
end

-- Keeps the `kept` most recently decided rounds of barrier b and deletes the older
-- ones; also forgets rounds whose retention passed (their keys expired). Round `keep`,
-- decided by the calling script, is never deleted: the caller reads it afterwards, and
-- so do its waiters. Only decided rounds count: undecided ones are bounded apart (at
-- most max_open_rounds per barrier, each until its deadline).
local function trim_decided(b, kept, keep, now, retention)
  local dk = decided_key(b)
  for _, o in ipairs(redis.call('ZRANGEBYSCORE', dk, '-inf', int(now - tonumber(retention)))) do
    if o ~= keep then drop_decided(b, o) end
  end
  local extra = redis.call('ZCARD', dk) - kept
  if extra <= 0 then return end
  -- The oldest extra + 1: one to spare in case `keep` is among them (a tie in ms).
  for _, o in ipairs(redis.call('ZRANGE', dk, 0, extra)) do
    if extra == 0 then break end
    if o ~= keep then
      drop_decided(b, o)
      extra = extra - 1
    end
  end
end

-- Sets the verdict of round r of barrier b exactly once: HSETNX of `verdict` is the
-- one decision; a second caller finds the field set and changes nothing. Emits
-- barrier.released or barrier.aborted with the arrived and missing participants.
-- Moves the round from the open to the decided index and trims the decided rounds to
-- `kept` (never this one). Returns true when this call decided.
local function decide(rk, b, r, verdict, reason, now, node, retention, kept)
  if redis.call('HSETNX', rk, 'verdict', verdict) == 0 then return false end
  redis.call('HSET', rk, 'decided_at', int(now), 'reason', reason)
  redis.call('ZREM', DEADLINES, b .. '/' .. r)
  redis.call('PEXPIRE', rk, retention)
  redis.call('ZREM', open_key(b), r)
  redis.call('ZADD', decided_key(b), int(now), r)
  ttl_at_least(decided_key(b), retention)
  ttl_at_least(rounds_key(b), retention)
  trim_decided(b, kept, r, now, retention)
  local f = redis.call('HMGET', rk, 'parts', 'opened_at', 'arrived', 'n', 'max_missing')
  local arrived, missing = {}, {}
  for _, id in ipairs(split_parts(f[1] or '')) do
    if redis.call('HEXISTS', rk, 'a:' .. id) == 1 then
      arrived[#arrived + 1] = id
    else
      missing[#missing + 1] = id
    end
  end
  local data = '{"reason":"' .. reason .. '","arrived":' .. json_list(arrived) .. ',"missing":' ..
    json_list(missing) .. ',"n":' .. (f[4] or '0') .. ',"max_missing":' .. (f[5] or '0') ..
    ',"opened_at":' .. (f[2] or '0') .. '}'
  emit('barrier.' .. verdict, node, data, 'barrier', b, 'round', r)
  return true
end

-- Decides an open round whose deadline has passed (now >= deadline) by the rule:
-- released when at most max_missing participants are missing, else aborted.
-- Returns the verdict set by this call, or false.
local function decide_at_deadline(rk, b, r, now, node, retention, kept)
  local f = redis.call('HMGET', rk, 'n', 'max_missing', 'arrived')
  local missing = tonumber(f[1]) - tonumber(f[3] or '0')
  local verdict = 'aborted'
  if missing <= tonumber(f[2]) then verdict = 'released' end
  if decide(rk, b, r, verdict, 'deadline', now, node, retention, kept) then return verdict end
  return false
end

-- Removes DoubleBarrier b's entrants whose node is gone (node_gone of nodes'
-- liveness.lua, after the caller's liveness pass) (dbarrier.evicted each), and
-- resets the barrier when nobody is left (dbarrier.reset if it had been ready).
-- Returns the number of entrants left and the number evicted.
local function db_evict(b, now, node)
  local ink, hk = db_in_key(b), db_key(b)
  local evicted = 0
  local members = redis.call('ZRANGE', ink, 0, -1)
  for _, m in ipairs(members) do
    if node_gone(m, now) then
      redis.call('ZREM', ink, m)
      evicted = evicted + 1
      emit('dbarrier.evicted', node, '{"entrant":"' .. m .. '","reason":"node_dead"}', 'dbarrier', b)
    end
  end
  local left = redis.call('ZCARD', ink)
  if left == 0 and redis.call('EXISTS', hk) == 1 then
    local cycle = redis.call('HGET', hk, 'cycle')
    redis.call('DEL', hk)
    if cycle then emit('dbarrier.reset', node, '{"cycle":"' .. cycle .. '"}', 'dbarrier', b) end
  end
  return left, evicted
end
