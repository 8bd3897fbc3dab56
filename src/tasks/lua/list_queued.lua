-- list_queued.lua: read-only; a page of a queue's queued tasks in claim order,
-- merging the plain ids of the ready set with every group's queue.
--
--@include tasks/lib
--
-- The work is bounded by offset + limit (the caller caps offset), not by the
-- size of the queue or of each key: the keys are merged with a heap of their
-- next entries, each key read a chunk at a time (16 entries, doubling up to
-- 1024) only as far as the page needs.
--
-- KEYS[1]  P:q:<queue>:ready
-- ARGV[1]  queue
-- ARGV[2]  offset
-- ARGV[3]  limit
--
-- Returns {total, id...} (at most `limit` ids, starting at `offset`).
local q, offset, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local want = offset + limit

-- A source is one key: buf holds its entries {score, id} read so far, from pos on.
local function refill(src)
  while src.pos > #src.buf and not src.done do
    local r = redis.call('ZRANGE', src.key, src.from, src.from + src.chunk - 1, 'WITHSCORES')
    src.done = #r < src.chunk * 2
    src.from = src.from + src.chunk
    src.chunk = math.min(src.chunk * 2, 1024)
    src.buf, src.pos = {}, 1
    for i = 1, #r, 2 do
      -- group tokens in the ready set are not tasks
      if string.sub(r[i], 1, 3) ~= '~g:' then src.buf[#src.buf + 1] = {tonumber(r[i + 1]), r[i]} end
    end
  end
  return src.buf[src.pos]
end

local function before(a, b)
  local x, y = a.buf[a.pos], b.buf[b.pos]
  if x[1] == y[1] then return x[2] < y[2] end
  return x[1] < y[1]
end

-- A binary min-heap of sources by their next entry.
local heap = {}
local function sift_down(i)
  local n = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(heap[l], heap[m]) then m = l end
    if r <= n and before(heap[r], heap[m]) then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]
    i = m
  end
end
local function push(src)
  heap[#heap + 1] = src
  local i = #heap
  while i > 1 and before(heap[i], heap[math.floor(i / 2)]) do
    local p = math.floor(i / 2)
    heap[i], heap[p] = heap[p], heap[i]
    i = p
  end
end

local function add(key)
  local src = {key = key, from = 0, chunk = math.min(16, want), buf = {}, pos = 1, done = false}
  if refill(src) then push(src) end
end
add(KEYS[1])
local gs = redis.call('SMEMBERS', qkey(q, 'groups'))
for i = 1, #gs do add(gqkey(q, gs[i])) end

local out = {queued_count(q)}
local taken = 0
while taken < want and #heap > 0 do
  local src = heap[1]
  taken = taken + 1
  if taken > offset then out[#out + 1] = src.buf[src.pos][2] end
  src.pos = src.pos + 1
  if not refill(src) then
    heap[1] = heap[#heap]
    heap[#heap] = nil
  end
  if #heap > 0 then sift_down(1) end
end
return out
