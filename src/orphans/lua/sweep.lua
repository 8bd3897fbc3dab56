-- sweep.lua: slow consistency sweep of one queue, run by every node now and then.
-- The hot paths keep the indexes exact; this catches what they cannot see:
-- a running task whose owner is not registered at all (removed by hand, say),
-- and index entries whose task no longer exists.
--
--@include orphans/lib
--
-- KEYS[1]  P:q:<queue>:running
-- ARGV[1]  queue
-- ARGV[2]  ttl_ms                 node ttl (grace)
-- ARGV[3]  window                 entries looked at per index
-- ARGV[4]  retention_ms           for tasks cancelled on recovery
-- ARGV[5]  dead_retention_ms      for tasks dead on recovery
-- ARGV[6]  history_max            orphan history, most records
-- ARGV[7]  history_max_age_ms     orphan history, oldest record
-- ARGV[8]  acting node id         for events
--
-- Returns {recovered, dangling_removed}
-- Emits orphan.recovered per recovered task, and task.dead or task.cancelled
-- where recovery ends a task.
local q, ttl, window = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local grace = liveness_pass(now, ttl)
local o = recovery_opts(now, 4)
local recovered, removed = 0, 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, window - 1)) do
  local f = redis.call('HMGET', tkey(id), 'state', 'owner')
  if f[1] ~= 'running' then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', DEADLINES, id)
    redis.call('ZREM', UNACKED, id)
    removed = removed + 1
  elseif grace == 0 then
    local score = redis.call('ZSCORE', P .. ':nodes', f[2])
    local in_index = redis.call('SISMEMBER', ntasks(f[2]), id) == 1
    if not score or (tonumber(score) <= now and not in_index) then
      redis.call('SADD', ntasks(f[2]), id)
      if recover_task(id, f[2], o) ~= 'stale' then recovered = recovered + 1 end
    end
  end
end
local function prune_missing(key, want_state)
  for _, id in ipairs(redis.call('ZRANGE', key, 0, window - 1)) do
    if string.sub(id, 1, 3) ~= '~g:' and redis.call('HGET', tkey(id), 'state') ~= want_state then
      redis.call('ZREM', key, id)
      removed = removed + 1
    end
  end
end
prune_missing(qkey(q, 'ready'), 'queued')
prune_missing(qkey(q, 'delayed'), 'delayed')
for _, g in ipairs(redis.call('SMEMBERS', qkey(q, 'groups'))) do
  prune_missing(gqkey(q, g), 'queued')
  -- slots held by tasks that are no longer running
  for _, id in ipairs(redis.call('SMEMBERS', grunning(g))) do
    if redis.call('HGET', tkey(id), 'state') ~= 'running' then
      redis.call('SREM', grunning(g), id)
      removed = removed + 1
    end
  end
  refresh_group_token(q, g)
end
return {recovered, removed}
