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
//! retry budget, the random source, the clock, the sleeper and the counters.
//! Build a second policy to get a second budget.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, Method};
use rand::rngs::{SmallRng, StdRng};
use rand::{RngCore, SeedableRng};

use crate::backoff::{Backoff, Jitter};
use crate::budget::RetryBudget;
use crate::classify::Classifier;
use crate::error::ConfigError;
use crate::idempotency::{KeyFormat, KeyGenerator};
use crate::metrics::Metrics;
use crate::runtime::{lock, Clock, Sleeper, SystemClock, TokioSleeper};

/// A random source the policy can own.
type Rng = Box<dyn RngCore + Send>;

/// The retry policy: what to retry, how long to wait, and how much.
///
/// `RetryPolicy::default()` is the safe default described in the README;
/// [`RetryPolicy::builder`] changes any part of it.
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) settings: Arc<Settings>,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    rng: Arc<Mutex<Rng>>,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) classifiers: Arc<[Arc<dyn Classifier>]>,
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
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

    /// The AWS SDKs' "standard" retry mode: 3 attempts, full jitter from
    /// 1 s capped at 20 s, and a quota of 500 tokens where a retry costs 5
    /// and a retry after a timeout 10. AWS credits one token per success that
    /// needed no retry; this preset credits one per first attempt, the
    /// model of this crate's budget.
    pub fn aws_standard() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
            .max_attempts(3)
            .backoff(Duration::from_secs(1), Duration::from_secs(20))
            .jitter(Jitter::Full)
            .budget_with_timeout_cost(500.0, 1.0, 5.0, 10.0)
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

    /// The client-wide retry budget, if on.
    pub fn budget(&self) -> Option<&RetryBudget> {
        self.budget.as_deref()
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
    /// deadline; Retry-After honoured up to 60 s; a budget of 10 tokens
    /// refilled by 0.1 per first attempt; Idempotency-Key (UUID v4, bare) on
    /// POST and PATCH; `Stripe-Should-Retry` honoured.
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
            .field("budget", &self.budget)
            .field("classifiers", &self.classifiers.len())
            .finish_non_exhaustive()
    }
}

/// Builds a [`RetryPolicy`]; a bad setting is kept and reported by
/// [`RetryPolicyBuilder::build`].
#[must_use]
pub struct RetryPolicyBuilder {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
    multiplier: f64,
    jitter: Jitter,
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    min_attempt_timeout: Option<Duration>,
    min_attempt_window: Duration,
    max_retry_after: Duration,
    key_header: Result<HeaderName, ConfigError>,
    key_methods: Vec<Method>,
    key_generator: KeyGenerator,
    key_format: KeyFormat,
    verdict_header: Result<Option<HeaderName>, ConfigError>,
    deadline_header: Result<Option<HeaderName>, ConfigError>,
    attempt_header: Result<Option<HeaderName>, ConfigError>,
    budget: Option<(f64, f64, f64, f64)>,
    shared_budget: Option<Arc<RetryBudget>>,
    rng: Option<Rng>,
    sleeper: Arc<dyn Sleeper>,
    clock: Arc<dyn Clock>,
    classifiers: Vec<Arc<dyn Classifier>>,
}

fn header_name(name: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| ConfigError::new("not a valid header name"))
}

impl RetryPolicyBuilder {
    fn new() -> Self {
        RetryPolicyBuilder {
            max_attempts: 3,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: Jitter::Full,
            deadline: Some(Duration::from_secs(30)),
            attempt_timeout: None,
            min_attempt_timeout: None,
            min_attempt_window: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(60),
            key_header: Ok(HeaderName::from_static("idempotency-key")),
            key_methods: vec![Method::POST, Method::PATCH],
            key_generator: KeyGenerator::UuidV4,
            key_format: KeyFormat::Bare,
            verdict_header: Ok(Some(HeaderName::from_static("stripe-should-retry"))),
            deadline_header: Ok(None),
            attempt_header: Ok(None),
            budget: Some((10.0, 0.1, 1.0, 1.0)),
            shared_budget: None,
            rng: None,
            sleeper: Arc::new(TokioSleeper),
            clock: Arc::new(SystemClock),
            classifiers: Vec::new(),
        }
    }

