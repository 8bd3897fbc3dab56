-- lib.lua: task helpers shared by every task script (prepended after the prelude).
--
-- KEYS / ARGV: none of its own: a library, included in other scripts, whose
-- KEYS and ARGV it does not read. Returns: nothing; it defines local functions.
--
-- Key layout (P is the hash-tagged prefix; q a queue, g a group, id a task id):
--   P:task:<id>             hash   the task; TTL once finished (retention). Its payload:
--                                  `payload`, or parts p1..pN with `parts` = N (see
--                                  payload_fields). priority, max_attempts, backoff_base
--                                  and backoff_cap only when not their TASK_DEFAULTS.
--                                  Attempt log:
--                                  a<n> 'node|token|claimed_at', e<n> 'ended_at|outcome';
--                                  x<1..10> 'attempt|node|token|claimed_at|ended_at' for
--                                  the latest claims not acknowledged (unacked: how many)
--   P:queues                set    known queue names (bounded by max_queues)
--   P:q:<q>:meta            hash   paused flag
--   P:q:<q>:ready           zset   what a claim looks at: queued tasks without a group,
--                                  and one token "~g:<g>" per group that has room and
--                                  queued tasks here, scored by that group's head task
--                                  (so a full group never blocks the tasks behind it)
--   P:q:<q>:g:<g>           zset   queued tasks of group g in q, FIFO by order score
--   P:q:<q>:groups          set    groups that have queued tasks in q
--   P:q:<q>:delayed         zset   delayed and retrying tasks, by run_at (Redis ms)
--   P:q:<q>:running         zset   running tasks, by start time
--   P:q:<q>:succeeded|cancelled|dead  zset  finished tasks, by finish time (trimmed)
--   P:dead                  zset   dead tasks of every queue, by finish time (trimmed)
--   P:group_limits          hash   group -> limit (bounded by max_groups)
--   P:group:<g>:running     set    running task ids of g, cluster-wide (the slots)
--   P:group:<g>:queues      set    queues that hold queued tasks of g
--   P:node:<node>:tasks     set    running task ids owned by a node (orphan cleaner)
--   P:deadlines             zset   running tasks with a timeout, by deadline
--   P:unacked               zset   claimed tasks not acknowledged yet (a task heartbeat, an
--                                  ack, the finish), by their claim lease's end (Redis ms)
--   P:limits                set    flow-control limits and templates (bounded by limits.max_limits)
--   P:limit:<L>             hash   limit L: its settings c (concurrency), rmax, rper, rburst (rate:
--                                  rmax per rper ms, at most rburst saved up; '0' for none) and its
--                                  bucket tok (tokens * rper), at (Redis ms of tok). A template key's
--                                  (L = name:key, settings in P:limit:name:*) holds the bucket only
--                                  and expires once the bucket would be full again
--   P:limit_run:<L>         set    running task ids holding a concurrency slot of L
--   P:limit_keys            zset   template keys in use -> last named or taken from (Redis ms);
--                                  bounded by tasks.max_limit_keys, pruned by limit_keys.lua
--   P:limit_queues:<L>      set    the queues that name L
--   P:q:<q>:limits          string the queue's limits, comma-separated: they bind each of its tasks.
--                                  Split namespaces: limits live in shard 0; in another shard this key
--                                  only says that the queue has limits (a claim reserves first)
--   P:limit_resv            zset   shard 0: reservations (limit_reserve.lua) -> their end (Redis ms)
--   P:limit_resd            hash   shard 0: reservation -> 'names|k' (its slots `<rid>.<1..k>`)
--   P:limit_tomb            zset   shard 0: `id:attempt` of tasks that ended before their claim's
--                                  reservation was settled -> when (ms); TTL 30 s
--   P:limit_out             zset   shards but 0: 'id:attempt|names' of ended tasks whose slots in
--                                  shard 0 are still to give back (limit_return.lua), by end time
--   P:q:<q>:g:@<L>          zset   queued tasks of q with limits of their own, first of them L,
--                                  FIFO (a line like a group's, its token "~g:@<L>" always in the
--                                  ready set while it is not empty; skipped while L has no room).
--                                  Lines take turns: one that gave a task goes behind what is
--                                  queued then (rotate_line), so keys of a template share q fairly
--   P:fence, P:epoch        string the fencing counter and epoch
--   P:seq, P:fseq           string order counters (back and front of a queue)
--   P:idem:<key>            string idempotency key -> task id; TTL the window
--   P:alias:<alias>         string alias -> task id; TTL once the task finished
--   P:debounce:<q>:<key>    string debounce key -> the task that waits for it; TTL its window
--
-- Order score: (1000 - priority) * 2^42 + 2^41 + seq, with seq > 0 for the back of
-- the queue and < 0 for the front: higher priority first, then FIFO. Exact below 2^53.
--
-- Speed: arguments are passed to redis.call as strings where possible (Lua numbers
-- are formatted on every call), and batch scripts gather per-key work into one
-- variadic call (ZADD, ZREM, SADD, SREM) per key.
-- Workflow advancement, defined by workflows/lua/hook.lua (appended after this
-- library): called whenever a task reaches a terminal state.
local wf_on_end

local TWO42 = 4398046511104
local TWO41 = 2199023255552
local TWO32 = 4294967296
local GROUP_LIMITS = P .. ':group_limits' -- @per-call
local DEADLINES = P .. ':deadlines' -- @per-call
local UNACKED = P .. ':unacked' -- @per-call

