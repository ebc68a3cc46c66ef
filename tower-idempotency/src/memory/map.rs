//! The records of a [`MemoryStore`](super::MemoryStore) and the table
//! that finds them: one record per `(scope, key)`, each scope's count and
//! the order its completed records are evicted in, the sweep of expired
//! records. Knows nothing of the store's bounds or of the store trait's
//! calls; uses only the store's value types.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hashbrown::HashTable;

use crate::store::{ClaimOutcome, Fingerprint, LeaseToken};

use super::weights::{id_of, Weights};
use super::KeptResponse;

/// Far enough in the future to mean "never" for a record's expiry.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A record's identity: `scope` and `key` in one string (the record keeps
/// its scope beside it, so that no two pairs coincide). Shared (not
/// copied) by the table and the eviction order.
type MapKey = Arc<str>;

/// The keyed hashes a request's record is found by, computed once per
/// request (outside the store's lock) and kept with the record: its
/// scope's, which finds the scope's accounting, and its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyHash {
    /// The keyed hash of the scope: finds the scope's accounting.
    pub(super) scope: u64,
    /// The keyed hash of `(scope, key)`: finds the record.
    pub(super) record: u64,
}

/// The keyed hashes of `(scope, key)`, over the pieces themselves: a
/// lookup copies neither into a buffer first. The scope is hashed once;
/// the record's hash is that of the scope's hash and the key, so the
/// scope's bytes are not hashed twice. Both use the store's `hasher`
/// (SipHash with a random key): keys a client chooses cannot be made to
/// collide, in either table.
pub(super) fn hash_of(hasher: &RandomState, scope: &str, key: &str) -> KeyHash {
    let scope = hasher.hash_one(scope);
    KeyHash {
        scope,
        record: record_hash(hasher, scope, key),
    }
}

/// The keyed hash of the record of `key` in the scope whose keyed hash is
/// `scope`: keyed itself, not only through `scope`.
pub(super) fn record_hash(hasher: &RandomState, scope: u64, key: &str) -> u64 {
    let mut state = hasher.build_hasher();
    state.write_u64(scope);
    state.write(key.as_bytes());
    state.finish()
}

#[derive(Debug)]
pub(super) enum State {
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
    Completed { response: KeptResponse, seq: u64 },
}

#[derive(Debug)]
pub(super) struct Record {
    /// The keyed hashes of its scope and of `id`, computed once: growing
    /// either table rehashes no string, and its scope's accounting is found
    /// without hashing the scope again.
    pub(super) hash: KeyHash,
    /// Its identity, shared with the eviction order.
    pub(super) id: MapKey,
    /// Its scope, shared with the scope's accounting.
    pub(super) scope: Arc<str>,
    pub(super) fingerprint: Fingerprint,
    pub(super) expires_at: SystemTime,
    pub(super) state: State,
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
pub(super) struct ScopeRecords {
    /// The keyed hash of `scope` ([`KeyHash`]'s): growing the table
    /// rehashes no string.
    hash: u64,
    /// The scope, shared with its records.
    scope: Arc<str>,
    /// Its records, in progress or completed.
    pub(super) count: usize,
    /// Its completed records (`seq`, hash and identity), oldest completion
    /// first (entries may be stale: checked against the record's `seq`
    /// before use). A queue, not a sorted map: completions are numbered
    /// in the order they happen, under the store's lock, so each is pushed
    /// at the back and the order holds (`ScopeRecords::push_completed`).
    pub(super) completed: VecDeque<(u64, u64, MapKey)>,
    /// Whether one of its records completed with a success (2xx) while it
    /// held records: a caller that did is no stranger, and its stored
    /// answers are never evicted to make room for another caller.
    pub(super) succeeded: bool,
}

impl ScopeRecords {
    /// Notes that its record `(hash, id)` completed with `seq`, the
    /// store's next number: greater than every `seq` queued before, so the
    /// queue stays oldest first.
    pub(super) fn push_completed(&mut self, seq: u64, hash: u64, id: MapKey) {
        debug_assert!(self.completed.back().is_none_or(|&(last, ..)| last < seq));
        self.completed.push_back((seq, hash, id));
    }
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    /// The records, found by the keyed hash of their identity
    /// ([`hash_of`], with the store's hasher).
    pub(super) records: HashTable<Record>,
    /// Every scope that holds a record, found by its keyed hash
    /// ([`KeyHash`]'s scope hash).
    scopes: HashTable<ScopeRecords>,
    /// The same scopes, ordered by the number of records each holds: a
    /// full store takes room from the heaviest. Kept only once the store
    /// has been full since the last sweep (`None` until then): a store
    /// that never fills pays nothing per request for it, and one that does
    /// counts its scopes once per sweep, O(n log n) beside the sweep's O(n).
    weights: Option<Weights>,
    pub(super) next_seq: u64,
    pub(super) next_sweep: Option<SystemTime>,
    /// The last sweep made to find room in a full store.
    pub(super) last_full_sweep: Option<SystemTime>,
    /// Number of leases handed out: each lease is this store's nonce and a
    /// number never handed out before.
    leases: u64,
    /// Completed records evicted before their expiry.
    pub(super) evicted: u64,
    /// The stored answers (not 2xx) of callers that had never succeeded
    /// when they were stored, oldest first, as in `ScopeRecords::completed`
    /// (entries may be stale: checked before use): what a caller may evict
    /// to make room when it has nothing of its own to give up.
    pub(super) strangers: VecDeque<(u64, u64, MapKey)>,
    /// The greatest epoch handed out: a key claimed again after its record
    /// was deleted still gets a greater one, even within a microsecond.
    pub(super) last_epoch: u64,
    /// Reused buffer for a new record's identity.
    joined: String,
}

impl Inner {
    pub(super) fn sweep(&mut self, now: SystemTime) -> u64 {
        let before = self.records.len();
        let Inner {
            records, scopes, ..
        } = self;
        records.retain(|record| {
            let live = match &mut record.state {
                // An expired record in progress may still have an owner
                // (cut off from the store for longer than its expiry): the
                // takeover's two steps, as a claim takes them. The first
                // sweep marks it seen stale; one after its time to live
                // more without an extension deletes it.
                State::InProgress {
                    locked_at,
                    stale_seen,
                    ttl,
                    ..
                } if record.expires_at <= now => match *stale_seen {
                    Some(seen) if seen > *locked_at => later(seen, *ttl) > now,
                    _ => {
                        *stale_seen = Some(now);
                        true
                    }
                },
                _ => record.expires_at > now,
            };
            if !live {
                if let Some(s) = find_scope(scopes, record.hash.scope, &record.scope) {
                    s.count = s.count.saturating_sub(1);
                }
            }
            live
        });
        let current = |&(seq, hash, ref id): &(u64, u64, MapKey)| {
            matches!(
                records.find(hash, |r| Arc::ptr_eq(&r.id, id)),
                Some(Record { state: State::Completed { seq: s, .. }, .. }) if *s == seq
            )
        };
        scopes.retain(|s| {
            s.completed.retain(current);
            s.count > 0
        });
        self.strangers.retain(current);
        // Counted again when the store is next full.
        self.weights = None;
        (before - self.records.len()) as u64
    }

