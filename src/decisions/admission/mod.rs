//! Retry admission: whether a retry may go out now, decided for every clone
//! of a client and kept per host ([`Partition`]).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use reqwest_safe_retry::admission::{
//!     AdaptiveAdmission, AdaptiveConfig, Admission, AttemptRecord, AttemptResult, Partition,
//!     RetryAdmission, RetryKind, RetryRequest,
//! };
//!
//! let admission = AdaptiveAdmission::new(AdaptiveConfig {
//!     capacity: 1.0,
//!     ..AdaptiveConfig::default()
//! })
//! .unwrap();
//! let host = Partition::of_url(&"https://api.example.com/".parse().unwrap());
//! let now = Instant::now();
//! let retry = RetryRequest::new(RetryKind::Transient, Duration::ZERO);
//! // One token: the first retry goes out at once.
//! assert!(matches!(admission.admit(host, retry, now), Admission::Admit(_)));
//! // The bucket is empty: the next one waits instead of failing…
//! assert!(matches!(admission.admit(host, retry, now), Admission::Wait(_)));
//! // …until a probe is due, 250 ms after the bucket ran dry.
//! let then = now + Duration::from_millis(250);
//! let Admission::Admit(probe) = admission.admit(host, retry, then) else { panic!() };
//! assert!(probe.is_probe());
//! // Another host is not held back by this one's empty bucket.
//! let other = Partition::named("another host");
//! assert!(matches!(admission.admit(other, retry, then), Admission::Admit(_)));
//! // The probe succeeded: evidence of recovery releases waiting retries,
//! // paced (10 per second, growing while they succeed).
//! admission.record(host, AttemptRecord::new(2, Some(probe), AttemptResult::Success), then);
//! let later = then + Duration::from_millis(100);
//! assert!(matches!(admission.admit(host, retry, later), Admission::Admit(_)));
//! ```
//!
//! # Why admission and not only a maximum of attempts
//!
//! `max_attempts = 3` caps one call, not the fleet: during an outage every
//! call makes three attempts and the failing service sees three times its
//! normal load exactly when it can least take it — and with retries at `k`
//! layers of a call chain, `3^k` times. A budget ties retries to real
//! traffic: each first attempt deposits a fraction of a token (10 % by
//! default) and each retry spends a whole one, so retries stay near a tenth
//! of traffic however long the outage lasts (Google SRE book, ch. 22; gRPC
//! retry throttling; Finagle and Envoy ship the same idea on by default).
//!
//! A budget that *refuses* a retry when it is empty ([`TokenBucket`], "fail
//! fast") pays for that with the short blips retries exist for: 400 calls
//! that fail together for one second drain it in milliseconds, and every one
//! of them fails. The default, [`AdaptiveAdmission`], makes such a retry
//! *wait* instead (bounded by its deadline), sends probes at a floor rate
//! while the failures continue, and releases the waiting retries at a rate
//! that grows while retries succeed (slow start) and halves when they
//! fail. First attempts are never held back.
//!
//! # Why per host
//!
//! One client calls many hosts (reqwest's advice is to build one and reuse
//! it), but failure is per host. With one budget per client, a dead host
//! drains the tokens a healthy host's retries need, and a healthy host's
//! successes reset the dead host's probe back-off. Every strategy here
//! therefore keeps its state per [`Partition`]: the request's scheme, host
//! and port by default, or a key of the caller's choosing
//! ([`crate::RequestOptions::partition`]). The table of hosts is bounded
//! ([`AdaptiveConfig::max_partitions`]); idle hosts are dropped first.
//!
//! # Rate-limited hosts
//!
//! A 429 or a spent quota (`RateLimit: …;r=0`, `X-RateLimit-Remaining:
//! 0`) puts the [`Route`] it came from into *pacing*: the route's
//! retries wait for release slots spaced at the rate it accepts, none
//! before its Retry-After or its reset ([`Admission::Paced`],
//! [`GrantSource::Paced`]); its first attempts wait, through
//! [`RetryAdmission::admit_first`], only while a spent quota's reset has
//! not come ([`FirstAttemptPacing`]). A limit is its caller's
//! ([`Route::for_caller`]) under its policy's name; several routes it
//! throttled within a second, none succeeding, are paced as one until
//! calm, never a route that did not meet it. A 503 with Retry-After paces
//! nothing. A wait spends no attempt ([`crate::RetryReport::rate_limit_wait`]).
//! Why and how: the `pacing` and `adaptive/scope` modules' docs.
//!
//! # Writing your own
//!
//! [`RetryAdmission`] is object-safe; hedged requests can share one
//! instance with the retry loop through
//! `RetryPolicyBuilder::shared_admission`. The circuit breaker is built in
//! (`RetryPolicyBuilder::circuit_breaker`, [`CircuitBreakerConfig`]).

