//! Counters a service can scrape.
//!
//! ```
//! use reqwest_safe_retry::RetryPolicy;
//!
//! let policy = RetryPolicy::default();
//! let snapshot = policy.metrics().snapshot();
//! assert_eq!(snapshot.calls, 0);
//! // Export `snapshot` to Prometheus, StatsD, OpenTelemetry…
//! ```
//!
//! With the `metrics` feature every count is also published, as it
//! happens, through the `metrics` crate's facade, labelled by host, with
//! each attempt's duration beside them: the application installs an
//! exporter (metrics-exporter-prometheus, an OpenTelemetry bridge, …)
//! before building the policy, and the series reach it without code of
//! ours or theirs (see `names` for what is published). A host's handles
//! are made when its first call starts; a publication is then a lookup in
//! a sharded map and an atomic add, with or without a recorder. Without
//! the feature nothing of it is built.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "metrics")]
mod published;
#[cfg(feature = "metrics")]
pub use published::{describe_metrics, names};

/// Publishes one more of a counter for a host through the `metrics`
/// facade; nothing without the feature.
macro_rules! publish {
    ($self:ident, $host:expr, $count:ident) => {
        #[cfg(feature = "metrics")]
        $self
            .published
            .with($host, None, |s| s.count(published::Count::$count));
        #[cfg(not(feature = "metrics"))]
        let _ = $host;
    };
}

/// Attempts-per-call histogram buckets: 1, 2, …, `BUCKETS - 1`, and one for
/// "more".
const BUCKETS: usize = 11;

/// Lock-free counters shared by every clone of a policy.
pub struct Metrics {
    counts: Counts,
    /// The series the `metrics` feature publishes, by host.
    #[cfg(feature = "metrics")]
    published: published::Published,
}

/// The hosts labelled apart by a [`Metrics`] made on its own: the
/// admission's default partition bound (`AdaptiveConfig::max_partitions`).
const DEFAULT_HOSTS: usize = 10_000;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(DEFAULT_HOSTS)
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("counts", &self.snapshot())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    first_attempt_failures: AtomicU64,
    retries: AtomicU64,
    final_failures: AtomicU64,
    budget_rejections: AtomicU64,
    retry_after_honoured: AtomicU64,
    deadline_give_ups: AtomicU64,
    admissions: AtomicU64,
    probes: AtomicU64,
    waits: AtomicU64,
    circuit_rejections: AtomicU64,
    throttled: AtomicU64,
    rate_limit_waits: AtomicU64,
    hedges: AtomicU64,
    hedge_wins: AtomicU64,
    attempts: [AtomicU64; BUCKETS],
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Logical calls started.
    pub calls: u64,
    /// Calls whose first attempt did not succeed, a throttling answer not
    /// included (that is in `throttled`).
    pub first_attempt_failures: u64,
    /// Retries made (attempts after the first).
    pub retries: u64,
    /// Calls that ended without success.
    pub final_failures: u64,
    /// Retries given up for lack of admission: refused by the budget, or
    /// still waiting when the wait reached its bound.
    pub budget_rejections: u64,
    /// Retries admitted and sent.
    pub admissions: u64,
    /// Of the admissions, the probes sent while failures continued.
    pub probes: u64,
    /// Retries that had to wait for admission (admitted or not).
    pub waits: u64,
    /// Calls the circuit breaker refused without an attempt (counted in
    /// `calls` and `final_failures` too, not in `attempts_per_call`).
    pub circuit_rejections: u64,
    /// Throttling answers (429, or 503 with Retry-After), of any attempt:
    /// counted here and not as first-attempt failures.
    pub throttled: u64,
    /// Attempts (first attempts included) that waited for a paced host's
    /// rate or a spent quota's reset.
    pub rate_limit_waits: u64,
    /// Delays set by a server's Retry-After.
    pub retry_after_honoured: u64,
    /// Calls given up because another attempt would not fit the deadline
    /// (including a Retry-After longer than the time left), and calls
    /// refused without an attempt because their deadline left no room
    /// for one (counted in `calls` and `final_failures` too, not in
    /// `attempts_per_call`).
    pub deadline_give_ups: u64,
    /// Hedges sent: second copies of an attempt slower than its host's
    /// usual latency (not counted in `retries` nor `admissions`).
    pub hedges: u64,
    /// Of the hedges, those whose answer was used.
    pub hedge_wins: u64,
    /// `attempts_per_call[i]` counts calls that made `i + 1` attempts; the
    /// last bucket counts calls that made more.
    pub attempts_per_call: Vec<u64>,
}

