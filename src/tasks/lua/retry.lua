-- retry.lua: an admin requeues a dead task with a fresh set of attempts.
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  actor, for the event
--
-- Returns {code, state}: 1 queued, 0 not dead (state), -2 unknown task
-- Emits task.enqueued (data.retry = true).
local id, actor = ARGV[1], ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'state', 'queue', 'group', 'priority', 'alias')
if not f[1] then return {-2, ''} end
if f[1] ~= 'dead' then return {0, f[1]} end
local q, g = f[2], f[3] or ''
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
redis.call('SADD', P .. ':queues', q)
redis.call('HSET', KEYS[1], 'attempts', '0', 'cancel_requested', '0', 'error', '')
redis.call('HDEL', KEYS[1], 'finished_at')
make_queued(id, q, g, order_score(tonumber(f[4]), next_seqs(1)), int(now))
emit('task.enqueued', actor, {state = 'queued', retry = true}, 'task', id, 'queue', q)
return {1, 'queued'}
