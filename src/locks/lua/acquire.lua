-- acquire.lua: owner tries to take lock l. Grants it when the lock is free (its lease
-- lapsed counts as free) and no live waiter is ahead in the FIFO queue; every grant
-- gets a fencing token greater than every token before it (next_fence). Acquiring a
-- lock one already holds extends the lease and returns the same token (a retry after
-- a lost response is safe). A caller that will wait keeps a place in the queue; the
-- place lapses waiter_ttl_ms after its last poll, so an abandoned waiter cannot block
-- the others for longer.
--
--@include locks/lib
--
-- KEYS[1]  P:lock:<l>               the lease
-- KEYS[2]  P:lock:<l>:q             FIFO queue of waiting owners
-- KEYS[3]  P:lock:<l>:qx            waiting owner -> when its place lapses
-- KEYS[4]  P:locks                  held locks by lease expiry
-- ARGV[1]  lock name l
-- ARGV[2]  owner                    the would-be holder (opaque id)
-- ARGV[3]  ttl_ms                   lease length
-- ARGV[4]  node                     '' or a node id: the lease also ends when that node is gone
-- ARGV[5]  queue                    '1': keep a place in the queue when not granted; '0': try only
-- ARGV[6]  waiter_ttl_ms
-- ARGV[7]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[8]  acting muster node id (events)
--
-- Returns {code, token, expires_at, holder, position}
--   code      1 acquired now, 2 already held by this owner (lease extended, same token),
--             0 not acquired, E.NODE_NOT_ALIVE the given node is not alive
--   holder    the current holder when not acquired ('' when free but others are ahead)
--   position  1-based place in the queue when not acquired and queued, else 0
-- Emits lock.expired (a lapsed lease found here), lock.acquired.
local l, owner, ttl, node, queue, me = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[8]
local now = now_ms()
liveness_pass(now, tonumber(ARGV[7]))
-- Lapsed places leave the queue, in chunks: unpack takes at most about 8000 values, and
-- a crashed node leaves all of its waiters to lapse together.
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now))
for i = 1, #gone, 4000 do
  local j = math.min(i + 3999, #gone)
  redis.call('ZREM', KEYS[2], unpack(gone, i, j))
  redis.call('ZREM', KEYS[3], unpack(gone, i, j))
end
if node ~= '' then
  local s = redis.call('ZSCORE', P .. ':nodes', node)
  if not s or tonumber(s) <= now then return {E.NODE_NOT_ALIVE, 0, 0, '', 0} end
end

local function not_granted(holder)
  if queue ~= '1' then return {0, 0, 0, holder, 0} end
  if not redis.call('ZSCORE', KEYS[2], owner) then
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    local score = now
    if #last > 0 and tonumber(last[2]) >= score then score = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[2], int(score), owner)
  end
  redis.call('ZADD', KEYS[3], int(now + tonumber(ARGV[6])), owner)
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
  return {0, 0, 0, holder, redis.call('ZRANK', KEYS[2], owner) + 1}
end

local function leave_queue()
  redis.call('ZREM', KEYS[2], owner)
  redis.call('ZREM', KEYS[3], owner)
end

if not lock_check(l, now, me) then
  local f = redis.call('HMGET', KEYS[1], 'owner', 'token')
  if f[1] ~= owner then return not_granted(f[1]) end
  local expires = int(now + ttl)
  redis.call('HSET', KEYS[1], 'expires_at', expires, 'ttl_ms', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], int(ttl + LINGER))
  redis.call('ZADD', LOCKS, expires, l)
  leave_queue()
  return {2, tonumber(f[2]), tonumber(expires), owner, 0}
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if #head > 0 and head[1] ~= owner then return not_granted('') end
leave_queue()
local token = int(next_fence(P .. ':locks:fence'))
local expires = int(now + ttl)
redis.call('HSET', KEYS[1], 'owner', owner, 'token', token, 'node', node, 'acquired_at', int(now),
  'expires_at', expires, 'ttl_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], int(ttl + LINGER))
redis.call('ZADD', LOCKS, expires, l)
emit('lock.acquired', me, '{"owner":' .. cjson.encode(owner) .. ',"token":' .. token .. ',"ttl_ms":' .. ARGV[3] ..
  ',"waiters":' .. redis.call('ZCARD', KEYS[2]) .. '}', 'lock', l)
return {1, tonumber(token), tonumber(expires), owner, 0}
