//! Every knob, validated in `build()`.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_safe_retry::{Jitter, RetryPolicy};
//!
//! let policy = RetryPolicy::builder()
//!     .max_attempts(4)
//!     .backoff(Duration::from_millis(50), Duration::from_secs(2))
//!     .jitter(Jitter::Equal)
//!     .deadline(Duration::from_secs(10))
//!     .attempt_timeout(Duration::from_secs(3))
//!     .seed(42) // deterministic delays, for tests
//!     .build()
//!     .unwrap();
//! assert_eq!(policy.max_attempts(), 4);
//! ```
//!
//! A policy is cheap to clone, and clones share what must be shared: the
//! retry admission, the random source, the clock, the sleeper and the
//! counters. Build a second policy to get a second admission.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, Method};
use rand::RngCore;

use crate::admission::{CircuitBreaker, RetryAdmission, TokenBucketConfig};
use crate::backoff::{Backoff, Jitter};
use crate::builder::RetryPolicyBuilder;
use crate::classify::Classifier;
use crate::hedge::{HedgeConfig, Hedger};
use crate::idempotency::{KeyFormat, KeyGenerator};
use crate::metrics::Metrics;
use crate::runtime::{lock, Clock, Sleeper};

/// A random source the policy can own.
pub(crate) type Rng = Box<dyn RngCore + Send>;

/// The retry policy: what to retry, how long to wait, and how much.
///
/// `RetryPolicy::default()` is the safe default described in the README;
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
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    /// The backoff after a throttling answer (429), when it differs.
    pub(crate) throttle_backoff: Option<Backoff>,
    /// Whether first attempts to a paced host wait for its rate.
    pub(crate) pace_first_attempts: bool,
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
    pub(crate) attempt_header: Option<HeaderName>,
    /// Hedging, when on.
    pub(crate) hedge: Option<HedgeConfig>,
}

impl RetryPolicy {
    /// A builder starting from the defaults.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
    }

    /// gRPC's connection backoff, for reconnect loops: 1 s initial delay,
    /// ×1.6, ±20 % jitter, 120 s cap, each connect attempt given at least
    /// max(20 s, the backoff that follows it) (see
    /// [`RetryPolicyBuilder::min_attempt_timeout`]),
    /// no attempt limit, no deadline and no request budget. Each call of
    /// [`crate::retry`] starts again from the initial delay, as gRPC does
    /// after a successful connection.
    pub fn grpc_connection_backoff() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
            .max_attempts(u32::MAX)
            .backoff(Duration::from_secs(1), Duration::from_secs(120))
            .multiplier(1.6)
            .jitter(Jitter::Proportional(0.2))
            .no_deadline()
            .min_attempt_timeout(Duration::from_secs(20))
            .no_budget()
    }

    /// The AWS SDKs' "standard" retry mode as of 2026
    /// (`AWS_NEW_RETRIES_2026`): 3 attempts; full jitter from 50 ms after a
    /// transient error and from 1 s after a throttling answer (429), capped
    /// at 20 s; a quota of 500 tokens where a transient retry costs 14 and a
    /// throttled one 5, the cost refunded when the retry succeeds, and one
    /// token credited for a success that needed no retry. The quota fails
    /// fast when empty, as AWS's does.
    pub fn aws_standard() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
            .max_attempts(3)
            .backoff(Duration::from_millis(50), Duration::from_secs(20))
            .throttle_backoff(Duration::from_secs(1), Duration::from_secs(20))
            .jitter(Jitter::Full)
            .token_bucket(TokenBucketConfig {
                capacity: 500.0,
                first_attempt_deposit: 0.0,
                success_deposit: 1.0,
                retry_cost: 14.0,
                timeout_cost: 14.0,
                throttled_cost: 5.0,
                refund_on_success: true,
            })
    }

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

    /// The counters shared by every clone of this policy.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs `f` with the policy's random source.
    pub(crate) fn with_rng<T>(&self, f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        let mut rng = lock(&self.rng);
        f(&mut **rng)
    }
}

impl Default for RetryPolicy {
    /// 3 attempts; full jitter from 100 ms, ×2, capped at 10 s; a 30 s
    /// deadline; Retry-After honoured up to 60 s; adaptive retry admission
    /// ([`crate::AdaptiveConfig::default`]); Idempotency-Key (UUID v4, bare)
    /// on POST and PATCH; `Stripe-Should-Retry` honoured; the time left sent
    /// downstream as `Request-Timeout-Ms`.
    fn default() -> Self {
        RetryPolicyBuilder::new()
            .build()
            .unwrap_or_else(|_| unreachable!("the default settings are valid"))
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
