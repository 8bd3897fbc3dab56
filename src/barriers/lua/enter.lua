-- enter.lua: etcd-style DoubleBarrier.Enter: node joins DoubleBarrier b of `count`
-- entrants. When the count-th entrant enters, the barrier is ready (every entrant may
-- proceed) and stays so until all of them have left; meanwhile a further entrant is
-- refused (too many). Entering again is a no-op (idempotent). An entrant's presence
-- is tied to its node's liveness: entrants whose node is gone (nodes' liveness rules,
-- which give leases back after a Redis stall) are evicted first, so a crashed node never blocks the
-- others forever.
--
--@include barriers/lib
--
-- KEYS[1]  P:dbarrier:<b>           hash count, created_at, ready_at, cycle; idle TTL
-- KEYS[2]  P:dbarrier:<b>:in        zset entrant node -> entered_at (Redis ms); idle TTL
-- KEYS[3]  P:dbarriers              zset b -> last activity
-- ARGV[1]  name b
-- ARGV[2]  entrant node id          must be registered and alive
-- ARGV[3]  count                    entrants that make the barrier ready (1..1000)
-- ARGV[4]  node_ttl_ms              nodes.ttl_ms (sets the liveness pass cadence)
-- ARGV[5]  idle_ttl_ms              the barrier's keys expire after this without calls
-- ARGV[6]  acting muster node id (events)
--
-- Returns {code, count, entrants, ready_at, cycle}
--   code      1 entered now, 2 already an entrant, E.TOO_MANY too many entrants,
--             E.WRONG_STATE count differs from the barrier's (count returned),
--             E.NODE_NOT_ALIVE the node is not alive
--   ready_at  Redis ms when the barrier became ready, 0 while not ready
--   cycle     id of the ready cycle (the stream id of its dbarrier.ready event), or ''
-- Emits dbarrier.evicted, dbarrier.reset (see db_evict), dbarrier.entered, and
-- dbarrier.ready when the count is reached.
local b, node, count, me = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[6]
local idle = ARGV[5]
local now = now_ms()
liveness_pass(now, tonumber(ARGV[4]))
db_evict(b, now, me)
local function state(code)
  local f = redis.call('HMGET', KEYS[1], 'count', 'ready_at', 'cycle')
  return {code, tonumber(f[1] or count), redis.call('ZCARD', KEYS[2]), tonumber(f[2] or '0'), f[3] or ''}
end
local function touch()
  redis.call('PEXPIRE', KEYS[1], idle)
  redis.call('PEXPIRE', KEYS[2], idle)
  redis.call('ZADD', KEYS[3], int(now), b)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', int(now - tonumber(idle)))
end
if redis.call('ZSCORE', KEYS[2], node) then
  touch()
  return state(2)
end
local score = redis.call('ZSCORE', P .. ':nodes', node)
if not score or tonumber(score) <= now then return state(E.NODE_NOT_ALIVE) end
local f = redis.call('HMGET', KEYS[1], 'count', 'ready_at')
if f[1] and tonumber(f[1]) ~= count then return state(E.WRONG_STATE) end
if f[2] or redis.call('ZCARD', KEYS[2]) >= count then return state(E.TOO_MANY) end
redis.call('ZADD', KEYS[2], int(now), node)
if not f[1] then redis.call('HSET', KEYS[1], 'count', int(count), 'created_at', int(now)) end
local entrants = redis.call('ZCARD', KEYS[2])
emit('dbarrier.entered', me, '{"entrant":"' .. node .. '","entrants":' .. entrants .. ',"count":' .. int(count) .. '}',
  'dbarrier', b)
if entrants >= count then
  local cycle = emit_now('dbarrier.ready', me, '{"count":' .. int(count) .. '}', 'dbarrier', b)
  redis.call('HSET', KEYS[1], 'ready_at', int(now), 'cycle', cycle)
end
touch()
return state(1)
