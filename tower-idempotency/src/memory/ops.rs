//! The [`IdempotencyStore`] calls of a [`MemoryStore`]: claim (with the
//! takeover of a stale lease), lookup, complete, extend, release, sweep.
//! Above the store (`memory/mod.rs`) and its records (`map.rs`).

use async_trait::async_trait;

use crate::store::{
    check_ids, next_epoch, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, LeaseToken,
    StoreError, StoredResponse,
};

use super::map::{later, outcome_of, Record, State};
use super::{KeptResponse, KeyHash, MemoryStore};

impl MemoryStore {
    /// [`IdempotencyStore::claim`], answered at once: what the trait's
    /// call does, without its boxed future (the layer calls this directly
    /// for a `MemoryStore` it was given by type).
    pub(crate) fn claim_now(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.claim_hashed(req, self.hash_of(req.scope, req.key))
    }

    /// [`MemoryStore::claim_now`] of a key whose [`hash_of`](Self::hash_of)
    /// is `hash`.
    pub(crate) fn claim_hashed(
        &self,
        req: ClaimRequest<'_>,
        hash: KeyHash,
    ) -> Result<ClaimOutcome, StoreError> {
        check_ids(req.scope, req.key)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        self.maybe_sweep(&mut inner, now);
        let lease = inner.new_lease(self.nonce);
        // Greater than every epoch this store handed out, so also than that
        // of the claim this one may replace (kept store-wide, not per
        // record: a key released or swept and claimed again within a
        // microsecond still gets a greater one).
        let epoch = next_epoch(Some(inner.last_epoch), now);
        inner.last_epoch = epoch;
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
        let Some(record) = inner.find_mut(hash, req.scope, req.key) else {
            self.make_room(&mut inner, hash, req.scope, now)?;
            let (id, scope) = inner.new_id(hash, req.scope, req.key);
            inner
                .records
                .insert_unique(hash.record, fresh(hash, id, scope, lease), |r| {
                    r.hash.record
                });
            return Ok(ClaimOutcome::Claimed { lease, epoch });
        };
        // An expired record in progress is not free: its owner may only be
        // cut off from the store. It follows the takeover's two steps below.
        if record.expires_at <= now && !matches!(record.state, State::InProgress { .. }) {
            *record = fresh(hash, record.id.clone(), record.scope.clone(), lease);
            return Ok(ClaimOutcome::Claimed { lease, epoch });
        }
        if let State::InProgress {
            locked_at,
            stale_seen,
            ..
        } = &mut record.state
        {
            // Whatever its fingerprint: a corrected request takes over the
            // key of an owner that is provably gone (one that died before
            // freeing it, say), as a retry of the same request would.
            if later(*locked_at, req.lock_timeout) <= now {
                match *stale_seen {
                    // Seen stale a lock timeout ago, and not extended since:
                    // its owner is gone.
                    Some(seen) if seen > *locked_at && later(seen, req.lock_timeout) <= now => {
                        *record = fresh(hash, record.id.clone(), record.scope.clone(), lease);
                        return Ok(ClaimOutcome::Claimed { lease, epoch });
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

    /// [`IdempotencyStore::complete_owned`] of a key whose
    /// [`hash_of`](Self::hash_of) is `hash`, answered at once (see
    /// [`MemoryStore::claim_now`]), with the response `response` makes
    /// (called only if the lease is still ours).
    pub(crate) fn complete_now(
        &self,
        hash: KeyHash,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: impl FnOnce() -> KeptResponse,
    ) -> bool {
        self.keep_response(hash, scope, key, lease, response)
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.claim_now(req)
    }

    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let hash = self.hash_of(scope, key);
        let now = self.clock.now();
        let mut inner = self.lock();
        Ok(match inner.find_mut(hash, scope, key) {
            Some(record)
                if record.expires_at > now || matches!(record.state, State::InProgress { .. }) =>
            {
                Some(outcome_of(record, fingerprint))
            }
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
        let hash = self.hash_of(scope, key);
        let response = || KeptResponse::Stored(response.clone());
        Ok(self.keep_response(hash, scope, key, lease, response))
    }

    async fn complete_owned(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: StoredResponse,
    ) -> Result<bool, StoreError> {
        let hash = self.hash_of(scope, key);
        let response = || KeptResponse::Stored(response);
        Ok(self.complete_now(hash, scope, key, lease, response))
    }

    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        let hash = self.hash_of(scope, key);
        let now = self.clock.now();
        let mut inner = self.lock();
        match inner.find_mut(hash, scope, key) {
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
        let hash = self.hash_of(scope, key);
        let released = self.lock().remove_if(
            hash,
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
    use std::time::Duration;

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
                matches!(claimed, ClaimOutcome::Claimed { .. }),
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

    /// Both of a record's hashes, its scope's and its own, are keyed per
    /// store (SipHash with a random key), never a fixed function: keys and
    /// scopes a client chooses cannot be made to collide in the table
    /// (hash flooding), since the collisions differ from store to store.
    #[test]
    fn both_hashes_are_keyed_per_store() {
        let (a, b) = (MemoryStore::new(), MemoryStore::new());
        let (one, other) = (a.hash_of("scope", "key"), b.hash_of("scope", "key"));
        assert_eq!(one, a.hash_of("scope", "key"), "one store, one hash");
        assert_ne!(one.scope, other.scope, "the scope's hash is not keyed");
        assert_ne!(one.record, other.record, "the record's hash is not keyed");
        // Keyed itself, not only through the scope's hash.
        let record = |store: &MemoryStore| super::super::map::record_hash(&store.hasher, 7, "key");
        assert_ne!(
            record(&a),
            record(&b),
            "the record's hash is keyed only through its scope's"
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
                    ClaimOutcome::Claimed { lease, .. } => lease,
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
