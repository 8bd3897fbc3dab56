-- decide_due.lua: decides the rounds whose deadline passed with nobody calling. Every
-- node runs it every barriers.interval_ms; the decision itself is decide() in
-- lib.lua, set at most once per round, so several nodes running it is harmless.
--
--@include barriers/lib
--
-- KEYS[1]  P:barriers:deadlines     "<b>/<r>" -> deadline (Redis ms)
-- (computed by lib.lua per barrier b: P:barrier:<b>:r:<r>, :rounds, :open, :decided)
-- ARGV[1]  acting muster node id (events)
-- ARGV[2]  retention_ms             how long a decided round is kept
-- ARGV[3]  limit                    most rounds looked at per call
-- ARGV[4]  rounds_kept              decided rounds kept per barrier
--
-- Returns {released, aborted, more}: rounds decided by this call, and 1 when the
-- limit was reached (call again).
-- Emits barrier.released | barrier.aborted per round decided.
local me, retention, limit, kept = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, limit)
local released, aborted = 0, 0
for _, m in ipairs(due) do
  local slash = string.find(m, '/', 1, true)
  if slash then
    local b, r = string.sub(m, 1, slash - 1), string.sub(m, slash + 1)
    local rk = round_key(b, r)
    if redis.call('EXISTS', rk) == 0 then
      -- Expired undecided (no node ran for its whole retention): forget its entries.
      redis.call('ZREM', open_key(b), r)
      redis.call('ZREM', rounds_key(b), r)
    elseif redis.call('HEXISTS', rk, 'verdict') == 0 then
      local v = decide_at_deadline(rk, b, r, now, me, retention, kept)
      if v == 'released' then released = released + 1 elseif v == 'aborted' then aborted = aborted + 1 end
    end
  end
  redis.call('ZREM', KEYS[1], m)
end
local more = 0
if #due == limit then more = 1 end
return {released, aborted, more}
