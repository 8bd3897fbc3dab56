-- lift.lua: etcd-style Barrier.Release: lowers barrier b; every waiter proceeds.
-- Anyone may release (as in etcd); releasing a barrier that is not held is a no-op.
--
--@include barriers/lib
--
-- KEYS[1]  P:barrier:<b>:hold       hash holder, held_at
-- KEYS[2]  P:barriers:holds         held barrier name -> when its hold lifts itself
-- ARGV[1]  barrier name b
-- ARGV[2]  actor                    who released it
-- ARGV[3]  acting muster node id (events)
--
-- Returns 1 released, 0 was not held.
-- Emits barrier.lifted when it returns 1.
local holder = redis.call('HGET', KEYS[1], 'holder')
if not holder then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
emit('barrier.lifted', ARGV[3], {holder = holder, by = ARGV[2]}, 'barrier', ARGV[1])
return 1
