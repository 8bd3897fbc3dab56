-- create.lua: starts a workflow (a DAG of tasks), idempotently.
--
--@include tasks/lib
--
-- The caller has validated the DAG (unique keys, known dependencies, no cycle)
-- and assigned every key its task id. Keys without dependencies are dispatched
-- at once; the others wait until all their dependencies succeeded (hook.lua).
--
-- KEYS[1]  P:workflows
-- ARGV[1]  workflow id
-- ARGV[2]  policy                 fail_fast | continue
-- ARGV[3]  idempotency key ('' for none)
-- ARGV[4]  idempotency window, ms
-- ARGV[5]  retention_ms           how long a finished workflow is kept
-- ARGV[6]  node id                the submitting node, for events
-- ARGV[7]  max_queues             checked here for every queue of the workflow, and
--                                 kept ('mq') for the successors' dispatch (hook.lua)
-- ARGV[8]  dead_retention_ms      kept ('dret'): how long a successor refused at
--                                 dispatch for max_queues is kept dead
-- ARGV[9]  n, the number of keys; then 4 fields per key, from ARGV[10]:
--          key, spec JSON ({"id","queue","t"}), dependency count, comma-separated dependents
--
-- Returns {code, id}: 1 created, 2 replay of the idempotency key (id is the original),
--                     E.TOO_MANY_QUEUES too many queues (id is ''), E.UNKNOWN_LIMIT a task
--                     names a flow-control limit not defined (id is its name)
-- Emits workflow.started, and task.enqueued per dispatched task.
local w, policy, idem, window, ret, node = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local max_queues, dret, n = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
if idem ~= '' then
  local prev = redis.call('GET', P .. ':wf:idem:' .. idem)
  if prev then return {2, prev} end
end
local new_queues = {}
for i = 0, n - 1 do
  local d = cjson.decode(ARGV[11 + i * 4])
  local q = d.queue
  if redis.call('SISMEMBER', P .. ':queues', q) == 0 then new_queues[q] = true end
  for name in string.gmatch(d.t.limits or '', '[^,]+') do
    if not limit_settings(name) then return {E.UNKNOWN_LIMIT, name} end
  end
end
local count = 0
for _ in pairs(new_queues) do count = count + 1 end
if count > 0 and redis.call('SCARD', P .. ':queues') + count > max_queues then return {E.TOO_MANY_QUEUES, ''} end
local now = now_ms()
local nows = int(now)
redis.call('HSET', wkey(w), 'state', 'running', 'policy', policy, 'open', n, 'bad', '0', 'ret', ret,
  'node', node, 'created_at', nows, 'n', n, 'idem', idem, 'mq', ARGV[7], 'dret', dret)
local roots = {}
for i = 0, n - 1 do
  local b = 10 + i * 4
  local k = ARGV[b]
  redis.call('HSET', wkey(w, 'spec'), k, ARGV[b + 1])
  redis.call('HSET', wkey(w, 'wait'), k, ARGV[b + 2])
  redis.call('HSET', wkey(w, 'st'), k, 'pending')
  if ARGV[b + 3] ~= '' then redis.call('HSET', wkey(w, 'next'), k, ARGV[b + 3]) end
  if ARGV[b + 2] == '0' then roots[#roots + 1] = k end
end
redis.call('ZADD', KEYS[1], nows, w)
if idem ~= '' then redis.call('SET', P .. ':wf:idem:' .. idem, w, 'PX', window) end
emit('workflow.started', node, '{"tasks":' .. n .. ',"policy":"' .. policy .. '"}', 'workflow', w)
for _, k in ipairs(roots) do wf_dispatch(w, k, nows, node) end
return {1, w}
