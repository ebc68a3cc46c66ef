//! The settings of the adaptive admission, by name, and their defaults.

use std::time::Duration;

/// The settings of an [`crate::admission::AdaptiveAdmission`], by name.
///
/// The defaults hold the three lines of BENCHMARKS.md: a 1 s blip of 400
/// calls ≥ 97 % succeed at ≤ 2.5× the traffic, a long outage stays ≤ 1.15×,
/// and a quiet process is never refused a retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// Tokens at the start and the most the bucket holds: the burst of
    /// retries admitted at once. Default 10.
    pub capacity: f64,
    /// Tokens each first attempt deposits: retries stay near this fraction
    /// of traffic in an outage. Default 0.1.
    pub first_attempt_deposit: f64,
    /// Cost of a retry paid from the bucket. Default 1.
    pub retry_cost: f64,
    /// The floor rate: with the bucket empty, one retry per this interval
    /// goes out as a probe, the first one this long after the bucket ran
    /// dry. At most one probe per host is in flight (one whose caller never
    /// reports back is presumed lost after `max_admission_wait`, or the
    /// current probe interval if longer). Default 250 ms.
    pub probe_interval: Duration,
    /// Each failed probe doubles the interval (counted from its failure) up
    /// to this, so a long outage costs a handful of probes; a success to
    /// the same host resets it. Default 16 s.
    pub max_probe_interval: Duration,
    /// Slow start: each successful retry raises the rate at which waiting
    /// retries are released by this many per second (so the rate grows
    /// exponentially while retries succeed); each failed retry halves it,
    /// and it halves for every second without a successful retry. 0 (only
    /// probes) or at least 1. Default 10.
    pub release_step: f64,
    /// The highest release rate, retries per second; at least 1. Default
    /// 10 000.
    pub max_release_rate: f64,
    /// How often a waiting retry asks again. Default 20 ms.
    pub poll_interval: Duration,
    /// The longest a retry waits for admission before the operation ends
    /// with `budget_exhausted` (the deadline bounds it too). Default 10 s.
    pub max_admission_wait: Duration,
    /// The most hosts (partitions) whose state is kept (rounded down to a
    /// multiple of 16, and at least 16); each costs about 200 bytes, plus
    /// 48 bytes per retry waiting on it. When the table is
    /// full, hosts idle past `partition_idle_expiry` are dropped first, and
    /// else the least recently used. Default 10 000 (about 3 MB: the
    /// table rounds its buckets up to a power of two).
    pub max_partitions: usize,
    /// A host unused for this long is the first dropped when room is
    /// needed; a dropped host starts again fresh. Default 5 minutes.
    pub partition_idle_expiry: Duration,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            capacity: 10.0,
            first_attempt_deposit: 0.1,
            retry_cost: 1.0,
            probe_interval: Duration::from_millis(250),
            max_probe_interval: Duration::from_secs(16),
            release_step: 10.0,
            max_release_rate: 10_000.0,
            poll_interval: Duration::from_millis(20),
            max_admission_wait: Duration::from_secs(10),
            max_partitions: 10_000,
            partition_idle_expiry: Duration::from_secs(300),
        }
    }
}