    /// A lease never handed out by this store before.
    pub(super) fn new_lease(&mut self, nonce: u64) -> LeaseToken {
        self.leases += 1;
        LeaseToken(uuid::Uuid::from_u64_pair(nonce, self.leases))
    }

    /// The record of `(scope, key)`, whose hashes are `hash`.
    pub(super) fn find_mut(
        &mut self,
        hash: KeyHash,
        scope: &str,
        key: &str,
    ) -> Option<&mut Record> {
        self.records.find_mut(hash.record, |r| r.is(scope, key))
    }

    /// What `scope` holds, if it holds a record; `hash` is its scope's.
    pub(super) fn scope(&self, hash: KeyHash, scope: &str) -> Option<&ScopeRecords> {
        self.scopes.find(hash.scope, |s| *s.scope == *scope)
    }

    /// What `scope`, whose keyed hash is `hash`, holds.
    pub(super) fn scope_mut(&mut self, hash: u64, scope: &str) -> Option<&mut ScopeRecords> {
        find_scope(&mut self.scopes, hash, scope)
    }

    /// The identity of a new record of `(scope, key)`, and its scope
    /// (counted as holding one more record); `hash` is the record's.
    pub(super) fn new_id(&mut self, hash: KeyHash, scope: &str, key: &str) -> (MapKey, Arc<str>) {
        self.joined.clear();
        self.joined.push_str(scope);
        self.joined.push_str(key);
        // One lookup when the scope holds records already (the common case).
        let scope = match self.scope_mut(hash.scope, scope) {
            Some(records) => {
                records.count += 1;
                let (hash, count) = (records.hash, records.count);
                let scope = records.scope.clone();
                if let Some(weights) = &mut self.weights {
                    weights.moved(hash, id_of(&scope), count - 1, count);
                }
                scope
            }
            None => {
                let shared: Arc<str> = Arc::from(scope);
                let records = ScopeRecords {
                    hash: hash.scope,
                    scope: shared.clone(),
                    count: 1,
                    completed: VecDeque::new(),
                    succeeded: false,
                };
                self.scopes.insert_unique(hash.scope, records, |s| s.hash);
                if let Some(weights) = &mut self.weights {
                    weights.moved(hash.scope, id_of(&shared), 0, 1);
                }
                shared
            }
        };
        (Arc::from(self.joined.as_str()), scope)
    }

