-- leave.lua: etcd-style DoubleBarrier.Leave: node leaves DoubleBarrier b. The caller
-- then waits (long poll, outside this script) until every entrant of the same ready
-- cycle has left or been evicted. Leaving when not an entrant is a no-op, so a
-- retried leave is safe. Entrants whose node is gone are evicted (see enter.lua).
--
--@include barriers/lib
--
-- KEYS[1]  P:dbarrier:<b>           hash count, created_at, ready_at, cycle
-- KEYS[2]  P:dbarrier:<b>:in        zset entrant node -> entered_at
-- ARGV[1]  name b
-- ARGV[2]  node id leaving
-- ARGV[3]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[4]  acting muster node id (events)
--
-- Returns {code, entrants, ready_at, cycle}
--   code      1 left now, 0 was not an entrant
--   entrants  entrants still in after this call
--   ready_at, cycle  of the ready cycle the barrier was in before this call (0, '' if
--             it was not ready: then nobody needs to wait)
-- Emits dbarrier.left, and dbarrier.evicted / dbarrier.reset (see db_evict).
local b, node, me = ARGV[1], ARGV[2], ARGV[4]
local now = now_ms()
liveness_pass(now, tonumber(ARGV[3]))
local f = redis.call('HMGET', KEYS[1], 'ready_at', 'cycle')
local code = 0
if redis.call('ZREM', KEYS[2], node) == 1 then
  code = 1
  emit('dbarrier.left', me, '{"entrant":"' .. node .. '"}', 'dbarrier', b)
end
local left = db_evict(b, now, me)
return {code, left, tonumber(f[1] or '0'), f[2] or ''}