impl Metrics {
    /// Counters whose published series label at most `hosts` hosts apart
    /// (the rest share `_other`); with the `metrics` feature, the series
    /// that exist before any call are registered at zero now.
    pub(crate) fn new(hosts: usize) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = hosts;
        Metrics {
            counts: Counts::default(),
            #[cfg(feature = "metrics")]
            published: published::Published::new(hosts),
        }
    }

    /// A call starts, to `host` (a partition's digest; 0: no host), sent
    /// to `url`, which names the host's series if it has none yet.
    pub(crate) fn call_started(&self, host: u64, url: Option<&reqwest::Url>) {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.published
            .with(host, url, |s| s.count(published::Count::Calls));
        #[cfg(not(feature = "metrics"))]
        let _ = (host, url);
    }

    pub(crate) fn first_attempt_failed(&self, host: u64) {
        self.counts
            .first_attempt_failures
            .fetch_add(1, Ordering::Relaxed);
        publish!(self, host, FirstAttemptFailures);
    }

    pub(crate) fn retried(&self, host: u64, by_retry_after: bool) {
        self.counts.retries.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, Retries);
        if by_retry_after {
            self.counts
                .retry_after_honoured
                .fetch_add(1, Ordering::Relaxed);
            publish!(self, host, RetryAfterHonoured);
        }
    }

    pub(crate) fn budget_rejected(&self, host: u64) {
        self.counts
            .budget_rejections
            .fetch_add(1, Ordering::Relaxed);
        publish!(self, host, BudgetRejections);
    }

    pub(crate) fn admitted(&self, host: u64, probe: bool) {
        self.counts.admissions.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, Admissions);
        if probe {
            self.counts.probes.fetch_add(1, Ordering::Relaxed);
            publish!(self, host, Probes);
        }
    }

    pub(crate) fn waited(&self, host: u64) {
        self.counts.waits.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, Waits);
    }

    pub(crate) fn throttled(&self, host: u64) {
        self.counts.throttled.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, Throttled);
    }

    pub(crate) fn waited_for_rate_limit(&self, host: u64) {
        self.counts.rate_limit_waits.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, RateLimitWaits);
    }

    pub(crate) fn deadline_gave_up(&self, host: u64) {
        self.counts
            .deadline_give_ups
            .fetch_add(1, Ordering::Relaxed);
        publish!(self, host, DeadlineGiveUps);
    }

    pub(crate) fn hedged(&self, host: u64) {
        self.counts.hedges.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, Hedges);
    }

    pub(crate) fn hedge_won(&self, host: u64) {
        self.counts.hedge_wins.fetch_add(1, Ordering::Relaxed);
        publish!(self, host, HedgeWins);
    }

    /// The breaker refused a call to `host` sent to `url`: a call started
    /// and failed, with no attempt.
    pub(crate) fn circuit_refused(&self, host: u64, url: &reqwest::Url) {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        self.counts.final_failures.fetch_add(1, Ordering::Relaxed);
        self.counts
            .circuit_rejections
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.published.with(host, Some(url), |s| {
            s.count(published::Count::Calls);
            s.count(published::Count::FinalFailures);
            s.count(published::Count::CircuitRejections);
        });
        #[cfg(not(feature = "metrics"))]
        let _ = (host, url);
    }

    /// A call to `host` sent to `url` (0 and `None`: an operation with no
    /// host) was refused with no room left for an attempt before its
    /// deadline: a call started, given up for the deadline, with no attempt.
    pub(crate) fn deadline_refused(&self, host: u64, url: Option<&reqwest::Url>) {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        self.counts.final_failures.fetch_add(1, Ordering::Relaxed);
        self.counts
            .deadline_give_ups
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.published.with(host, url, |s| {
            s.count(published::Count::Calls);
            s.count(published::Count::FinalFailures);
            s.count(published::Count::DeadlineGiveUps);
        });
        #[cfg(not(feature = "metrics"))]
        let _ = (host, url);
    }

    /// An attempt of an HTTP call to `host` took `took`: `method` is its
    /// label, `answer` the status code, or the transport failure's name.
    #[cfg(feature = "metrics")]
    pub(crate) fn attempt_took(
        &self,
        host: u64,
        method: &'static str,
        answer: Result<u16, &'static str>,
        took: std::time::Duration,
    ) {
        let answer = match answer {
            Ok(code) => published::Answer::Status(code),
            Err(kind) => published::Answer::Failed(kind),
        };
        self.published
            .with(host, None, |s| s.duration(method, answer, took));
    }

    pub(crate) fn call_finished(&self, host: u64, attempts: u32, success: bool) {
        let i = (attempts.max(1) as usize - 1).min(BUCKETS - 1);
        self.counts.attempts[i].fetch_add(1, Ordering::Relaxed);
        if !success {
            self.counts.final_failures.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        self.published.with(host, None, |s| {
            if !success {
                s.count(published::Count::FinalFailures);
            }
            s.attempts(attempts.max(1));
        });
        #[cfg(not(feature = "metrics"))]
        let _ = host;
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            calls: get(&self.counts.calls),
            first_attempt_failures: get(&self.counts.first_attempt_failures),
            retries: get(&self.counts.retries),
            final_failures: get(&self.counts.final_failures),
            budget_rejections: get(&self.counts.budget_rejections),
            retry_after_honoured: get(&self.counts.retry_after_honoured),
            deadline_give_ups: get(&self.counts.deadline_give_ups),
            admissions: get(&self.counts.admissions),
            probes: get(&self.counts.probes),
            waits: get(&self.counts.waits),
            circuit_rejections: get(&self.counts.circuit_rejections),
            throttled: get(&self.counts.throttled),
            rate_limit_waits: get(&self.counts.rate_limit_waits),
            hedges: get(&self.counts.hedges),
            hedge_wins: get(&self.counts.hedge_wins),
            attempts_per_call: self.counts.attempts.iter().map(get).collect(),
        }
    }
}
