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
local score = redis.call('ZSCORE', P .. ':nodes', node)
if not score or tonumber(score) <= now then return {-1, -1} end
local nstate = redis.call('HGET', P .. ':node:' .. node, 'state')
if nstate == 'draining' or nstate == 'left' then return {-2, -1} end
local out = {0, -1}
if redis.call('HGET', qkey(q, 'meta'), 'paused') ~= '1' then
  promote_due(q, now, 1000)
  local n = 0
  while n < max do
    local head = redis.call('ZRANGE', KEYS[1], 0, 0)
    if #head == 0 then break end
    local m = head[1]
    local id = nil
    if string.sub(m, 1, 3) == '~g:' then
      local g = string.sub(m, 4)
      local first = redis.call('ZRANGE', gqkey(q, g), 0, 0)
      if #first == 0 or not group_has_room(g) then
        refresh_group_token(q, g)
      else
        id = first[1]
        redis.call('ZREM', gqkey(q, g), id)
        if redis.call('EXISTS', tkey(id)) == 1 then
          redis.call('SADD', grunning(g), id)
        else
          id = nil
        end
        refresh_group_token(q, g)
      end
    else
      id = m
      redis.call('ZREM', KEYS[1], id)
      if redis.call('EXISTS', tkey(id)) == 0 then id = nil end
    end
    if id then
      redis.call('ZREM', qkey(q, 'queued'), id)
      local t = tkey(id)
      local f = redis.call('HMGET', t, 'payload', 'attempts', 'max_attempts', 'timeout_ms', 'group', 'priority', 'created_at')
      local attempt = tonumber(f[2]) + 1
      local token = next_token()
      local tok = int(token)
      redis.call('HSET', t, 'state', 'running', 'owner', node, 'token', tok, 'attempts', attempt,
        'started_at', now, 'updated_at', now, 'cancel_requested', 0, 'progress', 0,
        'a' .. attempt, node .. '|' .. tok .. '|' .. now)
      redis.call('ZADD', qkey(q, 'running'), now, id)
      redis.call('SADD', ntasks(node), id)
      local timeout = tonumber(f[4])
      if timeout > 0 then redis.call('ZADD', DEADLINES, now + timeout, id) end
      emit('task.claimed', now, node, {'task', id, 'queue', q}, {attempt = attempt, token = tok})
      n = n + 1
      out[#out + 1] = id; out[#out + 1] = token; out[#out + 1] = attempt; out[#out + 1] = f[1]
      out[#out + 1] = tonumber(f[3]); out[#out + 1] = timeout; out[#out + 1] = f[5]
      out[#out + 1] = tonumber(f[6]); out[#out + 1] = tonumber(f[7])
    end
  end
  out[1] = n
end
local nxt = redis.call('ZRANGE', qkey(q, 'delayed'), 0, 0, 'WITHSCORES')
if #nxt > 0 then out[2] = tonumber(nxt[2]) end
return out
