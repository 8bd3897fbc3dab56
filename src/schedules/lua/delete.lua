-- delete.lua: deletes a schedule and its history. Its occurrence records expire
-- with their TTL; its tasks live on as ordinary tasks.
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  actor, for the event
--
-- Returns 1 deleted, 0 no such schedule.
-- Emits schedule.deleted.
local s, actor = ARGV[1], ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1], shistory(s))
redis.call('SREM', P .. ':schedules', s)
emit('schedule.deleted', actor, '{}', 'schedule', s)
return 1
