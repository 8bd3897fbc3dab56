-- fail.lua: the holder of the current token reports a failed execution.
--
--@include tasks/lib
--
-- With attempts left (and the failure retryable) the task is retried after an
-- exponential backoff with jitter; otherwise it is dead. A task whose cancel was
-- requested is cancelled instead.
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  token (decimal)
-- ARGV[3]  error message
-- ARGV[4]  retryable: '1' or '0'
-- ARGV[5]  jitter in [0, 1), drawn by the caller
-- ARGV[6]  retention_ms (cancelled)
-- ARGV[7]  dead_retention_ms
-- ARGV[8]  next_max                 0, or claim up to this many next tasks for the owner
-- ARGV[9]  next_queue               queue to claim from ('': this task's queue)
-- ARGV[10] next_ack_ms              the next tasks' claim lease (ms; 0: none)
--
-- Returns {code, state, attempt, run_at, queue[, claim]}
--   code  1 failed (state 'delayed' with run_at, or 'dead'), 2 cancelled,
--         E.STALE (token not current or task not running: state and attempt are the
--         current ones), E.NOT_FOUND
--   claim when next_max > 0 and the failure was recorded: {owner, code, next_due,
--         more, task...}: the owner claimed for, then what claim.lua returns
-- Emits task.failed, then task.retrying, task.dead or task.cancelled; task.claimed.
local id, token, err, retryable, jitter = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', tonumber(ARGV[5])
local retention, dead_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local next_max, next_queue, next_ack_ms = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
local now = now_ms()
local f = redis.call('HMGET', KEYS[1], 'state', 'token', 'queue', 'group', 'owner', 'attempts', 'max_attempts',
  'backoff_base', 'backoff_cap', 'cancel_requested')
if not f[1] then return {E.NOT_FOUND, '', 0, 0, ''} end
if f[1] ~= 'running' or f[2] ~= token then return {E.STALE, f[1], tonumber(f[6] or '0'), 0, ''} end
local q, g, owner, attempt = f[3], f[4] or '', f[5], tonumber(f[6] or '0')
release_running(id, q, g, owner)
redis.call('HSET', KEYS[1], 'error', err, 'e' .. attempt, int(now) .. '|failed')
emit_task('task.failed', owner, {attempt = attempt, error = string.sub(err, 1, 200)}, id, q, g)
if f[10] == '1' then
  finish(id, q, 'cancelled', int(now), retention)
  emit('task.cancelled', owner, {attempt = attempt}, 'task', id, 'queue', q)
  local out = {2, 'cancelled', attempt, 0, q}
  if next_queue == '' then next_queue = q end
  claim_next(next_queue, owner, next_max, now, out, next_ack_ms)
  return out
end
local state, run_at = fail_or_retry(id, q, attempt, tonumber(f[7] or TASK_DEFAULTS.max_attempts),
  tonumber(f[8] or TASK_DEFAULTS.backoff_base), tonumber(f[9] or TASK_DEFAULTS.backoff_cap), jitter,
  retryable, now, dead_ttl, owner, 'failed')
local out = {1, state, attempt, run_at, q}
if next_queue == '' then next_queue = q end
claim_next(next_queue, owner, next_max, now, out, next_ack_ms)
return out
