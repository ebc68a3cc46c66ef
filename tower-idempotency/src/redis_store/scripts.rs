//! The Lua scripts a [`RedisStore`](super::RedisStore) runs: one per store
//! operation, so each is atomic on the server (no read-then-write race
//! between replicas), and each reads the server's clock (`TIME`), never a
//! replica's. Plain text: uses nothing of the crate.
//!
//! A record is a hash at `KEYS[1]`:
//!
//! | field | meaning |
//! |---|---|
//! | `fp` | the request's fingerprint (32 bytes) |
//! | `st` | `p` in progress, `c` completed |
//! | `lease` | the owner's lease token (in progress) |
//! | `locked` | when the lease was last taken or extended (ms) |
//! | `stale` | when a claim first found the lease stale since (ms, 0: never) |
//! | `exp` | when the record expires (ms) |
//! | `ttl` | the record's time to live (ms) |
//! | `epoch` | the fencing epoch of its last claim |
//! | `code`, `headers`, `body` | the stored response (completed) |
//!
//! Redis deletes a completed record at its expiry by itself. A record in
//! progress never expires in Redis: its owner may only be cut off. The
//! store's index (a sorted set: each in-progress record by when to look at
//! it again, its expiry at first) lets the sweep find the expired ones and
//! take the takeover's two steps: mark one seen stale, delete it a time to
//! live after the mark if no heartbeat came since. `KEYS[2]` of the claim
//! is the store's epoch high-water mark, `KEYS[3]` (and `KEYS[2]` of the
//! others) the index.

/// Shared by every script: the server's time in milliseconds and in
/// microseconds.
const NOW: &str = "
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
";

/// The state of a live record as a claim that does not win sees it, or
/// `false` if there is none (`rec`: HMGET of st, fp, exp, code, headers,
/// body; `fp`: the claimer's fingerprint).
const OUTCOME: &str = "
local function outcome(rec, fp, now)
  if not rec[1] then return false end
  local matches = 0
  if rec[2] == fp then matches = 1 end
  if rec[1] == 'c' then
    if tonumber(rec[3]) <= now then return false end
    return {'completed', matches, rec[4], rec[5], rec[6]}
  end
  return {'in_progress', matches}
end
";

/// `KEYS[1]` the record, `KEYS[2]` the epoch mark, `KEYS[3]` the index;
/// `ARGV`: fingerprint,
/// lease, lock timeout (ms), time to live (ms). Returns `{'claimed',
/// epoch}` or the record's state.
pub(super) fn claim() -> String {
    format!(
        "{NOW}{OUTCOME}
local lock, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local function claimed()
  local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
  local epoch = math.max(now_us, mark + 1)
  local text = string.format('%.0f', epoch)
  redis.call('SET', KEYS[2], text)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'st', 'p', 'lease', ARGV[2], 'locked', now,
    'stale', 0, 'exp', now + ttl, 'ttl', ttl, 'epoch', text)
  redis.call('ZADD', KEYS[3], now + ttl, KEYS[1])
  return {{'claimed', text}}
end
local rec = redis.call('HMGET', KEYS[1], 'st', 'fp', 'exp', 'code', 'headers', 'body',
  'locked', 'stale')
if not rec[1] then return claimed() end
if rec[1] == 'c' then
  return outcome(rec, ARGV[1], now) or claimed()
end
-- In progress, expired or not: its owner may only be cut off from the
-- store. A stale lease, whatever its fingerprint, is marked first, and
-- taken over a lock timeout after the mark if no heartbeat came since.
local locked, stale = tonumber(rec[7]), tonumber(rec[8])
if locked + lock <= now then
  if stale > locked then
    if stale + lock <= now then return claimed() end
  else
    redis.call('HSET', KEYS[1], 'stale', now)
  end
end
return outcome(rec, ARGV[1], now)
"
    )
}

/// `KEYS[1]` the record; `ARGV[1]` the fingerprint. The record's state,
/// or `false`.
pub(super) fn lookup() -> String {
    format!(
        "{NOW}{OUTCOME}
local rec = redis.call('HMGET', KEYS[1], 'st', 'fp', 'exp', 'code', 'headers', 'body')
return outcome(rec, ARGV[1], now)
"
    )
}

/// `KEYS[1]` the record, `KEYS[2]` the index; `ARGV`: lease, status code,
/// headers (JSON), body. 1 if stored, 0 if the lease is not current.
pub(super) fn complete() -> String {
    format!(
        "{NOW}
local rec = redis.call('HMGET', KEYS[1], 'st', 'lease', 'exp')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', 'c', 'code', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'lease', 'locked', 'stale')
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('PEXPIREAT', KEYS[1], math.max(tonumber(rec[3]), now + 1))
return 1
"
    )
}

/// `KEYS[1]` the record; `ARGV[1]` the lease. 1 if extended, 0 if the
/// lease is not current. The index keeps the record's old expiry: the
/// sweep finds it not expired then and looks again at the new one.
pub(super) fn extend() -> String {
    format!(
        "{NOW}
local rec = redis.call('HMGET', KEYS[1], 'st', 'lease', 'exp', 'ttl')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then return 0 end
local exp = math.max(tonumber(rec[3]), now + tonumber(rec[4]))
redis.call('HSET', KEYS[1], 'locked', now, 'exp', exp)
return 1
"
    )
}

/// `KEYS[1]` the record, `KEYS[2]` the index; `ARGV[1]` the lease. 1 if
/// deleted, 0 if the lease is not current.
pub(super) const RELEASE: &str = "
local rec = redis.call('HMGET', KEYS[1], 'st', 'lease')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
";

/// `KEYS[1]` the index; `ARGV[1]` the batch size. Looks at the records
/// due (expired in progress, or a marked one's time to live after its
/// mark): marks one not yet seen stale since its last heartbeat, deletes
/// one marked a time to live ago. The number deleted.
pub(super) fn sweep() -> String {
    format!(
        "{NOW}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local deleted = 0
for _, k in ipairs(due) do
  local rec = redis.call('HMGET', k, 'st', 'locked', 'stale', 'ttl', 'exp')
  if rec[1] ~= 'p' then
    redis.call('ZREM', KEYS[1], k)
  elseif tonumber(rec[5]) > now then
    redis.call('ZADD', KEYS[1], rec[5], k)
  else
    local locked, stale, ttl = tonumber(rec[2]), tonumber(rec[3]), tonumber(rec[4])
    if stale <= locked then
      redis.call('HSET', k, 'stale', now)
      redis.call('ZADD', KEYS[1], now + ttl, k)
    elseif stale + ttl <= now then
      redis.call('DEL', k)
      redis.call('ZREM', KEYS[1], k)
      deleted = deleted + 1
    else
      redis.call('ZADD', KEYS[1], stale + ttl, k)
    end
  end
end
return {{deleted, #due}}
"
    )
}
