-- janitor.lua: forgets finished workflows past their retention (their keys
-- expire by TTL; this trims the indexes that name them) and idempotency keys
-- expire by themselves.
--
-- KEYS[1]  P:workflows
-- KEYS[2]  P:workflows:done
-- ARGV[1]  retention_ms
-- ARGV[2]  limit
--
-- Returns the number of workflows forgotten (0 or more).
-- Emits nothing.
local now = now_ms()
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now - tonumber(ARGV[1])), 'LIMIT', 0, tonumber(ARGV[2]))
for _, w in ipairs(old) do
  redis.call('ZREM', KEYS[1], w)
  redis.call('ZREM', KEYS[2], w)
end
return #old
