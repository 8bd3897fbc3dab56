-- heartbeat.lua: registers or refreshes a node (a muster node or an external worker).
--
-- The node's score in the nodes sorted set is the expiry of this heartbeat,
-- computed from Redis TIME: the node is alive while its score is ahead of Redis
-- time (G11). A node joins when it was unknown, had left, or had been marked dead;
-- one whose heartbeat merely ran late (a Redis stall) is refreshed, not re-joined,
-- and keeps its state: a drain ends only when the node leaves.
--
-- KEYS[1]  {p}:nodes          sorted set, node id -> expiry (ms)
-- KEYS[2]  {p}:node:<id>      hash, node info; TTL ttl + dead retention
-- ARGV[1]  node id
-- ARGV[2]  ttl_ms             lifetime of this heartbeat
-- ARGV[3]  info_ttl_ms        TTL of the info hash (ttl + dead retention)
-- ARGV[4]  max_nodes          refuse a new node beyond this many registered
-- ARGV[5]  kind               "node" (muster) or "worker" (external)
-- ARGV[6]  addr               address or URL, may be empty
-- ARGV[7]  version            may be empty
-- ARGV[8]  labels             JSON object
-- ARGV[9]  owner              worker heartbeats: the credential (token name) that
--                             sends it; '' for a muster node's own heartbeat
--
-- Ownership (issue 36): a worker heartbeat never touches a muster node's record
-- (kind "node", while its info hash lives: through the dead retention), and a
-- worker's record belongs to the credential that registered it until it leaves
-- or is marked dead; only then may another credential take the id. A muster
-- node's own heartbeat always writes (it comes from that node's process).
--
-- Returns {code, now_ms, expires_ms, state}
--   code  1 joined (new, back after leaving or being marked dead), 0 refreshed,
--         E.TOO_MANY nodes.max_nodes registered already (expires_ms 0, state ''),
--         E.WRONG_STATE a worker heartbeat for a muster node's id (nothing written),
--         E.NOT_OWNER a worker registered by another credential (nothing written)
--   state "active" | "draining"
-- Emits node.joined when code is 1.
local id, ttl, info_ttl, max_nodes = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local prev = redis.call('ZSCORE', KEYS[1], id)
if ARGV[5] == 'worker' then
  local cur = redis.call('HMGET', KEYS[2], 'kind', 'owner', 'state', 'dead_at')
  if cur[1] == 'node' then
    return {E.WRONG_STATE, now, 0, ''}
  end
  if prev and cur[2] and cur[2] ~= ARGV[9] and cur[3] ~= 'left' and not cur[4] then
    return {E.NOT_OWNER, now, 0, ''}
  end
end
if not prev and redis.call('ZCARD', KEYS[1]) >= max_nodes then
  return {E.TOO_MANY, now, 0, ''}
end
local expires = now + ttl
redis.call('ZADD', KEYS[1], expires, id)
local info = redis.call('HMGET', KEYS[2], 'state', 'dead_at')
local state = info[1]
local joined = (not prev) or (not state) or state == 'left' or info[2] ~= false
if not state or state == 'left' then
  state = 'active'
end
if joined then
  redis.call('HSET', KEYS[2], 'started_at', now)
end
redis.call('HSET', KEYS[2], 'id', id, 'kind', ARGV[5], 'addr', ARGV[6], 'version', ARGV[7],
  'labels', ARGV[8], 'state', state, 'ttl_ms', ttl, 'last_seen', now)
if ARGV[9] ~= '' then
  redis.call('HSET', KEYS[2], 'owner', ARGV[9])
else
  redis.call('HDEL', KEYS[2], 'owner')
end
redis.call('HDEL', KEYS[2], 'dead_at')
redis.call('PEXPIRE', KEYS[2], info_ttl)
if joined then
  emit('node.joined', id, {kind = ARGV[5], addr = ARGV[6], version = ARGV[7]})
  return {1, now, expires, state}
end
return {0, now, expires, state}
