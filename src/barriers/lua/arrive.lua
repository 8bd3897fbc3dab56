-- arrive.lua: a participant arrives at round r of barrier b (G8). Idempotent: a
-- participant that arrives again changes nothing and reads the round as it is.
--
--@include barriers/lib
--
-- The first arrival opens the round: it snapshots the barrier's participants and
-- tolerance, and sets deadline = Redis time + timeout_ms. It is refused (and changes
-- nothing but stale entries of the open index) when the barrier already has
-- max_open_rounds undecided rounds. The verdict
-- is set once (see decide in lib.lua): `released` by the arrival that completes the
-- set of participants; at the deadline, `released` if at most max_missing are missing
-- and `aborted` otherwise. An arrival at or after the deadline first decides the round
-- (without counting itself) and is then recorded as late. Deciding a round deletes the
-- oldest decided rounds beyond rounds_kept, never the round just decided.
--
-- KEYS[1]  P:barrier:<b>            config hash
-- KEYS[2]  P:barrier:<b>:r:<r>      the round
-- KEYS[3]  P:barrier:<b>:rounds     round index
-- KEYS[4]  P:barriers:deadlines     open rounds by deadline
-- (computed by lib.lua: P:barrier:<b>:open and P:barrier:<b>:decided)
-- ARGV[1]  barrier name b
-- ARGV[2]  round id r
-- ARGV[3]  participant (node id) arriving
-- ARGV[4]  acting muster node id (events)
-- ARGV[5]  retention_ms             how long a decided round is kept
-- ARGV[6]  rounds_kept              decided rounds kept per barrier
-- ARGV[7]  max_open_rounds          undecided rounds allowed per barrier
--
-- Returns {code, decided, now_ms, field, value, ...}
--   code     1 ok, E.NOT_FOUND no such barrier, E.NOT_PARTICIPANT not a participant of
--            this round, E.TOO_MANY the round would open but the barrier has
--            max_open_rounds undecided rounds already
--   decided  the verdict this call set ('released' | 'aborted'), or ''
--   field, value ...  the round hash after the call (HGETALL)
-- Emits barrier.round_opened (first arrival), barrier.arrived (each participant once,
-- before the verdict), barrier.released | barrier.aborted (the decision), barrier.late
-- (first arrival of a participant after the decision).
local b, r, who, me = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, kept, max_open = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local rk = KEYS[2]
local now = now_ms()
local nows = int(now)
local cfg = redis.call('HMGET', KEYS[1], 'parts', 'n', 'max_missing', 'timeout_ms')
if not cfg[1] then return {E.NOT_FOUND, '', now} end

local parts = redis.call('HGET', rk, 'parts')
if not parts then
  -- Open the round with a snapshot of the configuration.
  if not string.find(cfg[1], ',' .. who .. ',', 1, true) then return {E.NOT_PARTICIPANT, '', now} end
  local ok = open_key(b)
  if redis.call('ZCARD', ok) >= max_open then
    -- At the bound: entries past their deadline may be stale (a round decided by an
    -- older node, or expired undecided); drop those before refusing.
    for _, o in ipairs(redis.call('ZRANGEBYSCORE', ok, '-inf', nows)) do
      local k = round_key(b, o)
      if redis.call('EXISTS', k) == 0 or redis.call('HEXISTS', k, 'verdict') == 1 then redis.call('ZREM', ok, o) end
    end
    if redis.call('ZCARD', ok) >= max_open then return {E.TOO_MANY, '', now} end
  end
  local life = tonumber(cfg[4]) + tonumber(retention)
  local deadline = int(now + tonumber(cfg[4]))
  redis.call('HSET', rk, 'parts', cfg[1], 'n', cfg[2], 'max_missing', cfg[3], 'timeout_ms', cfg[4],
    'opened_at', nows, 'deadline', deadline, 'arrived', '0')
  redis.call('PEXPIRE', rk, int(life))
  redis.call('ZADD', DEADLINES, deadline, b .. '/' .. r)
  redis.call('ZADD', ok, deadline, r)
  ttl_at_least(ok, int(life))
  -- An entry of an earlier incarnation of r (trimmed or expired) must not trim this one.
  redis.call('ZREM', decided_key(b), r)
  redis.call('ZADD', KEYS[3], nows, r)
  ttl_at_least(KEYS[3], int(life))
  -- Entries of rounds opened longer ago than the longest timeout plus retention: their
  -- keys expired (rounds stored before the open and decided indexes existed are left
  -- nowhere else).
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. int(now - MAX_TIMEOUT_MS - tonumber(retention)))
  local oid = emit_now('barrier.round_opened', me, '{"by":"' .. who .. '","deadline":' .. deadline .. ',"n":' ..
    cfg[2] .. ',"max_missing":' .. cfg[3] .. '}', 'barrier', b, 'round', r)
  redis.call('HSET', rk, 'opened_id', oid)
  parts = cfg[1]
elseif not string.find(parts, ',' .. who .. ',', 1, true) then
  return {E.NOT_PARTICIPANT, '', now}
end

local decided = ''
local f = redis.call('HMGET', rk, 'verdict', 'deadline')
local verdict = f[1]
if not verdict and now >= tonumber(f[2]) then
  -- The deadline passed and nobody has decided yet: decide first, without this arrival.
  verdict = decide_at_deadline(rk, b, r, now, me, retention, kept)
  decided = verdict or ''
  verdict = redis.call('HGET', rk, 'verdict')
end

if verdict then
  -- Decided: a participant that had not arrived is late.
  if redis.call('HEXISTS', rk, 'a:' .. who) == 0 and redis.call('HSETNX', rk, 'l:' .. who, nows) == 1 then
    emit('barrier.late', me, '{"participant":"' .. who .. '","verdict":"' .. verdict .. '"}', 'barrier', b,
      'round', r)
  end
elseif redis.call('HSETNX', rk, 'a:' .. who, nows) == 1 then
  local arrived = redis.call('HINCRBY', rk, 'arrived', 1)
  emit('barrier.arrived', me, '{"participant":"' .. who .. '","arrived":' .. arrived .. '}', 'barrier', b,
    'round', r)
  if arrived >= tonumber(redis.call('HGET', rk, 'n')) then
    decide(rk, b, r, 'released', 'all_arrived', now, me, retention, kept)
    decided = 'released'
  end
end

local out = {1, decided, now}
local all = redis.call('HGETALL', rk)
for i = 1, #all do out[#out + 1] = all[i] end
return out
