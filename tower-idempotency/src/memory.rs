//! [`MemoryStore`]: an in-process store for a single server and for tests.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hashbrown::HashTable;

use crate::store::{
    check_ids, ClaimOutcome, ClaimRequest, Clock, Fingerprint, IdempotencyStore, LeaseToken,
    StoreError, StoredResponse, SystemClock,
};

/// Default bound on the number of records a [`MemoryStore`] holds.
pub const DEFAULT_MEMORY_MAX_KEYS: usize = 100_000;

/// Default interval between two sweeps of expired records.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Far enough in the future to mean "never" for a record's expiry.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A record's identity: `scope` and `key` in one string (the record keeps
/// the scope's length beside it, so that no two pairs coincide). Shared
/// (not copied) by the table and the eviction order.
type MapKey = Arc<str>;

/// The keyed hash of `(scope, key)`, over the pieces themselves: a lookup
/// copies neither into a buffer first.
fn hash_of(hasher: &RandomState, scope: &str, key: &str) -> u64 {
    let mut state = hasher.build_hasher();
    state.write_usize(scope.len());
    state.write(scope.as_bytes());
    state.write(key.as_bytes());
    state.finish()
}

#[derive(Debug)]
enum State {
    InProgress {
        lease: LeaseToken,
        locked_at: SystemTime,
    },
    /// Completed; `seq` is the record's place in the eviction order.
    Completed { response: StoredResponse, seq: u64 },
}

#[derive(Debug)]
struct Record {
    /// The keyed hash of `id`, computed once: growing the table rehashes
    /// no string.
    hash: u64,
    /// Its identity, shared with the eviction order.
    id: MapKey,
    /// Where the scope ends in `id`.
    scope_len: usize,
    fingerprint: Fingerprint,
    expires_at: SystemTime,
    state: State,
}

impl Record {
    /// Whether this is the record of `(scope, key)`.
    fn is(&self, scope: &str, key: &str) -> bool {
        self.scope_len == scope.len()
            && self
                .id
                .split_at_checked(scope.len())
                .is_some_and(|(s, k)| s == scope && k == key)
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The records, found by the keyed hash of their identity.
    records: HashTable<Record>,
    /// Per store, random: keys chosen by clients cannot be made to collide.
    hasher: RandomState,
    /// Completed records (hash and identity), oldest completion first
    /// (entries may be stale: checked against the record's `seq` before use).
    completed: BTreeMap<u64, (u64, MapKey)>,
    next_seq: u64,
    next_sweep: Option<SystemTime>,
    /// Number of leases handed out: each lease is this store's nonce and a
    /// number never handed out before.
    leases: u64,
    /// Reused buffer for a new record's identity.
    joined: String,
}

impl Inner {
    fn sweep(&mut self, now: SystemTime) -> u64 {
        let before = self.records.len();
        self.records.retain(|record| record.expires_at > now);
        let records = &self.records;
        self.completed.retain(|seq, (hash, id)| {
            matches!(
                records.find(*hash, |r| Arc::ptr_eq(&r.id, id)),
                Some(Record { state: State::Completed { seq: s, .. }, .. }) if s == seq
            )
        });
        (before - self.records.len()) as u64
    }

    /// A lease never handed out by this store before.
    fn new_lease(&mut self, nonce: u64) -> LeaseToken {
        self.leases += 1;
        LeaseToken(uuid::Uuid::from_u64_pair(nonce, self.leases))
    }

    /// The hash of `(scope, key)` and its record.
    fn find_mut(&mut self, scope: &str, key: &str) -> (u64, Option<&mut Record>) {
        let hash = hash_of(&self.hasher, scope, key);
        (hash, self.records.find_mut(hash, |r| r.is(scope, key)))
    }

    /// The identity of a new record of `(scope, key)`.
    fn new_id(&mut self, scope: &str, key: &str) -> MapKey {
        self.joined.clear();
        self.joined.push_str(scope);
        self.joined.push_str(key);
        Arc::from(self.joined.as_str())
    }

