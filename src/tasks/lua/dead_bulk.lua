-- dead_bulk.lua: retries or discards up to `max` dead tasks, the oldest first:
-- one bounded page of a bulk action. Tasks::dead_bulk calls it page after page,
-- so a million dead letters never hold Redis for more than one page at a time.
--
--@include tasks/lib
--
-- KEYS[1]  P:dead (every queue's dead letters) or P:q:<queue>:dead (one queue's)
-- ARGV[1]  action: retry (a fresh set of attempts, as retry.lua) or discard (as
--          delete.lua)
-- ARGV[2]  max tasks in this call (1-500)
-- ARGV[3]  actor, for the events
-- ARGV[4]  max_queues (a retry registers a forgotten queue again, within it)
--
-- Returns {done, left, refused}
--   done     tasks retried or discarded by this call
--   left     dead tasks still in KEYS[1]
--   refused  tasks left dead because their queue could not be registered again
--            (E.TOO_MANY_QUEUES); they stay at the front of KEYS[1]
-- An index entry whose task is gone or no longer dead is dropped from KEYS[1].
-- Emits task.enqueued (data.retry = true) or task.deleted per task.
local action, max, actor = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local ids = redis.call('ZRANGE', KEYS[1], 0, max - 1)
local done, refused = 0, 0
for i = 1, #ids do
  local code, state
  if action == 'retry' then
    code, state = retry_dead(ids[i], actor, ARGV[4])
  else
    code, state = discard_finished(ids[i], actor)
  end
  if code == 1 then
    done = done + 1
  elseif code == E.TOO_MANY_QUEUES then
    refused = refused + 1
  elseif code == E.NOT_FOUND or state ~= 'dead' then
    redis.call('ZREM', KEYS[1], ids[i])
  end
end
return {done, redis.call('ZCARD', KEYS[1]), refused}
