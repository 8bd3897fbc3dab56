-- flush.lua: merges one node's outcome counts for one minute into the shared
-- history the dashboard's charts read, keeping the larger value of each field.
--
-- Every node's tailer reads every event, so every node counts the same outcomes:
-- taking the larger value (never the sum) means nodes never add up each other's
-- counts, and a node that saw the whole minute wins over one that joined halfway.
-- A day's counters grow by exactly what the minute's counters grew, here, so a day
-- is the sum of its merged minutes; its gauges keep the day's peak.
--
-- KEYS[1]  P:stats:m:<minute>  hash, "<queue>:<f>" -> value; TTL ARGV[1]
-- KEYS[2]  P:stats:d:<day>     hash, the same fields; TTL ARGV[2]
-- ARGV[1]  minute_ttl_ms
-- ARGV[2]  day_ttl_ms
-- ARGV[3]  n                   the number of field, value pairs that follow
--
-- Fields: <queue> is a queue name or `*` (all queues); <f> is s (succeeded),
-- f (failed attempts), d (dead): counters; q (queued), l (latency ms): gauges.
-- Returns the number of fields that grew. Emits nothing.
local minute_ttl, day_ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local grew = 0
for i = 4, 3 + 2 * n, 2 do
  local field, value = ARGV[i], tonumber(ARGV[i + 1])
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if value > cur then
    grew = grew + 1
    redis.call('HSET', KEYS[1], field, int(value))
    local kind = string.sub(field, -1)
    if kind == 'q' or kind == 'l' then
      local peak = tonumber(redis.call('HGET', KEYS[2], field) or '0')
      if value > peak then redis.call('HSET', KEYS[2], field, int(value)) end
    else
      redis.call('HINCRBY', KEYS[2], field, value - cur)
    end
  end
end
if grew > 0 then
  redis.call('PEXPIRE', KEYS[1], minute_ttl)
  redis.call('PEXPIRE', KEYS[2], day_ttl)
end
return grew
