-- lib.lua: recovery of a running task whose owner is dead (prepended after the
-- liveness and task libraries).
--
--@include nodes/liveness
--@include tasks/lib
--
-- KEYS: none of its own (a library included in other scripts). ARGV: only
-- recovery_opts(now, i) reads the caller's ARGV[i..i+4]: retention_ms,
-- dead_retention_ms, history_max, history_max_age_ms, acting node id.
-- Returns: nothing; it defines local functions.
--
-- Keys: P:orphans:history (zset, JSON record -> detected at, Redis ms; bounded by
-- count and age), P:orphans:counts (hash, action -> total).

-- Recovers task `id` from `owner` (known dead, or unknown to the registry):
-- requeued at the front of its queue (attempts left), dead (none left), or
-- cancelled (a cancel was requested). Its group slot is freed and its token dies
-- with the running state. A task that is no longer running under `owner` is
-- only dropped from the owner's index.
-- o: {now, reason, retention, dead_ttl, hist_max, hist_age, actor}
-- Returns 'requeued', 'dead', 'cancelled' or 'stale'.
local function recover_task(id, owner, o)
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'owner', 'queue', 'group', 'attempts', 'max_attempts', 'priority',
    'cancel_requested')
  if not f[1] or f[1] ~= 'running' or f[2] ~= owner then
    redis.call('SREM', ntasks(owner), id)
    return 'stale', ''
  end
  local q, g, attempt = f[3], f[4] or '', tonumber(f[5] or '0')
  local nows = int(o.now)
  release_running(id, q, g, owner)
  redis.call('HSET', t, 'e' .. attempt, nows .. '|' .. o.reason, 'updated_at', nows,
    'error', 'its owner ' .. owner .. ' stopped heartbeating (' .. o.reason .. ')')
  local action
  if f[8] == '1' then
    finish(id, q, 'cancelled', nows, o.retention)
    emit_task('task.cancelled', o.actor, '{"attempt":' .. attempt .. '}', id, q, g)
    action = 'cancelled'
  elseif attempt < tonumber(f[6] or TASK_DEFAULTS.max_attempts) then
    make_queued(id, q, g, order_score(tonumber(f[7] or TASK_DEFAULTS.priority), front_seq()), nows)
    action = 'requeued'
  else
    finish(id, q, 'dead', nows, o.dead_ttl)
    emit_task('task.dead', o.actor, '{"attempt":' .. attempt .. ',"reason":"orphaned"}', id, q, g)
    action = 'dead'
  end
  local record = cjson.encode({task = id, queue = q, owner = owner, attempt = attempt, detected_at = o.now,
    action = action, reason = o.reason})
  local hist = P .. ':orphans:history'
  redis.call('ZADD', hist, nows, record)
  redis.call('ZREMRANGEBYRANK', hist, 0, -(o.hist_max + 1))
  redis.call('ZREMRANGEBYSCORE', hist, '-inf', int(o.now - o.hist_age))
  redis.call('HINCRBY', P .. ':orphans:counts', action, 1)
  emit_task('orphan.recovered', o.actor,
    '{"owner":"' .. owner .. '","attempt":' .. attempt .. ',"action":"' .. action .. '"}', id, q, g)
  return action, q
end

local function recovery_opts(now, argv_from)
  return {
    now = now,
    reason = 'orphaned',
    retention = ARGV[argv_from],
    dead_ttl = ARGV[argv_from + 1],
    hist_max = tonumber(ARGV[argv_from + 2]),
    hist_age = tonumber(ARGV[argv_from + 3]),
    actor = ARGV[argv_from + 4],
  }
end
