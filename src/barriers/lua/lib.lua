-- lib.lua: barrier helpers shared by the barrier scripts (prepended after the prelude
-- and nodes' liveness.lua).
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Key layout (P is the hash-tagged prefix; b a barrier name, r a round id, both
-- validated [A-Za-z0-9._-]{1,128}):
--   P:barriers                 set    configured barrier names (bounded by max_barriers)
--   P:barrier:<b>              hash   config: parts (",n1,n2,"), n, max_missing, timeout_ms,
--                                     updated_at, updated_by
--   P:barrier:<b>:rounds       zset   round id -> opened_at (Redis ms); at most rounds_kept
--                                     decided rounds; TTL timeout + retention
--   P:barrier:<b>:r:<r>        hash   one round, TTL timeout + retention (retention once decided):
--                                     parts, n, max_missing, timeout_ms, opened_at, deadline,
--                                     arrived (count), a:<node> = arrival ms, l:<node> = late
--                                     arrival ms, verdict, decided_at, reason
--   P:barriers:deadlines       zset   "<b>/<r>" -> deadline (Redis ms), open rounds only
--   P:barrier:<b>:hold         hash   etcd-style hold: holder, held_at; TTL
--   P:dbarrier:<b>             hash   DoubleBarrier: count, created_at, ready_at, cycle; idle TTL
--   P:dbarrier:<b>:in          zset   DoubleBarrier entrants: node -> entered_at; idle TTL
--   P:dbarriers                zset   DoubleBarrier name -> last activity (trimmed by idle TTL)
local DEADLINES = P .. ':barriers:deadlines'
local DBARRIERS = P .. ':dbarriers'

local function round_key(b, r) return P .. ':barrier:' .. b .. ':r:' .. r end
local function db_key(b) return P .. ':dbarrier:' .. b end
local function db_in_key(b) return P .. ':dbarrier:' .. b .. ':in' end

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

-- Keeps the newest `kept` rounds of barrier b in its index (KEY idx) and deletes older
-- decided ones; an undecided round is never dropped (it is bounded by its deadline,
-- and trimmed when it is decided).
local function trim_rounds(b, idx, kept)
  local extra = redis.call('ZCARD', idx) - kept
  if extra <= 0 then return end
  for _, o in ipairs(redis.call('ZRANGE', idx, 0, extra - 1)) do
    local ok = round_key(b, o)
    if redis.call('HEXISTS', ok, 'verdict') == 1 or redis.call('EXISTS', ok) == 0 then
      redis.call('ZREM', idx, o)
      redis.call('DEL', ok)
    end
  end
end

-- Sets the verdict of round r of barrier b exactly once: HSETNX of `verdict` is the
-- one decision; a second caller finds the field set and changes nothing. Emits
-- barrier.released or barrier.aborted with the arrived and missing participants.
-- Trims the barrier's rounds to `kept`. Returns true when this call decided.
local function decide(rk, b, r, verdict, reason, now, node, retention, kept)
  if redis.call('HSETNX', rk, 'verdict', verdict) == 0 then return false end
  redis.call('HSET', rk, 'decided_at', int(now), 'reason', reason)
  redis.call('ZREM', DEADLINES, b .. '/' .. r)
  redis.call('PEXPIRE', rk, retention)
  trim_rounds(b, P .. ':barrier:' .. b .. ':rounds', kept)
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

-- Whether a registered node (muster node or external worker) is gone: its heartbeat
-- expired by Redis time and the post-stall grace does not hold (grace from
-- liveness_pass in nodes' liveness.lua).
local function node_gone(node, now, grace)
  if grace > 0 then return false end
  local s = redis.call('ZSCORE', P .. ':nodes', node)
  return (not s) or tonumber(s) <= now
end

-- Removes DoubleBarrier b's entrants whose node is gone (dbarrier.evicted each), and
-- resets the barrier when nobody is left (dbarrier.reset if it had been ready).
-- Returns the number of entrants left and the number evicted.
local function db_evict(b, now, grace, node)
  local ink, hk = db_in_key(b), db_key(b)
  local evicted = 0
  if grace == 0 then
    local members = redis.call('ZRANGE', ink, 0, -1)
    for _, m in ipairs(members) do
      if node_gone(m, now, grace) then
        redis.call('ZREM', ink, m)
        evicted = evicted + 1
        emit('dbarrier.evicted', node, '{"entrant":"' .. m .. '","reason":"node_dead"}', 'dbarrier', b)
      end
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
