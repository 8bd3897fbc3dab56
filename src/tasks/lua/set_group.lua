-- set_group.lua: sets or clears a group's concurrency limit, cluster-wide.
-- Raising the limit (or clearing it) lets queued tasks of the group start at once.
--
--@include tasks/lib
--
-- KEYS[1]  P:group_limits
-- ARGV[1]  group
-- ARGV[2]  limit (>= 1), or '' to remove the limit
-- ARGV[3]  max_groups
-- ARGV[4]  actor, for the event
--
-- Returns {code, running}: 1 set, E.TOO_MANY_GROUPS; running = slots in use now.
-- Emits group.updated.
local g, limit = ARGV[1], ARGV[2]
if limit == '' then
  redis.call('HDEL', KEYS[1], g)
else
  if redis.call('HEXISTS', KEYS[1], g) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
    return {E.TOO_MANY_GROUPS, 0}
  end
  redis.call('HSET', KEYS[1], g, limit)
end
refresh_group_everywhere(g)
emit('group.updated', ARGV[4], {limit = tonumber(limit)}, 'group', g)
return {1, redis.call('SCARD', grunning(g))}