    /// The most attempts per logical operation, the first included (≥ 1).
    /// Default 3.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The first delay's ceiling and the largest ceiling. Default 100 ms and
    /// 10 s.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.base = base;
        self.cap = cap;
        self
    }

    /// Growth per retry (≥ 1). Default 2.
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The jitter mode. Default [`Jitter::Full`].
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Total time for one logical operation, all attempts and sleeps
    /// included. Default 30 s.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// No total time limit (attempts and the budget still bound the work).
    pub fn no_deadline(mut self) -> Self {
        self.deadline = None;
        self
    }

    /// Time limit for each attempt; the engine uses `min(this, time left)`.
    /// Default: none (the time left).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Give each attempt at least `floor`, and at least the backoff ceiling
    /// that would follow it: gRPC's connection backoff (`MIN_CONNECT_TIMEOUT`,
    /// 20 s), so a slow connect is not cut short while the delays grow. The
    /// time left before the deadline still bounds it. Default: none.
    pub fn min_attempt_timeout(mut self, floor: Duration) -> Self {
        self.min_attempt_timeout = Some(floor);
        self
    }

    /// The least time that must be left after a sleep for another attempt to
    /// be worth starting. Default 100 ms.
    pub fn min_attempt_window(mut self, window: Duration) -> Self {
        self.min_attempt_window = window;
        self
    }

    /// The longest Retry-After obeyed; a longer one ends the operation at
    /// once. Default 60 s.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// The idempotency key header. Default `Idempotency-Key`.
    pub fn idempotency_header(mut self, name: &str) -> Self {
        self.key_header = header_name(name);
        self
    }

    /// The methods that get a key when the caller sets none. Default POST
    /// and PATCH. An empty list attaches no key by default.
    pub fn idempotency_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.key_methods = methods.into_iter().collect();
        self
    }

    /// How keys are made. Default UUID v4.
    pub fn key_generator(mut self, generator: KeyGenerator) -> Self {
        self.key_generator = generator;
        self
    }

    /// The key's wire form. Default bare.
    pub fn key_format(mut self, format: KeyFormat) -> Self {
        self.key_format = format;
        self
    }

    /// The header carrying an explicit server verdict (`true` retry, `false`
    /// do not). Default `Stripe-Should-Retry`.
    pub fn server_verdict_header(mut self, name: &str) -> Self {
        self.verdict_header = header_name(name).map(Some);
        self
    }

    /// Ignore any server verdict header.
    pub fn no_server_verdict_header(mut self) -> Self {
        self.verdict_header = Ok(None);
        self
    }

    /// Send the time left before the deadline, in whole milliseconds, in this
    /// header on every attempt, so inner services can stop working on what
    /// nobody waits for. Default: not sent.
    pub fn deadline_header(mut self, name: &str) -> Self {
        self.deadline_header = header_name(name).map(Some);
        self
    }

    /// Send the attempt number (1 for the first) in this header, like Envoy's
    /// `x-envoy-attempt-count`. Default: not sent.
    pub fn attempt_count_header(mut self, name: &str) -> Self {
        self.attempt_header = header_name(name).map(Some);
        self
    }

    /// A new budget of `capacity` tokens, refilled by `deposit` per first
    /// attempt, spending `retry_cost` per retry. Default 10, 0.1, 1.
    pub fn budget(mut self, capacity: f64, deposit: f64, retry_cost: f64) -> Self {
        self.budget = Some((capacity, deposit, retry_cost, retry_cost));
        self.shared_budget = None;
        self
    }

    /// Like [`RetryPolicyBuilder::budget`] with a separate cost for retries
    /// after a timeout.
    pub fn budget_with_timeout_cost(
        mut self,
        capacity: f64,
        deposit: f64,
        retry_cost: f64,
        timeout_cost: f64,
    ) -> Self {
        self.budget = Some((capacity, deposit, retry_cost, timeout_cost));
        self.shared_budget = None;
        self
    }

    /// Share an existing budget, for example between two clients that call
    /// the same service.
    pub fn shared_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.shared_budget = Some(budget);
        self.budget = None;
        self
    }

    /// No retry budget: only attempts and the deadline bound retries.
    pub fn no_budget(mut self) -> Self {
        self.budget = None;
        self.shared_budget = None;
        self
    }

    /// Seed the random source, for reproducible delays. Never use the same
    /// seed on many clients in production: identical seeds recreate
    /// synchronized retries. Default: seeded from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Some(Box::new(StdRng::seed_from_u64(seed)));
        self
    }

    /// Use this random source.
    pub fn rng(mut self, rng: impl RngCore + Send + 'static) -> Self {
        self.rng = Some(Box::new(rng));
        self
    }

    /// Use this sleeper (tests inject one that does not sleep).
    pub fn sleeper(mut self, sleeper: impl Sleeper) -> Self {
        self.sleeper = Arc::new(sleeper);
        self
    }

    /// Use this clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Use one [`crate::ManualClock`] as both clock and sleeper: sleeps
    /// return at once and move the clock.
    pub fn manual_clock(self, clock: &crate::ManualClock) -> Self {
        self.clock(clock.clone()).sleeper(clock.clone())
    }

    /// Add a classifier consulted before the server verdict and the default
    /// table; classifiers added earlier are asked first.
    pub fn classifier(mut self, classifier: impl Classifier) -> Self {
        self.classifiers.push(Arc::new(classifier));
        self
    }

    /// Checks every setting and builds the policy.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when `max_attempts` is 0, the backoff is invalid (see
    /// [`Backoff::from_parts`]), the deadline, an attempt timeout or the
    /// minimum attempt window is zero,
    /// a header name is invalid, or the budget values are.
    pub fn build(self) -> Result<RetryPolicy, ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new("max_attempts must be at least 1"));
        }
        if self.deadline == Some(Duration::ZERO) {
            return Err(ConfigError::new("the deadline must be greater than zero"));
        }
        if self.attempt_timeout == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "the attempt timeout must be greater than zero",
            ));
        }
        if self.min_attempt_window.is_zero() {
            return Err(ConfigError::new(
                "the minimum attempt window must be greater than zero",
            ));
        }
        let backoff = Backoff::from_parts(self.base, self.cap, self.multiplier, self.jitter)?;
        let budget = match (self.shared_budget, self.budget) {
            (Some(shared), _) => Some(shared),
            (None, Some((capacity, deposit, cost, timeout_cost))) => Some(Arc::new(
                RetryBudget::with_timeout_cost(capacity, deposit, cost, timeout_cost)?,
            )),
            (None, None) => None,
        };
        let settings = Settings {
            max_attempts: self.max_attempts,
            backoff,
            deadline: self.deadline,
            attempt_timeout: self.attempt_timeout,
            min_attempt_timeout: self.min_attempt_timeout,
            min_attempt_window: self.min_attempt_window,
            max_retry_after: self.max_retry_after,
            key_header: self.key_header?,
            key_methods: self.key_methods,
            key_generator: self.key_generator,
            key_format: self.key_format,
            verdict_header: self.verdict_header?,
            deadline_header: self.deadline_header?,
            attempt_header: self.attempt_header?,
        };
        let rng = self
            .rng
            .unwrap_or_else(|| Box::new(SmallRng::from_os_rng()));
        Ok(RetryPolicy {
            settings: Arc::new(settings),
            budget,
            rng: Arc::new(Mutex::new(rng)),
            sleeper: self.sleeper,
            clock: self.clock,
            metrics: Arc::new(Metrics::default()),
            classifiers: self.classifiers.into(),
        })
    }
}

