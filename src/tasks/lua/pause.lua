-- pause.lua: pauses or resumes a queue; a paused queue hands out no tasks.
--
-- KEYS[1]  P:q:<queue>:meta
-- ARGV[1]  queue
-- ARGV[2]  '1' pause, '0' resume
-- ARGV[3]  actor, for the event
-- ARGV[4]  max_queues
-- ARGV[5]  '1' emit the event, '0' not (a split namespace pauses a queue in
--          every shard and emits from the queue's own shard only)
--
-- Returns 1 changed, 0 already so, E.TOO_MANY_QUEUES.
-- Emits queue.paused or queue.resumed when it changed (and ARGV[5] is '1').
local q, paused, actor = ARGV[1], ARGV[2], ARGV[3]
if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
  if redis.call('SCARD', P .. ':queues') >= tonumber(ARGV[4]) then return E.TOO_MANY_QUEUES end
  redis.call('SADD', P .. ':queues', q)
end
local cur = redis.call('HGET', KEYS[1], 'paused') or '0'
if cur == paused then return 0 end
redis.call('HSET', KEYS[1], 'paused', paused)
local etype = 'queue.resumed'
if paused == '1' then etype = 'queue.paused' end
if ARGV[5] == '1' then emit(etype, actor, nil, 'queue', q) end
return 1
