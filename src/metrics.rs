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

use std::sync::atomic::{AtomicU64, Ordering};

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
    attempts: [AtomicU64; BUCKETS],
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Logical calls started.
    pub calls: u64,
    /// Calls whose first attempt did not succeed.
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
    /// Delays set by a server's Retry-After.
    pub retry_after_honoured: u64,
    /// Calls given up because another attempt would not fit the deadline
    /// (including a Retry-After longer than the time left).
    pub deadline_give_ups: u64,
    /// `attempts_per_call[i]` counts calls that made `i + 1` attempts; the
    /// last bucket counts calls that made more.
    pub attempts_per_call: Vec<u64>,
}

impl Metrics {
    pub(crate) fn call_started(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn first_attempt_failed(&self) {
        self.first_attempt_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn retried(&self, by_retry_after: bool) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        if by_retry_after {
            self.retry_after_honoured.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn budget_rejected(&self) {
        self.budget_rejections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn admitted(&self, probe: bool) {
        self.admissions.fetch_add(1, Ordering::Relaxed);
        if probe {
            self.probes.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn waited(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn deadline_gave_up(&self) {
        self.deadline_give_ups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn circuit_refused(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.final_failures.fetch_add(1, Ordering::Relaxed);
        self.circuit_rejections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn call_finished(&self, attempts: u32, success: bool) {
        if !success {
            self.final_failures.fetch_add(1, Ordering::Relaxed);
        }
        let i = (attempts.max(1) as usize - 1).min(BUCKETS - 1);
        self.attempts[i].fetch_add(1, Ordering::Relaxed);
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
            attempts_per_call: self.attempts.iter().map(get).collect(),
        }
    }
}
