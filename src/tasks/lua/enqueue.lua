-- enqueue.lua: submits one or more tasks to a queue, atomically.
--
--@include tasks/lib
--
-- Idempotency comes first: a task with an idempotency key whose key is already
-- recorded (within its window) is not created again; the original id is
-- returned (G5), even when the queue asked for could not be created now.
-- Aliases are unique while their task lives. A run_at more than max_delay_ms
-- after Redis time is refused (the bound `delay_ms` has; G11: Redis time, not
-- the submitting node's clock). The queue joins P:queues (bounded by
-- max_queues) with its first created task: a call that creates nothing
-- registers nothing.
--
-- KEYS[1]  P:q:<queue>:ready      (routes the call; all other keys share its slot)
-- ARGV[1]  queue
-- ARGV[2]  idempotency window, ms
-- ARGV[3]  max_queues
-- ARGV[4]  submitting node id (for the event)
-- ARGV[5]  max_delay_ms: the latest run_at accepted is Redis time + this
-- ARGV[6]  max_limit_keys: template keys in use at once (P:limit_keys), at most
-- ARGV[7]  retention_ms: how long a task a debounce replaced is kept (cancelled)
-- ARGV[8]  n, the number of tasks; then per task, from ARGV[9]: id, payload (JSON
--          text), and a mark: '' when every other setting holds its default (no
--          group, priority 0, no delay or run_at, TASK_DEFAULTS' max_attempts and
--          backoff, no timeout, alias, idempotency key, limits, debounce or trace
--          context: the common task, 3 arguments instead of 18; fewer strings for
--          Redis to convert and Lua to intern), else '+' and these 15
--          fields: group ('' for none), priority, delay_ms,
--          run_at (Redis ms, 0 for none), max_attempts, timeout_ms (0: none),
--          alias (''), idempotency key (''), backoff_base_ms, backoff_cap_ms,
--          limits (its own flow-control limits, comma-separated, '' for none; never
--          with a group: the task waits in the line of its first, '@<limit>'),
--          debounce key ('' for none), debounce ms ('0'; never with a delay or run_at):
--          the task is delayed that long, and replaces the task the key names
--          (P:debounce:<queue>:<key>) while that one still waits for its time,
--          traceparent and tracestate ('' for none: stored as tp and ts, handed to
--          every claim of the task)
--
-- Returns a flat list, 3 entries per task, in order: code, id, state
--   code  1 created (state 'state|<id>' when it replaced that task: a debounce),
--         2 replay of an idempotency key (id is the original task's),
--         E.ALIAS_TAKEN (id is the holder), E.TOO_MANY_QUEUES,
--         E.TOO_FAR run_at too far ahead (state is the Redis time now, ms),
--         E.UNKNOWN_LIMIT (state is the limit that is not defined),
--         E.TOO_MANY (state is a template key new past max_limit_keys)
-- Emits task.enqueued per created task.
-- The numeric settings are read where a task needs them (each tonumber is a strtod).
local q, window, node, n = ARGV[1], ARGV[2], ARGV[4], tonumber(ARGV[8])
local now = now_ms()
local nows = int(now)
local out = {}
local known = redis.call('SISMEMBER', P .. ':queues', q) == 1
local room = known or redis.call('SCARD', P .. ':queues') < tonumber(ARGV[3])
local seq = next_seqs(n)
local ready = {}
local delayed = {}
local b = 9
for i = 0, n - 1 do
  local id, payload = ARGV[b], ARGV[b + 1]
  local g, prio, delay_a, run_at_a, max_att, timeout_a, alias, idem, base, cap, lims, dkey, dms_a, tp, ts
  if ARGV[b + 2] == '' then
    g, prio, delay_a, run_at_a, max_att, timeout_a, alias, idem, base, cap, lims, dkey, dms_a, tp, ts =
      '', '0', '0', '0', TASK_DEFAULTS.max_attempts, '0', '', '', TASK_DEFAULTS.backoff_base, TASK_DEFAULTS.backoff_cap,
      '', '', '0', '', ''
    b = b + 3
  else
    g, prio, delay_a, run_at_a, max_att, timeout_a, alias, idem, base, cap, lims, dkey, dms_a, tp, ts =
      unpack(ARGV, b + 3, b + 17)
    b = b + 18
  end
  local delay, run_at = 0, 0
  if delay_a ~= '0' then delay = tonumber(delay_a) end
  if run_at_a ~= '0' then run_at = tonumber(run_at_a) end
  local done = false
  if idem ~= '' then
    local prev = redis.call('GET', P .. ':idem:' .. idem)
    if prev then
      -- The original task's state and queue (it may have been submitted to
      -- another queue): "state:queue" (queue names have no colon).
      local pf = redis.call('HMGET', tkey(prev), 'state', 'queue')
      out[#out + 1] = 2; out[#out + 1] = prev; out[#out + 1] = (pf[1] or 'expired') .. ':' .. (pf[2] or q)
      done = true
    end
  end
  if not done and run_at > 0 and run_at > now + tonumber(ARGV[5]) then
    out[#out + 1] = E.TOO_FAR; out[#out + 1] = id; out[#out + 1] = nows
    done = true
  end
  if not done and alias ~= '' then
    -- An alias is held while its task lives: queued, delayed or running. A
    -- finished holder (kept for retention) lets it go to a new task.
    local holder = redis.call('GET', P .. ':alias:' .. alias)
    local hstate = holder and redis.call('HGET', tkey(holder), 'state')
    if hstate == 'queued' or hstate == 'delayed' or hstate == 'running' then
      out[#out + 1] = E.ALIAS_TAKEN; out[#out + 1] = holder; out[#out + 1] = ''
      done = true
    end
  end
  if not done and lims ~= '' then
    for name in string.gmatch(lims, '[^,]+') do
      local s = limit_settings(name)
      if not s then
        out[#out + 1] = E.UNKNOWN_LIMIT; out[#out + 1] = id; out[#out + 1] = name
        done = true
        break
      end
      if s.key and not limit_key_room(name, tonumber(ARGV[6])) then
        out[#out + 1] = E.TOO_MANY; out[#out + 1] = id; out[#out + 1] = name
        done = true
        break
      end
    end
    if not done then g = limits_line(string.match(lims, '^[^,]+')) end
  end
  if not done and not room then
    out[#out + 1] = E.TOO_MANY_QUEUES; out[#out + 1] = id; out[#out + 1] = ''
    done = true
  end
  if not done then
    if not known then
      redis.call('SADD', P .. ':queues', q)
      known = true
    end
    local due = now
    if run_at > 0 then due = run_at elseif delay > 0 then due = now + delay end
    local state, score = 'queued', order_score(prio == '0' and 0 or tonumber(prio), seq + i)
    local fields = {'queue', q, 'created_at', nows, 'node', node}
    task_settings(fields, prio, max_att, base, cap)
    payload_fields(fields, payload)
    if timeout_a ~= '0' then fields[#fields + 1] = 'timeout_ms'; fields[#fields + 1] = timeout_a end
    if g ~= '' then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
    if tp ~= '' then fields[#fields + 1] = 'tp'; fields[#fields + 1] = tp end
    if ts ~= '' then fields[#fields + 1] = 'ts'; fields[#fields + 1] = ts end
    if lims ~= '' then
      fields[#fields + 1] = 'limits'; fields[#fields + 1] = lims
      limit_keys_touch(lims, now)
    end
    if alias ~= '' then
      fields[#fields + 1] = 'alias'; fields[#fields + 1] = alias
      redis.call('SET', P .. ':alias:' .. alias, id)
    end
    if idem ~= '' then
      fields[#fields + 1] = 'idem'; fields[#fields + 1] = idem
      redis.call('SET', P .. ':idem:' .. idem, id, 'PX', window)
    end
    -- Debounce: this task waits dms; the task its key names, still waiting for its
    -- time, is replaced (cancelled, and named in the answer).
    local dms = tonumber(dms_a)
    local replaced = ''
    if dms > 0 then
      due = now + dms
      local dk = P .. ':debounce:' .. q .. ':' .. dkey
      local old = redis.call('GET', dk)
      local of = old and redis.call('HMGET', tkey(old), 'state', 'run_at', 'group', 'attempts')
      if of and of[1] == 'delayed' and tonumber(of[2] or '0') > now then
        redis.call('ZREM', qkey(q, 'delayed'), old)
        redis.call('HSET', tkey(old), 'error', 'replaced by ' .. id .. ' (debounce key ' .. dkey .. ')',
          'replaced_by', id)
        finish(old, q, 'cancelled', nows, tonumber(ARGV[7]))
        emit_task('task.cancelled', node, '{"attempt":' .. (of[4] or '0') .. ',"reason":"debounced","replaced_by":"'
          .. id .. '"}', old, q, of[3] or '')
        replaced = old
      end
      redis.call('SET', dk, id, 'PX', int(dms))
      fields[#fields + 1] = 'debounce'; fields[#fields + 1] = dkey
    end
    if due > now then
      state = 'delayed'
      fields[#fields + 1] = 'run_at'; fields[#fields + 1] = int(due)
      if dms > 0 then
        -- At once, not with the batch's: a later item of this call may replace it.
        redis.call('ZADD', qkey(q, 'delayed'), int(due), id)
      else
        delayed[#delayed + 1] = int(due); delayed[#delayed + 1] = id
      end
    elseif g ~= '' then
      redis.call('ZADD', gqkey(q, g), score, id)
      redis.call('SADD', gqueues(g), q)
      redis.call('SADD', qkey(q, 'groups'), g)
    else
      ready[#ready + 1] = score; ready[#ready + 1] = id
    end
    fields[#fields + 1] = 'state'; fields[#fields + 1] = state
    redis.call('HSET', tkey(id), unpack(fields))
    if state == 'queued' and g ~= '' then refresh_group_token(q, g) end
    emit_task('task.enqueued', node, state == 'queued' and '{"state":"queued"}' or '{"state":"delayed"}', id, q, g)
    out[#out + 1] = 1; out[#out + 1] = id
    if replaced ~= '' then out[#out + 1] = state .. '|' .. replaced else out[#out + 1] = state end
  end
end
zadd_pairs(KEYS[1], ready)
if #delayed > 0 then zadd_pairs(qkey(q, 'delayed'), delayed) end
return out
