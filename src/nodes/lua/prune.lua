-- prune.lua: marks expired nodes dead (once each) and forgets long-dead ones.
--
-- Nobody is marked dead while the post-stall grace holds (see liveness.lua), so a
-- Redis outage never makes a live node look dead. A dead node stays listed
-- (marked) for dead_retention_ms; it is removed only once the orphan cleaner has
-- emptied its task set.
--
-- KEYS[1]  P:nodes            sorted set, node id -> expiry (ms)
-- ARGV[1]  ttl_ms             the cluster's node ttl (sets the grace length)
-- ARGV[2]  dead_retention_ms
-- ARGV[3]  limit              at most this many expired nodes handled per pass
--
-- Returns {marked, removed, alive, expired, grace_until_ms}
-- Emits node.dead for each node marked dead.
local ttl, retention, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local grace = liveness_pass(now, ttl)
local alive = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
local expired = redis.call('ZCOUNT', KEYS[1], '-inf', int(now))
if grace > 0 then
  return {0, 0, alive, expired, grace}
end
local marked, removed = 0, 0
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #rows, 2 do
  local id, score = rows[i], tonumber(rows[i + 1])
  if not in_own_grace(id, now) and mark_dead(id, score, now) then marked = marked + 1 end
  if score <= now - retention and redis.call('SCARD', P .. ':node:' .. id .. ':tasks') == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', P .. ':node:' .. id)
    removed = removed + 1
  end
end
return {marked, removed, alive, expired - removed, 0}
