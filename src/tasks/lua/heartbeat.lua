-- heartbeat.lua: the holder of the current token reports progress; learns about a
-- requested cancel. Also the task's acknowledgement: its claim lease ends (P:unacked,
-- see orphans/lua/unacked.lua); POST /api/v1/tasks/{id}/ack is this script with
-- neither progress nor fields.
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  token (decimal)
-- ARGV[3]  progress 0-100, or '' to leave it
-- ARGV[4]  runtime fields (JSON object text), or '' to leave them
--
-- Returns {code, state, cancel_requested}
--   code  1 ok, E.STALE (token not current or task not running), E.NOT_FOUND
-- Emits task.progress when progress or fields are given.
local id, token, progress, fields = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local f = redis.call('HMGET', KEYS[1], 'state', 'token', 'queue', 'owner', 'cancel_requested', 'attempts')
if not f[1] then return {E.NOT_FOUND, '', 0} end
if f[1] ~= 'running' or f[2] ~= token then return {E.STALE, f[1], 0} end
local now = now_ms()
redis.call('HSET', KEYS[1], 'updated_at', int(now))
redis.call('ZREM', P .. ':unacked', id)
if progress ~= '' or fields ~= '' then
  if progress ~= '' then redis.call('HSET', KEYS[1], 'progress', progress) end
  if fields ~= '' then redis.call('HSET', KEYS[1], 'fields', fields) end
  emit('task.progress', f[4], {attempt = tonumber(f[6] or '0'), progress = tonumber(progress)}, 'task', id, 'queue', f[3])
end
return {1, 'running', tonumber(f[5] or '0')}
