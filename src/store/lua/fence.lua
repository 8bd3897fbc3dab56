-- fence.lua: records the master a shard's tokens come from, at start, on a Redis
-- Cluster (fence_epoch in the prelude), so that a failover before the shard's
-- first claim, lock or election still raises its epoch (docs/sharding.md). A
-- namespace of one shard does this in layout.lua.
--
-- KEYS[1]  P:epoch:master  string  the CLUSTER MYID of the master that last
--                                  raised the shard's epoch (routes the call)
-- Returns the shard's epoch. Emits redis.failover when the shard's master changed
-- since its last fenced call (and one was recorded).
return fence_epoch()
