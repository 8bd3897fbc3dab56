-- cancel.lua: an admin cancels a whole workflow: pending keys and queued or
-- delayed tasks are cancelled, running tasks are asked to stop (their workers
-- learn it on their next heartbeat).
--
--@include tasks/lib
--
-- KEYS[1]  P:wf:<id>
-- ARGV[1]  workflow id
-- ARGV[2]  actor, for the event
--
-- Returns {code, state}: 1 cancelled, 0 already finished (state), E.NOT_FOUND unknown workflow
-- Emits workflow.cancelled, and task.cancelled per cancelled task.
local w, actor = ARGV[1], ARGV[2]
local h = redis.call('HMGET', KEYS[1], 'state', 'ret')
if not h[1] then return {E.NOT_FOUND, ''} end
if h[1] ~= 'running' then return {0, h[1]} end
local nows = int(now_ms())
redis.call('HSET', KEYS[1], 'state', 'cancelled')
emit('workflow.cancelled', actor, '{}', 'workflow', w)
local n = wf_cancel_rest(w, nows, h[2])
wf_close_keys(w, n, n, nows)
return {1, 'cancelled'}
