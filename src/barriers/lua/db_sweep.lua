-- db_sweep.lua: evicts DoubleBarrier entrants whose node is gone, so that waiters in
-- leave wake even when nobody calls; forgets barriers whose keys expired. Every node
-- runs it every barriers.interval_ms; each step is idempotent.
--
--@include barriers/lib
--
-- KEYS[1]  P:dbarriers              zset b -> last activity (Redis ms)
-- ARGV[1]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[2]  idle_ttl_ms
-- ARGV[3]  acting muster node id (events)
-- ARGV[4]  limit                    most barriers looked at per call
--
-- Returns {evicted, barriers}: entrants evicted, DoubleBarriers still known.
-- Emits dbarrier.evicted and dbarrier.reset (see db_evict).
local me, limit = ARGV[3], tonumber(ARGV[4])
local now = now_ms()
liveness_pass(now, tonumber(ARGV[1]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - tonumber(ARGV[2])))
local names = redis.call('ZRANGE', KEYS[1], 0, limit - 1)
local evicted = 0
for _, b in ipairs(names) do
  if redis.call('EXISTS', db_key(b)) == 0 and redis.call('EXISTS', db_in_key(b)) == 0 then
    redis.call('ZREM', KEYS[1], b)
  else
    local _, n = db_evict(b, now, me)
    evicted = evicted + n
  end
end
return {evicted, redis.call('ZCARD', KEYS[1])}
