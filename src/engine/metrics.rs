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
//! happens, through the `metrics` crate's facade: the application installs
//! an exporter (metrics-exporter-prometheus, an OpenTelemetry bridge, …)
//! and the counters reach it without code of ours or theirs. Without an
//! installed recorder a publication is one load of a global and nothing
//! else.

use std::sync::atomic::{AtomicU64, Ordering};

/// The names the `metrics` feature publishes under.
///
/// OpenTelemetry's semantic conventions have no metric for retries (only
/// the `http.request.resend_count` attribute, which the `tracing` events
/// carry), so the names follow its naming rules in this crate's namespace:
/// lowercase, dot-separated, counters without a `_total` suffix. A
/// Prometheus exporter turns the dots into underscores
/// (`reqwest_safe_retry_retries`; OpenTelemetry's adds `_total`). Each
/// counter is the
/// [`MetricsSnapshot`] field of the same name; all policies of a process
/// add up under one name.
#[cfg(feature = "metrics")]
pub mod names {
    /// Counter: logical calls started.
    pub const CALLS: &str = "reqwest_safe_retry.calls";
    /// Counter: calls whose first attempt did not succeed (a throttling
    /// answer is counted in `THROTTLED` instead).
    pub const FIRST_ATTEMPT_FAILURES: &str = "reqwest_safe_retry.first_attempt_failures";
    /// Counter: retries made (attempts after the first).
    pub const RETRIES: &str = "reqwest_safe_retry.retries";
    /// Counter: calls that ended without success.
    pub const FINAL_FAILURES: &str = "reqwest_safe_retry.final_failures";
    /// Counter: retries given up for lack of admission.
    pub const BUDGET_REJECTIONS: &str = "reqwest_safe_retry.budget_rejections";
    /// Counter: retries admitted and sent.
    pub const ADMISSIONS: &str = "reqwest_safe_retry.admissions";
    /// Counter: of the admissions, the probes sent while failures continued.
    pub const PROBES: &str = "reqwest_safe_retry.probes";
    /// Counter: retries that had to wait for admission.
    pub const WAITS: &str = "reqwest_safe_retry.waits";
    /// Counter: throttling answers (429, or 503 with Retry-After), not
    /// counted as first-attempt failures.
    pub const THROTTLED: &str = "reqwest_safe_retry.throttled";
    /// Counter: attempts that waited for a paced host's rate or a spent
    /// quota's reset.
    pub const RATE_LIMIT_WAITS: &str = "reqwest_safe_retry.rate_limit_waits";
    /// Counter: delays set by a server's Retry-After.
    pub const RETRY_AFTER_HONOURED: &str = "reqwest_safe_retry.retry_after_honoured";
    /// Counter: calls given up because another attempt would not fit the
    /// deadline.
    pub const DEADLINE_GIVE_UPS: &str = "reqwest_safe_retry.deadline_give_ups";
    /// Counter: hedges sent (second copies of a slow attempt).
    pub const HEDGES: &str = "reqwest_safe_retry.hedges";
    /// Counter: of the hedges, those whose answer was used.
    pub const HEDGE_WINS: &str = "reqwest_safe_retry.hedge_wins";
    /// Histogram: attempts per finished call (1 for a call that was not
    /// retried).
    pub const ATTEMPTS: &str = "reqwest_safe_retry.attempts";
}

/// Describes every published metric (its meaning, and the unit of the
/// histogram) to the installed recorder; call it once after installing
/// one. Exporters show the descriptions as `# HELP` lines.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use ::metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(names::CALLS, Unit::Count, "Logical calls started");
    describe_counter!(
        names::FIRST_ATTEMPT_FAILURES,
        Unit::Count,
        "Calls whose first attempt did not succeed"
    );
    describe_counter!(
        names::RETRIES,
        Unit::Count,
        "Retries made (attempts after the first)"
    );
    describe_counter!(
        names::FINAL_FAILURES,
        Unit::Count,
        "Calls that ended without success"
    );
    describe_counter!(
        names::BUDGET_REJECTIONS,
        Unit::Count,
        "Retries given up for lack of admission"
    );
    describe_counter!(names::ADMISSIONS, Unit::Count, "Retries admitted and sent");
    describe_counter!(
        names::PROBES,
        Unit::Count,
        "Admitted retries sent as probes while failures continued"
    );
    describe_counter!(
        names::WAITS,
        Unit::Count,
        "Retries that waited for admission"
    );
    describe_counter!(
        names::THROTTLED,
        Unit::Count,
        "Throttling answers (429, or 503 with Retry-After)"
    );
    describe_counter!(
        names::RATE_LIMIT_WAITS,
        Unit::Count,
        "Attempts that waited for a rate-limited host's pace or reset"
    );
    describe_counter!(
        names::RETRY_AFTER_HONOURED,
        Unit::Count,
        "Delays set by a server's Retry-After"
    );
    describe_counter!(
        names::DEADLINE_GIVE_UPS,
        Unit::Count,
        "Calls given up because another attempt would not fit the deadline"
    );
    describe_counter!(
        names::HEDGES,
        Unit::Count,
        "Hedges sent: second copies of an attempt slower than its host's usual latency"
    );
    describe_counter!(
        names::HEDGE_WINS,
        Unit::Count,
        "Hedges whose answer was used"
    );
    describe_histogram!(names::ATTEMPTS, Unit::Count, "Attempts per finished call");
}

