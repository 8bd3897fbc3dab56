-- trigger.lua: fires a schedule now, outside its expression ("trigger now").
--
--@include schedules/lib
--
-- The occurrence is Redis now. Each call has its own identity, the task's
-- idempotency key: schedule:<s>:trigger:key:<K> when the client sent an
-- Idempotency-Key K, else schedule:<s>:trigger:<task id> (a fresh ULID per call),
-- so two calls in the same Redis millisecond are two triggers. A call whose key
-- already names a task (a client retry within tasks.idempotency_window_ms) is a
-- replay: it returns that task and changes nothing (no overlap policy, no count,
-- no history, no event). Otherwise the overlap policy applies as for any
-- occurrence. The cursor does not move: the schedule's own occurrences are
-- unaffected.
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  actor (the caller's name, for history and events)
-- ARGV[3]  node id (the task's submitter)
-- ARGV[4]  a fresh task id (a ULID)
-- ARGV[5]  history_max
-- ARGV[6]  idempotency window of the task, ms
-- ARGV[7]  max_queues
-- ARGV[8]  retention_ms of a task cancelled by 'replace'
-- ARGV[9]  the client's Idempotency-Key, '' for none
-- ARGV[10] the task's traceparent ('' none)
--
-- Returns {code, task id, occurrence, queue, replaced}
--   code  1 fired (the new task's id; replaced: the live task 'replace' cancelled, or ''),
--         2 replay (the task the key names, its occurrence and queue; replaced ''),
--         3 skipped: overlap 'forbid' and the previous task (its id) is live,
--         E.NOT_FOUND no such schedule (task '', occurrence 0, queue ''),
--         E.TOO_MANY_QUEUES too many queues (tasks.max_queues; task '')
-- Emits schedule.fired with manual = true (after task.enqueued, and task.cancelled
-- for 'replace'), or schedule.skipped; nothing on a replay.
local s, actor = ARGV[1], ARGV[2]
local o = {node = ARGV[3], window = ARGV[6], max_queues = tonumber(ARGV[7])}
local hist_max, retention, client_key = tonumber(ARGV[5]), ARGV[8], ARGV[9]
local idem = 'schedule:' .. s .. ':trigger:' .. ARGV[4]
if client_key ~= '' then idem = 'schedule:' .. s .. ':trigger:key:' .. client_key end
local sf = hash_table(KEYS[1])
local earlier = redis.call('GET', P .. ':idem:' .. idem)
if earlier then
  -- The task may be past its retention while its key lives: the schedule's queue then.
  local f = redis.call('HMGET', tkey(earlier), 'queue', 'occurrence')
  return {2, earlier, tonumber(f[2] or '0'), f[1] or sf.queue or '', ''}
end
if not sf.version then return {E.NOT_FOUND, '', 0, '', ''} end
local now = now_ms()
local nows = int(now)
if not queue_has_room(sf.queue, o.max_queues) then return {E.TOO_MANY_QUEUES, '', now, sf.queue, ''} end
local gate, prev = overlap_gate(s, sf, nows, nows, retention, actor)
if gate == 'skip' then
  push_history(s, {result = 'skipped_overlap', t = now, at = now, node = o.node, task = prev, manual = true,
    by = actor}, hist_max)
  redis.call('HINCRBY', KEYS[1], 'skipped', 1)
  emit('schedule.skipped', actor, {occurrence = now, live_task = prev, manual = true}, 'schedule', s, 'task', prev)
  return {3, prev, now, sf.queue, ''}
end
-- The key was checked above and the queue has room: this creates the task.
local c, id = submit_task(s, sf, ARGV[4], idem, nows, nows, o, ARGV[10])
if c == E.TOO_MANY_QUEUES then return {E.TOO_MANY_QUEUES, '', now, sf.queue, ''} end
redis.call('HSET', KEYS[1], 'last_task', id, 'last_t', nows, 'last_at', nows, 'last_node', o.node)
redis.call('HINCRBY', KEYS[1], 'fired', 1)
push_history(s, {result = 'fired', t = now, at = now, node = o.node, task = id, late_ms = 0, manual = true,
  by = actor, replaced = prev}, hist_max)
emit('schedule.fired', actor, {occurrence = now, late_ms = 0, manual = true, replaced = prev},
  'schedule', s, 'task', id, 'queue', sf.queue)
return {1, id, now, sf.queue, prev or ''}
