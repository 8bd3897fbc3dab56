-- list_queued.lua: read-only; a page of a queue's queued tasks in claim order,
-- merging the plain ids of the ready set with every group's queue.
--
-- KEYS[1]  P:q:<queue>:ready
-- ARGV[1]  queue
-- ARGV[2]  offset
-- ARGV[3]  limit
--
-- Returns {total, id...} (at most `limit` ids, starting at `offset`).
local q, offset, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want = offset + limit
local rows = {}
local function take(key)
  local r = redis.call('ZRANGE', key, 0, want - 1, 'WITHSCORES')
  for i = 1, #r, 2 do
    if string.sub(r[i], 1, 3) ~= '~g:' then rows[#rows + 1] = {tonumber(r[i + 1]), r[i]} end
  end
end
take(KEYS[1])
local gs = redis.call('SMEMBERS', qkey(q, 'groups'))
for i = 1, #gs do take(gqkey(q, gs[i])) end
table.sort(rows, function(a, b)
  if a[1] == b[1] then return a[2] < b[2] end
  return a[1] < b[1]
end)
local out = {queued_count(q)}
for i = offset + 1, math.min(want, #rows) do out[#out + 1] = rows[i][2] end
return out
