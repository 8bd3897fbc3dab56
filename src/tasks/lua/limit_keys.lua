-- limit_keys.lua: forgets template keys no longer in use (G13), in the limits' shard.
--
--@include tasks/lib
--
-- A key (`tenant:acme` of `tenant:*`) stays in P:limit_keys while it was named or
-- taken from within the last `idle_ms`, or tasks hold its slots, or tasks wait in its
-- line, or its bucket is refilling (its hash exists); otherwise it goes, and its room
-- under tasks.max_limit_keys with it. Run by every node's janitor pass (idempotent).
--
-- KEYS[1]  P:limit_keys
-- ARGV[1]  idle_ms
--
-- Returns {forgotten, kept}.
local now = now_ms()
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now - tonumber(ARGV[1])), 'LIMIT', 0, 1000)
local gone, kept = 0, 0
for i = 1, #old do
  local k = old[i]
  if redis.call('SCARD', lrun(k)) > 0 or redis.call('SCARD', gqueues(limits_line(k))) > 0
     or redis.call('EXISTS', lkey(k)) == 1 then
    redis.call('ZADD', KEYS[1], int(now), k)
    kept = kept + 1
  else
    redis.call('ZREM', KEYS[1], k)
    gone = gone + 1
  end
end
return {gone, kept}
