-- dequeue.lua: a waiter gives up its place in lock l's queue (its long poll ended
-- without the lock). If it was first in line and the lock is free, the next waiter
-- must not wait for its place to lapse, so this is announced.
--
--@include locks/lib
--
-- KEYS[1]  P:lock:<l>               the lease
-- KEYS[2]  P:lock:<l>:q             FIFO queue of waiting owners
-- KEYS[3]  P:lock:<l>:qx            waiting owner -> when its place lapses
-- ARGV[1]  lock name l
-- ARGV[2]  owner
-- ARGV[3]  acting muster node id (events)
--
-- Returns 1 removed, 0 was not waiting.
-- Emits lock.waiter_left when the head of the queue left while the lock is free.
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('ZREM', KEYS[3], ARGV[2])
if head[1] == ARGV[2] and redis.call('EXISTS', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) > 0 then
  emit('lock.waiter_left', ARGV[3], {owner = ARGV[2]}, 'lock', ARGV[1])
end
return 1
