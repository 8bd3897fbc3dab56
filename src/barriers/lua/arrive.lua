-- arrive.lua: a participant arrives at round r of barrier b (G8). Idempotent: a
-- participant that arrives again changes nothing and reads the round as it is.
--
-- The first arrival opens the round: it snapshots the barrier's participants and
-- tolerance, and sets deadline = Redis time + timeout_ms. The verdict is set once
-- (see decide in lib.lua): `released` by the arrival that completes the set of
-- participants; at the deadline, `released` if at most max_missing are missing and
-- `aborted` otherwise. An arrival at or after the deadline first decides the round
-- (without counting itself) and is then recorded as late. Opening or deciding a round
-- deletes the oldest decided rounds beyond rounds_kept.
--
-- KEYS[1]  P:barrier:<b>            config hash
-- KEYS[2]  P:barrier:<b>:r:<r>      the round
-- KEYS[3]  P:barrier:<b>:rounds     round index
-- KEYS[4]  P:barriers:deadlines     open rounds by deadline
-- ARGV[1]  barrier name b
-- ARGV[2]  round id r
-- ARGV[3]  participant (node id) arriving
-- ARGV[4]  acting muster node id (events)
-- ARGV[5]  retention_ms             how long a decided round is kept
-- ARGV[6]  rounds_kept
--
-- Returns {code, decided, now_ms, field, value, ...}
--   code     1 ok, -1 no such barrier, -2 not a participant of this round
--   decided  the verdict this call set ('released' | 'aborted'), or ''
--   field, value ...  the round hash after the call (HGETALL)
-- Emits barrier.round_opened (first arrival), barrier.arrived (each participant once,
-- before the verdict), barrier.released | barrier.aborted (the decision), barrier.late
-- (first arrival of a participant after the decision).
local b, r, who, me = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, kept = ARGV[5], tonumber(ARGV[6])
local rk = KEYS[2]
local now = now_ms()
local nows = int(now)
local cfg = redis.call('HMGET', KEYS[1], 'parts', 'n', 'max_missing', 'timeout_ms')
if not cfg[1] then return {-1, '', now} end

local parts = redis.call('HGET', rk, 'parts')
if not parts then
  -- Open the round with a snapshot of the configuration.
  if not string.find(cfg[1], ',' .. who .. ',', 1, true) then return {-2, '', now} end
  local deadline = int(now + tonumber(cfg[4]))
  redis.call('HSET', rk, 'parts', cfg[1], 'n', cfg[2], 'max_missing', cfg[3], 'timeout_ms', cfg[4],
    'opened_at', nows, 'deadline', deadline, 'arrived', '0')
  redis.call('PEXPIRE', rk, int(tonumber(cfg[4]) + tonumber(retention)))
  redis.call('ZADD', DEADLINES, deadline, b .. '/' .. r)
  redis.call('ZADD', KEYS[3], nows, r)
  redis.call('PEXPIRE', KEYS[3], int(tonumber(cfg[4]) + tonumber(retention)))
  trim_rounds(b, KEYS[3], kept)
  emit('barrier.round_opened', me, '{"by":"' .. who .. '","deadline":' .. deadline .. ',"n":' .. cfg[2] ..
    ',"max_missing":' .. cfg[3] .. '}', 'barrier', b, 'round', r)
  parts = cfg[1]
elseif not string.find(parts, ',' .. who .. ',', 1, true) then
  return {-2, '', now}
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