use std::fmt;
use std::time::{Duration, Instant};

use crate::signals::rate_limit::RateLimit;
use crate::vocabulary::{Partition, Route};

mod adaptive;
mod breaker;
mod pacing;
mod partitions;
mod token_bucket;

pub use adaptive::{AdaptiveAdmission, AdaptiveConfig};
pub(crate) use breaker::CircuitBreaker;
pub use breaker::CircuitBreakerConfig;
/// The bounded per-host map, shared with the hedger's latency table.
pub(super) use partitions::{Bounds, Partitions};
pub use token_bucket::{NoAdmission, TokenBucket, TokenBucketConfig};

/// Decides, for every clone of a client, whether a retry may go out now.
///
/// Every call names the [`Partition`] (by default the host) it is made
/// for; an implementation keeps its state per partition, or ignores it to
/// decide for the whole client. The engine calls
/// [`RetryAdmission::first_attempt`] when a logical operation starts,
/// [`RetryAdmission::admit_first`] before the first attempt (unless the
/// policy opts out), [`RetryAdmission::admit`] when a retry has slept its
/// backoff and is about to be sent, and [`RetryAdmission::record`] after
/// every attempt, with what the answer said about the host's rate. Time comes from the policy's clock, so an implementation
/// is tested with a `time::ManualClock` (feature `test-util`) and no real sleeping.
pub trait RetryAdmission: Send + Sync + fmt::Debug + 'static {
    /// A logical operation sends its first attempt. First attempts are never
    /// held back; this only lets the admission count traffic.
    fn first_attempt(&self, partition: Partition, now: Instant);

    /// Whether a retry of this kind could be admitted at all, asked before
    /// the backoff sleep so that a strategy that fails fast fails before
    /// sleeping. Nothing is spent. The default says yes.
    fn may_admit(&self, partition: Partition, kind: RetryKind) -> bool {
        let _ = (partition, kind);
        true
    }

    /// May this retry be sent now? Called after the backoff sleep, so a
    /// retry is counted when it is sent, not when it starts sleeping.
    fn admit(&self, partition: Partition, retry: RetryRequest, now: Instant) -> Admission;

    /// May a first attempt be sent now? First attempts are never held back
    /// by a budget; this asks only whether the route is paced in a way
    /// that `pacing` says holds first attempts: then the answer may be
    /// [`Admission::Paced`], or a grant of [`GrantSource::Paced`] to pass
    /// back in the attempt's [`AttemptRecord`]. `waited` is how long this
    /// first attempt has waited so far. Any other answer sends it at once.
    /// The default sends every first attempt at once.
    ///
    /// `route` is the request's [`Route`] within the partition: a pacing
    /// is kept for the route that was throttled, so one throttled endpoint
    /// holds no other.
    fn admit_first(
        &self,
        partition: Partition,
        route: Route,
        pacing: FirstAttemptPacing,
        waited: Duration,
        now: Instant,
    ) -> Admission {
        let _ = (partition, route, pacing, waited, now);
        Admission::Admit(Grant::new(GrantSource::Free, 0.0))
    }

    /// How an attempt ended, with the grant it was sent under (`None` for a
    /// first attempt). A hedged attempt is recorded as the attempt (the
    /// answer used) and as its hedge (its grant and result, [`AttemptResult::Other`]
    /// if dropped before it answered; never if the call is dropped mid-race).
    /// An attempt sent under a grant whose call is dropped before it ends
    /// is recorded as `Other`, freeing its place (a paced release, a probe).
    fn record(&self, partition: Partition, attempt: AttemptRecord, now: Instant);
}

