-- functions_forget.lua: forgets the records of function libraries the sweep deleted
-- (store/script/sweep.rs), each only if it is still over: a node that recorded
-- one since (it uses it again, and reloads it on its next call) keeps its record.
--
-- KEYS[1]  P:functions  sorted set, library name -> until when (Redis ms) a live
--                       node uses it (functions_record.lua)
-- ARGV[1]  n            the number of library names that follow
--
-- Returns the number of records removed. Emits nothing.
local now, n = now_ms(), tonumber(ARGV[1])
local removed = 0
for i = 2, 1 + n do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= now then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
