-- trim_dead.lua: trims the cross-queue dead index P:dead past dead retention.
--
-- Its own step of every janitor pass, run whether or not any queue is left:
-- a dead task's queue may be forgotten (and so never visited again) while
-- the task is still named here, and P:dead may name tasks of queues that were
-- never registered (a workflow successor refused for tasks.max_queues).
--
-- KEYS[1]  P:dead
-- ARGV[1]  dead_retention_ms
--
-- Returns the number of entries trimmed.
local now = now_ms()
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now - tonumber(ARGV[1])))
