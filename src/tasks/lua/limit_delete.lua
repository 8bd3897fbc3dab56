-- limit_delete.lua: removes a flow-control limit or template (G13).
--
--@include tasks/lib
--
-- Tasks running under it keep their slots until they end (the set empties and goes);
-- queues and tasks that name it are no longer held by it.
--
-- KEYS[1]  P:limits
-- ARGV[1]  name
-- ARGV[2]  actor, for the event
--
-- Returns {code}: 1 removed, E.NOT_FOUND.
-- Emits limit.deleted.
local name = ARGV[1]
if redis.call('SREM', KEYS[1], name) == 0 then return {E.NOT_FOUND} end
redis.call('DEL', lkey(name))
emit('limit.deleted', ARGV[2], {}, 'limit', name)
return {1}
