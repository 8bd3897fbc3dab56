-- cancel.lua: cancels a queued or delayed task at once; asks a running task's
-- worker to stop (it learns on its next heartbeat; its fail then cancels).
--
--@include tasks/lib
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  retention_ms
-- ARGV[3]  actor (token name or node), for the event
--
-- Returns {code, state}
--   code  1 cancelled, 2 cancel requested (running), E.WRONG_STATE already finished
--         (state), E.NOT_FOUND
-- Emits task.cancelled, or task.cancel_requested.
local id, retention, actor = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local f = redis.call('HMGET', KEYS[1], 'state', 'queue', 'group', 'attempts')
if not f[1] then return {E.NOT_FOUND, ''} end
local state, q, g = f[1], f[2], f[3] or ''
local now = now_ms()
if state == 'queued' then
  unqueue(id, q, g)
elseif state == 'delayed' then
  redis.call('ZREM', qkey(q, 'delayed'), id)
elseif state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1', 'updated_at', int(now))
  emit('task.cancel_requested', actor, {attempt = tonumber(f[4])}, 'task', id, 'queue', q)
  return {2, 'running'}
else
  return {E.WRONG_STATE, state}
end
finish(id, q, 'cancelled', int(now), retention)
emit_task('task.cancelled', actor, '{"attempt":' .. (f[4] or '0') .. '}', id, q, g)
return {1, 'cancelled'}
