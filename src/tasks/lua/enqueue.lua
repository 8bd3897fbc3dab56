-- enqueue.lua: submits one or more tasks to a queue, atomically.
--
-- Idempotency: a task with an idempotency key whose key is already recorded
-- (within its window) is not created again; the original id is returned (G5).
-- Aliases are unique while their task lives.
--
-- KEYS[1]  P:q:<queue>:queued     (routes the call; all other keys share its slot)
-- ARGV[1]  queue
-- ARGV[2]  idempotency window, ms
-- ARGV[3]  max_queues
-- ARGV[4]  submitting node id (for the event)
-- ARGV[5]  n, the number of tasks; then 12 fields per task:
--          id, payload (JSON text), group ('' for none), priority, delay_ms,
--          run_at (Redis ms, 0 for none), max_attempts, timeout_ms (0: none),
--          alias (''), idempotency key (''), backoff_base_ms, backoff_cap_ms
--
-- Returns a flat list, 3 entries per task, in order: code, id, state
--   code  1 created, 2 replay of an idempotency key (id is the original task's),
--         -1 alias taken (id is the holder), -2 too many queues
-- Emits task.enqueued per created task.
local q, window, max_queues, node, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local out = {}
if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
  if redis.call('SCARD', P .. ':queues') >= max_queues then
    for i = 0, n - 1 do
      out[#out + 1] = -2; out[#out + 1] = ARGV[6 + i * 12]; out[#out + 1] = ''
    end
    return out
  end
  redis.call('SADD', P .. ':queues', q)
end
for i = 0, n - 1 do
  local b = 6 + i * 12
  local id, payload, g, priority = ARGV[b], ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
  local delay, run_at, max_attempts, timeout = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), ARGV[b + 6], ARGV[b + 7]
  local alias, idem, base, cap = ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 11]
  local done = false
  if idem ~= '' then
    local prev = redis.call('GET', P .. ':idem:' .. idem)
    if prev then
      local st = redis.call('HGET', tkey(prev), 'state') or 'expired'
      out[#out + 1] = 2; out[#out + 1] = prev; out[#out + 1] = st
      done = true
    end
  end
  if not done and alias ~= '' then
    local holder = redis.call('GET', P .. ':alias:' .. alias)
    if holder and redis.call('EXISTS', tkey(holder)) == 1 then
      out[#out + 1] = -1; out[#out + 1] = holder; out[#out + 1] = ''
      done = true
    end
  end
  if not done then
    local t = tkey(id)
    redis.call('HSET', t, 'id', id, 'queue', q, 'payload', payload, 'group', g, 'priority', priority,
      'max_attempts', max_attempts, 'attempts', 0, 'timeout_ms', timeout, 'alias', alias, 'idem', idem,
      'backoff_base', base, 'backoff_cap', cap, 'created_at', now, 'updated_at', now, 'progress', 0,
      'cancel_requested', 0, 'node', node)
    if idem ~= '' then redis.call('SET', P .. ':idem:' .. idem, id, 'PX', window) end
    if alias ~= '' then redis.call('SET', P .. ':alias:' .. alias, id) end
    local due = now
    if run_at > 0 then due = run_at elseif delay > 0 then due = now + delay end
    local state
    if due > now then
      redis.call('ZADD', qkey(q, 'delayed'), due, id)
      redis.call('HSET', t, 'state', 'delayed', 'run_at', due)
      state = 'delayed'
    else
      make_queued(id, q, g, order_score(priority, false), now)
      state = 'queued'
    end
    emit('task.enqueued', now, node, {'task', id, 'queue', q}, {state = state, group = g, priority = priority})
    out[#out + 1] = 1; out[#out + 1] = id; out[#out + 1] = state
  end
end
return out
