//! [`MemoryStore`]: an in-process store for a single server and for tests.

use std::collections::{BTreeMap, HashMap};
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
/// its scope beside it, so that no two pairs coincide). Shared (not
/// copied) by the table and the eviction order.
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
        /// When a claim first found this lease stale (and no extension came
        /// since): a takeover waits a lock timeout after it.
        stale_seen: Option<SystemTime>,
        /// The record's time to live, renewed by each extension.
        ttl: Duration,
    },
    /// Completed; `seq` is the record's place in its scope's eviction order.
    Completed { response: StoredResponse, seq: u64 },
}

#[derive(Debug)]
struct Record {
    /// The keyed hash of `id`, computed once: growing the table rehashes
    /// no string.
    hash: u64,
    /// Its identity, shared with the eviction order.
    id: MapKey,
    /// Its scope, shared with the scope's accounting.
    scope: Arc<str>,
    fingerprint: Fingerprint,
    expires_at: SystemTime,
    state: State,
}

impl Record {
    /// Whether this is the record of `(scope, key)`.
    fn is(&self, scope: &str, key: &str) -> bool {
        self.scope.len() == scope.len()
            && self
                .id
                .split_at_checked(scope.len())
                .is_some_and(|(s, k)| s == scope && k == key)
    }
}

/// What one scope (one caller) holds.
#[derive(Debug)]
struct ScopeRecords {
    /// The scope, shared with its records.
    scope: Arc<str>,
    /// Its records, in progress or completed.
    count: usize,
    /// Its completed records (hash and identity), oldest completion first
    /// (entries may be stale: checked against the record's `seq` before
    /// use).
    completed: BTreeMap<u64, (u64, MapKey)>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The records, found by the keyed hash of their identity.
    records: HashTable<Record>,
    /// Per store, random: keys chosen by clients cannot be made to collide.
    hasher: RandomState,
    /// Every scope that holds a record.
    scopes: HashMap<Arc<str>, ScopeRecords>,
    next_seq: u64,
    next_sweep: Option<SystemTime>,
    /// The last sweep made to find room in a full store.
    last_full_sweep: Option<SystemTime>,
    /// Number of leases handed out: each lease is this store's nonce and a
    /// number never handed out before.
    leases: u64,
    /// Completed records evicted before their expiry.
    evicted: u64,
    /// Reused buffer for a new record's identity.
    joined: String,
}

