//! The builder: every knob of a [`crate::RetryPolicy`], validated in `build()`,
//! and the presets. It stands on top of every floor, as the one place that
//! chooses the admission, the classifiers, the clock and the headers a
//! policy is built with.
//!
//! May use: `vocabulary`, `signals`, `decisions`, `engine`, `http`.
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
//!     .build()
//!     .unwrap();
//! assert_eq!(policy.max_attempts(), 4);
//! ```
//!
//! A policy is cheap to clone, and clones share what must be shared: the
//! retry admission, the random source, the clock, the sleeper and the
//! counters. Build a second policy to get a second admission.

mod build;
mod presets;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
#[cfg(any(test, feature = "test-util"))]
use rand::rngs::StdRng;
#[cfg(any(test, feature = "test-util"))]
use rand::SeedableRng;

use crate::decisions::{
    AdaptiveConfig, CircuitBreakerConfig, FirstAttemptPacing, HedgeConfig, Jitter, RetryAdmission,
    TokenBucketConfig,
};
#[cfg(any(test, feature = "test-util"))]
use crate::engine::ManualClock;
use crate::engine::{Clock, Rng, Sleeper, SystemClock, TokioSleeper};
use crate::http::DEFAULT_DEADLINE_HEADER;
use crate::signals::Classifier;
use crate::vocabulary::{ConfigError, KeyFormat, KeyGenerator};

/// Which retry admission a built policy gets.
#[derive(Debug)]
enum AdmissionChoice {
    Adaptive(AdaptiveConfig),
    TokenBucket(TokenBucketConfig),
    Shared(Arc<dyn RetryAdmission>),
    None,
}

/// Builds a [`crate::RetryPolicy`]; a bad setting is kept and reported by
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
    throttle_backoff: Option<(Duration, Duration)>,
    pace_first_attempts: FirstAttemptPacing,
    admission: AdmissionChoice,
    circuit_breaker: Option<CircuitBreakerConfig>,
    hedge: Option<HedgeConfig>,
    replay_limit: usize,
    replay_cap: usize,
    rng: Option<Rng>,
    sleeper: Arc<dyn Sleeper>,
    clock: Arc<dyn Clock>,
    classifiers: Vec<Arc<dyn Classifier>>,
}

fn header_name(setting: &'static str, name: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| ConfigError::named(setting, "not a valid header name"))
}

impl RetryPolicyBuilder {
    pub(crate) fn new() -> Self {
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
            deadline_header: Ok(Some(HeaderName::from_static(DEFAULT_DEADLINE_HEADER))),
            attempt_header: Ok(None),
            throttle_backoff: None,
            pace_first_attempts: FirstAttemptPacing::SpentQuota,
            admission: AdmissionChoice::Adaptive(AdaptiveConfig::default()),
            circuit_breaker: None,
            hedge: None,
            replay_limit: 1 << 20,
            replay_cap: 16 << 20,
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
    /// be worth starting, and at a call's start for its first: an HTTP call
    /// whose deadline (its own, or inherited from the request a service is
    /// serving) leaves less sends nothing and fails at once as a timeout.
    /// Default 100 ms.
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
        self.key_header = header_name("idempotency_header", name);
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
        self.verdict_header = header_name("server_verdict_header", name).map(Some);
        self
    }

    /// Ignore any server verdict header.
    pub fn no_server_verdict_header(mut self) -> Self {
        self.verdict_header = Ok(None);
        self
    }

    /// Send the time left before the deadline, in whole milliseconds, in this
    /// header on every attempt, so inner services can stop working on what
    /// nobody waits for ([`crate::deadline::InheritDeadlineLayer`] reads it). Default:
    /// sent, as `Request-Timeout-Ms` ([`crate::deadline::DEFAULT_DEADLINE_HEADER`]),
    /// whenever the call has a deadline.
    pub fn deadline_header(mut self, name: &str) -> Self {
        self.deadline_header = header_name("deadline_header", name).map(Some);
        self
    }

    /// Send no deadline header.
    pub fn no_deadline_header(mut self) -> Self {
        self.deadline_header = Ok(None);
        self
    }

    /// Send the attempt number (1 for the first) in this header, like Envoy's
    /// `x-envoy-attempt-count`. Default: not sent.
    pub fn attempt_count_header(mut self, name: &str) -> Self {
        self.attempt_header = header_name("attempt_count_header", name).map(Some);
        self
    }

