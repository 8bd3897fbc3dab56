-- lib.lua: lease helpers shared by the lock and election scripts (prepended after the
-- prelude and nodes' liveness.lua).
--
--@include nodes/liveness
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Key layout (P is the hash-tagged prefix; l a lock name, e an election name, both
-- validated [A-Za-z0-9._-]{1,128}):
--   P:lock:<l>          hash   owner, token, node, acquired_at, expires_at, ttl_ms;
--                              TTL lease + LINGER (the lease itself is expires_at)
--   P:lock:<l>:q        zset   waiting owners in FIFO order (score: enqueue order);
--                              TTL waiter_ttl, refreshed by every waiter's poll
--   P:lock:<l>:qx       zset   waiting owner -> when its place lapses (Redis ms); same TTL
--   P:locks             zset   held lock name -> lease expiry (Redis ms): the expiry loop's
--                              index, entries removed on release and expiry
--   P:locks:fence       string lock fencing counter (low 32 bits of every token)
--   P:election:<e>      hash   leader, epoch, value, elected_at, expires_at, ttl_ms;
--                              TTL lease + LINGER
--   P:elections         zset   election name with a leader -> lease expiry
--   P:elections:epoch   string election epoch counter (low 32 bits of every epoch)
--   P:epoch             string the failover epoch (high 32 bits), shared with task tokens
local LOCKS = P .. ':locks' -- @per-call
local ELECTIONS = P .. ':elections' -- @per-call
local LINGER = 60000
local TWO32 = 4294967296

local function lock_key(l) return P .. ':lock:' .. l end
local function election_key(e) return P .. ':election:' .. e end

-- The next value of a fencing counter: the failover epoch in the high bits and the
-- counter below, as task tokens (G1), so values keep growing across a failover that
-- bumps the epoch even if the new master lost the last increments. Below 2^53.
local function next_fence(counter)
  local epoch = fence_epoch()
  local c = redis.call('INCR', counter)
  if c >= TWO32 then
    epoch = epoch + 1
    redis.call('SET', P .. ':epoch', int(epoch))
    redis.call('SET', counter, '1')
    c = 1
  end
  return epoch * TWO32 + c
end

-- Ends lock l's lease if it lapsed by Redis time, or if it is tied to a node that is
-- gone (node_gone of nodes' liveness.lua, after the caller's liveness pass)
-- (lock.expired). Returns true when the lock is free afterwards.
local function lock_check(l, now, me)
  local lk = lock_key(l)
  local f = redis.call('HMGET', lk, 'owner', 'token', 'expires_at', 'node')
  if not f[1] then return true end
  local reason
  if tonumber(f[3]) <= now then
    reason = 'ttl'
  elseif f[4] and f[4] ~= '' and node_gone(f[4], now) then
    reason = 'node_dead'
  end
  if not reason then return false end
  redis.call('DEL', lk)
  redis.call('ZREM', LOCKS, l)
  emit('lock.expired', me, '{"owner":' .. cjson.encode(f[1]) .. ',"token":' .. f[2] .. ',"reason":"' .. reason ..
    '","expires_at":' .. f[3] .. '}', 'lock', l)
  return true
end

-- Ends election e's leadership if its lease lapsed (election.expired). Returns true
-- when nobody leads afterwards.
local function election_check(e, now, me)
  local ek = election_key(e)
  local f = redis.call('HMGET', ek, 'leader', 'epoch', 'expires_at')
  if not f[1] then return true end
  if tonumber(f[3]) > now then return false end
  redis.call('DEL', ek)
  redis.call('ZREM', ELECTIONS, e)
  emit('election.expired', me, '{"leader":' .. cjson.encode(f[1]) .. ',"epoch":' .. f[2] .. '}', 'election', e)
  return true
end