/// Publishes one more of `names::$name` through the `metrics` facade;
/// nothing without the feature.
macro_rules! publish {
    ($name:ident) => {
        #[cfg(feature = "metrics")]
        {
            // What `metrics::counter!` registers, but with the key built
            // (and hashed) once at compile time instead of on every call.
            static KEY: ::metrics::Key = ::metrics::Key::from_static_name(names::$name);
            ::metrics::with_recorder(|r| r.register_counter(&KEY, &METADATA)).increment(1);
        }
    };
}

/// The metadata every published metric is registered with: what the
/// `metrics` macros give one written in this module.
#[cfg(feature = "metrics")]
static METADATA: ::metrics::Metadata<'static> =
    ::metrics::Metadata::new(module_path!(), ::metrics::Level::INFO, Some(module_path!()));

/// Attempts-per-call histogram buckets: 1, 2, …, `BUCKETS - 1`, and one for
/// "more".
const BUCKETS: usize = 11;

/// Lock-free counters shared by every clone of a policy.
#[derive(Debug, Default)]
pub struct Metrics {
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
    /// (including a Retry-After longer than the time left).
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
    pub(crate) fn call_started(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        publish!(CALLS);
    }

    pub(crate) fn first_attempt_failed(&self) {
        self.first_attempt_failures.fetch_add(1, Ordering::Relaxed);
        publish!(FIRST_ATTEMPT_FAILURES);
    }

    pub(crate) fn retried(&self, by_retry_after: bool) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        publish!(RETRIES);
        if by_retry_after {
            self.retry_after_honoured.fetch_add(1, Ordering::Relaxed);
            publish!(RETRY_AFTER_HONOURED);
        }
    }

    pub(crate) fn budget_rejected(&self) {
        self.budget_rejections.fetch_add(1, Ordering::Relaxed);
        publish!(BUDGET_REJECTIONS);
    }

    pub(crate) fn admitted(&self, probe: bool) {
        self.admissions.fetch_add(1, Ordering::Relaxed);
        publish!(ADMISSIONS);
        if probe {
            self.probes.fetch_add(1, Ordering::Relaxed);
            publish!(PROBES);
        }
    }

    pub(crate) fn waited(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        publish!(WAITS);
    }

    pub(crate) fn throttled(&self) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
        publish!(THROTTLED);
    }

    pub(crate) fn waited_for_rate_limit(&self) {
        self.rate_limit_waits.fetch_add(1, Ordering::Relaxed);
        publish!(RATE_LIMIT_WAITS);
    }

    pub(crate) fn deadline_gave_up(&self) {
        self.deadline_give_ups.fetch_add(1, Ordering::Relaxed);
        publish!(DEADLINE_GIVE_UPS);
    }

    pub(crate) fn hedged(&self) {
        self.hedges.fetch_add(1, Ordering::Relaxed);
        publish!(HEDGES);
    }

    pub(crate) fn hedge_won(&self) {
        self.hedge_wins.fetch_add(1, Ordering::Relaxed);
        publish!(HEDGE_WINS);
    }

    pub(crate) fn circuit_refused(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.final_failures.fetch_add(1, Ordering::Relaxed);
        self.circuit_rejections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn call_finished(&self, attempts: u32, success: bool) {
        if !success {
            self.final_failures.fetch_add(1, Ordering::Relaxed);
            publish!(FINAL_FAILURES);
        }
        let i = (attempts.max(1) as usize - 1).min(BUCKETS - 1);
        self.attempts[i].fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        {
            static KEY: ::metrics::Key = ::metrics::Key::from_static_name(names::ATTEMPTS);
            ::metrics::with_recorder(|r| r.register_histogram(&KEY, &METADATA))
                .record(f64::from(attempts.max(1)));
        }
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            calls: get(&self.calls),
            first_attempt_failures: get(&self.first_attempt_failures),
            retries: get(&self.retries),
            final_failures: get(&self.final_failures),
            budget_rejections: get(&self.budget_rejections),
            retry_after_honoured: get(&self.retry_after_honoured),
            deadline_give_ups: get(&self.deadline_give_ups),
            admissions: get(&self.admissions),
            probes: get(&self.probes),
            waits: get(&self.waits),
            circuit_rejections: get(&self.circuit_rejections),
            throttled: get(&self.throttled),
            rate_limit_waits: get(&self.rate_limit_waits),
            hedges: get(&self.hedges),
            hedge_wins: get(&self.hedge_wins),
            attempts_per_call: self.attempts.iter().map(get).collect(),
        }
    }
}
