-- delete.lua: deletes a schedule and its history. Its occurrence records expire
-- with their TTL; its tasks live on as ordinary tasks. A schedule written from
-- config.toml (source 'config') is refused unless ARGV[3] is '1': config wins,
-- whatever the calling node's own config says.
--
--@include schedules/lib
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  actor, for the event
-- ARGV[3]  '1': delete even a schedule written from config.toml (the operator
--          removed it from every node's config), else '0'
--
-- Returns 1 deleted, E.NOT_FOUND no such schedule, E.WRONG_STATE written from
-- config.toml (and ARGV[3] is '0').
-- Emits schedule.deleted.
local s, actor, force = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', KEYS[1]) == 0 then return E.NOT_FOUND end
if redis.call('HGET', KEYS[1], 'source') == 'config' and force ~= '1' then return E.WRONG_STATE end
redis.call('DEL', KEYS[1], shistory(s))
redis.call('SREM', P .. ':schedules', s)
emit('schedule.deleted', actor, '{}', 'schedule', s)
return 1
