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
-- ARGV[6]  n, the number of tasks; then 12 fields per task, from ARGV[7]:
--          id, payload (JSON text), group ('' for none), priority, delay_ms,
--          run_at (Redis ms, 0 for none), max_attempts, timeout_ms (0: none),
--          alias (''), idempotency key (''), backoff_base_ms, backoff_cap_ms
--
-- Returns a flat list, 3 entries per task, in order: code, id, state
--   code  1 created, 2 replay of an idempotency key (id is the original task's),
--         E.ALIAS_TAKEN (id is the holder), E.TOO_MANY_QUEUES,
--         E.TOO_FAR run_at too far ahead (state is the Redis time now, ms)
-- Emits task.enqueued per created task.
local q, window, max_queues, node = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local max_delay, n = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local nows = int(now)
local out = {}
local known = redis.call('SISMEMBER', P .. ':queues', q) == 1
local room = known or redis.call('SCARD', P .. ':queues') < max_queues
local seq = next_seqs(n)
local ready = {}
local delayed = {}
for i = 0, n - 1 do
  local b = 7 + i * 12
  local id, payload, g, prio = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local delay, run_at = 0, 0
  if ARGV[b + 4] ~= '0' then delay = tonumber(ARGV[b + 4]) end
  if ARGV[b + 5] ~= '0' then run_at = tonumber(ARGV[b + 5]) end
  local alias, idem = ARGV[b + 8], ARGV[b + 9]
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
  if not done and run_at > now + max_delay then
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
    local state, score = 'queued', order_score(tonumber(prio), seq + i)
    local fields = {'queue', q, 'priority', prio, 'max_attempts', ARGV[b + 6],
      'backoff_base', ARGV[b + 10], 'backoff_cap', ARGV[b + 11], 'created_at', nows, 'node', node}
    payload_fields(fields, payload)
    if ARGV[b + 7] ~= '0' then fields[#fields + 1] = 'timeout_ms'; fields[#fields + 1] = ARGV[b + 7] end
    if g ~= '' then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
    if alias ~= '' then
      fields[#fields + 1] = 'alias'; fields[#fields + 1] = alias
      redis.call('SET', P .. ':alias:' .. alias, id)
    end
    if idem ~= '' then
      fields[#fields + 1] = 'idem'; fields[#fields + 1] = idem
      redis.call('SET', P .. ':idem:' .. idem, id, 'PX', window)
    end
    if due > now then
      state = 'delayed'
      fields[#fields + 1] = 'run_at'; fields[#fields + 1] = int(due)
      delayed[#delayed + 1] = int(due); delayed[#delayed + 1] = id
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
    emit_task('task.enqueued', node, '{"state":"' .. state .. '"}', id, q, g)
    out[#out + 1] = 1; out[#out + 1] = id; out[#out + 1] = state
  end
end
local b = batch_new()
if #ready > 0 then batch_add(b, KEYS[1], unpack(ready)) end
batch_flush(b, 'ZADD')
b = batch_new()
if #delayed > 0 then batch_add(b, qkey(q, 'delayed'), unpack(delayed)) end
batch_flush(b, 'ZADD')
return out
