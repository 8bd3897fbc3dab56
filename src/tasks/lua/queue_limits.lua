-- queue_limits.lua: sets the flow-control limits that bind every task of a queue (G13).
--
--@include tasks/lib
--
-- Tasks running now keep the slots they hold; the next claim of the queue obeys the
-- new list.
--
-- KEYS[1]  P:q:<queue>:limits
-- ARGV[1]  queue
-- ARGV[2]  the limits, comma-separated ('' removes them all)
-- ARGV[3]  actor, for the event
--
-- Split namespaces: the limits live in shard 0, where this runs last (it checks the
-- names, keeps P:limit_queues, emits the event). In every other shard it runs first
-- and only marks the queue (P:q:<q>:limits): a claim there then reserves in shard 0.
--
-- Returns {code, name}: 1 set, E.UNKNOWN_LIMIT (name: the limit not defined).
-- Emits queue.limits (shard 0).
local q, list = ARGV[1], ARGV[2]
if not limits_here() then
  if list == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], list) end
  return {1, ''}
end
for name in string.gmatch(list, '[^,]+') do
  if not limit_settings(name) then return {E.UNKNOWN_LIMIT, name} end
end
local old = redis.call('GET', KEYS[1])
for name in string.gmatch(old or '', '[^,]+') do redis.call('SREM', lqueues(name), q) end
if list == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], list)
  for name in string.gmatch(list, '[^,]+') do redis.call('SADD', lqueues(name), q) end
end
emit('queue.limits', ARGV[3], {limits = list}, 'queue', q)
return {1, ''}
