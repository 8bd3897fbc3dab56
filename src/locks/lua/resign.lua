-- resign.lua: the leader of election e resigns; the next campaign elects a new leader
-- with a greater epoch. Only the current leader (at the given epoch, when given) may.
--
--@include locks/lib
--
-- KEYS[1]  P:election:<e>           the leadership
-- KEYS[2]  P:elections              led elections by lease expiry
-- ARGV[1]  election name e
-- ARGV[2]  candidate                the leader resigning
-- ARGV[3]  epoch                    its epoch, or '' for whatever epoch it leads
-- ARGV[4]  acting muster node id (events)
--
-- Returns {code, leader, epoch}
--   code  1 resigned, E.STALE not the leader (at that epoch): the current leader and
--         epoch returned ('' and 0 when nobody leads)
-- Emits election.expired (a lapsed lease found here), election.resigned.
local e, cand, epoch, me = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
election_check(e, now, me)
local f = redis.call('HMGET', KEYS[1], 'leader', 'epoch')
if f[1] ~= cand or (epoch ~= '' and f[2] ~= epoch) then
  return {E.STALE, f[1] or '', tonumber(f[2] or '0')}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], e)
emit('election.resigned', me, '{"leader":' .. cjson.encode(cand) .. ',"epoch":' .. f[2] .. '}', 'election', e)
return {1, cand, tonumber(f[2])}
