-- unacked.lua: the claim lease (issue 35): puts back in its queue every claimed task
-- that its worker did not acknowledge (a task heartbeat, an ack, or its complete or
-- fail) within the claim's ack_ms, by Redis time. A claim whose answer never reached
-- its worker (a closed socket, a client timeout, a proxy) strands no task under a
-- worker that lives on.
--
--@include orphans/lib
--
-- The task goes to the front of its queue (a cancel requested meanwhile cancels it
-- instead). Its token is refused from then on: the task is no longer running under
-- it, and its next claim issues a greater one (G1), so the first worker's late
-- heartbeat, complete or fail gets 409. The attempt is not counted: `attempts` goes
-- back by one, and the claim moves from the attempt log (a<n>) to the log of claims
-- not acknowledged (x<k>, the latest 10; `unacked` counts them all). A task whose
-- owner is gone by Redis time is left to the orphan cleaner (recover.lua, which
-- counts the attempt: a worker that dies on a task is not the lost answer this
-- undoes). Skipped during the post-stall grace, like every other liveness decision:
-- no worker could acknowledge while Redis stood still.
--
--
-- A task put back more than max_unacked times (a worker that crashes on receipt and
-- comes back under the same id before its registration lapses, again and again) has
-- its attempt counted from then on, like an orphan's: requeued while attempts remain,
-- else dead (reason not_acknowledged). So a poison task still reaches the dead
-- letters instead of cycling for ever. 0: never counted.
--
-- KEYS[1]  P:unacked              zset, task id -> end of its claim lease (Redis ms)
-- ARGV[1]  ttl_ms                 node ttl (grace)
-- ARGV[2]  limit                  most tasks per pass
-- ARGV[3]  retention_ms           for tasks cancelled here
-- ARGV[4]  acting node id         for events
-- ARGV[5]  max_unacked            lapses not counted as attempts, per task (0: all)
-- ARGV[6]  dead_retention_ms      for tasks dead here
--
-- Returns {requeued, cancelled, grace_until_ms, {queue of each requeued task}, dead,
--          {queue of each dead task}, {id, action, queue, traceparent, ...}}
--   the last: each task put back that has a trace context (issue 39), action
--   'requeued', 'dead' or 'cancelled', for the node's span
--   grace_until_ms  while liveness decisions wait after a stall (Redis ms; nothing
--                   done), else 0
-- Emits task.requeued (reason not_acknowledged), task.cancelled or task.dead.
local ttl, limit, retention, actor = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local max_unacked, dead_retention = tonumber(ARGV[5]), ARGV[6]
local now = now_ms()
local nows = int(now)
local grace = liveness_pass(now, ttl)
if grace > 0 then return {0, 0, grace, {}, 0, {}, {}} end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nows, 'LIMIT', 0, limit)
local requeued, cancelled, dead = 0, 0, 0
local queues, dead_queues, traced = {}, {}, {}
for i = 1, #due do
  local id = due[i]
  local t = tkey(id)
  redis.call('ZREM', KEYS[1], id)
  local f = redis.call('HMGET', t, 'state', 'owner', 'queue', 'group', 'attempts', 'priority', 'cancel_requested',
    'max_attempts', 'tp')
  if f[1] == 'running' and not node_gone(f[2], now) then
    local owner, q, g, attempt = f[2], f[3], f[4] or '', tonumber(f[5] or '0')
    release_running(id, q, g, owner)
    local k = redis.call('HINCRBY', t, 'unacked', 1)
    local counted = max_unacked > 0 and k > max_unacked
    if counted then
      redis.call('HSET', t, 'e' .. attempt, nows .. '|not_acknowledged', 'updated_at', nows,
        'error', 'not acknowledged within its claim lease, ' .. k .. ' times (claim.max_unacked is ' ..
        max_unacked .. ')')
    else
      local claim = redis.call('HGET', t, 'a' .. attempt) or ''
      redis.call('HDEL', t, 'a' .. attempt, 'e' .. attempt)
      redis.call('HSET', t, 'x' .. ((k - 1) % 10 + 1), attempt .. '|' .. claim .. '|' .. nows,
        'attempts', int(math.max(attempt - 1, 0)), 'updated_at', nows)
    end
    local action = 'requeued'
    if f[7] == '1' then
      finish(id, q, 'cancelled', nows, retention)
      emit_task('task.cancelled', actor, '{"attempt":' .. attempt .. ',"reason":"not_acknowledged"}', id, q, g)
      cancelled = cancelled + 1
      action = 'cancelled'
    elseif counted and attempt >= tonumber(f[8] or TASK_DEFAULTS.max_attempts) then
      finish(id, q, 'dead', nows, dead_retention)
      emit_task('task.dead', actor, '{"attempt":' .. attempt .. ',"reason":"not_acknowledged"}', id, q, g)
      dead = dead + 1
      dead_queues[#dead_queues + 1] = q
      action = 'dead'
    else
      make_queued(id, q, g, order_score(tonumber(f[6] or TASK_DEFAULTS.priority), front_seq()), nows)
      emit_task('task.requeued', actor, {owner = owner, attempt = attempt, reason = 'not_acknowledged'}, id, q, g)
      requeued = requeued + 1
      queues[#queues + 1] = q
    end
    if f[9] then
      traced[#traced + 1] = id; traced[#traced + 1] = action; traced[#traced + 1] = q; traced[#traced + 1] = f[9]
    end
  end
end
return {requeued, cancelled, grace, queues, dead, dead_queues, traced}
