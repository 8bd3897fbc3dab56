-- expire.lua: ends the leases of locks and leaderships that lapsed by Redis time, so
-- that waiters wake (lock.expired, election.expired) even when nobody calls. Every
-- node runs it every locks.interval_ms; each step is idempotent.
--
--@include locks/lib
--
-- KEYS[1]  P:locks                  held locks by lease expiry
-- KEYS[2]  P:elections              led elections by lease expiry
-- ARGV[1]  limit                    most leases looked at per kind and call
-- ARGV[2]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[3]  acting muster node id (events)
--
-- Returns {locks_expired, elections_expired}
-- Emits lock.expired and election.expired.
local limit, me = tonumber(ARGV[1]), ARGV[3]
local now = now_ms()
liveness_pass(now, tonumber(ARGV[2]))
local nl, ne = 0, 0
for _, l in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, limit)) do
  if redis.call('EXISTS', lock_key(l)) == 0 then
    redis.call('ZREM', KEYS[1], l)
  elseif lock_check(l, now, me) then
    nl = nl + 1
  end
end
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now), 'LIMIT', 0, limit)) do
  if redis.call('EXISTS', election_key(e)) == 0 then
    redis.call('ZREM', KEYS[2], e)
  elseif election_check(e, now, me) then
    ne = ne + 1
  end
end
return {nl, ne}
