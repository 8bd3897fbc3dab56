-- upsert.lua: creates a schedule or replaces its definition.
--
--@include schedules/lib
--
-- Config wins (docs/concepts.md, Schedules): a schedule written from
-- config.toml (source 'config') is refused to modes 'create' and 'put',
-- whatever the calling node's own config says, so a node without the entry
-- cannot change it; only mode 'config' (the reconcile of a node that lists
-- it) writes over it.
--
-- A new schedule's cursor is Redis now: it fires the occurrences after its
-- creation. A replaced definition keeps the cursor (occurrences up to it keep
-- their outcomes, and any still pending are fired by the new definition), except
-- that the cursor moves up to now when the expression or time zone changes (a new
-- timeline has no past to catch up on) or the schedule goes from disabled to
-- enabled (the time it was disabled is not an outage).
--
-- KEYS[1]  P:schedule:<s>
-- ARGV[1]  schedule id
-- ARGV[2]  mode: 'create' (refused if it exists), 'put' (create or replace),
--          'config' (create or replace as defined in config.toml; a no-op while the
--          stored config_hash is the same, so an operator's enable/disable stands
--          until the config entry itself changes)
-- ARGV[3]  actor (token name or node id), for the event
-- ARGV[4]  max_schedules
-- ARGV[5]  config_hash: a digest of the config entry ('' unless mode is 'config')
-- ARGV[6]  n; then n field, value pairs: the definition (see lib.lua), enabled included
--
-- Returns {code, version}
--   code  1 created, 2 replaced, 3 unchanged (config), E.EXISTS exists (create),
--         E.TOO_MANY too many schedules (schedules.max_schedules; version 0),
--         E.WRONG_STATE written from config.toml (stored source 'config'; modes
--         create and put), E.UNKNOWN_LIMIT the task's limits name one not defined
--         (modes create and put; version 0, then its name). config.toml's schedules
--         are written whatever their limits: a limit not defined holds nothing.
-- Emits schedule.created or schedule.updated.
local s, mode, actor, max, chash = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local n = tonumber(ARGV[6])
local old = redis.call('HMGET', KEYS[1], 'version', 'enabled', 'source', 'config_hash', 'expr', 'tz', 'cursor')
local exists = old[1] ~= false
if exists and mode ~= 'config' and old[3] == 'config' then return {E.WRONG_STATE, tonumber(old[1])} end
if exists and mode == 'create' then return {E.EXISTS, tonumber(old[1])} end
if exists and mode == 'config' and old[3] == 'config' and old[4] == chash then return {3, tonumber(old[1])} end
if not exists and redis.call('SCARD', P .. ':schedules') >= max then return {E.TOO_MANY, 0} end
local now = now_ms()
local nows = int(now)
local fields = {}
local new = {}
for i = 0, n - 1 do
  local f, v = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
  fields[#fields + 1] = f; fields[#fields + 1] = v
  new[f] = v
end
if mode ~= 'config' then
  for name in string.gmatch(new.limits or '', '[^,]+') do
    if not limit_settings(name) then return {E.UNKNOWN_LIMIT, 0, name} end
  end
end
local enabled = new.enabled or '1'
local source = 'api'
if mode == 'config' then source = 'config' end
fields[#fields + 1] = 'source'; fields[#fields + 1] = source
fields[#fields + 1] = 'config_hash'; fields[#fields + 1] = chash
fields[#fields + 1] = 'updated_at'; fields[#fields + 1] = nows
redis.call('HSET', KEYS[1], unpack(fields))
if not exists then
  redis.call('HSET', KEYS[1], 'created_at', nows, 'cursor', nows, 'fired', '0', 'skipped', '0', 'missed', '0')
  redis.call('SADD', P .. ':schedules', s)
elseif (old[2] ~= '1' and enabled == '1') or old[5] ~= new.expr or old[6] ~= new.tz then
  if tonumber(old[7] or '0') < now then redis.call('HSET', KEYS[1], 'cursor', nows) end
end
local v = redis.call('HINCRBY', KEYS[1], 'version', 1)
local etype = 'schedule.updated'
if not exists then etype = 'schedule.created' end
emit(etype, actor, {version = v, source = source, enabled = enabled == '1'}, 'schedule', s)
if exists then return {2, v} end
return {1, v}
