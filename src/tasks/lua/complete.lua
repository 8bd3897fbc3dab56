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
-- ARGV[2]  next_max                0, or (with n = 1) claim up to this many next tasks for
--                                  the task's owner, in this same call
-- ARGV[3]  next_queue              queue to claim from ('': the completed task's queue)
-- ARGV[4]  next_ack_ms                the next tasks' claim lease (ms; 0: none)
-- ARGV[5]  n; then per task: id, token (decimal), result (JSON text, '' for none)
--
-- Returns {items, claim}
--   items  a flat list, 3 entries per task: code, state, attempt
--   claim  when next_max > 0 and the task was completed, {owner, code, next_due, more,
--          task...}: the owner claimed for, then what claim.lua returns; else empty
--   code  1 succeeded (state 'succeeded:<queue>', for the metrics' label),
--         E.STALE (token not current or task not running: state is the current one),
--         E.NOT_FOUND
-- Emits task.succeeded per completed task, and task.claimed per task claimed next. A
-- workflow task's completion also dispatches its ready successors
-- (workflows/lua/hook.lua), in this same call.
local retention, next_max, next_queue = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local next_ack_ms, n = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local nows = int(now)
local out = {}
local next_owner
local zrem, srem, zadd = batch_new(), batch_new(), batch_new()
local groups = {}
local deadlines, acked = {}, {}
for i = 0, n - 1 do
  local id, token, result = ARGV[6 + i * 3], ARGV[7 + i * 3], ARGV[8 + i * 3]
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
    batch_add(zrem, qkey(q, 'running'), id)
    batch_add(srem, ntasks(owner), id)
    batch_add(zadd, qkey(q, 'succeeded'), nows, id)
    if f[8] then deadlines[#deadlines + 1] = id end
    acked[#acked + 1] = id
    limits_release(id, f[10])
    if g ~= '' then
      batch_add(srem, grunning(g), id)
      groups[g] = true
    end
    emit_task('task.succeeded', owner, '{"attempt":' .. attempt .. '}', id, q, g)
    if f[9] then wf_on_end(id, 'succeeded', nows) end
    out[#out + 1] = 1; out[#out + 1] = 'succeeded:' .. f[3]; out[#out + 1] = attempt
    if n == 1 and next_max > 0 then
      next_owner = owner
      if next_queue == '' then next_queue = q end
    end
  end
end
if #deadlines > 0 then batch_add(zrem, DEADLINES, unpack(deadlines)) end
if #acked > 0 then batch_add(zrem, UNACKED, unpack(acked)) end
batch_flush(zrem, 'ZREM')
batch_flush(srem, 'SREM')
batch_flush(zadd, 'ZADD')
for g in pairs(groups) do refresh_group_everywhere(g) end
local claim = {}
if next_owner then claim_next(next_queue, next_owner, next_max, now, claim, next_ack_ms) end
return {out, claim}
