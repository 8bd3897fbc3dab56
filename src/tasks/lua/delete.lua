-- delete.lua: discards a finished task (succeeded, cancelled or dead) now,
-- instead of at the end of its retention.
--
--@include tasks/lib
--
-- KEYS[1]  P:task:<id>
-- ARGV[1]  id
-- ARGV[2]  actor, for the event
--
-- Returns {code, state}: 1 deleted, E.WRONG_STATE not finished (state), E.NOT_FOUND
-- Emits task.deleted.
local id, actor = ARGV[1], ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'state', 'queue', 'alias')
if not f[1] then return {E.NOT_FOUND, ''} end
local state, q = f[1], f[2]
if state ~= 'succeeded' and state ~= 'cancelled' and state ~= 'dead' then return {E.WRONG_STATE, state} end
redis.call('ZREM', qkey(q, state), id)
redis.call('ZREM', P .. ':dead', id)
if f[3] and f[3] ~= '' and redis.call('GET', P .. ':alias:' .. f[3]) == id then
  redis.call('DEL', P .. ':alias:' .. f[3])
end
redis.call('DEL', KEYS[1])
emit('task.deleted', actor, {state = state}, 'task', id, 'queue', q)
return {1, state}
