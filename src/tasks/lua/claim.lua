-- claim.lua: hands up to `max` queued tasks of a queue to one node (G1).
--
-- Each claimed task gets a fencing token greater than every token issued before
-- in this namespace. Order: priority, then enqueue order. Delayed tasks that are
-- due by Redis time are promoted first. A group at its limit is skipped without
-- blocking tasks behind it; within a group tasks start in FIFO order (G6).
--
-- KEYS[1]  P:q:<queue>:ready      (routes the call)
-- ARGV[1]  queue
-- ARGV[2]  node id; must be alive (score ahead of Redis time) and not draining
-- ARGV[3]  max tasks to claim (1-1000)
--
-- Returns {code, next_due, task...}
--   code      n >= 0 tasks claimed, -1 node unknown or expired, -2 node draining or left
--   next_due  Redis ms when the earliest delayed task is due, or -1
--   task      9 entries per task: id, token, attempt, payload, max_attempts,
--             timeout_ms, group, priority, created_at
-- Emits task.claimed per task.
local q, node, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local nows = int(now)
local score = redis.call('ZSCORE', P .. ':nodes', node)
if not score or tonumber(score) <= now then return {-1, -1} end
local nstate = redis.call('HGET', P .. ':node:' .. node, 'state')
if nstate == 'draining' or nstate == 'left' then return {-2, -1} end
local out = {0, -1}
if redis.call('HGET', qkey(q, 'meta'), 'paused') ~= '1' then
  promote_due(q, now, 1000)
  -- 1. Pick ids in claim order. Plain ids at the head are taken in one read;
  --    a group token yields that group's head and the ready set is read again,
  --    because the token's new score may belong before the next plain id.
  local picked = {}
  local from_group = {}
  local plain = {}
  local guard = 0
  while #picked < max and guard < 10000 do
    guard = guard + 1
    local head = redis.call('ZRANGE', KEYS[1], 0, max - #picked - 1)
    if #head == 0 then break end
    local reread = false
    for i = 1, #head do
      local m = head[i]
      if string.sub(m, 1, 3) == '~g:' then
        local g = string.sub(m, 4)
        local first = redis.call('ZRANGE', gqkey(q, g), 0, 0)
        if #first > 0 and group_has_room(g) then
          local id = first[1]
          redis.call('ZREM', gqkey(q, g), id)
          redis.call('SADD', grunning(g), id)
          picked[#picked + 1] = id
          from_group[id] = g
        end
        refresh_group_token(q, g)
        reread = true
        break
      else
        picked[#picked + 1] = m
        plain[#plain + 1] = m
      end
    end
    if #plain > 0 then
      redis.call('ZREM', KEYS[1], unpack(plain))
      plain = {}
    end
    if not reread then break end
  end
  -- 2. Hand them out.
  if #picked > 0 then
    local token = next_tokens(#picked)
    local running, mine, deadlines = {}, {}, {}
    local n = 0
    for i = 1, #picked do
      local id = picked[i]
      local t = tkey(id)
      local f = redis.call('HMGET', t, 'payload', 'attempts', 'max_attempts', 'timeout_ms', 'priority', 'created_at', 'progress')
      if f[1] then
        local attempt = tonumber(f[2] or '0') + 1
        local tok = int(token + i - 1)
        local a = int(attempt)
        if f[7] and f[7] ~= '0' then
          redis.call('HSET', t, 'state', 'running', 'owner', node, 'token', tok, 'attempts', a,
            'started_at', nows, 'a' .. a, node .. '|' .. tok .. '|' .. nows, 'progress', '0')
        else
          redis.call('HSET', t, 'state', 'running', 'owner', node, 'token', tok, 'attempts', a,
            'started_at', nows, 'a' .. a, node .. '|' .. tok .. '|' .. nows)
        end
        running[#running + 1] = nows; running[#running + 1] = id
        mine[#mine + 1] = id
        local timeout = tonumber(f[4] or '0')
        if timeout > 0 then
          deadlines[#deadlines + 1] = int(now + timeout); deadlines[#deadlines + 1] = id
        end
        local g = from_group[id] or ''
        emit_task('task.claimed', node, '{"attempt":' .. a .. ',"token":' .. tok .. '}', id, q, g)
        n = n + 1
        out[#out + 1] = id; out[#out + 1] = token + i - 1; out[#out + 1] = attempt; out[#out + 1] = f[1]
        out[#out + 1] = tonumber(f[3]); out[#out + 1] = timeout; out[#out + 1] = g
        out[#out + 1] = tonumber(f[5]); out[#out + 1] = tonumber(f[6])
      elseif from_group[id] then
        -- the task vanished while queued: give its slot back
        redis.call('SREM', grunning(from_group[id]), id)
        refresh_group_everywhere(from_group[id])
      end
    end
    local b = batch_new()
    if #running > 0 then batch_add(b, qkey(q, 'running'), unpack(running)) end
    if #deadlines > 0 then batch_add(b, DEADLINES, unpack(deadlines)) end
    batch_flush(b, 'ZADD')
    b = batch_new()
    if #mine > 0 then batch_add(b, ntasks(node), unpack(mine)) end
    batch_flush(b, 'SADD')
    out[1] = n
  end
end
local nxt = redis.call('ZRANGE', qkey(q, 'delayed'), 0, 0, 'WITHSCORES')
if #nxt > 0 then out[2] = tonumber(nxt[2]) end
return out
