-- campaign.lua: candidate campaigns in election e. If nobody leads (a lapsed lease
-- counts as nobody), the candidate becomes leader with a new epoch, greater than
-- every epoch before it (next_fence), so there is at most one leader per epoch. The
-- leader campaigning again renews its lease and keeps its epoch.
--
--@include locks/lib
--
-- KEYS[1]  P:election:<e>           the leadership
-- KEYS[2]  P:elections              led elections by lease expiry
-- ARGV[1]  election name e
-- ARGV[2]  candidate                opaque id
-- ARGV[3]  ttl_ms                   lease length
-- ARGV[4]  value                    the leader's value (JSON text, may be '')
-- ARGV[5]  acting muster node id (events)
--
-- Returns {code, leader, epoch, expires_at, value, elected_at}
--   code  1 elected now, 2 already the leader (lease renewed), 0 another candidate leads
-- Emits election.expired (a lapsed lease found here), election.elected.
local e, cand, ttl, me = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5]
local now = now_ms()
local function reply(code)
  local f = redis.call('HMGET', KEYS[1], 'leader', 'epoch', 'expires_at', 'value', 'elected_at')
  return {code, f[1] or '', tonumber(f[2] or '0'), tonumber(f[3] or '0'), f[4] or '', tonumber(f[5] or '0')}
end
if not election_check(e, now, me) then
  if redis.call('HGET', KEYS[1], 'leader') ~= cand then return reply(0) end
  local expires = int(now + ttl)
  redis.call('HSET', KEYS[1], 'expires_at', expires, 'ttl_ms', ARGV[3])
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'value', ARGV[4]) end
  redis.call('PEXPIRE', KEYS[1], int(ttl + LINGER))
  redis.call('ZADD', KEYS[2], expires, e)
  return reply(2)
end
local epoch = int(next_fence(P .. ':elections:epoch'))
local expires = int(now + ttl)
redis.call('HSET', KEYS[1], 'leader', cand, 'epoch', epoch, 'expires_at', expires, 'ttl_ms', ARGV[3],
  'value', ARGV[4], 'elected_at', int(now))
redis.call('PEXPIRE', KEYS[1], int(ttl + LINGER))
redis.call('ZADD', KEYS[2], expires, e)
emit('election.elected', me, '{"leader":' .. cjson.encode(cand) .. ',"epoch":' .. epoch .. '}', 'election', e)
return reply(1)
