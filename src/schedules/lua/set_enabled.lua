-- set_enabled.lua: enables or disables a schedule.
--
--@include schedules/lib
--
-- A disabled schedule fires nothing and records no missed occurrences. Enabling
-- moves the cursor to Redis now, so it fires the occurrences after that, and
-- bumps the version so no node acts on occurrences it computed before.
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  '1' enable, '0' disable
-- ARGV[3]  actor, for the event
--
-- Returns {code, version}: 1 changed, 0 already so, E.NOT_FOUND no such schedule
-- (version 0).
-- Emits schedule.enabled or schedule.disabled.
local s, want, actor = ARGV[1], ARGV[2], ARGV[3]
local f = redis.call('HMGET', KEYS[1], 'version', 'enabled')
if not f[1] then return {E.NOT_FOUND, 0} end
if f[2] == want then return {0, tonumber(f[1])} end
local nows = int(now_ms())
redis.call('HSET', KEYS[1], 'enabled', want, 'updated_at', nows)
if want == '1' then redis.call('HSET', KEYS[1], 'cursor', nows) end
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
local etype = 'schedule.disabled'
if want == '1' then etype = 'schedule.enabled' end
emit(etype, actor, {version = v}, 'schedule', s)
return {1, v}
