-- recover.lua: the orphan cleaner's pass, run by every node every orphans.interval_ms
-- (safe because each recovery is idempotent and atomic here).
--
--@include orphans/lib
--
-- Every node whose heartbeat expired by Redis time is marked dead (once), and each
-- running task in its task index is recovered (see orphans/lua/lib.lua). The
-- liveness pass runs first: after a Redis stall it gives every entry its lease
-- back, so no live owner is taken for dead (G3, fail closed).
--
-- KEYS[1]  P:nodes
-- ARGV[1]  ttl_ms                 node ttl (sets the pass cadence, see liveness.lua)
-- ARGV[2]  limit                  most tasks recovered per pass
-- ARGV[3]  retention_ms           for tasks cancelled on recovery
-- ARGV[4]  dead_retention_ms      for tasks dead on recovery
-- ARGV[5]  history_max            orphan history, most records
-- ARGV[6]  history_max_age_ms     orphan history, oldest record
-- ARGV[7]  acting node id         for events
--
-- Returns {requeued, dead, cancelled, stale, grace_until_ms, {queue of each dead task},
--          {id, action, queue, traceparent of each task recovered that has a trace context}}
--   grace_until_ms  while task timeouts wait after a stall (Redis ms), else 0
-- Emits node.dead (first time a node is seen dead), orphan.recovered per task,
-- and task.dead or task.cancelled where recovery ends a task.
local ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local grace = liveness_pass(now, ttl)
local o = recovery_opts(now, 3)
local counts = {requeued = 0, dead = 0, cancelled = 0, stale = 0}
local dead_q = {}
local traced = {}
local budget = limit
-- Expired nodes stay listed (dead) for dead_retention_ms, mostly with no task
-- left: look at up to 1000 of them, so a burst of dead workers cannot hide a
-- newer one's tasks behind the first page (about 5 us each when empty).
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, 1000)
for i = 1, #rows, 2 do
  if budget <= 0 then break end
  local node, score = rows[i], tonumber(rows[i + 1])
  mark_dead(node, score, now)
  local ids = redis.call('SRANDMEMBER', ntasks(node), budget)
  for j = 1, #ids do
    local action, q = recover_task(ids[j], node, o)
    counts[action] = counts[action] + 1
    if action == 'dead' then dead_q[#dead_q + 1] = q end
    if action ~= 'stale' then
      local tp = redis.call('HGET', tkey(ids[j]), 'tp')
      if tp then
        traced[#traced + 1] = ids[j]; traced[#traced + 1] = action; traced[#traced + 1] = q
        traced[#traced + 1] = tp
      end
    end
    budget = budget - 1
  end
end
return {counts.requeued, counts.dead, counts.cancelled, counts.stale, grace, dead_q, traced}
