-- limit_reserve.lua: reserves room under a queue's limits for a claim in another shard
-- (G13, split namespaces).
--
--@include tasks/lib
--
-- Limits live in shard 0. A claim of a queue with limits in shard s != 0 first reserves
-- here: up to `want` tasks' worth of each limit's tokens (taken now) and concurrency
-- slots (placeholders `<rid>.<i>` in P:limit_run:<L>, until limit_confirm.lua turns
-- the used ones into the claimed tasks' `id:attempt` and gives back the rest). A
-- reservation never confirmed (its node died between the calls) lapses at `ttl_ms`:
-- its slots are freed here by the next reservation; its tokens stay spent (the limit
-- is never exceeded, at worst under-used).
--
-- KEYS[1]  P:limit_resv
-- ARGV[1]  queue
-- ARGV[2]  want: tasks the claim asks for (1-1000)
-- ARGV[3]  rid: the reservation's id (unique: node and sequence)
-- ARGV[4]  ttl_ms: how long it holds unconfirmed
-- ARGV[5..] outbox entries `id:attempt|names` of the claim's shard, handed over first
--          (as limit_return.lua; the claim then removes them from the outbox)
--
-- Returns {k, next_due, names, now}
--   k         tasks reserved (want when the queue has no limits here; 0 when a limit
--             has no room)
--   next_due  Redis ms when a limit with no room may have some again, or -1
--   names     the limits reserved under, comma-separated ('' when none)
--   now       this shard's Redis time (ms): when the reservation granted them
local q, want, rid = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = now_ms()
local nows = int(now)
local resv, resd = KEYS[1], P .. ':limit_resd'
for i = 5, #ARGV do limits_return(ARGV[i]) end
-- Lapsed reservations first: their slots go back.
local lapsed = redis.call('ZRANGEBYSCORE', resv, '-inf', int(now), 'LIMIT', 0, 100)
for i = 1, #lapsed do
  local d = redis.call('HGET', resd, lapsed[i])
  if d then
    local names, k = string.match(d, '^(.*)|(%d+)$')
    for name in string.gmatch(names or '', '[^,]+') do
      for j = 1, tonumber(k or '0') do redis.call('SREM', lrun(name), lapsed[i] .. '.' .. j) end
    end
    redis.call('HDEL', resd, lapsed[i])
  end
  redis.call('ZREM', resv, lapsed[i])
end
local qlims = redis.call('GET', qkey(q, 'limits'))
if not qlims then return {want, -1, '', nows} end
local k, next_due, names = limits_list_room(qlims, want, now, -1)
if #names == 0 then return {want, -1, '', nows} end
if k <= 0 then return {0, next_due, '', nows} end
local ids = {}
for j = 1, k do ids[j] = rid .. '.' .. j end
for i = 1, #names do limit_take(names[i], limit_settings(names[i]), now, ids) end
local list = table.concat(names, ',')
redis.call('HSET', resd, rid, list .. '|' .. k)
redis.call('ZADD', resv, int(now + tonumber(ARGV[4])), rid)
return {k, next_due, list, nows}
