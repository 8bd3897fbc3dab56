-- epoch.lua: bumps the fencing epoch once per master, after a failover.
--
-- Tokens (tasks and locks) are epoch * 2^32 + counter. After an asynchronous
-- failover the new master may have lost the last counter increments, so the
-- counter alone could hand out a token again; a larger epoch puts every token
-- issued from now on above every token issued before (G1, G10).
-- The bump is idempotent per master: the master's run_id is recorded, and
-- every node that observes the same switch calls this; only the first bumps.
--
-- KEYS[1]  {p}:epoch           string, the fencing epoch (absent: 1)
-- KEYS[2]  {p}:epoch:master    string, run_id of the master that set it
-- ARGV[1]  run_id of the master this script runs on (from INFO server)
-- ARGV[2]  min_epoch           the highest epoch the caller has seen + 1
-- ARGV[3]  node id of the caller
-- ARGV[4]  master address, for the event
--
-- Returns {epoch, bumped (1|0)}. Emits redis.failover when it bumps.
local cur = tonumber(redis.call('GET', KEYS[1]) or '1')
-- Already bumped for this master, and not behind anything the caller saw
-- (a master that missed a later epoch, say after a split, is bumped again).
if redis.call('GET', KEYS[2]) == ARGV[1] and cur + 1 >= (tonumber(ARGV[2]) or 0) then
  return {cur, 0}
end
local e = math.max(cur + 1, tonumber(ARGV[2]) or 0)
redis.call('SET', KEYS[1], int(e))
redis.call('SET', KEYS[2], ARGV[1])
emit('redis.failover', ARGV[3], {epoch = e, master = ARGV[4]})
return {e, 1}
