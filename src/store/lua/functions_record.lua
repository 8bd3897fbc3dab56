-- functions_record.lua: records that a live node uses these function libraries for
-- one more lease (store/script/sweep.rs). The sweep deletes a library only once
-- its record here has ended: no live node named it within a lease.
--
-- KEYS[1]  P:functions  sorted set, library name -> until when (Redis ms) a live
--                       node uses it. Bounded: one member per library a node of
--                       the namespace recorded and the sweep has not deleted yet;
--                       TTL ARGV[2], renewed by every record.
-- ARGV[1]  lease_ms     how long past now the libraries count as used
-- ARGV[2]  keep_ms      the key's TTL
-- ARGV[3]  n            the number of library names that follow
--
-- A record only moves a library's end later (ZADD GT): a node that records late
-- never shortens another node's lease.
-- Returns {now_ms, until_ms}. Emits nothing.
local lease, keep, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local until_ms = now + lease
local pairs_ = {}
for i = 4, 3 + n do
  pairs_[#pairs_ + 1] = int(until_ms)
  pairs_[#pairs_ + 1] = ARGV[i]
end
if n > 0 then
  redis.call('ZADD', KEYS[1], 'GT', unpack(pairs_))
end
redis.call('PEXPIRE', KEYS[1], keep)
return {now, until_ms}
