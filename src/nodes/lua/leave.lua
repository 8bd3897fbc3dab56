-- leave.lua: a node leaves the cluster (graceful shutdown, or an admin removes it).
--
-- A node that still owns running tasks is not forgotten yet: its expiry is set
-- to 0, so it is dead at once and the orphan cleaner recovers its tasks on its
-- next pass; prune removes it once its task set is empty. Otherwise it is
-- removed immediately.
--
-- KEYS[1]  {p}:nodes          sorted set, node id -> expiry (ms)
-- KEYS[2]  {p}:node:<id>      hash, node info
-- KEYS[3]  {p}:node:<id>:tasks  set of the node's running task ids
-- ARGV[1]  node id
-- ARGV[2]  reason             "left" (the node itself) or "removed" (an admin)
-- ARGV[3]  only kind          "" any registration, or "worker": only an external
--                             worker's (a worker leaving through the API may not
--                             remove a muster node)
-- ARGV[4]  owner              with ARGV[3] "worker": the credential that asks;
--                             a worker registered by another one is refused
--
-- Returns 1 left (removed), 2 left (kept until its tasks are recovered),
--   E.NOT_FOUND unknown node, E.WRONG_STATE not of the required kind,
--   E.NOT_OWNER a worker registered by another credential.
-- Emits node.left unless it returns an error code.
local now = now_ms()
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return E.NOT_FOUND
end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[2], 'kind') ~= ARGV[3] then
  return E.WRONG_STATE
end
if ARGV[3] ~= '' then
  local owner = redis.call('HGET', KEYS[2], 'owner')
  if owner and owner ~= ARGV[4] then
    return E.NOT_OWNER
  end
end
emit('node.left', ARGV[1], {reason = ARGV[2]})
if redis.call('SCARD', KEYS[3]) > 0 then
  redis.call('ZADD', KEYS[1], 0, ARGV[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'state', 'left', 'dead_at', now)
  end
  return 2
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
