//! The Lua scripts a [`RedisStore`](super::RedisStore) runs: one per store
//! operation, so each is atomic on the server (no read-then-write race
//! between replicas), and each that needs a clock reads the server's
//! (`TIME`), never a replica's. Plain text: uses nothing of the crate.
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
//! Only a record in progress is read for `lease`, `locked`, `stale`, `ttl`
//! and `epoch`: a completed one keeps its last owner's (completing deletes
//! nothing), and a claim that takes a record over deletes it first.
//! Redis deletes a completed record at its expiry by itself. A record in
//! progress never expires in Redis: its owner may only be cut off. The
//! store's index (a sorted set: each in-progress record by when to look at
//! it again, its expiry at first) lets the sweep find the expired ones and
//! take the takeover's two steps: mark one seen stale, delete it a time to
//! live after the mark if no heartbeat came since. `KEYS[2]` of the claim
//! is the store's epoch high-water mark, `KEYS[3]` (and `KEYS[2]` of the
//! others) the index.

/// Shared by the scripts that read the clock: the server's time in
/// milliseconds (`now`), its `TIME` reply kept in `t` for the claim's epoch
/// in microseconds. Lua reads the reply's strings as numbers; the claim
/// writes numbers back as `string.format('%d', …)`, integer formatting,
/// where handing Redis a Lua number formats it as a float (`%.17g`), a
/// tenth of the claim's instructions.
const NOW: &str = "
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
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
local lock = tonumber(ARGV[3])
local rec = redis.call('HMGET', KEYS[1], 'st', 'fp', 'exp', 'code', 'headers', 'body',
  'locked', 'stale')
local function claimed()
  local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
  local epoch = string.format('%d', math.max(t[1] * 1000000 + t[2], mark + 1))
  redis.call('SET', KEYS[2], epoch)
  -- A record taken over keeps nothing of its last owner's; a new key has
  -- nothing to delete.
  if rec[1] then redis.call('DEL', KEYS[1]) end
  local exp = string.format('%d', now + ARGV[4])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'st', 'p', 'lease', ARGV[2], 'locked',
    string.format('%d', now), 'stale', '0', 'exp', exp, 'ttl', ARGV[4], 'epoch', epoch)
  redis.call('ZADD', KEYS[3], exp, KEYS[1])
  return {{'claimed', epoch}}
end
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
///
/// No clock: Redis deletes the record at the expiry its claim or last
/// heartbeat set (at once if that has passed: no claim or lookup tells that
/// from a record kept past it). The last owner's fields (`lease`, `locked`, `stale`,
/// `ttl`, `epoch`) stay: every script reads them only in progress.
pub(super) const COMPLETE: &str = "
local rec = redis.call('HMGET', KEYS[1], 'st', 'lease', 'exp')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'st', 'c', 'code', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('PEXPIREAT', KEYS[1], rec[3])
return 1
";

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