/// Which pacing holds a first attempt back
/// ([`RetryAdmission::admit_first`]): a first attempt is the call the
/// caller would have made with no retry layer, so by default only the
/// server's own numbers hold one (`RetryPolicyBuilder::pace_first_attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FirstAttemptPacing {
    /// Held only while the route's quota is spent: from a `RateLimit: …;r=0`
    /// or `X-RateLimit-Remaining: 0` with a reset the policy accepts, until
    /// that reset. The calls held go out at the route's rate after it, not
    /// as one wave; a call that arrives after the reset goes at once. The
    /// default.
    #[default]
    SpentQuota,
    /// Held by every pacing of the route: after a 429 its new calls wait
    /// for release slots too, so a burst reaches the host at the rate it
    /// accepts, at the price of holding calls that a server shedding load
    /// whatever the rate would have answered.
    Always,
}

/// What kind of failure a retry follows; strategies may price them
/// differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryKind {
    /// A transient failure (5xx, a reset, a refused connection).
    Transient,
    /// The attempt timed out.
    Timeout,
    /// The server throttled the request (429).
    Throttled,
    /// Not a retry: a second copy of a request still in flight, sent
    /// because the first is slower than its host's usual latency (see
    /// [`crate::hedging::HedgeConfig`]). A hedge asks once and never waits: an
    /// answer other than [`Admission::Admit`] sends no hedge.
    Hedge,
}

/// A retry asking for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryRequest {
    kind: RetryKind,
    waited: Duration,
    route: Route,
    last: bool,
}

impl RetryRequest {
    /// A retry of `kind` that has already waited `waited` for admission.
    pub const fn new(kind: RetryKind, waited: Duration) -> Self {
        RetryRequest {
            kind,
            waited,
            route: Route::WHOLE,
            last: false,
        }
    }

    /// The same request, said to be (or not) its call's last attempt: a
    /// paced route sends a last attempt only at a rate it has seen
    /// accepted, never in a step up (a refusal would fail the call).
    #[must_use]
    pub const fn last_attempt(mut self, last: bool) -> Self {
        self.last = last;
        self
    }

    /// Whether it is its call's last attempt (`false` unless said).
    pub fn is_last_attempt(&self) -> bool {
        self.last
    }

    /// The same request, on `route` of its partition.
    #[must_use]
    pub const fn on_route(mut self, route: Route) -> Self {
        self.route = route;
        self
    }

    /// The route of its partition it is on ([`Route::WHOLE`] unless said).
    pub fn route(&self) -> Route {
        self.route
    }

    /// The kind of failure it follows.
    pub fn kind(&self) -> RetryKind {
        self.kind
    }

    /// How long it has waited for admission so far: the time elapsed since
    /// it first asked, not the sum of the waits it was told.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

/// The answer to [`RetryAdmission::admit`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Admission {
    /// Send it now.
    Admit(Grant),
    /// Ask again after this long (the engine bounds the wait by the
    /// deadline).
    Wait(Duration),
    /// Give up: the operation ends with `budget_exhausted`.
    Refuse,
    /// Ask again after this long: the host is paced to the rate it accepts,
    /// or its quota is spent until a reset (the engine bounds the wait by
    /// the deadline; the report counts it as a wait for the server's rate).
    Paced(Duration),
}

