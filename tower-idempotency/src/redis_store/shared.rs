//! What a [`RedisStore`](super::RedisStore) and a
//! [`RedisClusterStore`](super::RedisClusterStore) share: the core each
//! wraps (a connection, the names of its keys, its scripts, its sweep
//! schedule), the timeouts, and how Redis's errors and settings are read.
//!
//! ```text
//! RedisStore { inner: Shared<ConnectionManager> }
//! RedisClusterStore { inner: Shared<ClusterConnection> }
//! ```

use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

use crate::store::{spawn_sweep, IdempotencyStore, StoreError, SweepSchedule};

use super::keys::{Keys, Layout, DEFAULT_REDIS_PREFIX};
use super::scripts;

/// How long one store call may wait for Redis before it fails (and the
/// layer answers `503`, or tries again where it does): a cut connection
/// must not hang a request.
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a store sweeps by itself unless told otherwise.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(300);

/// Records a sweep looks at per script call: each call is short, so Redis
/// serves other clients between two.
pub(super) const SWEEP_BATCH: usize = 1000;

/// The scripts, loaded once per store (and again by Redis-rs after a
/// restart of the server: `NOSCRIPT` makes it load them again).
pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) lookup: Script,
    pub(super) complete: Script,
    pub(super) extend: Script,
    pub(super) release: Script,
    pub(super) sweep: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            claim: Script::new(&scripts::claim()),
            lookup: Script::new(&scripts::lookup()),
            complete: Script::new(scripts::COMPLETE),
            extend: Script::new(&scripts::extend()),
            release: Script::new(scripts::RELEASE),
            sweep: Script::new(&scripts::sweep()),
        }
    }
}

/// What a store on one node and one on a cluster share: a connection
/// (`C`), the names of its keys, its scripts and its sweep schedule.
/// `ops.rs` implements the store trait on it once for both.
#[derive(Clone)]
pub(super) struct Shared<C> {
    pub(super) conn: C,
    pub(super) keys: Keys,
    pub(super) scripts: Arc<Scripts>,
    /// When a claim starts the next sweep, shared by the store's clones.
    pub(super) sweep: Arc<SweepSchedule>,
}

impl<C> Shared<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) fn new(conn: C, layout: Layout) -> Self {
        Self {
            conn,
            keys: Keys::new(DEFAULT_REDIS_PREFIX, layout),
            scripts: Arc::new(Scripts::new()),
            sweep: Arc::new(SweepSchedule::new(Some(DEFAULT_SWEEP_EVERY), Duration::MAX)),
        }
    }

    pub(super) fn sweep_every(mut self, every: Option<Duration>) -> Self {
        self.sweep = Arc::new(SweepSchedule::new(every, Duration::MAX));
        self
    }

    pub(super) fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        self.keys = self.keys.with_prefix(prefix)?;
        Ok(self)
    }

    /// Starts a sweep in a task of its own if one is due.
    pub(super) fn maybe_sweep(&self)
    where
        Self: IdempotencyStore,
    {
        if self.sweep.due() {
            spawn_sweep(self.clone());
        }
    }
}

/// The value of `name` in an `INFO` answer.
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Refuses a server whose `INFO persistence memory` says it may lose keys;
/// `volatile` names the constructor that accepts one.
pub(super) fn check_durability(info: &str, volatile: &str) -> Result<(), StoreError> {
    if info_field(info, "aof_enabled") != Some("1") {
        return Err(StoreError::msg(format!(
            "this Redis keeps no append-only file (appendonly no): a restart would lose \
             keys, and their requests would run again. Turn AOF on, or use \
             {volatile} if that is acceptable",
        )));
    }
    match info_field(info, "maxmemory_policy") {
        Some("noeviction") => Ok(()),
        policy => Err(StoreError::msg(format!(
            "this Redis may evict keys (maxmemory-policy {}): an evicted key's request \
             would run again. Set maxmemory-policy noeviction, or use \
             {volatile} if that is acceptable",
            policy.unwrap_or("unknown")
        ))),
    }
}

/// Maps a Redis error to a store error: transient when the server may
/// answer later (a lost or timed-out connection, a server loading, a
/// failover under way, out of memory), permanent when the request itself
/// is wrong.
pub(super) fn redis_err(context: &'static str) -> impl Fn(RedisError) -> StoreError {
    move |err| {
        let permanent = matches!(
            err.kind(),
            ErrorKind::Parse
                | ErrorKind::UnexpectedReturnType
                | ErrorKind::InvalidClientConfig
                | ErrorKind::AuthenticationFailed
                | ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::CrossSlot)
        );
        let error = StoreError::with_source(context, err);
        if permanent {
            error
        } else {
            error.transient()
        }
    }
}