    /// The backoff after a throttling answer (429) when it should differ
    /// from the one after other transient failures (AWS: 1 s and 20 s).
    /// Default: the same backoff.
    pub fn throttle_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.throttle_backoff = Some((base, cap));
        self
    }

    /// Whether first attempts to a throttled route wait for its pacing too.
    ///
    /// `false`, the default ([`FirstAttemptPacing::SpentQuota`]): a new
    /// call waits only while the server's own numbers say its route's
    /// quota is spent, until the reset; a 429 paces the route's retries,
    /// never its new calls, so no call the caller would have made without
    /// a retry layer is held on a guess about the server's rate. `true`
    /// ([`FirstAttemptPacing::Always`]): after a 429 the route's new calls
    /// wait for release slots like its retries, so a burst reaches a
    /// rate-limited host at the rate it accepts (1.05–1.2× the calls
    /// instead of about 2×), at the price of holding calls that a server
    /// shedding load whatever the rate would have answered. A first
    /// attempt never waits past its deadline's last attempt window: then
    /// it goes, and the server answers.
    pub fn pace_first_attempts(mut self, pace: bool) -> Self {
        self.pace_first_attempts = if pace {
            FirstAttemptPacing::Always
        } else {
            FirstAttemptPacing::SpentQuota
        };
        self
    }

    /// Adaptive retry admission with these settings (the default, with
    /// [`AdaptiveConfig::default`]): a retry that finds no room waits,
    /// probes go out at a floor rate while failures continue, and successes
    /// release the waiting retries with slow start.
    pub fn adaptive_admission(mut self, config: AdaptiveConfig) -> Self {
        self.admission = AdmissionChoice::Adaptive(config);
        self
    }

    /// A plain token bucket that fails fast: a retry that finds it empty
    /// ends the operation with `budget_exhausted` at once.
    pub fn token_bucket(mut self, config: TokenBucketConfig) -> Self {
        self.admission = AdmissionChoice::TokenBucket(config);
        self
    }

    /// Share an admission, for example between two clients that call the
    /// same service, or with your own [`RetryAdmission`].
    pub fn shared_admission(mut self, admission: Arc<dyn RetryAdmission>) -> Self {
        self.admission = AdmissionChoice::Shared(admission);
        self
    }

    /// No retry admission at all ("none"): only attempts and the deadline
    /// bound retries.
    pub fn no_budget(mut self) -> Self {
        self.admission = AdmissionChoice::None;
        self
    }

    /// Turn on the circuit breaker, per host: while a host keeps failing,
    /// first attempts to it too are refused locally and at once, with
    /// [`crate::StopReason::CircuitOpen`] (no attempt is made). Google SRE's
    /// client-side adaptive throttling: a call is refused with probability
    /// `max(0, (requests − K·accepts) / (requests + 1))` over a sliding
    /// window, and never while the window is quiet or the failures are
    /// younger than a blip (see [`CircuitBreakerConfig`]). It guards calls
    /// made through the middleware; the generic [`crate::retry::retry`] has no
    /// value to return without an attempt, so it only feeds the breaker.
    /// Default: off.
    pub fn circuit_breaker(mut self, config: CircuitBreakerConfig) -> Self {
        self.circuit_breaker = Some(config);
        self
    }

    /// Turn on hedged requests: an attempt still unanswered after its
    /// host's usual latency (the `percentile` of recent ones) gets a second
    /// copy, and the first answer wins. Off by default, because it adds
    /// load (at most `max_extra_load` of first attempts, and every hedge is
    /// admitted by the retry admission like a retry). Only requests safe to
    /// send twice are hedged; see [`HedgeConfig`].
    pub fn hedge(mut self, config: HedgeConfig) -> Self {
        self.hedge = Some(config);
        self
    }

    /// Turn hedging off (the default).
    pub fn no_hedge(mut self) -> Self {
        self.hedge = None;
        self
    }

    /// Keep up to `bytes` of a streamed request body as it is sent, so a
    /// retry or a hedge can send it again (default 1 MiB; 0 turns it off).
    /// A body that outgrows it is sent on, once: the call stops with
    /// [`StopReason::BodyTooLargeToReplay`](crate::StopReason::BodyTooLargeToReplay).
    pub fn body_replay_limit(mut self, bytes: usize) -> Self {
        self.replay_limit = bytes;
        self
    }

    /// The most bytes the replay buffers of all calls keep together
    /// (default 16 MiB). A call that finds no room is sent as if it had no
    /// buffer, once; the cap never holds a body back.
    pub fn body_replay_cap(mut self, bytes: usize) -> Self {
        self.replay_cap = bytes;
        self
    }

    /// Seed the random source, for reproducible delays in tests (feature
    /// `test-util`). Not in a production build: the same seed on many
    /// clients recreates synchronized retries. Default: seeded from the OS.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Some(Box::new(StdRng::seed_from_u64(seed)));
        self
    }

    /// Use this random source, in tests (feature `test-util`).
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn rng(mut self, rng: impl rand::Rng + Send + 'static) -> Self {
        self.rng = Some(Box::new(rng));
        self
    }

    /// Use this sleeper: one that ends early when the service shuts down,
    /// say (see [`crate::time`]). Tests use a `ManualClock` (feature
    /// `test-util`) or tokio's paused time, which the default follows.
    pub fn sleeper(mut self, sleeper: impl Sleeper) -> Self {
        self.sleeper = Arc::new(sleeper);
        self
    }

    /// Use this clock (see [`crate::time`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Use one [`ManualClock`](crate::time::ManualClock) as both clock and
    /// sleeper: sleeps return at once and move the clock (feature
    /// `test-util`).
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn manual_clock(self, clock: &ManualClock) -> Self {
        self.clock(clock.clone()).sleeper(clock.clone())
    }

    /// Add a classifier consulted before the server verdict and the default
    /// table; classifiers added earlier are asked first.
    pub fn classifier(mut self, classifier: impl Classifier) -> Self {
        self.classifiers.push(Arc::new(classifier));
        self
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
            .field("admission", &self.admission)
            .field("circuit_breaker", &self.circuit_breaker)
            .field("hedge", &self.hedge)
            .finish_non_exhaustive()
    }
}
