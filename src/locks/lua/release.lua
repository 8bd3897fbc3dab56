-- release.lua: releases lock l held under `token`, or (token '') breaks it whoever holds
-- it (an admin). A stale token, or a lease that already lapsed, is refused.
--
--@include locks/lib
--
-- KEYS[1]  P:lock:<l>               the lease
-- KEYS[2]  P:locks                  held locks by lease expiry
-- ARGV[1]  lock name l
-- ARGV[2]  token                    the holder's fencing token, or '' to break the lock
-- ARGV[3]  actor                    who released (token name), for the event
-- ARGV[4]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[5]  acting muster node id (events)
--
-- Returns {code, holder, token}
--   code  1 released, E.STALE stale token (current holder and token returned),
--         E.NOT_FOUND was not held (and no token given)
-- Emits lock.expired (a lapsed lease found here), lock.released when it returns 1.
local l, token = ARGV[1], ARGV[2]
local now = now_ms()
liveness_pass(now, tonumber(ARGV[4]))
lock_check(l, now, ARGV[5])
local f = redis.call('HMGET', KEYS[1], 'owner', 'token')
if not f[1] then
  if token == '' then return {E.NOT_FOUND, '', 0} end
  return {E.STALE, '', 0}
end
if token ~= '' and f[2] ~= token then return {E.STALE, f[1], tonumber(f[2])} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], l)
local forced = 'false'
if token == '' then forced = 'true' end
emit('lock.released', ARGV[5], '{"owner":' .. cjson.encode(f[1]) .. ',"token":' .. f[2] .. ',"by":' ..
  cjson.encode(ARGV[3]) .. ',"forced":' .. forced .. '}', 'lock', l)
return {1, f[1], tonumber(f[2])}
