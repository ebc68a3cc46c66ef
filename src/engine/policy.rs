//! The policy: the settings every call reads, and the state its clones
//! share — the retry admission, the random source, the clock, the sleeper
//! and the counters. Build a second policy to get a second admission.
//!
//! ```
//! use reqwest_safe_retry::RetryPolicy;
//!
//! let policy = RetryPolicy::default();
//! let clone = policy.clone(); // the same admission and counters
//! assert!(std::sync::Arc::ptr_eq(policy.admission(), clone.admission()));
//! assert_eq!(policy.max_attempts(), 3);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use rand::Rng as RandomSource;

use crate::decisions::{
    Backoff, CircuitBreaker, FirstAttemptPacing, HedgeConfig, Hedger, ReplicaTable, RetryAdmission,
};
use crate::signals::Classifier;
use crate::vocabulary::replay::ReplayMemory;
use crate::vocabulary::{lock, KeyFormat, KeyGenerator};

use super::metrics::Metrics;
use super::runtime::{Clock, Sleeper};

/// A random source the policy can own.
pub(crate) type Rng = Box<dyn RandomSource + Send>;

/// The retry policy: what to retry, how long to wait, and how much.
///
/// `RetryPolicy::default()` is the safe default described in the guide ("Defaults, and why");
/// [`RetryPolicy::builder`] changes any part of it.
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) settings: Arc<Settings>,
    pub(crate) admission: Arc<dyn RetryAdmission>,
    /// The opt-in circuit breaker, per host.
    pub(crate) breaker: Option<Arc<CircuitBreaker>>,
    pub(crate) rng: Arc<Mutex<Rng>>,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) classifiers: Arc<[Arc<dyn Classifier>]>,
    /// Latencies and hedge budgets per host, for hedged requests.
    pub(crate) hedger: Arc<Hedger>,
    /// The health of each host's addresses, shared with the policy's
    /// [`crate::replicas::ReplicaResolver`]s.
    pub(crate) replicas: Arc<Replicas>,
    /// The bytes the replay buffers of this policy's calls hold.
    pub(crate) replay_memory: Arc<ReplayMemory>,
}

/// The replica table, and whether a resolver reads it: until one does,
/// no attempt looks at it (nothing changes for a client without one).
#[derive(Debug, Default)]
pub(crate) struct Replicas {
    pub(crate) table: ReplicaTable,
    pub(crate) installed: AtomicBool,
}

impl Replicas {
    /// The table, when a resolver reads it.
    pub(crate) fn in_use(&self) -> Option<&ReplicaTable> {
        self.installed
            .load(Ordering::Relaxed)
            .then_some(&self.table)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    /// The backoff after a throttling answer (429), when it differs.
    pub(crate) throttle_backoff: Option<Backoff>,
    /// Which pacing holds first attempts.
    pub(crate) pace_first_attempts: FirstAttemptPacing,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) min_attempt_timeout: Option<Duration>,
    pub(crate) min_attempt_window: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) key_header: HeaderName,
    pub(crate) key_methods: Vec<Method>,
    pub(crate) key_generator: KeyGenerator,
    pub(crate) key_format: KeyFormat,
    pub(crate) verdict_header: Option<HeaderName>,
    pub(crate) deadline_header: Option<HeaderName>,
    /// The deadline header's value for the whole deadline, in whole
    /// milliseconds, made once: what a first attempt that did not wait
    /// sends. A clone shares its bytes, where a value made per attempt
    /// allocates (and again when reqwest copies the headers it sends).
    pub(crate) deadline_value: Option<(u64, HeaderValue)>,
    pub(crate) attempt_header: Option<HeaderName>,
    /// Hedging, when on.
    pub(crate) hedge: Option<HedgeConfig>,
    /// The most bytes of a streamed body one call keeps for a retry (0:
    /// none).
    pub(crate) replay_limit: usize,
    /// The most bytes the replay buffers of all calls keep together.
    pub(crate) replay_cap: usize,
}

impl RetryPolicy {
    /// The most attempts per logical operation, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.settings.max_attempts
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &Backoff {
        &self.settings.backoff
    }

    /// The total time for one logical operation, if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.settings.deadline
    }

    /// The retry admission, shared by every clone and kept per host.
    pub fn admission(&self) -> &Arc<dyn RetryAdmission> {
        &self.admission
    }

    /// Hedging's settings, when the policy hedges.
    pub fn hedge(&self) -> Option<&HedgeConfig> {
        self.settings.hedge.as_ref()
    }

    /// The health of the addresses of each host resolved through this
    /// policy's [`crate::replicas::ReplicaResolver`]s.
    pub fn replicas(&self) -> &ReplicaTable {
        &self.replicas.table
    }

    /// The bytes of streamed bodies kept for a retry by this policy's
    /// calls in flight, all together (see
    /// [`RetryPolicyBuilder::body_replay_limit`](crate::RetryPolicyBuilder::body_replay_limit)).
    pub fn replay_bytes_kept(&self) -> usize {
        self.replay_memory.used()
    }

    /// The most bytes this policy's calls ever kept together for a retry.
    pub fn replay_bytes_peak(&self) -> usize {
        self.replay_memory.peak()
    }

    /// The counters shared by every clone of this policy.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs `f` with the policy's random source.
    pub(crate) fn with_rng<T>(&self, f: impl FnOnce(&mut dyn RandomSource) -> T) -> T {
        let mut rng = lock(&self.rng);
        f(&mut **rng)
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("settings", &self.settings)
            .field("admission", &self.admission)
            .field("circuit_breaker", &self.breaker)
            .field("classifiers", &self.classifiers.len())
            .finish_non_exhaustive()
    }
}
