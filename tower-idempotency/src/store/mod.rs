//! The storage abstraction: [`IdempotencyStore`] and the types it exchanges.
//!
//! May use: nothing of the crate, only std and external crates.
//!
//! A store keeps one record per `(scope, key)`. A record is either *in progress*
//! (claimed by one request, identified by a [`LeaseToken`]) or *completed*
//! (holding the [`StoredResponse`] to replay). Every record remembers the
//! [`Fingerprint`] of the request that created it and an expiry instant after
//! which it is treated as absent and may be swept.
//!
//! The trait and [`spawn_sweeper`] are here; below them, in files of their
//! own that import nothing above them, the values a store exchanges
//! (`values.rs`), its error (`error.rs`) and its clock (`clock.rs`). The bottom
//! floor: every store, the request path and the layer import this folder;
//! it imports nothing else of the crate.

mod clock;
mod error;
mod sweep;
mod values;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::error::StoreError;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) use self::sweep::{spawn_sweep, SweepSchedule};
pub(crate) use self::values::check_ids;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) use self::values::{headers_from_json, headers_to_json};
pub use self::values::{
    next_epoch, ClaimOutcome, ClaimRequest, Fingerprint, LeaseToken, StoredResponse,
    MAX_STORED_ID_LEN,
};

/// Persistent state behind [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// Implementations must make [`claim`](Self::claim) atomic: of many concurrent
/// claims for the same `(scope, key)` exactly one may return
/// [`ClaimOutcome::Claimed`]. The trait is object safe; the layer holds an
/// `Arc<dyn IdempotencyStore>`.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Atomically claims `(scope, key)`, or reports its current state.
    ///
    /// A record that has expired counts as absent. An in-progress record
    /// whose lease is *stale* (not extended for `lock_timeout`), whatever
    /// its fingerprint, is taken over (new lease, lock refreshed, the
    /// claimer's fingerprint) only in two steps: the first claim that finds it stale marks it as seen stale and
    /// is answered [`ClaimOutcome::InProgress`]; a claim at least
    /// `lock_timeout` after that mark takes it over, unless the lease was
    /// extended meanwhile. A takeover thus needs the lease stale while the
    /// store is reachable for longer than the owner needs to reach the store
    /// again: an owner cut off from the store for a while (a database
    /// failover) resumes its lease before anyone takes it over, however long
    /// the outage was. A different request (a corrected one) takes over the
    /// key of an owner gone for good (one that died before freeing it) in
    /// the same two steps, so no lost release strands a key until expiry.
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// The state of `(scope, key)` without claiming it: `None` if there is
    /// no live record (or the store cannot tell), else
    /// [`ClaimOutcome::InProgress`] or [`ClaimOutcome::Completed`] (never
    /// `Claimed`), with `fingerprint_matches` against `fingerprint`.
    ///
    /// The layer asks it when its lease turned out lost (another request
    /// took the key over), to answer with what the store holds rather than
    /// as if it had won. The default says `None`: the layer then answers
    /// `409` with `Retry-After`, and the retry reads the store's answer.
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let _ = (scope, key, fingerprint);
        Ok(None)
    }

    /// Stores the final response for a claim held with `lease`.
    ///
    /// Returns `Ok(false)` (and changes nothing) when the lease is no longer
    /// current: the claim was taken over, released, swept, or already completed
    /// (for example by the handler inside its own transaction).
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError>;

    /// [`complete`](Self::complete), taking the response by value: a store
    /// that keeps responses in memory can keep this one without copying
    /// it. The layer stores a handler's response with this first (and with
    /// `complete` when it tries again). The default borrows the response
    /// and calls `complete`.
    async fn complete_owned(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: StoredResponse,
    ) -> Result<bool, StoreError> {
        self.complete(scope, key, lease, &response).await
    }

    /// Extends the lease of an in-progress claim held with `lease`: its lock
    /// counts as taken now (a heartbeat), and its expiry moves to at least
    /// the record's time to live from now, so a live handler's record
    /// neither goes stale nor expires. The layer calls it periodically while
    /// the handler runs, so a live handler is never taken over; a dead
    /// one's claim frees once it has been seen stale for a lock timeout
    /// (see [`claim`](Self::claim)).
    ///
    /// Returns `Ok(false)` when the lease is no longer current.
    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError>;

    /// Deletes an in-progress claim held with `lease` so that a retry can run.
    ///
    /// Returns `Ok(false)` when the lease is no longer current.
    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError>;

    /// Deletes every expired record; returns how many were deleted.
    async fn sweep_expired(&self) -> Result<u64, StoreError>;
}

#[async_trait]
impl<T: IdempotencyStore + ?Sized> IdempotencyStore for Arc<T> {
    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        (**self).claim(request).await
    }
    async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        (**self).lookup(scope, key, fingerprint).await
    }
    async fn complete(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: &StoredResponse,
    ) -> Result<bool, StoreError> {
        (**self).complete(scope, key, lease, response).await
    }
    async fn complete_owned(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
        response: StoredResponse,
    ) -> Result<bool, StoreError> {
        (**self).complete_owned(scope, key, lease, response).await
    }
    async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        lease: LeaseToken,
    ) -> Result<bool, StoreError> {
        (**self).extend_lease(scope, key, lease).await
    }
    async fn release(&self, scope: &str, key: &str, lease: LeaseToken) -> Result<bool, StoreError> {
        (**self).release(scope, key, lease).await
    }
    async fn sweep_expired(&self) -> Result<u64, StoreError> {
        (**self).sweep_expired().await
    }
}

/// Spawns a background task on the current tokio runtime that calls
/// [`IdempotencyStore::sweep_expired`] every `every`.
///
/// The task runs until the returned handle is aborted (or the runtime shuts
/// down). Sweep errors are logged with `tracing` and the loop keeps going.
/// Must be called from within a tokio runtime.
pub fn spawn_sweeper(
    store: Arc<dyn IdempotencyStore>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every.max(Duration::from_millis(1)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            // Through the `dyn`: the blanket impl for `Arc` would box a
            // second future.
            sweep::sweep_logged(&*store).await;
        }
    })
}
