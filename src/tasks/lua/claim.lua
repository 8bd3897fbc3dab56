-- claim.lua: hands up to `max` queued tasks of a queue to one node (G1).
--
--@include tasks/lib
--
-- Each claimed task gets a fencing token greater than every token issued before
-- in this namespace. Order: priority, then enqueue order. Delayed tasks that are
-- due by Redis time are promoted first. A group at its limit is skipped without
-- blocking tasks behind it; within a group tasks start in FIFO order (G6). See
-- claim_tasks in tasks/lib.
--
-- KEYS[1]  P:q:<queue>:ready      (routes the call)
-- ARGV[1]  queue
-- ARGV[2]  node id; must be alive (score ahead of Redis time) and not draining
-- ARGV[3]  max tasks to claim (1-1000)
-- ARGV[4]  ack_ms: the claim lease (ms); each task must be acknowledged within it or it
--          goes back to the queue (orphans/lua/unacked.lua); 0: no lease
-- ARGV[5]  the caller's credential (token name): a worker registered by another one
--          is refused (E.NOT_OWNER); '' not checked
-- ARGV[6]  split namespaces, shard != 0: tasks reserved in shard 0 for the queue's limits
--          (limit_reserve.lua), or ''
-- ARGV[7]  the limits reserved under (with ARGV[6]), or ''
-- ARGV[8]  shard 0's time of the reservation (Redis ms, with ARGV[6]), or '': the
--          claimed tasks' started_at (the limits' clock decides when they started)
-- ARGV[9]  '1': a look again after a wake-up (tasks/wait.rs: an event said "look again"):
--          when the ready set is empty and no delayed task is due, answer 0 at once,
--          before the worker's registration is checked (a long poll's first claim
--          checked it; its next claim after a timer checks it again): a wake-up that
--          lost its task to another claim costs three commands, not seven (more = 3:
--          muster_claim_rechecks_empty_total). '' otherwise
--          (never with a reservation, ARGV[6])
-- ARGV[10..] outbox entries handed to shard 0 with the reservation: removed from this
--          shard's outbox (P:limit_out)
--
-- Returns {code, next_due, more, task...}
--   code      n >= 0 tasks claimed, E.NODE_NOT_ALIVE, E.NODE_DRAINING, E.NOT_OWNER
--   next_due  Redis ms when the earliest delayed task is due, or -1
--   more      1 when `max` tasks were claimed (the queue may hold more), else 0; 3 when
--             a look again (ARGV[9]) answered at once: nothing ready or due; 2
--             (nothing claimed) when the queue's limits are in shard 0 and ARGV[6] is '':
--             then the reply is {code, next_due, 2, count, entry...}, the head of this
--             shard's outbox to hand over with the reservation
--   task      11 entries per task: id, token, attempt, payload, max_attempts,
--             timeout_ms, group, priority, created_at, traceparent, tracestate
--             ('' none)
-- Emits task.claimed per task.
local q, node, max, ack_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
if ARGV[9] == '1' and ARGV[6] == '' then
  local idle, due = nothing_to_claim(q, now)
  if idle then return {0, due, 3} end
end
local refused = claim_refusal(node, now, ARGV[5])
if refused then return {refused, -1, 0} end
local out = {0, -1, 0}
local res
if ARGV[6] ~= '' then res = {k = tonumber(ARGV[6]), names = ARGV[7], at = ARGV[8]} end
if #ARGV >= 10 then redis.call('ZREM', P .. ':limit_out', unpack(ARGV, 10)) end
local n, next_due, more = claim_tasks(q, node, max, now, out, ack_ms, res)
out[1] = n; out[2] = next_due; out[3] = more
return out
