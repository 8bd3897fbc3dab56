-- limit_set.lua: defines or changes a flow-control limit or template (G13).
--
--@include tasks/lib
--
-- A changed limit keeps its bucket (refilled to the new capacity at most) and its
-- running tasks' slots; a lower concurrency lets nothing new start until enough end.
--
-- KEYS[1]  P:limits
-- ARGV[1]  name: a limit `name` or a template `name:*`
-- ARGV[2]  concurrency (>= 1), or '0' for none
-- ARGV[3]  rate max tokens per period, or '0' for no rate
-- ARGV[4]  rate period, ms ('0' without a rate)
-- ARGV[5]  rate burst: tokens that may be saved up ('0' without a rate)
-- ARGV[6]  max_limits
-- ARGV[7]  actor, for the event
--
-- Returns {code, created}: 1 set (created 1 when it is new), E.TOO_MANY.
-- Emits limit.updated.
local name = ARGV[1]
local created = redis.call('SISMEMBER', KEYS[1], name) == 0
if created and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[6]) then return {E.TOO_MANY, 0} end
redis.call('SADD', KEYS[1], name)
redis.call('HSET', lkey(name), 'c', ARGV[2], 'rmax', ARGV[3], 'rper', ARGV[4], 'rburst', ARGV[5])
if ARGV[3] == '0' then redis.call('HDEL', lkey(name), 'tok', 'at') end
emit('limit.updated', ARGV[7], {concurrency = tonumber(ARGV[2]), rate_max = tonumber(ARGV[3]),
  rate_per_ms = tonumber(ARGV[4]), rate_burst = tonumber(ARGV[5]), created = created}, 'limit', name)
return {1, created and 1 or 0}
