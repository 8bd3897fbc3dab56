-- janitor.lua: one queue's periodic upkeep, run by every node (idempotent):
-- promotes due delayed tasks, trims finished tasks past retention from the
-- indexes (their hashes expire by TTL), and forgets an empty, unpaused queue.
--
--@include tasks/lib
--
-- KEYS[1]  P:q:<queue>:meta
-- ARGV[1]  queue
-- ARGV[2]  retention_ms (succeeded, cancelled)
-- ARGV[3]  dead_retention_ms
--
-- The cross-queue dead index P:dead is trimmed by its own script (trim_dead.lua).
--
-- Returns {promoted, trimmed, forgotten (1 or 0), queued, delayed, running, dead, latency (ms),
--          paused (1 or 0), pause version (see pause.lua)}
local q, retention, dead_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local promoted = promote_due(q, now, 1000)
local trimmed = redis.call('ZREMRANGEBYSCORE', qkey(q, 'succeeded'), '-inf', int(now - retention))
  + redis.call('ZREMRANGEBYSCORE', qkey(q, 'cancelled'), '-inf', int(now - retention))
  + redis.call('ZREMRANGEBYSCORE', qkey(q, 'dead'), '-inf', int(now - dead_ttl))
local queued = queued_count(q)
local counts = {queued}
local total = queued
for _, s in ipairs({'delayed', 'running', 'dead', 'succeeded', 'cancelled'}) do
  local c = redis.call('ZCARD', qkey(q, s))
  counts[#counts + 1] = c
  total = total + c
end
local forgotten = 0
if total == 0 and redis.call('HGET', KEYS[1], 'paused') ~= '1'
   and redis.call('EXISTS', qkey(q, 'ready')) == 0 and redis.call('EXISTS', qkey(q, 'groups')) == 0 then
  redis.call('SREM', P .. ':queues', q)
  redis.call('DEL', KEYS[1])
  forgotten = 1
end
local paused, pause_v = 0, 0
if forgotten == 0 then
  local m = redis.call('HMGET', KEYS[1], 'paused', 'pause_v')
  if m[1] == '1' then paused = 1 end
  pause_v = tonumber(m[2] or '0')
end
return {promoted, trimmed, forgotten, counts[1], counts[2], counts[3], counts[4], queue_latency(q, now), paused, pause_v}
