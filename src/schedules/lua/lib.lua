-- lib.lua: schedule helpers shared by the schedule scripts (prepended after the
-- prelude and the task library, whose helpers it uses to submit and cancel tasks).
--
--@include tasks/lib
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Key layout (P is the hash-tagged prefix; s a schedule id; T an occurrence, Redis ms):
--   P:schedules              set     schedule ids (bounded by schedules.max_schedules)
--   P:schedule:<s>           hash    the definition (flat fields, below) and the runtime
--                                    state: cursor, last_task, counters, version
--   P:schedule:<s>:history   list    JSON entries, newest first, trimmed to history_max
--   P:schedule:<s>:fire:<T>  string  the occurrence record: its task id, or 'skipped';
--                                    SET NX with a TTL (schedules.record_ttl_ms)
-- A fired task also holds the idempotency key P:idem:schedule:<s>:<T> (task library);
-- a triggered one P:idem:schedule:<s>:trigger:<task id> or, with the client's
-- Idempotency-Key K, P:idem:schedule:<s>:trigger:key:<K> (see trigger.lua).
--
-- Definition fields: expr, tz, queue, overlap (allow|forbid|replace), backfill
-- ('1'|'0'), deadline ('' or ms), enabled ('1'|'0'), spec (the definition as given,
-- JSON), source (api|config), config_hash, and the resolved task template: payload
-- (JSON text), group (''), limits ('' or comma-separated: the task waits in the line
-- of the first, as enqueue.lua puts it), priority, max_attempts, timeout_ms ('0':
-- none), backoff_base, backoff_cap.
-- Runtime fields: version (bumped by every change of definition or enabled),
-- cursor (the latest occurrence that has its outcome; occurrences up to it are
-- never looked at again), last_task, last_t, last_at, last_node, fired, skipped,
-- missed, created_at, updated_at.

local function skey(s) return P .. ':schedule:' .. s end
local function shistory(s) return P .. ':schedule:' .. s .. ':history' end
local function sfire(s, t) return P .. ':schedule:' .. s .. ':fire:' .. t end

-- Appends one entry (a table, encoded here) to a schedule's history and trims it.
-- Times in entries stay below 1e14, within cjson's 14 significant digits.
local function push_history(s, entry, max)
  redis.call('LPUSH', shistory(s), cjson.encode(entry))
  redis.call('LTRIM', shistory(s), 0, max - 1)
end

-- The schedule's previous task if it is still live (queued, delayed or running):
-- returns its id and state, or nil.
local function live_task(id)
  if not id or id == '' then return nil end
  local st = redis.call('HGET', tkey(id), 'state')
  if st == 'queued' or st == 'delayed' or st == 'running' then return id, st end
  return nil
end

-- Ends a live task as cancelled, from any live state: a queued task leaves its
-- queue, a delayed one the retry schedule; a running one is released like an
-- orphan (running set, owner index, deadline, group slot) so its fencing token is
-- stale and the worker's heartbeat, complete and fail get 409.
-- Emits task.cancelled. Returns true if it cancelled something.
local function cancel_live(id, nows, retention, actor, reason)
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'queue', 'group', 'owner', 'attempts')
  local state, q, g, attempt = f[1], f[2], f[3] or '', f[5] or '0'
  if state == 'queued' then
    unqueue(id, q, g)
  elseif state == 'delayed' then
    redis.call('ZREM', qkey(q, 'delayed'), id)
  elseif state == 'running' then
    release_running(id, q, g, f[4])
    redis.call('HSET', t, 'e' .. attempt, nows .. '|cancelled')
  else
    return false
  end
  redis.call('HSET', t, 'error', reason)
  finish(id, q, 'cancelled', nows, retention)
  emit_task('task.cancelled', actor, {attempt = tonumber(attempt), reason = reason}, id, q, g)
  return true
end

-- Whether a task may be submitted to queue q: it is known, or there is room
-- for one more queue (tasks.max_queues).
local function queue_has_room(q, max_queues)
  return redis.call('SISMEMBER', P .. ':queues', q) == 1 or redis.call('SCARD', P .. ':queues') < max_queues
end

-- Submits the schedule's task, exactly as enqueue.lua submits a task that has no
-- delay, run_at or alias: the same hash fields (plus schedule and occurrence), the
-- idempotency key with its window, the queue registration bounded by max_queues,
-- the claim indexes (make_queued) and the task.enqueued event.
-- sf: the schedule's fields (HGETALL as a table); o: {node, window, max_queues};
-- tp: the task's traceparent ('' or nil: none).
-- Returns code, task id: 1 created, 2 the idempotency key already names a task
-- (that task's id), E.TOO_MANY_QUEUES too many queues ('') -- the codes of enqueue.lua.
local function submit_task(s, sf, id, idem, occurrence, nows, o, tp)
  local q, g = sf.queue, sf.group or ''
  local lims = sf.limits or ''
  if lims ~= '' then g = limits_line(string.match(lims, '^[^,]+')) end
  if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
    if redis.call('SCARD', P .. ':queues') >= o.max_queues then return E.TOO_MANY_QUEUES, '' end
    redis.call('SADD', P .. ':queues', q)
  end
  local prev = redis.call('GET', P .. ':idem:' .. idem)
  if prev then return 2, prev end
  local fields = {'queue', q, 'created_at', nows, 'node', o.node, 'idem', idem, 'schedule', s,
    'occurrence', occurrence}
  task_settings(fields, sf.priority, sf.max_attempts, sf.backoff_base, sf.backoff_cap)
  payload_fields(fields, sf.payload)
  if sf.timeout_ms and sf.timeout_ms ~= '0' then
    fields[#fields + 1] = 'timeout_ms'; fields[#fields + 1] = sf.timeout_ms
  end
  if g ~= '' then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
  if tp and tp ~= '' then fields[#fields + 1] = 'tp'; fields[#fields + 1] = tp end
  if lims ~= '' then
    fields[#fields + 1] = 'limits'; fields[#fields + 1] = lims
    limit_keys_touch(lims, now_ms())
  end
  redis.call('SET', P .. ':idem:' .. idem, id, 'PX', o.window)
  redis.call('HSET', tkey(id), unpack(fields))
  make_queued(id, q, g, order_score(tonumber(sf.priority), next_seqs(1)), nows)
  emit_task('task.enqueued', o.node, '{"state":"queued"}', id, q, g)
  return 1, id
end

-- HGETALL reply as a table.
local function hash_table(key)
  local flat = redis.call('HGETALL', key)
  local out = {}
  for i = 1, #flat, 2 do out[flat[i]] = flat[i + 1] end
  return out
end

-- The overlap policy, applied just before an occurrence fires. sf.last_task is
-- the task of the schedule's previous firing. Returns 'fire' or 'skip', and the
-- previous task's id when it was live (skipped for, or cancelled by 'replace').
local function overlap_gate(s, sf, occurrence, nows, retention, actor)
  local prev = live_task(sf.last_task)
  if not prev or sf.overlap == 'allow' then return 'fire', nil end
  if sf.overlap == 'forbid' then return 'skip', prev end
  cancel_live(prev, nows, retention, actor, 'replaced by occurrence ' .. occurrence .. ' of schedule ' .. s)
  return 'fire', prev
end