impl fmt::Debug for RetryPolicyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicyBuilder")
            .field("max_attempts", &self.max_attempts)
            .field("base", &self.base)
            .field("cap", &self.cap)
            .field("jitter", &self.jitter)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_reported_by_build() {
        assert!(RetryPolicy::builder().max_attempts(0).build().is_err());
        assert!(RetryPolicy::builder()
            .backoff(Duration::from_secs(2), Duration::from_secs(1))
            .build()
            .is_err());
        assert!(RetryPolicy::builder()
            .deadline(Duration::ZERO)
            .build()
            .is_err());
        assert!(RetryPolicy::builder()
            .min_attempt_window(Duration::ZERO)
            .build()
            .is_err());
        assert!(RetryPolicy::builder()
            .idempotency_header("bad header")
            .build()
            .is_err());
        assert!(RetryPolicy::builder()
            .budget(10.0, -1.0, 1.0)
            .build()
            .is_err());
        let err = RetryPolicy::builder().multiplier(0.5).build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid retry configuration: backoff multiplier must be a finite number of at least 1"
        );
    }

    #[test]
    fn presets_build_and_match_their_sources() {
        let grpc = RetryPolicy::grpc_connection_backoff().build().unwrap();
        assert_eq!(grpc.backoff().base(), Duration::from_secs(1));
        assert_eq!(grpc.backoff().cap(), Duration::from_secs(120));
        assert_eq!(grpc.backoff().multiplier(), 1.6);
        assert_eq!(grpc.backoff().jitter(), Jitter::Proportional(0.2));
        assert!(grpc.budget().is_none() && grpc.deadline().is_none());
        let aws = RetryPolicy::aws_standard().build().unwrap();
        assert_eq!(aws.max_attempts(), 3);
        assert_eq!(aws.backoff().cap(), Duration::from_secs(20));
        let quota = aws.budget().unwrap();
        assert_eq!(quota.capacity(), 500.0);
        // 5 per retry: 100 retries; then 10 per timeout: none left.
        assert_eq!((0..200).filter(|_| quota.try_withdraw_retry()).count(), 100);
        for _ in 0..10 {
            quota.deposit(); // 1 token per first attempt
        }
        assert!(quota.try_withdraw_timeout());
        assert!(!quota.try_withdraw_timeout() && !quota.try_withdraw_retry());
    }

    #[test]
    fn clones_share_the_budget() {
        let a = RetryPolicy::builder()
            .budget(1.0, 0.0, 1.0)
            .build()
            .unwrap();
        let b = a.clone();
        assert!(a.budget().unwrap().try_withdraw_retry());
        assert!(!b.budget().unwrap().try_withdraw_retry());
    }
}
