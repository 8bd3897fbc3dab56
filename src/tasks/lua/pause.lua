-- pause.lua: pauses or resumes a queue; a paused queue hands out no tasks.
--
-- A split namespace (redis.shards) pauses a queue in every shard, since a
-- group's tasks of the queue may be in any. The queue's own shard decides:
-- there a change bumps the queue's pause version, and the other shards take
-- that version with its state, newer versions only. So a shard that missed a
-- pause (its master failed) converges later, by a retry of the same call or
-- by any node's janitor, and a late copy of an older change never undoes a
-- newer one.
--
-- KEYS[1]  P:q:<queue>:meta
-- ARGV[1]  queue
-- ARGV[2]  '1' pause, '0' resume
-- ARGV[3]  actor, for the event
-- ARGV[4]  max_queues
-- ARGV[5]  version: '' in the queue's own shard (it decides, bumps the version
--          and emits the event), else the version the own shard gave this change
--
-- Returns {changed (1 or 0), version}, or E.TOO_MANY_QUEUES.
-- Emits queue.paused or queue.resumed when it changed in the queue's own shard.
local q, paused, actor, version = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
  if redis.call('SCARD', P .. ':queues') >= tonumber(ARGV[4]) then return E.TOO_MANY_QUEUES end
  redis.call('SADD', P .. ':queues', q)
end
local cur = redis.call('HGET', KEYS[1], 'paused') or '0'
local have = tonumber(redis.call('HGET', KEYS[1], 'pause_v') or '0')
if version ~= '' then
  -- A copy of the own shard's change: newer versions only.
  local v = tonumber(version)
  if v <= have then return {0, have} end
  redis.call('HSET', KEYS[1], 'paused', paused, 'pause_v', v)
  if cur == paused then return {0, v} end
  return {1, v}
end
if cur == paused then return {0, have} end
have = have + 1
redis.call('HSET', KEYS[1], 'paused', paused, 'pause_v', have)
local etype = 'queue.resumed'
if paused == '1' then etype = 'queue.paused' end
emit(etype, actor, nil, 'queue', q)
return {1, have}
