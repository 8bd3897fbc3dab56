-- functions_ended.lua: the function libraries whose record has ended: no live node
-- of the namespace named them within a lease (store/script/sweep.rs), so the sweep
-- may delete them.
--
-- KEYS[1]  P:functions  sorted set, library name -> until when (Redis ms) a live
--                       node uses it (functions_record.lua)
-- ARGV[1]  max          at most this many names
--
-- Returns the names, oldest record first. Changes nothing, emits nothing.
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