/// Why a retry was admitted, and what it cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    source: GrantSource,
    cost: f64,
}

/// Where an admission came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrantSource {
    /// Paid from the token bucket.
    Token,
    /// Released by evidence of recovery (slow start).
    Released,
    /// A probe, sent at the floor rate while failures continue.
    Probe,
    /// Free: no admission control.
    Free,
    /// A release slot of a paced host (one that throttled, or whose quota
    /// is spent).
    Paced,
    /// A hedge ([`RetryKind::Hedge`]) paid from the token bucket: its answer
    /// is not a retry's, and says nothing of an outage's recovery.
    Hedge,
}

impl Grant {
    /// A grant from `source` that cost `cost` tokens.
    pub fn new(source: GrantSource, cost: f64) -> Self {
        Grant { source, cost }
    }

    /// Where it came from.
    pub fn source(&self) -> GrantSource {
        self.source
    }

    /// The tokens it cost (refunded by strategies that refund a retry that
    /// succeeds).
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// Whether it is a probe.
    pub fn is_probe(&self) -> bool {
        self.source == GrantSource::Probe
    }

    /// Whether it is a paced host's release slot.
    pub fn is_paced(&self) -> bool {
        self.source == GrantSource::Paced
    }
}

/// How one attempt ended, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptResult {
    /// It succeeded.
    Success,
    /// It failed transiently: the server or the network is (still) failing.
    Failure,
    /// Anything else (a permanent answer): no evidence either way.
    Other,
}

/// One finished attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptRecord {
    attempt: u32,
    grant: Option<Grant>,
    result: AttemptResult,
    throttled: bool,
    too_fast: bool,
    retry_after: Option<Duration>,
    rate_limit: Option<RateLimit>,
    route: Route,
}

impl AttemptRecord {
    /// Attempt number `attempt` (1 for the first), sent under `grant`
    /// (`None` for a first attempt), ended with `result`.
    pub fn new(attempt: u32, grant: Option<Grant>, result: AttemptResult) -> Self {
        AttemptRecord {
            attempt,
            grant,
            result,
            throttled: false,
            too_fast: false,
            retry_after: None,
            rate_limit: None,
            route: Route::WHOLE,
        }
    }

    /// The same attempt, made on `route` of its partition.
    #[must_use]
    pub fn on_route(mut self, route: Route) -> Self {
        self.route = route;
        self
    }

    /// The route of its partition it was made on.
    pub fn route(&self) -> Route {
        self.route
    }

    /// The throttling answer said the requests came too fast (a 429), not
    /// only "later" (a 503 with Retry-After): only such an answer says the
    /// rate the host accepts is lower than the rate sent.
    #[must_use]
    pub fn too_fast(mut self) -> Self {
        self.too_fast = true;
        self
    }

    /// Whether the answer said the requests came too fast.
    pub fn was_too_fast(&self) -> bool {
        self.too_fast
    }

    /// The answer was a throttling one (429, or 503 with Retry-After),
    /// with the server's Retry-After if it sent one.
    #[must_use]
    pub fn throttled(mut self, retry_after: Option<Duration>) -> Self {
        self.throttled = true;
        self.retry_after = retry_after;
        self
    }

    /// The answer carried rate-limit fields.
    #[must_use]
    pub fn with_rate_limit(mut self, rate_limit: RateLimit) -> Self {
        self.rate_limit = Some(rate_limit);
        self
    }

    /// Whether the answer was a throttling one.
    pub fn was_throttled(&self) -> bool {
        self.throttled
    }

    /// The Retry-After of a throttling answer.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The rate-limit fields the answer carried.
    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.rate_limit
    }

    /// The attempt number, 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The grant a retry was sent under; `None` for a first attempt.
    pub fn grant(&self) -> Option<Grant> {
        self.grant
    }

    /// How it ended.
    pub fn result(&self) -> AttemptResult {
        self.result
    }
}
