-- prune.lua: marks expired nodes dead (once each) and forgets long-dead ones.
--
--@include nodes/liveness
--
-- The liveness pass runs first (see liveness.lua): after a stall it gives every entry
-- its lease back, so a Redis outage never makes a live node look dead. A dead node
-- stays listed (marked) for dead_retention_ms; a node that left (graceful shutdown or
-- DELETE) is forgotten as soon as it holds no task. Either is removed only once the
-- orphan cleaner has emptied its task set.
--
-- KEYS[1]  P:nodes            sorted set, node id -> expiry (ms)
-- ARGV[1]  ttl_ms             the cluster's node ttl (sets the pass cadence, see liveness.lua)
-- ARGV[2]  dead_retention_ms
-- ARGV[3]  limit              at most this many expired nodes handled per pass
--
-- Returns {marked, removed, alive, expired, grace_until_ms}
--   grace_until_ms  while task timeouts wait after a stall (Redis ms), else 0
-- Emits node.dead for each node marked dead.
local ttl, retention, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local grace = liveness_pass(now, ttl)
local alive = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
local expired = redis.call('ZCOUNT', KEYS[1], '-inf', int(now))
local marked, removed = 0, 0
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #rows, 2 do
  local id, score = rows[i], tonumber(rows[i + 1])
  if mark_dead(id, score, now) then marked = marked + 1 end
  if (score <= now - retention or redis.call('HGET', P .. ':node:' .. id, 'state') == 'left')
      and redis.call('SCARD', P .. ':node:' .. id .. ':tasks') == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', P .. ':node:' .. id)
    removed = removed + 1
  end
end
return {marked, removed, alive, expired - removed, grace}
