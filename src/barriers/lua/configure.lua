-- configure.lua: creates or updates barrier b. Rounds already open keep the
-- participants and tolerance they opened with; the change applies to new rounds.
--
--@include barriers/lib
--
-- KEYS[1]  P:barriers               set of barrier names
-- KEYS[2]  P:barrier:<b>            config hash
-- ARGV[1]  barrier name b
-- ARGV[2]  participants             ",n1,n2,...," (validated node ids, no duplicates)
-- ARGV[3]  n                        number of participants
-- ARGV[4]  max_missing              0 .. n-1
-- ARGV[5]  timeout_ms               round deadline after its first arrival
-- ARGV[6]  actor                    who configured it (token name)
-- ARGV[7]  max_barriers
-- ARGV[8]  acting muster node id (events)
--
-- Returns {code, now_ms}: code 1 created, 0 updated, E.TOO_MANY too many barriers
-- (max_barriers).
-- Emits barrier.configured unless it returns E.TOO_MANY.
local now = now_ms()
local created = redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0
if created and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[7]) then return {E.TOO_MANY, now} end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'parts', ARGV[2], 'n', ARGV[3], 'max_missing', ARGV[4], 'timeout_ms', ARGV[5],
  'updated_at', int(now), 'updated_by', ARGV[6])
emit('barrier.configured', ARGV[8], '{"n":' .. ARGV[3] .. ',"max_missing":' .. ARGV[4] .. ',"timeout_ms":' ..
  ARGV[5] .. ',"by":' .. cjson.encode(ARGV[6]) .. '}', 'barrier', ARGV[1])
if created then return {1, now} end
return {0, now}
