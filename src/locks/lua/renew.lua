-- renew.lua: extends the lease of lock l held under `token`. A stale token (the lock
-- is free or held under another token) or a lease that already lapsed is refused and
-- changes nothing but the lapsed lease's expiry.
--
--@include locks/lib
--
-- KEYS[1]  P:lock:<l>               the lease
-- KEYS[2]  P:locks                  held locks by lease expiry
-- ARGV[1]  lock name l
-- ARGV[2]  token                    the fencing token of the holder
-- ARGV[3]  ttl_ms                   new lease length, from now
-- ARGV[4]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[5]  acting muster node id (events)
--
-- Returns {code, expires_at, holder, token}
--   code    1 renewed, E.STALE stale token (current holder and token returned, '' and 0
--           when free), E.LAPSED the lease had lapsed (or its node is gone): the lock is
--           free now
-- Emits lock.expired when it returns E.LAPSED.
local l, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
liveness_pass(now, tonumber(ARGV[4]))
local f = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not f[1] or f[2] ~= token then return {E.STALE, 0, f[1] or '', tonumber(f[2] or '0')} end
if lock_check(l, now, ARGV[5]) then return {E.LAPSED, 0, '', 0} end
local expires = int(now + ttl)
redis.call('HSET', KEYS[1], 'expires_at', expires, 'ttl_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], int(ttl + LINGER))
redis.call('ZADD', KEYS[2], expires, l)
return {1, tonumber(expires), f[1], tonumber(token)}
