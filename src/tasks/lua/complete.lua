-- complete.lua: finishes running tasks as succeeded; the batch form of complete.
--
--@include tasks/lib
--
-- Only the holder of the current fencing token may complete a task (G1): a stale
-- or unknown token changes nothing and reports the task's current state. A complete
-- is also the task's acknowledgement (its claim lease ends).
--
-- KEYS[1]  P:deadlines             (routes the call)
-- ARGV[1]  retention_ms            how long the finished task is kept
-- ARGV[2]  n; then 6 fields per task: id, token (decimal), result (JSON text, '' for
--          none), next_max (0, or claim up to this many next tasks for the task's
--          owner in this same call), next_queue (queue to claim from; '': the
--          completed task's queue), next_ack_ms (the next tasks' claim lease, ms; 0:
--          none). Several tasks with next_max > 0 are the single completes of several
--          workers, grouped (tasks/group.rs): each claims for its own owner.
--
-- Returns {items, claims}
--   items   a flat list, 3 entries per task: code, state, attempt
--   claims  empty when no task asked for next tasks; else one list per task: for a
--           task completed with next_max > 0, {owner, code, next_due, more, task...}
--           (the owner claimed for, then what claim.lua returns), else empty
--   code  1 succeeded (state 'succeeded:<queue>', for the metrics' label),
--         E.STALE (token not current or task not running: state is the current one),
--         E.NOT_FOUND
-- Emits task.succeeded per completed task, and task.claimed per task claimed next. A
-- workflow task's completion also dispatches its ready successors
-- (workflows/lua/hook.lua), in this same call.
local retention, n = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local nows = int(now)
local out = {}
-- Per task asking for next tasks: {index, owner, queue, max, ack_ms}.
local wants = {}
local zrem, srem, zadd = batch_new(), batch_new(), batch_new()
local groups = {}
local deadlines, acked = {}, {}
-- The keys and label of the last task's queue and owner: a batch is mostly one
-- queue's tasks of one owner, so they are built once, not per task.
local kq, krunning, ksucceeded, klabel, kowner, ktasks
for i = 0, n - 1 do
  local a = 3 + i * 6
  local id, token, result = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'token', 'queue', 'group', 'owner', 'attempts', 'alias', 'timeout_ms', 'wf',
    'held')
  if not f[1] then
    out[#out + 1] = E.NOT_FOUND; out[#out + 1] = ''; out[#out + 1] = 0
  elseif f[1] ~= 'running' or f[2] ~= token then
    out[#out + 1] = E.STALE; out[#out + 1] = f[1]; out[#out + 1] = tonumber(f[6] or '0')
  else
    local q, g, owner, attempt = f[3], f[4] or '', f[5], f[6]
    if result ~= '' then
      redis.call('HSET', t, 'state', 'succeeded', 'finished_at', nows, 'e' .. attempt, nows .. '|succeeded',
        'result', result)
    else
      redis.call('HSET', t, 'state', 'succeeded', 'finished_at', nows, 'e' .. attempt, nows .. '|succeeded')
    end
    redis.call('PEXPIRE', t, retention)
    if f[7] and f[7] ~= '' and redis.call('GET', P .. ':alias:' .. f[7]) == id then
      redis.call('PEXPIRE', P .. ':alias:' .. f[7], retention)
    end
    if q ~= kq then
      kq, krunning, ksucceeded, klabel = q, qkey(q, 'running'), qkey(q, 'succeeded'), 'succeeded:' .. q
    end
    if owner ~= kowner then kowner, ktasks = owner, ntasks(owner) end
    batch_add(zrem, krunning, id)
    batch_add(srem, ktasks, id)
    batch_add(zadd, ksucceeded, nows, id)
    if f[8] then deadlines[#deadlines + 1] = id end
    acked[#acked + 1] = id
    limits_release(id, f[10])
    if g ~= '' then
      batch_add(srem, grunning(g), id)
      groups[g] = true
    end
    emit_task('task.succeeded', owner, '{"attempt":' .. attempt .. '}', id, q, g)
    if f[9] then wf_on_end(id, 'succeeded', nows) end
    out[#out + 1] = 1; out[#out + 1] = klabel; out[#out + 1] = attempt
    if ARGV[a + 3] ~= '0' then
      local nq = ARGV[a + 4]
      if nq == '' then nq = q end
      wants[#wants + 1] = {i + 1, owner, nq, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 5])}
    end
  end
end
call_all('ZREM', DEADLINES, deadlines)
call_all('ZREM', UNACKED, acked)
batch_flush(zrem, 'ZREM')
batch_flush(srem, 'SREM')
batch_zadd(zadd)
for g in pairs(groups) do refresh_group_everywhere(g) end
local claims = {}
for i = 1, #wants do
  local w = wants[i]
  for j = #claims + 1, w[1] do claims[j] = {} end
  claim_next(w[3], w[2], w[4], now, claims[w[1]], w[5])
end
if #wants > 0 then
  for j = #claims + 1, n do claims[j] = {} end
end
return {out, claims}