    /// Removes the record of `(scope, key)` if `remove` says so.
    fn remove_if(&mut self, scope: &str, key: &str, remove: impl FnOnce(&Record) -> bool) -> bool {
        let hash = hash_of(&self.hasher, scope, key);
        match self.records.find_entry(hash, |r| r.is(scope, key)) {
            Ok(entry) if remove(entry.get()) => {
                entry.remove();
                true
            }
            _ => false,
        }
    }

    /// Removes the oldest completed record; `false` if there is none.
    fn evict_oldest_completed(&mut self) -> bool {
        while let Some((seq, (hash, id))) = self.completed.pop_first() {
            if let Ok(entry) = self.records.find_entry(hash, |r| Arc::ptr_eq(&r.id, &id)) {
                if matches!(entry.get().state, State::Completed { seq: s, .. } if s == seq) {
                    entry.remove();
                    return true;
                }
            }
        }
        false
    }
}

/// An idempotency store kept in a `Mutex` over a hash table inside the process.
///
/// Suitable for a single server instance and for tests; records are lost on
/// restart and are not shared between processes. Use
/// [`with_clock`](Self::with_clock) with a [`ManualClock`](crate::ManualClock)
/// to test expiry and lock timeouts without sleeping.
///
/// Bounded: at most [`max_keys`](Self::max_keys) records (default 100 000).
/// When a new key would exceed the bound, the oldest completed record goes
/// (expired in-progress ones when there is none); in-progress claims are
/// never evicted (a claim that
/// finds only in-progress records gets a transient error, answered `503`).
/// Expired records are swept while writing, at most once per
/// [`sweep_every`](Self::sweep_every) (default 60 s), so no background task
/// is needed.
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
    /// Random, per store: its leases differ from any other store's.
    nonce: u64,
    clock: Arc<dyn Clock>,
    max_keys: NonZeroUsize,
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
            nonce: uuid::Uuid::new_v4().as_u64_pair().0,
            clock,
            max_keys: NonZeroUsize::new(DEFAULT_MEMORY_MAX_KEYS).unwrap_or(NonZeroUsize::MIN),
            sweep_every: DEFAULT_SWEEP_EVERY,
        }
    }

    /// Holds at most `max` records (default 100 000).
    pub fn max_keys(mut self, max: NonZeroUsize) -> Self {
        self.max_keys = max;
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

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked while holding it;
        // every critical section below leaves the map consistent, so continue.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sweeps if the last sweep is older than `sweep_every`.
    fn maybe_sweep(&self, inner: &mut Inner, now: SystemTime) {
        if inner.next_sweep.is_none_or(|at| at <= now) {
            inner.sweep(now);
            inner.next_sweep = Some(now.checked_add(self.sweep_every).unwrap_or(now));
        }
    }

    /// Makes room for one new record, or explains why there is none.
    fn make_room(&self, inner: &mut Inner, now: SystemTime) -> Result<(), StoreError> {
        if inner.records.len() < self.max_keys.get() {
            return Ok(());
        }
        // Evicting is O(log n); a sweep is O(n), so it runs here only when
        // every record is in progress (some of them may have expired).
        if inner.evict_oldest_completed() || inner.sweep(now) > 0 {
            return Ok(());
        }
        Err(StoreError::msg(format!(
            "the memory store is full: {} keys are in progress",
            inner.records.len()
        ))
        .transient())
    }

    /// Completes the claim held with `lease` with the response `response`
    /// makes (called only then: a lease no longer ours copies nothing).
    fn keep_response(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: impl FnOnce() -> StoredResponse,
    ) -> bool {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        match inner.find_mut(scope, key) {
            (hash, Some(record)) if matches!(record.state, State::InProgress { lease: l, .. } if l == lease) =>
            {
                record.state = State::Completed {
                    response: response(),
                    seq,
                };
                let id = record.id.clone();
                inner.next_seq += 1;
                inner.completed.insert(seq, (hash, id));
                true
            }
            _ => false,
        }
    }
}