local function tkey(id) return P .. ':task:' .. id end
local function qkey(q, s) return P .. ':q:' .. q .. ':' .. s end
local function gqkey(q, g) return P .. ':q:' .. q .. ':g:' .. g end
local function grunning(g) return P .. ':group:' .. g .. ':running' end
local function gqueues(g) return P .. ':group:' .. g .. ':queues' end
local function ntasks(node) return P .. ':node:' .. node .. ':tasks' end

-- A task's payload goes into its hash as one field when it is at most
-- PAYLOAD_PART bytes, else in parts p1..pN of at most PAYLOAD_PART bytes each
-- (cut between UTF-8 characters) with 'parts' = N, up to PAYLOAD_PARTS_MAX
-- parts. Redis keeps a hash whose values are all at most
-- hash-max-listpack-value bytes (64 by default) as a listpack, a third of
-- the memory of the hashtable one long value turns it into. A longer payload
-- stays one field. Read it back with task_payload.
local PAYLOAD_PART = 64
local PAYLOAD_PARTS_MAX = 32
-- The parts' field names, built once (a name built per part was a
-- concatenation per part written or read). A part is at least 61 bytes (a cut moves
-- back over at most three continuation bytes), so 2 048 bytes make at most 34.
local PART_NAMES = {'p1', 'p2', 'p3', 'p4', 'p5', 'p6', 'p7', 'p8', 'p9', 'p10', 'p11', 'p12',
  'p13', 'p14', 'p15', 'p16', 'p17', 'p18', 'p19', 'p20', 'p21', 'p22', 'p23', 'p24', 'p25', 'p26',
  'p27', 'p28', 'p29', 'p30', 'p31', 'p32', 'p33', 'p34'}
