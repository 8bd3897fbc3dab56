-- limit_return.lua: gives back the concurrency slots of tasks that ended in another
-- shard (G13, split namespaces).
--
--@include tasks/lib
--
-- A task claimed in shard s != 0 under limits held here leaves `id:attempt|names` in
-- s's P:limit_out when it ends (limits_release); a node reads the outbox, calls this,
-- then removes what it handed over. Idempotent: a slot given back twice (two nodes
-- reading the same outbox) is given back once.
--
-- KEYS[1]  P:limits
-- ARGV[1..] `id:attempt|names` entries
--
-- Returns {n}: slots freed.
local n = 0
for i = 1, #ARGV do n = n + limits_return(ARGV[i]) end
return {n}
