-- drain.lua: marks a node draining for the whole cluster. A draining node gets
-- no new work; it finishes what it runs and then leaves.
--
-- KEYS[1]  {p}:nodes          sorted set, node id -> expiry (ms)
-- KEYS[2]  {p}:node:<id>      hash, node info
-- ARGV[1]  node id
-- ARGV[2]  actor              who asked (a node id or token name), for the event
--
-- Returns 1 marked draining, 2 already draining, E.NODE_NOT_ALIVE no such live node.
-- Emits node.draining when it returns 1.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now or redis.call('EXISTS', KEYS[2]) == 0 then
  return E.NODE_NOT_ALIVE
end
if redis.call('HGET', KEYS[2], 'state') == 'draining' then
  return 2
end
redis.call('HSET', KEYS[2], 'state', 'draining')
emit('node.draining', ARGV[1], {by = ARGV[2]})
return 1