impl Inner {
    fn sweep(&mut self, now: SystemTime) -> u64 {
        let before = self.records.len();
        let Inner {
            records, scopes, ..
        } = self;
        records.retain(|record| {
            let live = record.expires_at > now;
            if !live {
                if let Some(s) = scopes.get_mut(&*record.scope) {
                    s.count = s.count.saturating_sub(1);
                }
            }
            live
        });
        scopes.retain(|_, s| {
            s.completed.retain(|seq, (hash, id)| {
                matches!(
                    records.find(*hash, |r| Arc::ptr_eq(&r.id, id)),
                    Some(Record { state: State::Completed { seq: s, .. }, .. }) if s == seq
                )
            });
            s.count > 0
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

    /// The identity of a new record of `(scope, key)`, and its scope
    /// (counted as holding one more record).
    fn new_id(&mut self, scope: &str, key: &str) -> (MapKey, Arc<str>) {
        self.joined.clear();
        self.joined.push_str(scope);
        self.joined.push_str(key);
        // One lookup when the scope holds records already (the common case).
        let scope = match self.scopes.get_mut(scope) {
            Some(records) => {
                records.count += 1;
                records.scope.clone()
            }
            None => {
                let shared: Arc<str> = Arc::from(scope);
                self.scopes.insert(
                    shared.clone(),
                    ScopeRecords {
                        scope: shared.clone(),
                        count: 1,
                        completed: BTreeMap::new(),
                    },
                );
                shared
            }
        };
        (Arc::from(self.joined.as_str()), scope)
    }

    /// Counts a removed record out of its scope.
    fn forget(&mut self, record: &Record) {
        if let Some(s) = self.scopes.get_mut(&*record.scope) {
            s.count = s.count.saturating_sub(1);
            if s.count == 0 {
                self.scopes.remove(&*record.scope);
            }
        }
    }

    /// Removes the record of `(scope, key)` if `remove` says so.
    fn remove_if(&mut self, scope: &str, key: &str, remove: impl FnOnce(&Record) -> bool) -> bool {
        let hash = hash_of(&self.hasher, scope, key);
        match self.records.find_entry(hash, |r| r.is(scope, key)) {
            Ok(entry) if remove(entry.get()) => {
                let (record, _) = entry.remove();
                self.forget(&record);
                true
            }
            _ => false,
        }
    }

    /// Removes the oldest completed record of `scope`; `false` if it has
    /// none. Only completed records: an in-progress one is never evicted.
    fn evict_oldest_completed(&mut self, scope: &str) -> bool {
        loop {
            let Some((seq, (hash, id))) = self
                .scopes
                .get_mut(scope)
                .and_then(|s| s.completed.pop_first())
            else {
                return false;
            };
            if let Ok(entry) = self.records.find_entry(hash, |r| Arc::ptr_eq(&r.id, &id)) {
                if matches!(entry.get().state, State::Completed { seq: s, .. } if s == seq) {
                    let (record, _) = entry.remove();
                    self.forget(&record);
                    self.evicted += 1;
                    tracing::warn!(
                        scope = &*record.scope,
                        "memory store full: a completed idempotency key was evicted before its \
                         expiry (a retry of it would run again)"
                    );
                    return true;
                }
            }
        }
    }
}

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
/// second); then **the claiming caller's own** oldest completed record is
/// evicted, never another caller's: one caller flooding the store, or many
/// callers each sending a key, can never make another caller's completed
/// key run again inside its expiry. A caller with nothing of its own to
/// give up gets a transient error (answered `503` + `Retry-After`) until
/// records expire: under a flood a newcomer may be refused, never charged
/// twice. Set `max_keys_per_scope` (a quarter of `max_keys`, say) when
/// callers are not trusted, so that one of them cannot fill the store.
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
    fn make_room(&self, inner: &mut Inner, scope: &str, now: SystemTime) -> Result<(), StoreError> {
        let own = |inner: &Inner| inner.scopes.get(scope).map_or(0, |s| s.count);
        let per_scope = self
            .max_keys_per_scope
            .map_or(usize::MAX, NonZeroUsize::get);
        let fits =
            |inner: &Inner| inner.records.len() < self.max_keys.get() && own(inner) < per_scope;
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
        // Then the caller's own oldest completed record: never another's.
        if inner.evict_oldest_completed(scope) {
            return Ok(());
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
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: impl FnOnce() -> StoredResponse,
    ) -> bool {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        let (hash, id, owner) = match inner.find_mut(scope, key) {
            (hash, Some(record)) if matches!(record.state, State::InProgress { lease: l, .. } if l == lease) =>
            {
                record.state = State::Completed {
                    response: response(),
                    seq,
                };
                (hash, record.id.clone(), record.scope.clone())
            }
            _ => return false,
        };
        inner.next_seq += 1;
        if let Some(s) = inner.scopes.get_mut(&*owner) {
            s.completed.insert(seq, (hash, id));
        }
        true
    }
}

/// How often a full store may sweep to find room.
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(1);

fn later(now: SystemTime, by: Duration) -> SystemTime {
    now.checked_add(by.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// What a claim that does not win says of a live record.
fn outcome_of(record: &Record, fingerprint: Fingerprint) -> ClaimOutcome {
    let fingerprint_matches = record.fingerprint == fingerprint;
    match &record.state {
        State::Completed { response, .. } => ClaimOutcome::Completed {
            response: response.clone(),
            fingerprint_matches,
        },
        State::InProgress { .. } => ClaimOutcome::InProgress {
            fingerprint_matches,
        },
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        check_ids(req.scope, req.key)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        self.maybe_sweep(&mut inner, now);
        let lease = inner.new_lease(self.nonce);
        let fresh = |hash, id, scope, lease| Record {
            hash,
            id,
            scope,
            fingerprint: req.fingerprint,
            expires_at: later(now, req.ttl),
            state: State::InProgress {
                lease,
                locked_at: now,
                stale_seen: None,
                ttl: req.ttl,
            },
        };
        let (hash, found) = inner.find_mut(req.scope, req.key);
        let Some(record) = found else {
            self.make_room(&mut inner, req.scope, now)?;
            let (id, scope) = inner.new_id(req.scope, req.key);
            inner
                .records
                .insert_unique(hash, fresh(hash, id, scope, lease), |r| r.hash);
            return Ok(ClaimOutcome::Claimed(lease));
        };
        if record.expires_at <= now {
            *record = fresh(hash, record.id.clone(), record.scope.clone(), lease);
            return Ok(ClaimOutcome::Claimed(lease));
        }
        let fingerprint_matches = record.fingerprint == req.fingerprint;
        if let State::InProgress {
            locked_at,
            stale_seen,
            ..
        } = &mut record.state
        {
            if fingerprint_matches && later(*locked_at, req.lock_timeout) <= now {
                match *stale_seen {
                    // Seen stale a lock timeout ago, and not extended since:
                    // its owner is gone.
                    Some(seen) if seen > *locked_at && later(seen, req.lock_timeout) <= now => {
                        *record = fresh(hash, record.id.clone(), record.scope.clone(), lease);
                        return Ok(ClaimOutcome::Claimed(lease));
                    }
                    Some(seen) if seen > *locked_at => {}
                    // First seen stale: its owner gets a lock timeout to
                    // come back (from an outage of the store, say).
                    _ => *stale_seen = Some(now),
                }
            }
        }
        Ok(outcome_of(record, req.fingerprint))
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let now = self.clock.now();
        let mut inner = self.lock();
        Ok(match inner.find_mut(scope, key).1 {
            Some(record) if record.expires_at > now => Some(outcome_of(record, fingerprint)),
            _ => None,
        })
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
                        ttl,
                        ..
                    },
                expires_at,
                ..
            }) if *l == lease => {
                *locked_at = now;
                // A live handler's record does not expire under it.
                *expires_at = (*expires_at).max(later(now, *ttl));
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
