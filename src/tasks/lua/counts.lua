-- counts.lua: read-only; the counts of several queues as of one Redis instant.
--
--@include tasks/lib
--
-- KEYS[1]  P:queues               (routes the call)
-- ARGV[1..n] queue names
--
-- Returns {now, then 10 entries per queue: queued, delayed, running, dead, succeeded,
--          cancelled, finished in the last minute (succeeded + cancelled + dead),
--          paused ('1' or '0'), groups with queued tasks, latency (ms)}
--          (queue_latency in tasks/lib.lua)
local now = now_ms()
local since = int(now - 60000)

local out = {now}
for i = 1, #ARGV do
  local q = ARGV[i]
  out[#out + 1] = queued_count(q)
  for _, s in ipairs({'delayed', 'running', 'dead', 'succeeded', 'cancelled'}) do
    out[#out + 1] = redis.call('ZCARD', qkey(q, s))
  end
  local recent = 0
  for _, s in ipairs({'succeeded', 'cancelled', 'dead'}) do
    recent = recent + redis.call('ZCOUNT', qkey(q, s), since, '+inf')
  end
  out[#out + 1] = recent
  out[#out + 1] = redis.call('HGET', qkey(q, 'meta'), 'paused') or '0'
  out[#out + 1] = redis.call('SCARD', qkey(q, 'groups'))
  out[#out + 1] = queue_latency(q, now)
end
return out
