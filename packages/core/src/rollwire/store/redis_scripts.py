"""The Lua scripts of the Redis store: each write is one script, so its checks and its effects are
one atomic step on the server (the terminal-session check runs inside the commit).

Every script that can race with an append first checks the session's *stale flag*: when an append
finds that another writer (another gateway) moved the session on, it sets the flag to the id of
its pipeline and fails ``stale``; every later write of that session in the same pipeline then fails
``stale`` too, so the writer can re-send them, in order, once it has re-read the session.
"""

from __future__ import annotations

__all__ = ["APPEND", "COMPLETE", "CREATE", "DELETE", "TERMINAL_LUA"]

TERMINAL_LUA = (
    "local TERMINAL = {completed=true, failed=true, timeout=true, cancelled=true}\n"
    "local TAB = '\\t'\n"
)

# KEYS: session, all-index, group-index, status-index, creation counter
# ARGV: data, status, has_group, group, created_at, incarnation, num_calls, num_tokens, sid
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = redis.call('INCR', KEYS[5])
local member = string.format('%016d', n) .. ARGV[9]
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'status', ARGV[2], 'inc', ARGV[6], 'seq', '0',
  'num_calls', ARGV[7], 'num_tokens', ARGV[8], 'member', member)
redis.call('ZADD', KEYS[2], ARGV[5], member)
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'group', ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[5], member)
end
redis.call('ZADD', KEYS[4], ARGV[5], member)
return 1
"""

# KEYS: session, calls, request keys, overrides, stale flag, tool blob (or the session key)
# ARGV: 1 batch, 2 incarnation, 3 expected index, 4 value, 5 completion tokens, 6 request key
#       ('' none), 7 retry count, 8 retry_of ('' none), 9 ok '1'/'0', 10 call id, 11 tools ('' none)
# Returns {'ok', superseded earlier call, retry_of, superseded by} | {'closed', status} |
#         {'missing'} | {'stale'}
APPEND = """
local h = redis.call('HMGET', KEYS[1], 'status', 'inc', 'seq')
if not h[1] then return {'missing'} end
if redis.call('GET', KEYS[5]) == ARGV[1] then return {'stale'} end
if TERMINAL[h[1]] then return {'closed', h[1]} end
if h[2] ~= ARGV[2] or h[3] ~= ARGV[3] then
  redis.call('SET', KEYS[5], ARGV[1], 'PX', 60000)
  return {'stale'}
end
if ARGV[11] ~= '' then redis.call('SET', KEYS[6], ARGV[11], 'NX') end
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], 'seq', tostring(tonumber(ARGV[3]) + 1))
redis.call('HINCRBY', KEYS[1], 'num_calls', 1)
redis.call('HINCRBY', KEYS[1], 'num_tokens', tonumber(ARGV[5]))
local rc = tonumber(ARGV[7])
local retry_of, earlier, by = ARGV[8], '', ''
if ARGV[6] ~= '' then
  local prev = redis.call('HGET', KEYS[3], ARGV[6])
  local p_id, p_rc, p_ok, p_matched
  if prev then
    p_id, p_rc, p_ok, p_matched = string.match(prev, '^([^\\t]*)\\t(%d+)\\t(%d)\\t(%d)$')
  end
  if rc > 0 then
    if retry_of == '' and p_id then
      retry_of = p_id
      redis.call('HSET', KEYS[4], ARGV[10] .. TAB .. 'of', retry_of)
    end
  elseif p_id and tonumber(p_rc) > 0 and p_matched == '0' and p_ok == '1' then
    -- The retry landed first (this original was still running): this copy is the spare one.
    by = p_id
    redis.call('HSET', KEYS[4], ARGV[10] .. TAB .. 'sup', by)
  end
  local matched = '0'
  if rc > 0 and retry_of ~= '' then matched = '1' end
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[10] .. TAB .. rc .. TAB .. ARGV[9] .. TAB .. matched)
end
if rc > 0 and retry_of ~= '' and ARGV[9] == '1' then
  earlier = retry_of
  redis.call('HSET', KEYS[4], earlier .. TAB .. 'sup', ARGV[10])
end
return {'ok', earlier, retry_of, by}
"""

# KEYS: session, stale flag, all-index
# ARGV: 1 batch, 2 status, 3 reward JSON, 4 metrics JSON, 5 error JSON, 6 completed_at, 7 prefix
# Returns {'ok' | 'terminal', HGETALL} | {'missing'} | {'stale'}
COMPLETE = """
local h = redis.call('HMGET', KEYS[1], 'status', 'member')
if not h[1] then return {'missing'} end
if redis.call('GET', KEYS[2]) == ARGV[1] then return {'stale'} end
if TERMINAL[h[1]] then return {'terminal', redis.call('HGETALL', KEYS[1])} end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'reward', ARGV[3], 'metrics', ARGV[4],
  'error', ARGV[5], 'completed_at', ARGV[6])
local score = redis.call('ZSCORE', KEYS[3], h[2])
redis.call('ZREM', ARGV[7] .. 'idx:st:' .. h[1], h[2])
if score then redis.call('ZADD', ARGV[7] .. 'idx:st:' .. ARGV[2], score, h[2]) end
return {'ok', redis.call('HGETALL', KEYS[1])}
"""

# KEYS: session, calls, request keys, overrides, stale flag, all-index
# ARGV: 1 batch, 2 prefix
DELETE = """
if redis.call('GET', KEYS[5]) == ARGV[1] then return 'stale' end
local h = redis.call('HMGET', KEYS[1], 'status', 'member', 'group')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
if not h[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[6], h[2])
redis.call('ZREM', ARGV[2] .. 'idx:st:' .. h[1], h[2])
if h[3] then redis.call('ZREM', ARGV[2] .. 'idx:g:' .. h[3], h[2]) end
return 1
"""
