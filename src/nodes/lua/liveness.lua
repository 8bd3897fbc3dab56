-- liveness.lua: who is dead, decided in one place (prepended to prune.lua, and to
-- the orphan cleaner's and timeout monitor's scripts).
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Keys: P:nodes (zset, id -> heartbeat expiry, Redis ms), P:nodes:pass (Redis ms of
-- the last liveness pass by any node; TTL), P:nodes:grace (Redis ms until which
-- nobody is declared dead; TTL).
--
-- Stall safety (G3, fail closed): if no node ran a pass for longer than one ttl —
-- Redis was unreachable or stalled, or the whole cluster was down — then expired
-- entries may belong to live nodes that could not reach Redis. Everyone gets one
-- ttl of grace to heartbeat before anything is declared dead or orphaned. A node
-- or worker registered with a longer ttl of its own (it heartbeats less often)
-- gets that ttl from the end of the stall (P:nodes:stalled_at, see in_own_grace).
local NODES = P .. ':nodes'
-- The longest ttl a worker may register (nodes routes): how long stalled_at matters.
local MAX_NODE_TTL_MS = 3600000

-- Records this pass; returns the Redis ms until which the grace holds (0: none).
local function liveness_pass(now, ttl)
  local last = tonumber(redis.call('GET', NODES .. ':pass') or '0')
  redis.call('SET', NODES .. ':pass', int(now), 'PX', int(ttl * 10))
  local grace = tonumber(redis.call('GET', NODES .. ':grace') or '0')
  if last == 0 or now - last > ttl then
    if redis.call('ZCOUNT', NODES, '-inf', int(now)) > 0 then
      grace = now + ttl
      redis.call('SET', NODES .. ':grace', int(grace), 'PX', int(ttl * 2))
      redis.call('SET', NODES .. ':stalled_at', int(now), 'PX', int(MAX_NODE_TTL_MS + ttl))
    end
  end
  if grace > now then return grace end
  return 0
end

-- Whether node id, expired, is still within its own ttl since the last stall
-- ended: then it has not yet had a chance to heartbeat, and is not dead.
local function in_own_grace(id, now)
  local stalled = tonumber(redis.call('GET', NODES .. ':stalled_at') or '0')
  if stalled == 0 then return false end
  local own = tonumber(redis.call('HGET', P .. ':node:' .. id, 'ttl_ms') or '0')
  return now < stalled + own
end

-- Marks an expired node dead once (event node.dead). Returns true if it did now.
local function mark_dead(id, expired_at, now)
  local h = P .. ':node:' .. id
  if redis.call('EXISTS', h) == 1 and not redis.call('HGET', h, 'dead_at') then
    redis.call('HSET', h, 'dead_at', int(now))
    if redis.call('HGET', h, 'state') ~= 'left' then
      emit('node.dead', id, '{"expired_at":' .. int(expired_at) .. '}')
      return true
    end
  end
  return false
end
