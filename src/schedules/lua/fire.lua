-- fire.lua: gives each due occurrence of one schedule its one outcome, in order (G7).
--
--@include schedules/lib
--
-- The calling node proposes the schedule's occurrences after the cursor it read,
-- computed from the definition of version ARGV[2], up to its own clock plus
-- schedules.max_skew_ms. Due-ness is Redis time: the script stops at the first
-- proposed occurrence later than now. Every due occurrence T after the cursor gets
-- exactly one outcome, decided here:
--   missed           lateness (now - T) > starting_deadline_ms; or, without backfill,
--                    a late occurrence (lateness > grace) whose successor is due too
--                    (after an outage only the latest due occurrence runs); or
--                    the queue is new and the cluster has tasks.max_queues queues
--   skipped_overlap  overlap 'forbid' while the previous firing's task is live
--   fired            the task is submitted with idempotency key schedule:<s>:<T>;
--                    with overlap 'replace' a live previous task is cancelled first
-- Fired and skipped occurrences are recorded with SET NX and a TTL
-- (P:schedule:<s>:fire:<T>). The cursor moves to the last occurrence given an
-- outcome, so a later proposal of T, by any node, is a no-op; the record and the
-- task's idempotency key are two more guards against a second task for T.
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  the version the node computed the occurrences from
-- ARGV[3]  node id (history, events, the task's submitter)
-- ARGV[4]  grace_ms: lateness up to which an occurrence is on time (schedules.max_skew_ms)
-- ARGV[5]  record_ttl_ms
-- ARGV[6]  history_max
-- ARGV[7]  idempotency window of the task, ms (tasks.idempotency_window_ms)
-- ARGV[8]  max_queues (tasks.max_queues)
-- ARGV[9]  retention_ms of a task cancelled by 'replace' (tasks.retention_ms)
-- ARGV[10] the schedule's occurrence after the last one proposed (Redis ms), 0 if none
-- ARGV[11] n; then n triples: occurrence T (Redis ms, ascending), a fresh task id,
--          the task's traceparent ('' none: the node's trace of the occurrence)
--
-- Returns {code, cursor, fired, skipped, missed, wait_ms, T...}, the Ts fired last
--   code  1  every proposed occurrence was due and has its outcome (wait_ms -1)
--         0  stopped at a proposed occurrence not yet due; wait_ms until it is
--        E.NOT_FOUND no such schedule, E.STALE the definition changed (version),
--        E.WRONG_STATE disabled (after a refusal the counts are 0, wait_ms -1)
-- Emits schedule.fired (after task.enqueued, and task.cancelled for 'replace'),
-- schedule.skipped, and one schedule.missed per run of consecutive missed occurrences.
local s, version, node = ARGV[1], ARGV[2], ARGV[3]
local grace, record_ttl, hist_max = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local o = {node = node, window = ARGV[7], max_queues = tonumber(ARGV[8])}
local retention, after, n = ARGV[9], tonumber(ARGV[10]), tonumber(ARGV[11])
local sf = hash_table(KEYS[1])
if not sf.version then return {E.NOT_FOUND, 0, 0, 0, 0, -1} end
if sf.version ~= version then return {E.STALE, 0, 0, 0, 0, -1} end
if sf.enabled ~= '1' then return {E.WRONG_STATE, 0, 0, 0, 0, -1} end
local now = now_ms()
local nows = int(now)
local cursor = tonumber(sf.cursor or '0')
local deadline = nil
if sf.deadline and sf.deadline ~= '' then deadline = tonumber(sf.deadline) end
local backfill = sf.backfill == '1'
local fired, skipped, missed = 0, 0, 0
local fired_at = {}
local last = nil

-- Consecutive missed occurrences with the same reason make one history entry.
local run = {n = 0}
local function flush_missed()
  if run.n == 0 then return end
  push_history(s, {result = 'missed', t = run.from, last = run.to, count = run.n, reason = run.reason,
    at = now, node = node}, hist_max)
  emit('schedule.missed', node, {occurrence = run.from, last = run.to, count = run.n, reason = run.reason},
    'schedule', s)
  missed = missed + run.n
  run = {n = 0}
end
local function miss(t, reason)
  if run.n > 0 and run.reason ~= reason then flush_missed() end
  if run.n == 0 then run.from = t; run.reason = reason end
  run.to = t
  run.n = run.n + 1
end

local code, wait = 1, -1
for i = 0, n - 1 do
  local ts, task_id, tp = ARGV[12 + 3 * i], ARGV[13 + 3 * i], ARGV[14 + 3 * i]
  local t = tonumber(ts)
  if t > now then
    code, wait = 0, t - now
    break
  end
  if t > cursor then
    local succ = after
    if i < n - 1 then succ = tonumber(ARGV[15 + 3 * i]) end
    local late = now - t
    if deadline and late > deadline then
      miss(t, 'deadline')
    elseif late > grace and not backfill and succ > 0 and succ <= now then
      miss(t, 'superseded')
    elseif not queue_has_room(sf.queue, o.max_queues) then
      miss(t, 'too_many_queues')
    elseif redis.call('SET', sfire(s, ts), 'pending', 'NX', 'PX', record_ttl) then
      local idem = 'schedule:' .. s .. ':' .. ts
      local earlier = redis.call('GET', P .. ':idem:' .. idem)
      if earlier then
        -- Fired before (the cursor and the record were lost): that task stands.
        redis.call('SET', sfire(s, ts), earlier, 'XX', 'KEEPTTL')
      else
        local gate, prev = overlap_gate(s, sf, ts, nows, retention, node)
        if gate == 'skip' then
          flush_missed()
          redis.call('SET', sfire(s, ts), 'skipped', 'XX', 'KEEPTTL')
          skipped = skipped + 1
          push_history(s, {result = 'skipped_overlap', t = t, at = now, node = node, task = prev}, hist_max)
          emit('schedule.skipped', node, {occurrence = t, live_task = prev}, 'schedule', s, 'task', prev)
        else
          local c, id = submit_task(s, sf, task_id, idem, ts, nows, o, tp)
          if c ~= 1 then
            -- Not reached: the queue had room and the idempotency key was free.
            redis.call('DEL', sfire(s, ts))
            miss(t, 'too_many_queues')
          else
            flush_missed()
            redis.call('SET', sfire(s, ts), id, 'XX', 'KEEPTTL')
            sf.last_task = id
            last = {t = ts, id = id}
            fired = fired + 1
            fired_at[#fired_at + 1] = t
            push_history(s, {result = 'fired', t = t, at = now, node = node, task = id, late_ms = late,
              replaced = prev}, hist_max)
            emit('schedule.fired', node, {occurrence = t, late_ms = late, replaced = prev},
              'schedule', s, 'task', id, 'queue', sf.queue)
          end
        end
      end
    end
    cursor = t
  end
end
flush_missed()
redis.call('HSET', KEYS[1], 'cursor', int(cursor))
if last then
  redis.call('HSET', KEYS[1], 'last_task', last.id, 'last_t', last.t, 'last_at', nows, 'last_node', node)
end
if fired > 0 then redis.call('HINCRBY', KEYS[1], 'fired', fired) end
if skipped > 0 then redis.call('HINCRBY', KEYS[1], 'skipped', skipped) end
if missed > 0 then redis.call('HINCRBY', KEYS[1], 'missed', missed) end
local out = {code, cursor, fired, skipped, missed, wait}
for _, t in ipairs(fired_at) do out[#out + 1] = t end
return out