    /// Counts a removed record out of its scope.
    fn forget(&mut self, record: &Record) {
        let found = self
            .scopes
            .find_entry(record.hash.scope, |s| *s.scope == *record.scope);
        if let Ok(mut entry) = found {
            let s = entry.get_mut();
            s.count = s.count.saturating_sub(1);
            if let Some(weights) = &mut self.weights {
                weights.moved(s.hash, id_of(&s.scope), s.count + 1, s.count);
            }
            if s.count == 0 {
                entry.remove();
            }
        }
    }

    /// Removes the record of `(scope, key)` if `remove` says so.
    pub(super) fn remove_if(
        &mut self,
        hash: KeyHash,
        scope: &str,
        key: &str,
        remove: impl FnOnce(&Record) -> bool,
    ) -> bool {
        match self.records.find_entry(hash.record, |r| r.is(scope, key)) {
            Ok(entry) if remove(entry.get()) => {
                let (record, _) = entry.remove();
                self.forget(&record);
                true
            }
            _ => false,
        }
    }

    /// Removes the oldest stored answer of a caller that never succeeded
    /// (a stranger: a made-up scope, say); `false` if there is none. Such
    /// callers cannot lock a new caller out of a full store.
    pub(super) fn evict_oldest_stranger(&mut self) -> bool {
        while let Some((seq, hash, id)) = self.strangers.pop_front() {
            let Ok(entry) = self.records.find_entry(hash, |r| Arc::ptr_eq(&r.id, &id)) else {
                continue;
            };
            let record = entry.get();
            let still_a_stranger = self
                .scopes
                .find(record.hash.scope, |s| *s.scope == *record.scope)
                .is_some_and(|s| !s.succeeded);
            if still_a_stranger
                && matches!(record.state, State::Completed { seq: s, .. } if s == seq)
            {
                let (record, _) = entry.remove();
                self.forget(&record);
                self.evicted += 1;
                tracing::warn!(
                    scope = &*record.scope,
                    "memory store full: the stored answer of a caller that never succeeded was \
                     evicted to make room for another caller (a retry of it would run again)"
                );
                return true;
            }
        }
        false
    }

    /// Removes the oldest completed record of the heaviest scope other
    /// than `scope` (whose hashes are `hash`) that holds more than `own + 1`
    /// records (more than `scope` will hold with its new one); `false` if
    /// none does, or none of those holds a completed record. So room never
    /// comes from a caller lighter than the claiming one: a caller within
    /// its fair share loses nothing.
    pub(super) fn evict_from_heaviest(&mut self, hash: KeyHash, scope: &str, own: usize) -> bool {
        let claimant = self.scope(hash, scope).map(|s| id_of(&s.scope));
        let scopes = &self.scopes;
        let weights = self.weights.get_or_insert_with(|| {
            let mut weights = Weights::default();
            for s in scopes {
                weights.moved(s.hash, id_of(&s.scope), 0, s.count);
            }
            weights
        });
        let mut next = weights.heaviest(own.saturating_add(1), None);
        while let Some(weight @ (_, hash, id)) = next {
            let heavy = self
                .scopes
                .find(hash, |s| id_of(&s.scope) == id)
                .map(|s| s.scope.clone());
            if let Some(heavy) = heavy.filter(|_| Some(id) != claimant) {
                if self.evict_oldest_completed(hash, &heavy) {
                    return true;
                }
            }
            next = self
                .weights
                .as_ref()
                .and_then(|w| w.heaviest(own.saturating_add(1), Some(weight)));
        }
        false
    }

    /// Removes the oldest completed record of `scope`, whose keyed hash is
    /// `hash`; `false` if it has none. Only completed records: an
    /// in-progress one is never evicted.
    pub(super) fn evict_oldest_completed(&mut self, hash: u64, scope: &str) -> bool {
        loop {
            let Some((seq, record, id)) = self
                .scope_mut(hash, scope)
                .and_then(|s| s.completed.pop_front())
            else {
                return false;
            };
            if let Ok(entry) = self.records.find_entry(record, |r| Arc::ptr_eq(&r.id, &id)) {
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

/// What `scope`, whose keyed hash is `hash`, holds (a function, not a
/// method: the sweep holds the records' table meanwhile).
fn find_scope<'a>(
    scopes: &'a mut HashTable<ScopeRecords>,
    hash: u64,
    scope: &str,
) -> Option<&'a mut ScopeRecords> {
    scopes.find_mut(hash, |s| *s.scope == *scope)
}

pub(super) fn later(now: SystemTime, by: Duration) -> SystemTime {
    now.checked_add(by.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// What a claim that does not win says of a live record.
pub(super) fn outcome_of(record: &Record, fingerprint: Fingerprint) -> ClaimOutcome {
    let fingerprint_matches = record.fingerprint == fingerprint;
    match &record.state {
        State::Completed { response, .. } => ClaimOutcome::Completed {
            response: response.to_stored(),
            fingerprint_matches,
        },
        State::InProgress { .. } => ClaimOutcome::InProgress {
            fingerprint_matches,
        },
    }
}
