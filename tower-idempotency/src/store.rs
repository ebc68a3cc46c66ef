//! The storage abstraction: [`IdempotencyStore`] and the types it exchanges.
//!
//! A store keeps one record per `(scope, key)`. A record is either *in progress*
//! (claimed by one request, identified by a [`LeaseToken`]) or *completed*
//! (holding the [`StoredResponse`] to replay). Every record remembers the
//! [`Fingerprint`] of the request that created it and an expiry instant after
//! which it is treated as absent and may be swept.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

/// SHA-256 digest identifying the content of a request (method, path and
/// query, selected headers, body).
///
/// Two requests with the same idempotency key must carry the same fingerprint;
/// otherwise the second one is rejected with `422 Unprocessable Content`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The digest as 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a fingerprint from a byte slice; `None` unless it is 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let array: [u8; 32] = bytes.try_into().ok()?;
        Some(Self(array))
    }

    /// Lower-case hexadecimal representation (64 characters).
    pub fn to_hex(&self) -> String {
        use std::fmt::Write;
        let mut out = String::with_capacity(64);
        for b in self.0 {
            // Writing into a String never fails.
            let _ = write!(out, "{b:02x}");
        }
        out
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// Opaque token proving ownership of an in-progress claim.
///
/// Only the holder of the current lease may complete or release the claim; a
/// claim taken over after the lock timeout gets a fresh token, so the stale
/// owner's later `complete`/`release` calls become no-ops.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub uuid::Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn new_random() -> Self {
        Self(uuid::Uuid::new_v4())
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A final response as persisted by a store and replayed to retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Selected response headers (name in lower case, value as text), in order.
    pub headers: Vec<(String, String)>,
    /// The complete response body.
    pub body: Bytes,
}

impl StoredResponse {
    /// Creates a stored response.
    pub fn new(status: u16, headers: Vec<(String, String)>, body: impl Into<Bytes>) -> Self {
        Self {
            status,
            headers,
            body: body.into(),
        }
    }

    /// A response with a JSON body and `content-type: application/json`.
    ///
    /// Handy for handlers that complete their key inside their own database
    /// transaction (see `PostgresStore::complete_in_tx`).
    pub fn json(status: u16, body: impl Into<Bytes>) -> Self {
        Self::new(
            status,
            vec![("content-type".to_owned(), "application/json".to_owned())],
            body,
        )
    }
}

/// Parameters of one claim attempt.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// Caller identity the key is scoped to (tenant, API key id, ...).
    pub scope: &'a str,
    /// The idempotency key as sent by the client (unquoted).
    pub key: &'a str,
    /// Fingerprint of the request.
    pub fingerprint: Fingerprint,
    /// An in-progress claim whose lock is older than this may be taken over by
    /// a request with the same fingerprint.
    pub lock_timeout: Duration,
    /// How long the record lives (from creation or takeover) before it expires.
    pub ttl: Duration,
}

/// Result of [`IdempotencyStore::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key was free (new, expired, or taken over after the lock timeout):
    /// the caller owns it now and must `complete` or `release` it.
    Claimed(LeaseToken),
    /// Another request holds the key and its lock has not timed out.
    InProgress {
        /// Whether the stored fingerprint equals the claimed one.
        fingerprint_matches: bool,
    },
    /// The key has a stored final response.
    Completed {
        /// The response to replay.
        response: StoredResponse,
        /// Whether the stored fingerprint equals the claimed one.
        fingerprint_matches: bool,
    },
}

/// Error reported by a store backend.
///
/// Either *transient* (the store could not be reached, a pool or a statement
/// timed out, the server is restarting: the same request may succeed later,
/// and the layer answers `503` with `Retry-After`) or *permanent* (anything
/// else: the layer answers `500`, without inviting a retry).
#[derive(Debug)]
pub struct StoreError {
    message: String,
    transient: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl StoreError {
    /// A permanent error with a message only.
    pub fn msg(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
            source: None,
        }
    }

    /// A permanent error wrapping a backend error.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            transient: false,
            source: Some(Box::new(source)),
        }
    }

    /// Marks the error as transient: retrying later may succeed.
    pub fn transient(mut self) -> Self {
        self.transient = true;
        self
    }

    /// Whether retrying later may succeed (connection lost, pool exhausted,
    /// timeout, server restarting).
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {}", self.message, source),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Longest scope or key a store accepts, in bytes. The layer stores a
/// 64-character digest as the scope and keys of at most 255 characters; the
/// limit protects stores used directly.
pub const MAX_STORED_ID_LEN: usize = 512;

/// Refuses a scope or key longer than [`MAX_STORED_ID_LEN`], with a
/// permanent error (retrying cannot help).
pub(crate) fn check_ids(scope: &str, key: &str) -> Result<(), StoreError> {
    for (what, value) in [("scope", scope), ("key", key)] {
        if value.len() > MAX_STORED_ID_LEN {
            return Err(StoreError::msg(format!(
                "the {what} is {} bytes long; stores accept at most {MAX_STORED_ID_LEN}",
                value.len()
            )));
        }
    }
    Ok(())
}

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
    /// whose fingerprint matches and whose lease is *stale* (not extended for
    /// `lock_timeout`) is taken over (new lease, lock refreshed) only in two
    /// steps: the first claim that finds it stale marks it as seen stale and
    /// is answered [`ClaimOutcome::InProgress`]; a claim at least
    /// `lock_timeout` after that mark takes it over, unless the lease was
    /// extended meanwhile. A takeover thus needs the lease stale while the
    /// store is reachable for longer than the owner needs to reach the store
    /// again: an owner cut off from the store for a while (a database
    /// failover) resumes its lease before anyone takes it over, however long
    /// the outage was.
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

/// Source of the current time for stores, so tests can move time by hand.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The real system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A manual clock starting at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A manual clock starting at `start`.
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by` (not at all if that overflows).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now = now.checked_add(by).unwrap_or(*now);
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: SystemTime) {
        *self.now.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
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
            match (*store).sweep_expired().await {
                Ok(n) if n > 0 => tracing::debug!(swept = n, "swept expired idempotency keys"),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "sweeping expired idempotency keys failed")
                }
            }
        }
    })
}
