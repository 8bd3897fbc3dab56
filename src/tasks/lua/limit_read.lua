-- limit_read.lua: a flow-control limit's settings and use now (G13).
--
--@include tasks/lib
--
-- KEYS[1]  P:limits
-- ARGV[1]  name: a limit, a template `name:*`, or a template's key `name:key`
--
-- Returns {code, c, rmax, rper, rburst, running, tokens, waiting, queues}
--   code     1, E.NOT_FOUND (neither the limit nor its template is defined)
--   running  tasks holding a slot of it now
--   tokens   whole tokens in its bucket now (-1 without a rate)
--   waiting  queued tasks whose own limits start with it (in their line), plus the
--            queued tasks of the queues that name it
--   queues   the queues that name it, comma-separated
local name = ARGV[1]
local s = limit_settings(name)
if not s then return {E.NOT_FOUND, 0, 0, 0, 0, 0, 0, 0, ''} end
local now = now_ms()
local tokens = -1
if s.rmax > 0 then tokens = math.floor(limit_tokens(name, s, now) / s.rper) end
local waiting = 0
local line = limits_line(name)
for _, q in ipairs(redis.call('SMEMBERS', gqueues(line))) do
  waiting = waiting + redis.call('ZCARD', gqkey(q, line))
end
local qs = redis.call('SMEMBERS', lqueues(name))
for i = 1, #qs do waiting = waiting + queued_count(qs[i]) end
return {1, s.c, s.rmax, s.rper, s.rburst, redis.call('SCARD', lrun(name)), tokens, waiting, table.concat(qs, ',')}
