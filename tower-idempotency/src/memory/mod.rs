//! [`MemoryStore`]: an in-process store for a single server and for tests.
//!
//! May use: `store`.
//!
//! In three files: this one holds the store, its settings and its bounds
//! (making room for a new key, keeping a response); below it, `map.rs`
//! holds the records and the table that finds them; above it, `ops.rs`
//! answers the store trait's calls. They use only the store's types
//! (`crate::store`), nothing else of the crate.

mod map;
mod ops;
mod response;
mod weights;

use std::hash::RandomState;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::store::{Clock, LeaseToken, StoreError, SystemClock};

pub(crate) use self::map::KeyHash;
use self::map::{hash_of, later, Inner, State};
pub(crate) use self::response::KeptResponse;

/// Default bound on the number of records a [`MemoryStore`] holds.
pub const DEFAULT_MEMORY_MAX_KEYS: usize = 100_000;

/// Default interval between two sweeps of expired records.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// An idempotency store kept in a `Mutex` over a hash table inside the process.
///
/// Suitable for a single server instance and for tests; records are lost on
/// restart and are not shared between processes. Use
/// [`with_clock`](Self::with_clock) with a [`ManualClock`](crate::ManualClock)
/// to test expiry and lock timeouts without sleeping.
///
/// Bounded: at most [`max_keys`](Self::max_keys) records (default 100 000),
/// and at most [`max_keys_per_scope`](Self::max_keys_per_scope) of them for
/// one caller (one scope; by default no bound of its own). When a new key
/// would exceed a bound, expired records are swept first (at most once a
/// second). Then, for a caller that has succeeded (a 2xx among its
/// records), room comes from **the heaviest caller**, the one holding the
/// most records, when that one holds more than the claiming caller will;
/// then from the claiming caller's own oldest completed record; then from
/// the oldest answer stored for a caller that never succeeded (a made-up
/// scope, say). Never from a caller that succeeded and holds no more than
/// the claiming one: a caller that keeps within its fair share
/// (`max_keys` / the callers holding records) never loses a completed
/// record inside its expiry, whatever the others send, however many
/// credentials they use; callers that never succeeded cannot lock a new
/// caller out. A caller's first keys, before it has succeeded, take room
/// only from its own records and from such strangers' answers. A caller
/// with nothing to give up (the store full of claims in progress and of
/// answers of callers that succeeded and are no heavier than it) gets a
/// transient error (answered `503` + `Retry-After`) until records expire:
/// refused, never charged twice. Set `max_keys_per_scope` (a quarter of
/// `max_keys`, say) when callers are not trusted, so that one of them
/// cannot fill the store and hold new callers out.
/// In-progress claims are never evicted. Every eviction of a completed
/// record before its expiry is logged at `warn` and counted
/// ([`evictions`](Self::evictions)): a retry of that key would run its
/// handler again, so size `max_keys` above the keys a caller sends within
/// the expiry. Expired records are swept while
/// writing, at most once per [`sweep_every`](Self::sweep_every) (default
/// 60 s), so no background task is needed.
///
/// Leases are numbered, not drawn at random: a lease is the store's random
/// nonce and a counter, so no claim pays for a random number and no two
/// claims of a store (or of two stores) share one.
///
/// ```
/// use std::num::NonZeroUsize;
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// let store = MemoryStore::new().max_keys(NonZeroUsize::new(10_000).unwrap());
/// let layer = IdempotencyLayer::new(store);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    /// Per store, random: keys chosen by clients cannot be made to collide.
    hasher: RandomState,
    /// Random, per store: its leases differ from any other store's.
    nonce: u64,
    clock: Arc<dyn Clock>,
    max_keys: NonZeroUsize,
    /// One caller's bound (`None`: only `max_keys`).
    max_keys_per_scope: Option<NonZeroUsize>,
    sweep_every: Duration,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store using the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store reading the time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner::default())),
            hasher: RandomState::new(),
            nonce: uuid::Uuid::new_v4().as_u64_pair().0,
            clock,
            max_keys: NonZeroUsize::new(DEFAULT_MEMORY_MAX_KEYS).unwrap_or(NonZeroUsize::MIN),
            max_keys_per_scope: None,
            sweep_every: DEFAULT_SWEEP_EVERY,
        }
    }

    /// Holds at most `max` records (default 100 000).
    pub fn max_keys(mut self, max: NonZeroUsize) -> Self {
        self.max_keys = max;
        self
    }

    /// Holds at most `max` records for one caller (one scope); a caller at
    /// its bound makes room by giving up its own oldest completed record,
    /// or is refused. Default: no bound but [`max_keys`](Self::max_keys).
    pub fn max_keys_per_scope(mut self, max: NonZeroUsize) -> Self {
        self.max_keys_per_scope = Some(max);
        self
    }

    /// Sweeps expired records while writing at most once per `every`
    /// (default 60 s; `Duration::ZERO` sweeps on every write).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }

    /// Number of records currently held (including expired, unswept ones).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    /// Number of completed records evicted before their expiry to make
    /// room (each also logged at `warn`): a retry of any of them would run
    /// its handler again. Zero while `max_keys` is large enough.
    pub fn evictions(&self) -> u64 {
        self.lock().evicted
    }

    /// The keyed hashes the store finds `(scope, key)` and its scope by:
    /// computed once per request (the layer hands the claim's to the
    /// completion), and outside the lock.
    pub(crate) fn hash_of(&self, scope: &str, key: &str) -> KeyHash {
        hash_of(&self.hasher, scope, key)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked while holding it;
        // every critical section below leaves the map consistent, so continue.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sweeps if the last sweep is older than `sweep_every`.
    fn maybe_sweep(&self, inner: &mut Inner, now: SystemTime) {
        if inner.next_sweep.is_none_or(|at| at <= now) {
            inner.sweep(now);
            inner.next_sweep = Some(later(now, self.sweep_every));
        }
    }

    /// Makes room for one new record of `scope`, or explains why there is
    /// none.
    fn make_room(
        &self,
        inner: &mut Inner,
        hash: KeyHash,
        scope: &str,
        now: SystemTime,
    ) -> Result<(), StoreError> {
        let own = |inner: &Inner| inner.scope(hash, scope).map_or(0, |s| s.count);
        let per_scope = self
            .max_keys_per_scope
            .map_or(usize::MAX, NonZeroUsize::get);
        // Without a per-scope bound (the default), the scope's count is not
        // looked up: no count reaches `usize::MAX`.
        let fits = |inner: &Inner| {
            inner.records.len() < self.max_keys.get()
                && (per_scope == usize::MAX || own(inner) < per_scope)
        };
        if fits(inner) {
            return Ok(());
        }
        // Expired records first: a sweep is O(n), so at most once a second.
        if inner
            .last_full_sweep
            .is_none_or(|at| later(at, FULL_SWEEP_EVERY) <= now)
        {
            inner.last_full_sweep = Some(now);
            if inner.sweep(now) > 0 && fits(inner) {
                return Ok(());
            }
        }
        // A caller at its own bound gives up its own oldest completed
        // record, or nothing.
        let held = own(inner);
        if held >= per_scope {
            if inner.evict_oldest_completed(hash.scope, scope) {
                return Ok(());
            }
        } else {
            // The store as a whole is full. A caller that succeeded takes
            // room from the heaviest caller when that one holds more than
            // it will; then the caller's own oldest completed record; then
            // the oldest answer stored for a caller that never succeeded.
            // Never the answer of a caller that succeeded and holds no more
            // than the claiming one.
            let succeeded = inner.scope(hash, scope).is_some_and(|s| s.succeeded);
            if succeeded && inner.evict_from_heaviest(hash, scope, held) {
                return Ok(());
            }
            if inner.evict_oldest_completed(hash.scope, scope) || inner.evict_oldest_stranger() {
                return Ok(());
            }
        }
        let why = if own(inner) >= per_scope {
            format!("this caller holds its {per_scope} keys in progress")
        } else {
            format!(
                "the memory store is full ({} keys) and this caller holds no completed key to \
                 make room with",
                inner.records.len()
            )
        };
        tracing::warn!(scope, "memory store refused a new idempotency key: {why}");
        Err(StoreError::msg(why).transient())
    }

    /// Completes the claim held with `lease` with the response `response`
    /// makes (called only then: a lease no longer ours copies nothing).
    fn keep_response(
        &self,
        hash: KeyHash,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: impl FnOnce() -> KeptResponse,
    ) -> bool {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        let (id, owner, success) = match inner.find_mut(hash, scope, key) {
            Some(record) if matches!(record.state, State::InProgress { lease: l, .. } if l == lease) =>
            {
                let response = response();
                let success = (200..300).contains(&response.status());
                record.state = State::Completed { response, seq };
                (record.id.clone(), record.scope.clone(), success)
            }
            _ => return false,
        };
        inner.next_seq += 1;
        let mut stranger = false;
        // The record's owner is `scope` (the record was found by it): its
        // accounting is found by the hash already at hand.
        if let Some(s) = inner.scope_mut(hash.scope, &owner) {
            s.succeeded |= success;
            stranger = !s.succeeded;
            s.push_completed(seq, hash.record, id.clone());
        }
        if stranger {
            inner.strangers.push_back((seq, hash.record, id));
        }
        true
    }
}

/// How often a full store may sweep to find room.
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(1);