local function payload_fields(fields, payload)
  local n = #payload
  if n <= PAYLOAD_PART or n > PAYLOAD_PART * PAYLOAD_PARTS_MAX then
    fields[#fields + 1] = 'payload'; fields[#fields + 1] = payload
    return
  end
  local i, k = 1, 0
  while i <= n do
    local e = math.min(i + PAYLOAD_PART - 1, n)
    -- Do not cut a UTF-8 character: move back over continuation bytes.
    while e < n and e > i do
      local b = string.byte(payload, e + 1)
      if b < 128 or b >= 192 then break end
      e = e - 1
    end
    k = k + 1
    fields[#fields + 1] = PART_NAMES[k] or 'p' .. k; fields[#fields + 1] = string.sub(payload, i, e)
    i = e + 1
  end
  fields[#fields + 1] = 'parts'; fields[#fields + 1] = tostring(k)
end

-- A task hash leaves out these fields while they hold these values (issue 41:
-- memory per queued task: each listpack entry costs its name and its value).
-- Fixed here, not taken from the configuration, so a hash reads the same
-- whatever the node that wrote it was configured with: read a missing one as
-- TASK_DEFAULTS[name] (`f[i] or TASK_DEFAULTS.max_attempts`); Rust's reader
-- has the same values (tasks/read.rs).
local TASK_DEFAULTS = {priority = '0', max_attempts = '3', backoff_base = '1000', backoff_cap = '300000'}

-- Appends field `name` = `value` to `fields` (HSET name, value pairs) unless
-- it holds its TASK_DEFAULTS value.
local function put_setting(fields, name, value)
  local s = tostring(value)
  if s ~= TASK_DEFAULTS[name] then fields[#fields + 1] = name; fields[#fields + 1] = s end
end

-- Appends the task's priority, attempts and backoff to `fields`, leaving out
-- those that hold their TASK_DEFAULTS value (no table built per task: enqueue
-- runs this for every task of a batch).
local function task_settings(fields, priority, max_attempts, base, cap)
  put_setting(fields, 'priority', priority)
  put_setting(fields, 'max_attempts', max_attempts)
  put_setting(fields, 'backoff_base', base)
  put_setting(fields, 'backoff_cap', cap)
end

-- The payload of task hash t, given its 'payload' and 'parts' fields as read, and
-- f[at .. at + PARTS_AHEAD - 1] its first parts, read by the same HMGET (p1 ..):
-- a payload of up to PARTS_AHEAD parts (256 bytes) costs no second read, which
-- was a command per claimed task for the common payload of 65 to 256 bytes. nil
-- when the task has neither.
local PARTS_AHEAD = 4
local function task_payload(t, whole, parts, f, at)
  if whole then return whole end
  if not parts then return nil end
  local n = tonumber(parts)
  if n <= PARTS_AHEAD then return table.concat(f, '', at, at + n - 1) end
  local names = PART_NAMES
  if n > #names then
    names = {}
    for i = 1, n do names[i] = 'p' .. i end
  end
  return table.concat(f, '', at, at + PARTS_AHEAD - 1)
    .. table.concat(redis.call('HMGET', t, unpack(names, PARTS_AHEAD + 1, n)))
end

-- Emits a task event; the group is a subject when there is one, so that nodes
-- can wake claimers of every queue when a group slot frees up.
-- Without a group, with the data as JSON text (the hot paths), the entry is built
-- here, in emit's form, in one concatenation (no varargs, no subject lookups).
local function emit_task(etype, node, data, id, q, g)
  if g and g ~= '' then return emit(etype, node, data, 'task', id, 'queue', q, 'group', g) end
  if type(data) ~= 'string' then return emit(etype, node, data, 'task', id, 'queue', q) end
  return emit_entry(etype .. '\n' .. (node or '') .. '\nt=' .. id .. '\nq=' .. q .. '\n' .. data)
end

-- One variadic command `cmd key members...` for the whole list, in parts of at most
-- 4000 members (Lua's stack bounds unpack); none when the list is empty.
local function call_all(cmd, key, list)
  for j = 1, #list, 4000 do redis.call(cmd, key, unpack(list, j, math.min(j + 3999, #list))) end
end

-- ZADD of a list of (score, member) pairs, the last pair first. A small sorted set
-- (up to zset-max-listpack-entries, 128 by default) is a listpack, and Redis
-- inserts each member by scanning it from the head to the first greater score (or
-- equal score and greater member): the pairs of a batch come in ascending order
-- (sequence numbers; one start time and ids in order), so each would be scanned
-- past all the others, where in descending order each lands before the one added
-- last. A larger set (a skiplist) costs the same either way.
local function zadd_pairs(key, list)
  local n = #list
  if n == 0 then return end
  if n == 2 then
    redis.call('ZADD', key, list[1], list[2])
    return
  end
  local r = {}
  for j = n - 1, 1, -2 do
    r[#r + 1] = list[j]; r[#r + 1] = list[j + 1]
  end
  call_all('ZADD', key, r)
end

-- Collects members per key and sends one variadic command per key. A batch is one
-- table: its keys in order in the array part, each key's members under the key (a
-- key is never a number). batch_add takes one member or two (a score and a member):
-- no table is built per call.
local function batch_new() return {} end
local function batch_add(b, key, v1, v2)
  local m = b[key]
  if not m then
    m = {}
    b[key] = m
    b[#b + 1] = key
  end
  m[#m + 1] = v1
  if v2 ~= nil then m[#m + 1] = v2 end
end
local function batch_flush(b, cmd)
  for i = 1, #b do
    local key = b[i]
    call_all(cmd, key, b[key])
  end
end
-- batch_flush for a batch of (score, member) pairs: one ZADD per key (zadd_pairs).
local function batch_zadd(b)
  for i = 1, #b do
    local key = b[i]
    zadd_pairs(key, b[key])
  end
end

local function order_score(priority, seq)
  return int((1000 - priority) * TWO42 + TWO41 + seq)
end

-- n consecutive back-of-queue sequence numbers: returns the first.
local function next_seqs(n)
  if n == 1 then return redis.call('INCR', P .. ':seq') end
  return redis.call('INCRBY', P .. ':seq', int(n)) - n + 1
end

local function front_seq()
  return -redis.call('INCR', P .. ':fseq')
end

-- n consecutive fencing tokens: epoch in the high bits, a counter below 2^32.
-- Returns the first token. When an epoch's counter space is used up the epoch
-- advances, so tokens only grow.
local function next_tokens(n)
  local epoch = fence_epoch()
  local c
  if n == 1 then c = redis.call('INCR', P .. ':fence') else c = redis.call('INCRBY', P .. ':fence', int(n)) end
  if c >= TWO32 then
    epoch = epoch + 1
    redis.call('SET', P .. ':epoch', int(epoch))
    redis.call('SET', P .. ':fence', int(n))
    c = n
  end
  return epoch * TWO32 + c - n + 1
end

-- Flow-control limits (G13). A limit's settings, per call: name -> {c, rmax, rper,
-- rburst, key} or false (not defined); key: a template's key (its bucket expires).
local LIMITS = {} -- @per-call
local LIMIT_POLL_MS = 100

local function lkey(name) return P .. ':limit:' .. name end
-- The line (a group-like line of a queue) of tasks whose own limits start with `name`,
-- and whether group g is such a line rather than a group.
local function limits_line(name) return '@' .. name end
local function is_limits_line(g) return string.sub(g, 1, 1) == '@' end
local function lrun(name) return P .. ':limit_run:' .. name end
local function lqueues(name) return P .. ':limit_queues:' .. name end
-- Whether this call runs in the shard that holds the limits: the only one, or shard 0 of
-- a split namespace (its tag is `{prefix#0.k}`; `#` cannot occur in a prefix).
local function limits_here() return not string.find(P, '#', 1, true) or string.find(P, '#0.', 1, true) ~= nil end

local function limit_settings(name)
  local s = LIMITS[name]
  if s ~= nil then return s end
  local f = redis.call('HMGET', lkey(name), 'c', 'rmax', 'rper', 'rburst')
  local key = false
  if not f[1] then
    local base = string.match(name, '^([^:]+):[^:*]+$')
    if base then f = redis.call('HMGET', lkey(base .. ':*'), 'c', 'rmax', 'rper', 'rburst') end
    key = true
  end
  if not f[1] then
    s = false
  else
    s = {c = tonumber(f[1]), rmax = tonumber(f[2]), rper = tonumber(f[3]), rburst = tonumber(f[4]), key = key}
  end
  LIMITS[name] = s
  return s
end

-- Limit `name`'s bucket refilled to `now` (scaled: one token is rper); its capacity is rburst
-- tokens. A missing bucket is full.
local function limit_tokens(name, s, now)
  local b = redis.call('HMGET', lkey(name), 'tok', 'at')
  local cap = s.rburst * s.rper
  if not b[1] then return cap end
  local tok = tonumber(b[1]) + (now - tonumber(b[2])) * s.rmax
  if tok > cap then tok = cap end
  return tok
end

-- How many more tasks limit `name` lets start now (a large number when unbounded), and
-- when (Redis ms) its next token comes when that is none for want of tokens (else -1).
local function limit_room(name, s, now)
  local room, due = 1000000, -1
  if s.c > 0 then
    room = s.c - redis.call('SCARD', lrun(name))
    -- No event says when a slot of a queue's limit frees up: a waiting claim
    -- looks again after LIMIT_POLL_MS.
    if room <= 0 then due = now + LIMIT_POLL_MS end
  end
  if s.rmax > 0 then
    local tok = limit_tokens(name, s, now)
    local r = math.floor(tok / s.rper)
    if r < room then room = r end
    if r <= 0 then
      local at = now + math.ceil((s.rper - tok) / s.rmax)
      if at > due then due = at end
    end
  end
  if room < 0 then room = 0 end
  return room, due
end

-- Template keys in use (P:limit_keys, bounded by tasks.max_limit_keys): whether key
-- `name` is in use or there is room for one more; and the touch that keeps the
-- keys of limits `lims` (comma-separated) in use as of `now`.
local function limit_key_room(name, max_keys)
  local keys = P .. ':limit_keys'
  return redis.call('ZSCORE', keys, name) or redis.call('ZCARD', keys) < max_keys
end
local function limit_keys_touch(lims, now)
  for name in string.gmatch(lims, '[^,]+') do
    local s = limit_settings(name)
    if s and s.key then redis.call('ZADD', P .. ':limit_keys', int(now), name) end
  end
end

-- Takes from limit `name` what the tasks `ids` starting now use: a concurrency slot each
-- and a token each.
local function limit_take(name, s, now, ids)
  if #ids == 0 then return end
  if s.key then redis.call('ZADD', P .. ':limit_keys', int(now), name) end
  if s.c > 0 then redis.call('SADD', lrun(name), unpack(ids)) end
  if s.rmax > 0 then
    local tok = limit_tokens(name, s, now) - #ids * s.rper
    redis.call('HSET', lkey(name), 'tok', int(tok), 'at', int(now))
    if s.key then
      redis.call('PEXPIRE', lkey(name), math.ceil((s.rburst * s.rper - tok) / s.rmax) + 1000)
    end
  end
end

-- Gives back in shard 0 the slots named by an outbox entry `id:attempt|names`. A slot
-- not there (its reservation not settled yet: the task ended first; or handed over
-- twice) leaves a tombstone in P:limit_tomb for LIMIT_TOMB_MS, so that a settling
-- that comes later does not take it (limit_confirm.lua).
local LIMIT_TOMB_MS = 30000
local function limits_return(entry)
  local member, names = string.match(entry, '^([^|]+)|(.*)$')
  if not member then return 0 end
  local n, missed = 0, false
  for name in string.gmatch(names, '[^,]+') do
    local s = limit_settings(name)
    if s and s.c > 0 then
      local r = redis.call('SREM', lrun(name), member)
      n = n + r
      if r == 0 then missed = true end
    end
  end
  if missed then
    local tomb, now = P .. ':limit_tomb', now_ms()
    redis.call('ZADD', tomb, int(now), member)
    redis.call('ZREMRANGEBYSCORE', tomb, '-inf', int(now - LIMIT_TOMB_MS))
    redis.call('PEXPIRE', tomb, LIMIT_TOMB_MS)
  end
  return n
end

-- Gives back the concurrency slots task `id` holds: its 'held' limits, comma-separated,
-- whose slots are here (member: the id); or, prefixed '=', limits in shard 0 reserved
-- for it by a claim in this shard (member `id:attempt`): those go to the outbox
-- P:limit_out, which the nodes hand to shard 0 (limit_return.lua) and then trim.
local function limits_release(id, held)
  if not held or held == '' then return end
  if string.sub(held, 1, 1) == '=' then
    local a = redis.call('HGET', tkey(id), 'attempts') or '0'
    redis.call('ZADD', P .. ':limit_out', int(now_ms()), id .. ':' .. a .. '|' .. string.sub(held, 2))
    return
  end
  for name in string.gmatch(held, '[^,]+') do redis.call('SREM', lrun(name), id) end
end

-- The room under limits `list` (comma-separated; names not defined hold nothing): at
-- most `max`, the Redis ms when one without room may have some (or -1 if `due` is
-- -1 and none gives one sooner), and the defined names.
local function limits_list_room(list, max, now, due)
  local names = {}
  for name in string.gmatch(list, '[^,]+') do
    local s = limit_settings(name)
    if s then
      local room, d = limit_room(name, s, now)
      if room < max then max = room end
      if d >= 0 and (due < 0 or d < due) then due = d end
      names[#names + 1] = name
    end
  end
  return max, due, names
end

-- Whether a task of limits line g (g = '@' .. its first limit) with limits `own`
-- (comma-separated) may start now; false with the Redis ms of the next token, or -1.
local function own_limits_room(own, now)
  for name in string.gmatch(own or '', '[^,]+') do
    local s = limit_settings(name)
    if s then
      local room, due = limit_room(name, s, now)
      if room <= 0 then return false, due end
    end
  end
  return true, -1
end

local function group_has_room(g)
  if is_limits_line(g) then return true end
  local limit = redis.call('HGET', GROUP_LIMITS, g)
  if not limit then return true end
  return redis.call('SCARD', grunning(g)) < tonumber(limit)
end

-- Publishes group g's token in q's ready set at the score of g's head, or removes it
-- when g has no queued task in q or no free slot.
local function refresh_group_token(q, g)
  local token = '~g:' .. g
  local head = redis.call('ZRANGE', gqkey(q, g), '0', '0', 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', qkey(q, 'ready'), token)
    redis.call('SREM', gqueues(g), q)
    redis.call('SREM', qkey(q, 'groups'), g)
  elseif is_limits_line(g) then
    -- GT: a line's turn (rotate_line) is not undone by its tasks' comings and goings.
    redis.call('ZADD', qkey(q, 'ready'), 'GT', head[2], token)
  elseif group_has_room(g) then
    redis.call('ZADD', qkey(q, 'ready'), head[2], token)
  else
    redis.call('ZREM', qkey(q, 'ready'), token)
  end
end

-- Round robin across lines of own limits (one tenant's backlog does not starve
-- another's): a line that just gave a task goes behind everything queued in q now at its
-- head's priority, as if its head had just been submitted.
local function rotate_line(q, g)
  local head = redis.call('ZRANGE', gqkey(q, g), '0', '0', 'WITHSCORES')
  if #head == 0 then return refresh_group_token(q, g) end
  local hs = tonumber(head[2])
  local back = math.floor(hs / TWO42) * TWO42 + TWO41 + next_seqs(1)
  if back < hs then back = hs end
  redis.call('ZADD', qkey(q, 'ready'), int(back), '~g:' .. g)
end

local function refresh_group_everywhere(g)
  local qs = redis.call('SMEMBERS', gqueues(g))
  for i = 1, #qs do refresh_group_token(qs[i], g) end
end

-- Makes a task queued (claimable) at `score` (a string).
local function make_queued(id, q, g, score, nows)
  if g ~= '' then
    redis.call('ZADD', gqkey(q, g), score, id)
    redis.call('SADD', gqueues(g), q)
    redis.call('SADD', qkey(q, 'groups'), g)
    refresh_group_token(q, g)
  else
    redis.call('ZADD', qkey(q, 'ready'), score, id)
  end
  redis.call('HSET', tkey(id), 'state', 'queued', 'updated_at', nows)
end

-- Takes a queued task out of the claim structures.
local function unqueue(id, q, g)
  if g ~= '' then
    redis.call('ZREM', gqkey(q, g), id)
    refresh_group_token(q, g)
  else
    redis.call('ZREM', qkey(q, 'ready'), id)
  end
end

-- Frees everything a running task holds: its place in the running set, its owner's
-- index, its deadline, its claim lease, and its group slot (which may let the group's
-- next task run).
local function release_running(id, q, g, owner)
  limits_release(id, redis.call('HGET', tkey(id), 'held'))
  redis.call('ZREM', qkey(q, 'running'), id)
  if owner and owner ~= '' then redis.call('SREM', ntasks(owner), id) end
  redis.call('ZREM', DEADLINES, id)
  redis.call('ZREM', UNACKED, id)
  if g ~= '' then
    redis.call('SREM', grunning(g), id)
    refresh_group_everywhere(g)
  end
end

-- Moves a task to a terminal state and starts its retention clock.
local function finish(id, q, state, nows, ttl)
  redis.call('ZADD', qkey(q, state), nows, id)
  if state == 'dead' then redis.call('ZADD', P .. ':dead', nows, id) end
  redis.call('HSET', tkey(id), 'state', state, 'finished_at', nows, 'updated_at', nows)
  redis.call('PEXPIRE', tkey(id), ttl)
  local alias = redis.call('HGET', tkey(id), 'alias')
  if alias and alias ~= '' and redis.call('GET', P .. ':alias:' .. alias) == id then
    redis.call('PEXPIRE', P .. ':alias:' .. alias, ttl)
  end
  wf_on_end(id, state, nows)
end

-- Moves due delayed tasks of q to queued (at most `limit`). Returns how many.
local function promote_due(q, now, limit)
  local due = redis.call('ZRANGEBYSCORE', qkey(q, 'delayed'), '-inf', int(now), 'LIMIT', '0', int(limit))
  if #due == 0 then return 0 end
  local nows = int(now)
  local seq = next_seqs(#due)
  for i = 1, #due do
    local id = due[i]
    redis.call('ZREM', qkey(q, 'delayed'), id)
    local f = redis.call('HMGET', tkey(id), 'priority', 'group', 'state')
    if f[3] == 'delayed' then
      make_queued(id, q, f[2] or '', order_score(tonumber(f[1] or TASK_DEFAULTS.priority), seq + i - 1), nows)
    end
  end
  return #due
end

-- Queued tasks of q: the plain ids in its ready set plus every group's queue
-- (group tokens in the ready set are not tasks).
local function queued_count(q)
  local n = redis.call('ZCARD', qkey(q, 'ready'))
  local gs = redis.call('SMEMBERS', qkey(q, 'groups'))
  for i = 1, #gs do
    if redis.call('ZSCORE', qkey(q, 'ready'), '~g:' .. gs[i]) then n = n - 1 end
    n = n + redis.call('ZCARD', gqkey(q, gs[i]))
  end
  return n
end

-- Queue latency (ms): how long the longest-waiting task at the head of a line
-- has been claimable (`now` less when it became queued: the `updated_at`
-- make_queued sets, or `created_at` for a task queued at its submit): the head
-- of the ready set and the head of each group's line; 0 with nothing queued.
-- Heads only, so it stays O(groups): within a line tasks are claimed in
-- order, so a head is its line's oldest unless a later one has a higher
-- priority.
local function queue_latency(q, now)
  local oldest = now
  local function at(id)
    local t = redis.call('HMGET', tkey(id), 'updated_at', 'created_at')
    return tonumber(t[1] or t[2] or now) or now
  end
  local head = redis.call('ZRANGE', qkey(q, 'ready'), 0, 0)[1]
  if head and string.sub(head, 1, 3) ~= '~g:' then
    oldest = math.min(oldest, at(head))
  end
  local gs = redis.call('SMEMBERS', qkey(q, 'groups'))
  for i = 1, #gs do
    local gh = redis.call('ZRANGE', gqkey(q, gs[i]), 0, 0)[1]
    if gh then oldest = math.min(oldest, at(gh)) end
  end
  return int(now - oldest)
end

-- Retry delay: base * 2^(attempt-1), capped, with jitter in [half, full] of it.
local function backoff_ms(attempt, base, cap, jitter)
  local d = base * math.pow(2, attempt - 1)
  if d > cap then d = cap end
  return math.floor(d * (0.5 + 0.5 * jitter))
end

-- After a failed execution: retry later (attempts left, retryable) or dead.
-- Returns the new state ('delayed' or 'dead') and the retry time (or 0).
local function fail_or_retry(id, q, attempt, max_attempts, base, cap, jitter, retryable, now, dead_ttl, node, reason)
  if retryable and attempt < max_attempts then
    local run_at = now + backoff_ms(attempt, base, cap, jitter)
    redis.call('ZADD', qkey(q, 'delayed'), int(run_at), id)
    redis.call('HSET', tkey(id), 'state', 'delayed', 'run_at', int(run_at), 'updated_at', int(now))
    emit('task.retrying', node, {attempt = attempt, run_at = run_at, reason = reason}, 'task', id, 'queue', q)
    return 'delayed', run_at
  end
  finish(id, q, 'dead', int(now), dead_ttl)
  emit('task.dead', node, {attempt = attempt, reason = reason}, 'task', id, 'queue', q)
  return 'dead', 0
end

-- Why `node` may not claim now: E.NODE_NOT_ALIVE (unknown, or its heartbeat expired
-- by Redis time), E.NODE_DRAINING (draining or left), or nil.
-- credential: the claiming caller's (token name); a worker registered by another
-- credential is refused with E.NOT_OWNER, as its heartbeats are (nodes/lua/heartbeat.lua).
-- nil or '': not checked (a complete's or fail's next claim, for the finished task's owner).
local function claim_refusal(node, now, credential)
  local score = redis.call('ZSCORE', P .. ':nodes', node)
  if not score or tonumber(score) <= now then return E.NODE_NOT_ALIVE end
  local info = redis.call('HMGET', P .. ':node:' .. node, 'state', 'owner')
  if credential and credential ~= '' and info[2] and info[2] ~= credential then return E.NOT_OWNER end
  local st = info[1]
  if st == 'draining' or st == 'left' then return E.NODE_DRAINING end
  return nil
end

-- Hands up to `max` queued tasks of q to `node` (whose claim_refusal is nil) and
-- appends 11 entries per task to `out`: id, token, attempt, payload, max_attempts,
-- timeout_ms, group, priority, created_at, traceparent, tracestate ('' none). Order: priority, then enqueue order;
-- delayed tasks due by Redis time are promoted first; a group at its limit is
-- skipped without blocking the tasks behind it; FIFO within a group (G1, G6).
-- ack_ms > 0: each claimed task must be acknowledged within ack_ms (P:unacked), or
-- orphans/lua/unacked.lua puts it back; 0: no claim lease.
-- res: in a shard other than 0, what the caller reserved in shard 0 for a queue with
-- limits ({k = tasks, names = its limits, at = shard 0's time of the reservation},
-- limit_reserve.lua), else nil. no_more: do not look whether more are ready (more is 0
-- unless 2): a complete's or fail's next claim, whose caller wakes nobody with it.
-- Returns n (tasks claimed), next_due (Redis ms when the earliest delayed task is
-- due, or -1), more (1 when max tasks were taken and the ready set is not empty; 2
-- when the queue's limits are in shard 0 and nothing was reserved: then `out` gets the
-- head of this shard's outbox of limit slots, a count and the entries, for the caller
-- to hand over with its reservation). Emits task.claimed per task.
-- Whether a claim of q would find nothing now, told by two reads: the ready set is
-- empty and no delayed task is due by Redis time (a due one is promoted by a claim).
-- Returns true and the earliest delayed task's time (Redis ms, or -1), or false.
-- What a claim does first, before its other checks, where a caller can do without
-- them for an empty queue (claim.lua's look again; a complete's next claim).
local function nothing_to_claim(q, now)
  if redis.call('ZCARD', qkey(q, 'ready')) > 0 then return false end
  local head = redis.call('ZRANGE', qkey(q, 'delayed'), '0', '0', 'WITHSCORES')
  if #head == 0 then return true, -1 end
  local due = tonumber(head[2])
  if due > now then return true, due end
  return false
end

-- An empty table that is never written: what claim_tasks starts its optional
-- lists with, so a claim that finds nothing builds none (each table costs the
-- allocation and the collector's time).
local NONE = {}
local function claim_tasks(q, node, max, now, out, ack_ms, res, no_more)
  local nows = int(now)
  local next_due = -1
  local delayed = qkey(q, 'delayed')
  local head = redis.call('ZRANGE', delayed, '0', '0', 'WITHSCORES')
  if #head > 0 and tonumber(head[2]) <= now then
    promote_due(q, now, 1000)
    head = redis.call('ZRANGE', delayed, '0', '0', 'WITHSCORES')
  end
  if #head > 0 then next_due = tonumber(head[2]) end
  if redis.call('HGET', qkey(q, 'meta'), 'paused') == '1' then return 0, next_due, 0 end
  -- 0. The queue's limits bind every task of it: at most their least room (G13). In a
  --    shard other than 0 they are held in shard 0: the claim takes at most what the
  --    caller reserved there first (res: {k, names}), and without a reservation
  --    nothing (more = 2: reserve, then claim again).
  local qnames = NONE
  local qlims = redis.call('GET', qkey(q, 'limits'))
  local remote
  if qlims and not limits_here() then
    if not res then
      -- What the caller hands to shard 0 with its reservation: this shard's outbox.
      local handed = redis.call('ZRANGE', P .. ':limit_out', 0, 199)
      out[#out + 1] = #handed
      for i = 1, #handed do out[#out + 1] = handed[i] end
      return 0, next_due, 2
    end
    if res.k < max then max = res.k end
    if max <= 0 then return 0, next_due, 0 end
    qlims, remote = nil, res.names
  elseif qlims then
    max, next_due, qnames = limits_list_room(qlims, max, now, next_due)
    if max <= 0 then return 0, next_due, 0 end
  end
  -- 1. Pick ids in claim order, popping the ready set's head. A group token yields
  --    that group's head (if it has room); members popped after a token go back, and
  --    the set is read again, because the token's new score may come before them.
  local ready = qkey(q, 'ready')
  local picked, from_group, own = {}, NONE, NONE
  local stashed = NONE
  local guard = 0
  while #picked < max and guard < 10000 do
    guard = guard + 1
    local want = max - #picked
    local popped = redis.call('ZPOPMIN', ready, want == 1 and '1' or int(want))
    if #popped == 0 then break end
    local back
    for i = 1, #popped, 2 do
      local m = popped[i]
      if back then
        back[#back + 1] = popped[i + 1]; back[#back + 1] = m
      elseif string.sub(m, 1, 3) == '~g:' then
        local g = string.sub(m, 4)
        local first = redis.call('ZRANGE', gqkey(q, g), '0', '0')
        local ok, lims = #first > 0, nil
        if ok and is_limits_line(g) then
          -- A line of tasks with limits of their own: its head starts when each has
          -- room; else the line waits (its token set aside until this claim ends)
          -- and blocks nothing behind it.
          local due
          lims = redis.call('HGET', tkey(first[1]), 'limits') or ''
          ok, due = own_limits_room(lims, now)
          if not ok then
            if stashed == NONE then stashed = {} end
            stashed[#stashed + 1] = popped[i + 1]; stashed[#stashed + 1] = m
            if due >= 0 and (next_due < 0 or due < next_due) then next_due = due end
          end
        elseif ok then
          ok = group_has_room(g)
        end
        if ok then
          local id = first[1]
          redis.call('ZREM', gqkey(q, g), id)
          if lims then
            for name in string.gmatch(lims, '[^,]+') do
              local ls = limit_settings(name)
              if ls then limit_take(name, ls, now, {id}) end
            end
            if own == NONE then own = {} end
            own[id] = lims
          else
            redis.call('SADD', grunning(g), id)
          end
          picked[#picked + 1] = id
          if from_group == NONE then from_group = {} end
          from_group[id] = g
        end
        if ok and lims then
          rotate_line(q, g)
        elseif ok or not lims then
          refresh_group_token(q, g)
        end
        back = {}
      else
        picked[#picked + 1] = m
      end
    end
    if not back then break end
    if #back > 0 then redis.call('ZADD', ready, unpack(back)) end
  end
  if #stashed > 0 then redis.call('ZADD', ready, unpack(stashed)) end
  if #picked == 0 then return 0, next_due, 0 end
  -- 2. Hand them out. A task started under a reservation in shard 0 records as its
  --    start the time its limits granted it there (shard 0's clock decides G13).
  local started = nows
  if remote and res.at then started = res.at end
  local token = next_tokens(#picked)
  local running, mine, deadlines, unacked = {}, {}, {}, {}
  local ack_by = ack_ms > 0 and int(now + ack_ms)
  local n = 0
  for i = 1, #picked do
    local id = picked[i]
    local t = tkey(id)
    local f = redis.call('HMGET', t, 'payload', 'attempts', 'max_attempts', 'timeout_ms', 'priority', 'created_at',
      'progress', 'parts', 'tp', 'ts', 'p1', 'p2', 'p3', 'p4')
    f[1] = task_payload(t, f[1], f[8], f, 11)
    if f[1] then
      -- A first attempt (most claims) needs no number parsed or formatted.
      local attempt, a = 1, '1'
      if f[2] then
        attempt = tonumber(f[2]) + 1
        a = int(attempt)
      end
      local tok = int(token + i - 1)
      if f[7] and f[7] ~= '0' then
        redis.call('HSET', t, 'state', 'running', 'owner', node, 'token', tok, 'attempts', a,
          'started_at', started, 'a' .. a, node .. '|' .. tok .. '|' .. nows, 'progress', '0')
      else
        redis.call('HSET', t, 'state', 'running', 'owner', node, 'token', tok, 'attempts', a,
          'started_at', started, 'a' .. a, node .. '|' .. tok .. '|' .. nows)
      end
      -- The limits whose slots it holds until it ends (limits_release).
      if remote then
        if remote ~= '' then redis.call('HSET', t, 'held', '=' .. remote) end
      elseif qlims or own[id] then
        local held = qlims or ''
        if own[id] and own[id] ~= '' then held = (held ~= '' and held .. ',' or '') .. own[id] end
        redis.call('HSET', t, 'held', held)
      end
      running[#running + 1] = nows; running[#running + 1] = id
      mine[#mine + 1] = id
      if ack_by then unacked[#unacked + 1] = ack_by; unacked[#unacked + 1] = id end
      local timeout = f[4] or '0'
      if timeout ~= '0' then
        deadlines[#deadlines + 1] = int(now + tonumber(timeout)); deadlines[#deadlines + 1] = id
      end
      local g = from_group[id] or ''
      emit_task('task.claimed', node, '{"attempt":' .. a .. ',"token":' .. tok .. '}', id, q, g)
      n = n + 1
      out[#out + 1] = id; out[#out + 1] = token + i - 1; out[#out + 1] = attempt; out[#out + 1] = f[1]
      out[#out + 1] = f[3] or TASK_DEFAULTS.max_attempts; out[#out + 1] = timeout
      if is_limits_line(g) then out[#out + 1] = '' else out[#out + 1] = g end
      out[#out + 1] = f[5] or TASK_DEFAULTS.priority; out[#out + 1] = f[6] or '0'
      out[#out + 1] = f[9] or ''; out[#out + 1] = f[10] or ''
    elseif from_group[id] then
      -- the task vanished while queued: give its slot back
      limits_release(id, own[id])
      redis.call('SREM', grunning(from_group[id]), id)
      refresh_group_everywhere(from_group[id])
    end
  end
  for i = 1, #qnames do limit_take(qnames[i], limit_settings(qnames[i]), now, mine) end
  zadd_pairs(qkey(q, 'running'), running)
  zadd_pairs(DEADLINES, deadlines)
  zadd_pairs(UNACKED, unacked)
  if #mine > 0 then redis.call('SADD', ntasks(node), unpack(mine)) end
  -- more: the queue holds more ready tasks (or group heads) after these, so the
  -- caller wakes another waiter; checked, not guessed from #picked == max, since
  -- a waiter woken for nothing costs a whole claim call.
  local more = 0
  if not no_more and #picked == max and redis.call('ZCARD', ready) > 0 then more = 1 end
  return n, next_due, more
end

-- complete and fail can also claim the worker's next task (one call per task for a
-- one-at-a-time worker): appends {node, code, next_due, more, task...} to `out`,
-- where node is the owner claimed for and code is n >= 0 or claim_refusal's. max 0:
-- nothing asked, nothing appended. When nothing_to_claim, code is 0 whatever the
-- owner's registration. ack_ms: the claim lease, as in claim_tasks. more
-- is 0 (or 2): the node answers the worker and wakes no other waiter with it, so the
-- ready set's size is not read (a command per call).
local function claim_next(q, node, max, now, out, ack_ms)
  if max <= 0 then return end
  out[#out + 1] = node
  -- An empty queue answers at once, the owner's registration unchecked: nothing is
  -- claimed either way, and a busy worker's next claim finds its queue empty each
  -- time the queue runs dry (then it long-polls, and that claim checks it).
  local idle, due = nothing_to_claim(q, now)
  if idle then
    out[#out + 1] = 0; out[#out + 1] = due; out[#out + 1] = 0
    return
  end
  local refused = claim_refusal(node, now)
  if refused then
    out[#out + 1] = refused; out[#out + 1] = -1; out[#out + 1] = 0
    return
  end
  local at = #out + 1
  out[at] = 0; out[at + 1] = -1; out[at + 2] = 0
  local n, next_due, more = claim_tasks(q, node, max, now, out, ack_ms, nil, true)
  out[at] = n; out[at + 1] = next_due; out[at + 2] = more
end

-- Requeues dead task `id` with a fresh set of attempts (retry.lua, dead_bulk.lua).
-- Returns code, state: 1 'queued', E.WRONG_STATE (not dead) with its state,
-- E.NOT_FOUND, or E.TOO_MANY_QUEUES when its forgotten queue cannot be registered
-- again within max_queues. Emits task.enqueued (data.retry = true).
local function retry_dead(id, actor, max_queues)
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'queue', 'group', 'priority', 'alias')
  if not f[1] then return E.NOT_FOUND, '' end
  if f[1] ~= 'dead' then return E.WRONG_STATE, f[1] end
  local q, g = f[2], f[3] or ''
  if redis.call('SISMEMBER', P .. ':queues', q) == 0 then
    if redis.call('SCARD', P .. ':queues') >= tonumber(max_queues) then return E.TOO_MANY_QUEUES, 'dead' end
    redis.call('SADD', P .. ':queues', q)
  end
  local now = now_ms()
  redis.call('ZREM', qkey(q, 'dead'), id)
  redis.call('ZREM', P .. ':dead', id)
  redis.call('PERSIST', t)
  if f[5] and f[5] ~= '' then
    -- Take the alias back unless a live task got it meanwhile; then this task
    -- goes on without it.
    local akey = P .. ':alias:' .. f[5]
    local holder = redis.call('GET', akey)
    local hstate = holder and holder ~= id and redis.call('HGET', tkey(holder), 'state')
    if hstate == 'queued' or hstate == 'delayed' or hstate == 'running' then
      redis.call('HDEL', t, 'alias')
    else
      redis.call('SET', akey, id)
    end
  end
  redis.call('HSET', t, 'attempts', '0', 'cancel_requested', '0', 'error', '')
  redis.call('HDEL', t, 'finished_at')
  make_queued(id, q, g, order_score(tonumber(f[4] or TASK_DEFAULTS.priority), next_seqs(1)), int(now))
  emit('task.enqueued', actor, {state = 'queued', retry = true}, 'task', id, 'queue', q)
  return 1, 'queued'
end

-- Discards finished task `id` (succeeded, cancelled or dead) now (delete.lua,
-- dead_bulk.lua). Returns code, state: 1 and the state it had, E.WRONG_STATE
-- (not finished) with its state, or E.NOT_FOUND. Emits task.deleted.
local function discard_finished(id, actor)
  local t = tkey(id)
  local f = redis.call('HMGET', t, 'state', 'queue', 'alias')
  if not f[1] then return E.NOT_FOUND, '' end
  local state, q = f[1], f[2]
  if state ~= 'succeeded' and state ~= 'cancelled' and state ~= 'dead' then return E.WRONG_STATE, state end
  redis.call('ZREM', qkey(q, state), id)
  redis.call('ZREM', P .. ':dead', id)
  if f[3] and f[3] ~= '' and redis.call('GET', P .. ':alias:' .. f[3]) == id then
    redis.call('DEL', P .. ':alias:' .. f[3])
  end
  redis.call('DEL', t)
  emit('task.deleted', actor, {state = state}, 'task', id, 'queue', q)
  return 1, state
end
