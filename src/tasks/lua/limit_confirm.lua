-- limit_confirm.lua: settles a reservation (limit_reserve.lua) once the claim in the
-- other shard ran (G13, split namespaces).
--
--@include tasks/lib
--
-- The tasks claimed hold a slot each (`id:attempt`, given back through
-- limit_return.lua when they end), except those that ended already (a tombstone in
-- P:limit_tomb: the node settles after answering the claim, so a quick task can end
-- first); the reservation's placeholders go, and the tokens reserved for tasks not
-- claimed go back to each rate limit's bucket. A reservation that lapsed meanwhile (its
-- node settled it more than its ttl late) gives nothing: its placeholders are gone, and
-- a slot taken now could outlive its task's end, never to be given back.
--
-- KEYS[1]  P:limit_resv
-- ARGV[1]  rid
-- ARGV[2]  the limits reserved under, comma-separated
-- ARGV[3]  k: tasks reserved
-- ARGV[4..] `id:attempt` of each task claimed (at most k)
--
-- Returns {code}: 1 settled, 2 the reservation had lapsed (nothing taken).
local rid, list, k = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local resd = P .. ':limit_resd'
local live = redis.call('HDEL', resd, rid) == 1
redis.call('ZREM', KEYS[1], rid)
local used = #ARGV - 3
local hold = {}
if live then
  local tomb = P .. ':limit_tomb'
  for i = 4, #ARGV do
    if redis.call('ZREM', tomb, ARGV[i]) == 0 then hold[#hold + 1] = ARGV[i] end
  end
end
for name in string.gmatch(list, '[^,]+') do
  local s = limit_settings(name)
  if s then
    if live then
      local ph = {}
      for j = 1, k do ph[j] = rid .. '.' .. j end
      redis.call('SREM', lrun(name), unpack(ph))
    end
    if s.c > 0 and #hold > 0 then redis.call('SADD', lrun(name), unpack(hold)) end
    if live and s.rmax > 0 and used < k then
      local tok = limit_tokens(name, s, now) + (k - used) * s.rper
      local cap = s.rburst * s.rper
      if tok > cap then tok = cap end
      redis.call('HSET', lkey(name), 'tok', int(tok), 'at', int(now))
      if s.key then redis.call('PEXPIRE', lkey(name), math.ceil((cap - tok) / s.rmax) + 1000) end
    end
  end
end
return {live and 1 or 2}