fn later(now: SystemTime, by: Duration) -> SystemTime {
    now.checked_add(by.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        check_ids(req.scope, req.key)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        self.maybe_sweep(&mut inner, now);
        let lease = inner.new_lease(self.nonce);
        let fresh = |hash, id, lease| Record {
            hash,
            id,
            scope_len: req.scope.len(),
            fingerprint: req.fingerprint,
            expires_at: later(now, req.ttl),
            state: State::InProgress {
                lease,
                locked_at: now,
            },
        };
        let (hash, found) = inner.find_mut(req.scope, req.key);
        let Some(record) = found else {
            self.make_room(&mut inner, now)?;
            let id = inner.new_id(req.scope, req.key);
            inner
                .records
                .insert_unique(hash, fresh(hash, id, lease), |r| r.hash);
            return Ok(ClaimOutcome::Claimed(lease));
        };
        if record.expires_at <= now {
            *record = fresh(hash, record.id.clone(), lease);
            return Ok(ClaimOutcome::Claimed(lease));
        }
        let fingerprint_matches = record.fingerprint == req.fingerprint;
        match &record.state {
            State::Completed { response, .. } => Ok(ClaimOutcome::Completed {
                response: response.clone(),
                fingerprint_matches,
            }),
            State::InProgress { locked_at, .. }
                if fingerprint_matches && later(*locked_at, req.lock_timeout) <= now =>
            {
                *record = fresh(hash, record.id.clone(), lease);
                Ok(ClaimOutcome::Claimed(lease))
            }
            State::InProgress { .. } => Ok(ClaimOutcome::InProgress {
                fingerprint_matches,
            }),
        }
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        Ok(self.keep_response(scope, key, lease, || response.clone()))
    }

    async fn complete_owned(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: StoredResponse,
    ) -> Result<bool, StoreError> {
        Ok(self.keep_response(scope, key, lease, || response))
    }

    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut inner = self.lock();
        match inner.find_mut(scope, key).1 {
            Some(Record {
                state:
                    State::InProgress {
                        lease: l,
                        locked_at,
                    },
                ..
            }) if *l == lease => {
                *locked_at = now;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        let released = self.lock().remove_if(
            scope,
            key,
            |record| matches!(record.state, State::InProgress { lease: l, .. } if l == lease),
        );
        Ok(released)
    }

    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        let now = self.clock.now();
        Ok(self.lock().sweep(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(scope: &'a str, key: &'a str) -> ClaimRequest<'a> {
        ClaimRequest {
            scope,
            key,
            fingerprint: Fingerprint([0; 32]),
            lock_timeout: Duration::from_secs(5),
            ttl: Duration::from_secs(60),
        }
    }

    /// Moving characters between scope and key never yields the same
    /// record, even when the two concatenate to the same text.
    #[tokio::test]
    async fn pairs_that_concatenate_alike_are_different_records() {
        let store = MemoryStore::new();
        let long = "x".repeat(300);
        let pairs = [
            ("ab", "c"),
            ("a", "bc"),
            ("", "abc"),
            ("abc", ""),
            ("1:a", "b"),
            ("1", ":ab"),
            (long.as_str(), ""),
            ("x", &long[1..]),
        ];
        for (scope, key) in pairs {
            let claimed = store.claim(request(scope, key)).await.unwrap();
            assert!(
                matches!(claimed, ClaimOutcome::Claimed(_)),
                "{scope:?}/{key:?} found another pair's record: {claimed:?}"
            );
        }
        assert_eq!(store.len(), pairs.len());
        // The same pair is the same record.
        let again = store.claim(request("a", "bc")).await.unwrap();
        assert!(
            matches!(again, ClaimOutcome::InProgress { .. }),
            "{again:?}"
        );
    }

    /// Leases are never handed out twice by a store, and two stores hand
    /// out different ones.
    #[tokio::test]
    async fn leases_are_unique() {
        let claim = |store: &MemoryStore, key: &'static str| {
            let store = store.clone();
            async move {
                match store.claim(request("s", key)).await.unwrap() {
                    ClaimOutcome::Claimed(lease) => lease,
                    other => panic!("{other:?}"),
                }
            }
        };
        let (a, b) = (MemoryStore::new(), MemoryStore::new());
        let leases = [
            claim(&a, "1").await,
            claim(&a, "2").await,
            claim(&b, "1").await,
        ];
        assert_ne!(leases[0], leases[1]);
        assert_ne!(leases[0], leases[2]);
        assert_ne!(leases[1], leases[2]);
    }
}
