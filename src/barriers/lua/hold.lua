-- hold.lua: etcd-style Barrier.Hold: raises barrier b so that waiters block until it is
-- released or its TTL passes. Holding again by the same holder refreshes the TTL. The
-- barrier need not be configured (PUT): the hold index lists it either way.
--
--@include barriers/lib
--
-- KEYS[1]  P:barrier:<b>:hold       hash holder, held_at; TTL
-- KEYS[2]  P:barriers:holds         held barrier name -> when its hold lifts itself
-- ARGV[1]  barrier name b
-- ARGV[2]  holder                   who holds it (free text id)
-- ARGV[3]  ttl_ms                   the hold lifts itself after this
-- ARGV[4]  acting muster node id (events)
--
-- Returns {code, holder, held_at, expires_at}
--   code 1 held now, 2 refreshed (same holder), E.WRONG_STATE held by another holder
-- Emits barrier.held when it returns 1.
local now = now_ms()
local f = redis.call('HMGET', KEYS[1], 'holder', 'held_at')
if f[1] and f[1] ~= ARGV[2] then
  return {E.WRONG_STATE, f[1], tonumber(f[2]), now + redis.call('PTTL', KEYS[1])}
end
local expires = now + tonumber(ARGV[3])
-- Holds that lifted themselves (their TTL passed) leave the index here.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
redis.call('ZADD', KEYS[2], int(expires), ARGV[1])
ttl_at_least(KEYS[2], ARGV[3])
if f[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {2, f[1], tonumber(f[2]), expires}
end
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'held_at', int(now))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
emit('barrier.held', ARGV[4], {holder = ARGV[2], ttl_ms = tonumber(ARGV[3])}, 'barrier', ARGV[1])
return {1, ARGV[2], now, expires}
