-- retry.lua: an admin requeues a dead task with a fresh set of attempts.
--
--@include tasks/lib
--
-- The task's queue may have been forgotten meanwhile (or never registered,
-- for a workflow successor refused for tasks.max_queues): it is registered
-- again, within tasks.max_queues.
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  actor, for the event
-- ARGV[3]  max_queues
--
-- Returns {code, state}: 1 queued, E.WRONG_STATE not dead (state), E.NOT_FOUND,
--   E.TOO_MANY_QUEUES its queue is not registered and the cluster has max_queues queues
-- Emits task.enqueued (data.retry = true).
local id, actor = ARGV[1], ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'state', 'queue', 'group', 'priority', 'alias')
if not f[1] then return {E.NOT_FOUND, ''} end
if f[1] ~= 'dead' then return {E.WRONG_STATE, f[1]} end
local q, g = f[2], f[3] or ''
if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
  if redis.call('SCARD', P .. ':queues') >= tonumber(ARGV[3]) then return {E.TOO_MANY_QUEUES, 'dead'} end
  redis.call('SADD', P .. ':queues', q)
end
local now = now_ms()
redis.call('ZREM', qkey(q, 'dead'), id)
redis.call('ZREM', P .. ':dead', id)
redis.call('PERSIST', KEYS[1])
if f[5] and f[5] ~= '' then
  -- Take the alias back unless a live task got it meanwhile; then this task
  -- goes on without it.
  local akey = P .. ':alias:' .. f[5]
  local holder = redis.call('GET', akey)
  local hstate = holder and holder ~= id and redis.call('HGET', tkey(holder), 'state')
  if hstate == 'queued' or hstate == 'delayed' or hstate == 'running' then
    redis.call('HDEL', KEYS[1], 'alias')
  else
    redis.call('SET', akey, id)
  end
end
redis.call('HSET', KEYS[1], 'attempts', '0', 'cancel_requested', '0', 'error', '')
redis.call('HDEL', KEYS[1], 'finished_at')
make_queued(id, q, g, order_score(tonumber(f[4]), next_seqs(1)), int(now))
emit('task.enqueued', actor, {state = 'queued', retry = true}, 'task', id, 'queue', q)
return {1, 'queued'}
