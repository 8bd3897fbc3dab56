-- complete.lua: finishes running tasks as succeeded; the batch form of complete.
--
-- Only the holder of the current fencing token may complete a task (G1): a stale
-- or unknown token changes nothing and reports the task's current state.
--
-- KEYS[1]  P:deadlines             (routes the call)
-- ARGV[1]  retention_ms            how long the finished task is kept
-- ARGV[2]  n; then per task: id, token (decimal), result (JSON text, '' for none)
--
-- Returns a flat list, 3 entries per task: code, state, attempt
--   code  1 succeeded, -1 stale token or not running (state is the current one),
--         -2 unknown task
-- Emits task.succeeded per completed task.
local retention, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local id, token, result = ARGV[3 + i * 3], ARGV[4 + i * 3], ARGV[5 + i * 3]
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'token', 'queue', 'group', 'owner', 'attempts')
  if not f[1] then
    out[#out + 1] = -2; out[#out + 1] = ''; out[#out + 1] = 0
  elseif f[1] ~= 'running' or f[2] ~= token then
    out[#out + 1] = -1; out[#out + 1] = f[1]; out[#out + 1] = tonumber(f[6])
  else
    local q, g, owner, attempt = f[3], f[4] or '', f[5], tonumber(f[6])
    release_running(id, q, g, owner)
    redis.call('HSET', t, 'result', result, 'progress', 100, 'e' .. attempt, now .. '|succeeded')
    finish(id, q, 'succeeded', now, retention)
    emit('task.succeeded', now, owner, subj(id, q, g), {attempt = attempt})
    out[#out + 1] = 1; out[#out + 1] = 'succeeded'; out[#out + 1] = attempt
  end
end
return out
