-- delete.lua: removes barrier b with its rounds (open ones too: their waiters get 404)
-- and its hold; a barrier that is only held (never configured) loses its hold.
--
--@include barriers/lib
--
-- KEYS[1]  P:barriers               set of barrier names
-- KEYS[2]  P:barrier:<b>            config hash
-- KEYS[3]  P:barrier:<b>:rounds     round index
-- KEYS[4]  P:barriers:deadlines     open rounds by deadline
-- KEYS[5]  P:barrier:<b>:hold       etcd-style hold
-- KEYS[6]  P:barrier:<b>:open       undecided rounds
-- KEYS[7]  P:barrier:<b>:decided    decided rounds
-- KEYS[8]  P:barriers:holds         held barrier names
-- ARGV[1]  barrier name b
-- ARGV[2]  actor                    token name
-- ARGV[3]  acting muster node id (events)
--
-- Returns 1 deleted, 0 no such barrier (neither configured nor held).
-- Emits barrier.deleted.
local b = ARGV[1]
if redis.call('SREM', KEYS[1], b) == 0 and redis.call('EXISTS', KEYS[2]) == 0 and
  redis.call('EXISTS', KEYS[5]) == 0 then
  return 0
end
local rounds = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, r in ipairs(rounds) do
  redis.call('DEL', round_key(b, r))
  redis.call('ZREM', KEYS[4], b .. '/' .. r)
end
-- Rounds the index may have lost (see arrive.lua); each index holds at most
-- max_open_rounds or rounds_kept entries.
for _, k in ipairs({KEYS[6], KEYS[7]}) do
  for _, r in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    redis.call('DEL', round_key(b, r))
    redis.call('ZREM', KEYS[4], b .. '/' .. r)
  end
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[8], b)
emit('barrier.deleted', ARGV[3], {by = ARGV[2], rounds = #rounds}, 'barrier', b)
return 1
