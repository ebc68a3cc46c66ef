//! [`MemoryStore`]: an in-process store for a single server and for tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use async_trait::async_trait;

use crate::store::{
    ClaimOutcome, ClaimRequest, Clock, Fingerprint, IdempotencyStore, LeaseToken, StoreError,
    StoredResponse, SystemClock,
};

#[derive(Debug)]
enum State {
    InProgress {
        lease: LeaseToken,
        locked_at: SystemTime,
    },
    Completed(StoredResponse),
}

#[derive(Debug)]
struct Record {
    fingerprint: Fingerprint,
    expires_at: SystemTime,
    state: State,
}

/// An idempotency store kept in a `Mutex<HashMap>` inside the process.
///
/// Suitable for a single server instance and for tests; records are lost on
/// restart and are not shared between processes. Use
/// [`with_clock`](Self::with_clock) with a [`ManualClock`](crate::ManualClock)
/// to test expiry and lock timeouts without sleeping.
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
/// let layer = IdempotencyLayer::new(MemoryStore::new());
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<(String, String), Record>>>,
    clock: Arc<dyn Clock>,
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
            records: Arc::new(Mutex::new(HashMap::new())),
            clock,
        }
    }

    /// Number of records currently held (including expired, unswept ones).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Record>> {
        // A poisoned lock only means another thread panicked while holding it;
        // every critical section below leaves the map consistent, so continue.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now();
        let mut map = self.lock();
        let map_key = (req.scope.to_owned(), req.key.to_owned());
        let fresh = |lease| Record {
            fingerprint: req.fingerprint,
            expires_at: now + req.ttl,
            state: State::InProgress {
                lease,
                locked_at: now,
            },
        };
        match map.get_mut(&map_key) {
            None => {
                let lease = LeaseToken::new_random();
                map.insert(map_key, fresh(lease));
                Ok(ClaimOutcome::Claimed(lease))
            }
            Some(record) if record.expires_at <= now => {
                let lease = LeaseToken::new_random();
                *record = fresh(lease);
                Ok(ClaimOutcome::Claimed(lease))
            }
            Some(record) => {
                let fingerprint_matches = record.fingerprint == req.fingerprint;
                match &record.state {
                    State::Completed(response) => Ok(ClaimOutcome::Completed {
                        response: response.clone(),
                        fingerprint_matches,
                    }),
                    State::InProgress { locked_at, .. }
                        if fingerprint_matches && *locked_at + req.lock_timeout <= now =>
                    {
                        let lease = LeaseToken::new_random();
                        *record = fresh(lease);
                        Ok(ClaimOutcome::Claimed(lease))
                    }
                    State::InProgress { .. } => Ok(ClaimOutcome::InProgress {
                        fingerprint_matches,
                    }),
                }
            }
        }
    }

    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        let mut map = self.lock();
        match map.get_mut(&(scope.to_owned(), key.to_owned())) {
            Some(record) if matches!(record.state, State::InProgress { lease: l, .. } if l == lease) =>
            {
                record.state = State::Completed(response.clone());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        let mut map = self.lock();
        let map_key = (scope.to_owned(), key.to_owned());
        match map.get(&map_key) {
            Some(record) if matches!(record.state, State::InProgress { lease: l, .. } if l == lease) =>
            {
                map.remove(&map_key);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, record| record.expires_at > now);
        Ok((before - map.len()) as u64)
    }
}
