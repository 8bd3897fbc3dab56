-- layout.lua: records how the namespace's data is laid out over hash slots, or
-- refuses a node that would lay it out another way (docs/sharding.md): a namespace
-- written with one layout and read with another would split in two without a
-- single error, each half invisible to the nodes of the other.
--
-- KEYS[1]  P:layout  hash    shards -> how many hash tags the data is split into;
--                            placement -> the rule that maps a name to one of them.
--                            Written once, by the first node on the namespace; no
--                            TTL (one small key per namespace).
-- KEYS[2]  P:queues  set     \
-- KEYS[3]  P:nodes   zset     } any of them present: the namespace already holds
-- KEYS[4]  P:seq     string  /  data in the one-shard layout (written by a version
--                               that did not record its layout)
-- ARGV[1]  shards     the node's layout: how many shards
-- ARGV[2]  placement  the node's placement rule (`single` for one shard)
-- Returns {0, shards, placement} when the namespace has this layout (recorded now
-- or before); {E.WRONG_STATE, shards, placement} with the namespace's layout when
-- it differs: nothing changed. Emits nothing, except redis.failover when a Redis
-- Cluster failed over since the last fenced call (fence_epoch).
--
-- On a Redis Cluster, for a namespace of one shard, it also records the master
-- the namespace's tokens come from (fence_epoch in the prelude), so that a
-- failover before the first claim raises the epoch too; a split namespace does so
-- in each shard (fence.lua).
if CLUSTER and ARGV[1] == '1' then fence_epoch() end
local recorded = redis.call('HMGET', KEYS[1], 'shards', 'placement')
local shards, placement = recorded[1], recorded[2]
if not shards then
  if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4]) > 0 then
    shards, placement = '1', 'single'
  else
    shards, placement = ARGV[1], ARGV[2]
  end
  if shards == ARGV[1] and placement == ARGV[2] then
    redis.call('HSET', KEYS[1], 'shards', shards, 'placement', placement, 'since_ms', int(now_ms()))
  end
end
if shards ~= ARGV[1] or placement ~= ARGV[2] then
  return {E.WRONG_STATE, shards, placement}
end
return {0, shards, placement}
