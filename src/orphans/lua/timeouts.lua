-- timeouts.lua: fails running tasks past their timeout_ms (the timeout monitor),
-- as `fail` would: retried after the backoff while attempts are left, else dead.
-- Conditional: a task that finished or was recovered meanwhile is left alone, and
-- the worker's late complete with the old token gets 409. Skipped during the
-- post-stall grace, like every other liveness decision.
--
--@include orphans/lib
--
-- KEYS[1]  P:deadlines            zset, task id -> deadline (Redis ms)
-- ARGV[1]  ttl_ms                 node ttl (grace)
-- ARGV[2]  limit                  most tasks per pass
-- ARGV[3]  jitter in [0, 1)       for the retry backoff
-- ARGV[4]  retention_ms           for tasks cancelled here
-- ARGV[5]  dead_retention_ms
-- ARGV[6]  acting node id
--
-- Returns {timed_out, retried, dead, grace_until_ms, {queue of each timed-out task},
--          {queue of each task that went dead}, {id, action, queue, traceparent, ...}}
--   the last: each timed-out task with a trace context (issue 39), action
--   'retried', 'dead' or 'cancelled', for the node's timeout span
--   grace_until_ms  while task timeouts wait after a stall (Redis ms; nothing
--                   done, both lists empty), else 0
-- Emits task.failed (reason timeout), then task.retrying, task.dead or task.cancelled.
local ttl, limit, jitter = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local retention, dead_ttl, actor = ARGV[4], ARGV[5], ARGV[6]
local now = now_ms()
local grace = liveness_pass(now, ttl)
if grace > 0 then return {0, 0, 0, grace, {}, {}, {}} end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, limit)
local timed_out, retried, dead = 0, 0, 0
local timed_q, dead_q, traced = {}, {}, {}
for i = 1, #due do
  local id = due[i]
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'owner', 'queue', 'group', 'attempts', 'max_attempts', 'backoff_base',
    'backoff_cap', 'cancel_requested', 'timeout_ms', 'tp')
  redis.call('ZREM', KEYS[1], id)
  if f[1] == 'running' then
    local q, g, owner, attempt = f[3], f[4] or '', f[2], tonumber(f[5] or '0')
    release_running(id, q, g, owner)
    local msg = 'timed out after ' .. (f[10] or '?') .. ' ms'
    redis.call('HSET', t, 'error', msg, 'e' .. attempt, int(now) .. '|timed_out', 'updated_at', int(now))
    emit_task('task.failed', actor, {attempt = attempt, error = msg, reason = 'timeout'}, id, q, g)
    timed_out = timed_out + 1
    timed_q[#timed_q + 1] = q
    local action = 'retried'
    if f[9] == '1' then
      finish(id, q, 'cancelled', int(now), retention)
      emit_task('task.cancelled', actor, '{"attempt":' .. attempt .. '}', id, q, g)
      action = 'cancelled'
    else
      local state = fail_or_retry(id, q, attempt, tonumber(f[6] or TASK_DEFAULTS.max_attempts),
        tonumber(f[7] or TASK_DEFAULTS.backoff_base), tonumber(f[8] or TASK_DEFAULTS.backoff_cap), jitter, true,
        now, dead_ttl, actor, 'timeout')
      if state == 'dead' then
        dead = dead + 1
        dead_q[#dead_q + 1] = q
        action = 'dead'
      else
        retried = retried + 1
      end
    end
    if f[11] then
      traced[#traced + 1] = id; traced[#traced + 1] = action; traced[#traced + 1] = q; traced[#traced + 1] = f[11]
    end
  end
end
return {timed_out, retried, dead, 0, timed_q, dead_q, traced}
