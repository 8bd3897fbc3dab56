-- hook.lua: workflow advancement, run inside whichever task script moves a
-- workflow task to a terminal state (appended after tasks/lua/lib.lua, so the
-- advance is atomic with the task's own transition).
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Keys of workflow w (all expire `ret` ms after w is finished):
--   P:wf:<w>         hash  state (running|succeeded|failed|cancelled), policy
--                          (fail_fast|continue), open (keys not yet terminal), bad (keys
--                          ended other than succeeded), ret (retention ms), node, created_at,
--                          finished_at, n (keys), idem, mq (tasks.max_queues), dret
--                          (dead retention ms); mq and dret are absent in workflows
--                          created before they were recorded (no bound at dispatch)
--   P:wf:<w>:spec    hash  key -> JSON {"id": task id, "queue": ..., "t": {task fields}}
--   P:wf:<w>:next    hash  key -> comma-separated keys that depend on it
--   P:wf:<w>:wait    hash  key -> dependencies not yet succeeded
--   P:wf:<w>:st      hash  key -> pending | queued (dispatched) | succeeded | dead |
--                          cancelled | skipped
-- Indexes: P:workflows (zset, w -> created_at), P:workflows:done (zset, w -> finished_at).
--
-- Exactly-once dispatch: a key is dispatched only while st[key] is 'pending', and the
-- same call sets it to 'queued'; its `wait` counter reaches 0 in exactly one call.
--
-- Queue bound: creation checks that every queue of the workflow fits in
-- tasks.max_queues, but a successor's queue joins P:queues only when it is
-- dispatched, and may have been forgotten, or the room taken, meanwhile. Such a
-- successor is not dropped and the bound is not passed: its task is created
-- dead, with an error that says why (G2: it reached a terminal state), and the
-- workflow goes on by its failure policy. Its queue has no indexes, so it is
-- indexed in P:dead only (listed under /api/v1/dead, trimmed by trim_dead.lua);
-- a retry queues it once there is room (retry.lua).
local function wkey(w, s)
  if s then return P .. ':wf:' .. w .. ':' .. s end
  return P .. ':wf:' .. w
end

local function split(list)
  local out = {}
  if list and list ~= '' then
    for part in string.gmatch(list, '[^,]+') do out[#out + 1] = part end
  end
  return out
end

-- Creates and queues (or delays) the task of key k; records the dispatch. When
-- k's queue cannot be registered (tasks.max_queues), creates it dead instead.
local function wf_dispatch(w, k, nows, node)
  local d = cjson.decode(redis.call('HGET', wkey(w, 'spec'), k))
  local t, id, q = d.t, d.id, d.queue
  local g = t.group or ''
  local lims = t.limits or ''
  if lims ~= '' then g = limits_line(string.match(lims, '^[^,]+')) end
  local fields = {'queue', q, 'created_at', nows, 'node', node, 'wf', w, 'wfkey', k}
  task_settings(fields, t.priority, t.max_attempts, t.backoff_base, t.backoff_cap)
  payload_fields(fields, t.payload)
  if g ~= '' then fields[#fields + 1] = 'group'; fields[#fields + 1] = g end
  if lims ~= '' then
    fields[#fields + 1] = 'limits'; fields[#fields + 1] = lims
    limit_keys_touch(lims, tonumber(nows))
  end
  if t.timeout_ms ~= '0' then fields[#fields + 1] = 'timeout_ms'; fields[#fields + 1] = t.timeout_ms end
  -- The run's trace context (issue 39), shared by all its tasks.
  if t.tp and t.tp ~= '' then fields[#fields + 1] = 'tp'; fields[#fields + 1] = t.tp end
  if t.ts and t.ts ~= '' then fields[#fields + 1] = 'ts'; fields[#fields + 1] = t.ts end
  redis.call('HSET', wkey(w, 'st'), k, 'queued')
  if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
    local h = redis.call('HMGET', wkey(w), 'mq', 'dret')
    if h[1] and redis.call('SCARD', P .. ':queues') >= tonumber(h[1]) then
      local err = 'the queue `' .. q .. '` could not be created: the cluster already has the maximum of ' ..
        h[1] .. ' queues (tasks.max_queues); retry this task once a queue is free'
      fields[#fields + 1] = 'state'; fields[#fields + 1] = 'dead'
      fields[#fields + 1] = 'finished_at'; fields[#fields + 1] = nows
      fields[#fields + 1] = 'updated_at'; fields[#fields + 1] = nows
      fields[#fields + 1] = 'error'; fields[#fields + 1] = err
      redis.call('HSET', tkey(id), unpack(fields))
      redis.call('PEXPIRE', tkey(id), h[2])
      redis.call('ZADD', P .. ':dead', nows, id)
      emit('task.dead', node, {attempt = 0, reason = 'too_many_queues', workflow = w, key = k},
        'task', id, 'queue', q, 'workflow', w)
      wf_on_end(id, 'dead', nows)
      return
    end
    redis.call('SADD', P .. ':queues', q)
  end
  local state = 'queued'
  if t.delay_ms ~= '0' then
    local due = int(tonumber(nows) + tonumber(t.delay_ms))
    fields[#fields + 1] = 'state'; fields[#fields + 1] = 'delayed'
    fields[#fields + 1] = 'run_at'; fields[#fields + 1] = due
    redis.call('HSET', tkey(id), unpack(fields))
    redis.call('ZADD', qkey(q, 'delayed'), due, id)
    state = 'delayed'
  else
    redis.call('HSET', tkey(id), unpack(fields))
    make_queued(id, q, g, order_score(tonumber(t.priority), next_seqs(1)), nows)
  end
  local data = '{"state":"' .. state .. '","workflow":"' .. w .. '","key":"' .. k .. '"}'
  if g ~= '' then
    emit('task.enqueued', node, data, 'task', id, 'queue', q, 'group', g, 'workflow', w)
  else
    emit('task.enqueued', node, data, 'task', id, 'queue', q, 'workflow', w)
  end
end

-- Marks every pending key downstream of k skipped (policy continue: a failed
-- branch stops, independent branches go on). Returns how many.
local function wf_skip_downstream(w, k)
  local n, todo, i = 0, {k}, 1
  while i <= #todo do
    for _, d in ipairs(split(redis.call('HGET', wkey(w, 'next'), todo[i]))) do
      if redis.call('HGET', wkey(w, 'st'), d) == 'pending' then
        redis.call('HSET', wkey(w, 'st'), d, 'skipped')
        n = n + 1
        todo[#todo + 1] = d
      end
    end
    i = i + 1
  end
  return n
end

local wf_busy = false -- @per-call

-- Cancels everything of w that has not started: pending keys, and dispatched
-- tasks still queued or delayed. Running tasks are asked to stop. Returns how
-- many keys became terminal.
local function wf_cancel_rest(w, nows, ret)
  local n = 0
  local st = redis.call('HGETALL', wkey(w, 'st'))
  wf_busy = true
  for i = 1, #st, 2 do
    local k, v = st[i], st[i + 1]
    if v == 'pending' then
      redis.call('HSET', wkey(w, 'st'), k, 'cancelled')
      n = n + 1
    elseif v == 'queued' then
      local id = cjson.decode(redis.call('HGET', wkey(w, 'spec'), k)).id
      local f = redis.call('HMGET', tkey(id), 'state', 'queue', 'group')
      if f[1] == 'queued' or f[1] == 'delayed' then
        if f[1] == 'queued' then
          unqueue(id, f[2], f[3] or '')
        else
          redis.call('ZREM', qkey(f[2], 'delayed'), id)
        end
        finish(id, f[2], 'cancelled', nows, ret)
        emit('task.cancelled', '', '{"workflow":"' .. w .. '"}', 'task', id, 'queue', f[2], 'workflow', w)
        redis.call('HSET', wkey(w, 'st'), k, 'cancelled')
        n = n + 1
      elseif f[1] == 'running' then
        redis.call('HSET', tkey(id), 'cancel_requested', '1')
      elseif not f[1] then
        redis.call('HSET', wkey(w, 'st'), k, 'cancelled')
        n = n + 1
      end
    end
  end
  wf_busy = false
  return n
end

-- Counts keys that became terminal; when none is left open, the workflow is
-- finished (if still running, by its result) and its keys start to expire.
local function wf_close_keys(w, closed, bad, nows)
  if closed == 0 then return end
  if bad > 0 then redis.call('HINCRBY', wkey(w), 'bad', bad) end
  local open = redis.call('HINCRBY', wkey(w), 'open', -closed)
  if open > 0 then return end
  local h = redis.call('HMGET', wkey(w), 'state', 'bad', 'ret', 'node')
  if h[1] == 'running' then
    local result = 'succeeded'
    if tonumber(h[2] or '0') > 0 then result = 'failed' end
    redis.call('HSET', wkey(w), 'state', result)
    emit('workflow.' .. result, h[4] or '', '{}', 'workflow', w)
  end
  redis.call('HSET', wkey(w), 'finished_at', nows)
  redis.call('ZADD', P .. ':workflows:done', nows, w)
  for _, s in ipairs({false, 'spec', 'next', 'wait', 'st'}) do
    redis.call('PEXPIRE', wkey(w, s or nil), h[3])
  end
end

wf_on_end = function(id, state, nows)
  if wf_busy then return end
  local f = redis.call('HMGET', tkey(id), 'wf', 'wfkey')
  if not f[1] then return end
  local w, k = f[1], f[2]
  local h = redis.call('HMGET', wkey(w), 'state', 'policy', 'ret', 'node')
  if not h[1] then return end
  local cur = redis.call('HGET', wkey(w, 'st'), k)
  if cur ~= 'queued' then return end
  redis.call('HSET', wkey(w, 'st'), k, state)
  local closed, bad = 1, 0
  if state ~= 'succeeded' then bad = 1 end
  if h[1] == 'running' then
    if state == 'succeeded' then
      for _, d in ipairs(split(redis.call('HGET', wkey(w, 'next'), k))) do
        local left = redis.call('HINCRBY', wkey(w, 'wait'), d, -1)
        if left == 0 and redis.call('HGET', wkey(w, 'st'), d) == 'pending' then
          wf_dispatch(w, d, nows, h[4] or '')
        end
      end
    elseif h[2] == 'fail_fast' then
      redis.call('HSET', wkey(w), 'state', 'failed')
      emit('workflow.failed', h[4] or '', '{"key":"' .. k .. '","task":"' .. id .. '"}', 'workflow', w)
      local n = wf_cancel_rest(w, nows, h[3])
      closed, bad = closed + n, bad + n
    else
      local n = wf_skip_downstream(w, k)
      closed, bad = closed + n, bad + n
    end
  end
  wf_close_keys(w, closed, bad, nows)
end
