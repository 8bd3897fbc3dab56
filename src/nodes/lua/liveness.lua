-- liveness.lua: who is dead, decided in one place (prepended to prune.lua, to the
-- orphan cleaner's and timeout monitor's scripts, and to the lock and barrier
-- scripts that evict entrants of dead nodes).
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Keys: P:nodes (zset, id -> heartbeat expiry, Redis ms), P:nodes:pass (Redis ms of
-- the last liveness pass by any node; TTL one day), P:nodes:grace (Redis ms until
-- which task timeouts wait after a stall; TTL).
--
-- Stall safety (G3, fail closed). Every node runs a liveness pass at least every
-- heartbeat (nodes.heartbeat_ms, at most a quarter of the ttl), so consecutive passes
-- are normally a quarter of a ttl apart or less. A longer gap means nobody could reach
-- Redis, or Redis did not run commands (stalled, restarted, partitioned from every
-- node): during it, no entry could heartbeat. So when a pass finds a gap longer than
-- 3/8 of the ttl, it gives every entry that was alive at the previous pass its lease
-- back: the gap minus one normal quarter-ttl interval is added to its expiry, as if
-- Redis time had stood still. An entry that heartbeats on time outside the stall is
-- therefore never declared dead because of it, whatever the stall's length, and an
-- entry already expired before the stall is judged as before. If passes keep coming
-- late (a slow link to Redis) leases run slower but still run out, so a dead node is
-- still found. An entry with a longer ttl of its own (a worker) gets its own lease
-- back the same way. Task timeouts, which the stall also kept workers from meeting,
-- wait one ttl after such a pass (P:nodes:grace). Such a pass emits liveness.stalled
-- (gap_ms: since the pass before; extended_ms: what every lease got back; leases: how
-- many), so an operator sees why a dead node was found late.
local NODES = P .. ':nodes' -- @per-call
local DAY_MS = 86400000

-- Records this pass and repairs leases after a stall (see above). ttl: the
-- cluster's node ttl. Returns the Redis ms until which task timeouts wait (0: none).
local function liveness_pass(now, ttl)
  local last = tonumber(redis.call('GET', NODES .. ':pass') or '0')
  redis.call('SET', NODES .. ':pass', int(now), 'PX', DAY_MS)
  local normal = math.floor(ttl / 4)
  if last > 0 and now - last > normal + math.floor(normal / 2) then
    local lost = now - last - normal
    local rows = redis.call('ZRANGEBYSCORE', NODES, '(' .. int(last), '+inf', 'WITHSCORES')
    local pairs_ = {}
    for i = 1, #rows, 2 do
      pairs_[#pairs_ + 1] = int(tonumber(rows[i + 1]) + lost)
      pairs_[#pairs_ + 1] = rows[i]
      if #pairs_ >= 4000 then
        redis.call('ZADD', NODES, 'XX', unpack(pairs_))
        pairs_ = {}
      end
    end
    if #pairs_ > 0 then redis.call('ZADD', NODES, 'XX', unpack(pairs_)) end
    redis.call('SET', NODES .. ':grace', int(now + ttl), 'PX', int(ttl * 2))
    emit('liveness.stalled', '', '{"gap_ms":' .. int(now - last) .. ',"extended_ms":' .. int(lost) .. ',"leases":'
      .. int(#rows / 2) .. '}')
    return now + ttl
  end
  local grace = tonumber(redis.call('GET', NODES .. ':grace') or '0')
  if grace > now then return grace end
  return 0
end

-- Whether a registered node or worker is gone: its heartbeat expired by Redis time
-- (after the repair of liveness_pass, which the caller runs first) or it is unknown.
local function node_gone(id, now)
  local s = redis.call('ZSCORE', NODES, id)
  return (not s) or tonumber(s) <= now
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
