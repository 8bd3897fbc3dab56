-- delete.lua: removes barrier b with its rounds (open ones too: their waiters get 404)
-- and its hold.
--
-- KEYS[1]  P:barriers               set of barrier names
-- KEYS[2]  P:barrier:<b>            config hash
-- KEYS[3]  P:barrier:<b>:rounds     round index
-- KEYS[4]  P:barriers:deadlines     open rounds by deadline
-- KEYS[5]  P:barrier:<b>:hold       etcd-style hold
-- ARGV[1]  barrier name b
-- ARGV[2]  actor                    token name
-- ARGV[3]  acting muster node id (events)
--
-- Returns 1 deleted, 0 no such barrier.
-- Emits barrier.deleted.
local b = ARGV[1]
if redis.call('SREM', KEYS[1], b) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
local rounds = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, r in ipairs(rounds) do
  redis.call('DEL', round_key(b, r))
  redis.call('ZREM', KEYS[4], b .. '/' .. r)
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[5])
emit('barrier.deleted', ARGV[3], {by = ARGV[2], rounds = #rounds}, 'barrier', b)
return 1
