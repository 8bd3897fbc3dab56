-- prune.lua: marks expired nodes dead (once each) and forgets long-dead ones.
--
-- Stall safety: if no node ran this script for longer than one ttl (Redis was
-- down or stalled, or the whole cluster was), every node gets one ttl of grace
-- to heartbeat again before anyone is marked dead. A Redis outage therefore
-- never makes a live node look dead (G3, fail closed). The orphan cleaner only
-- recovers tasks of nodes marked dead here, so the grace protects their tasks too.
--
-- A dead node stays listed (marked) for dead_retention_ms; it is removed only
-- once the orphan cleaner has emptied its task set.
--
-- KEYS[1]  {p}:nodes          sorted set, node id -> expiry (ms)
-- KEYS[2]  {p}:nodes:pass     string, Redis ms of the last pass; TTL
-- KEYS[3]  {p}:nodes:grace    string, Redis ms until which nobody is marked dead; TTL
-- ARGV[1]  ttl_ms             the cluster's node ttl (sets the grace length)
-- ARGV[2]  dead_retention_ms
-- ARGV[3]  limit              at most this many expired nodes handled per pass
--
-- Returns {marked, removed, alive, expired, grace_until_ms}
-- Emits node.dead for each node marked dead.
local ttl, retention, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], now, 'PX', ttl * 10)
local alive = redis.call('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
local expired = redis.call('ZCOUNT', KEYS[1], '-inf', int(now))
local grace = tonumber(redis.call('GET', KEYS[3]) or '0')
-- No pass for over a ttl (or none on record: the whole cluster was down):
-- expired entries may belong to live nodes that could not reach Redis.
if expired > 0 and (last == 0 or now - last > ttl) then
  grace = now + ttl
  redis.call('SET', KEYS[3], grace, 'PX', ttl * 2)
end
if now < grace then
  return {0, 0, alive, expired, grace}
end
local marked, removed = 0, 0
local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #rows, 2 do
  local id, score = rows[i], tonumber(rows[i + 1])
  local h = P .. ':node:' .. id
  if redis.call('EXISTS', h) == 1 and not redis.call('HGET', h, 'dead_at') then
    redis.call('HSET', h, 'dead_at', now)
    local state = redis.call('HGET', h, 'state')
    if state ~= 'left' then
      emit('node.dead', id, {expired_at = score})
      marked = marked + 1
    end
  end
  if score <= now - retention and redis.call('SCARD', P .. ':node:' .. id .. ':tasks') == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('DEL', h)
    removed = removed + 1
  end
end
return {marked, removed, alive, expired - removed, 0}
