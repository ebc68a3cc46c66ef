//! The circuit breaker (opt-in, per host): while a host keeps failing, first
//! attempts too are refused locally and at once.
//!
//! # Why, and why this one
//!
//! Admission bounds *retries* to about a tenth of traffic; in a long outage
//! every first attempt still reaches the dead host and waits for its
//! timeout. A breaker spares both sides. Classic three-state breakers
//! (closed, open, half-open) trip on a count and hold every call back for a
//! fixed time, which refuses a short blip's calls along with an outage's.
//! This one is Google SRE's client-side adaptive throttling (SRE book,
//! ch. 21): over a sliding window, per host, a call is refused with
//! probability
//!
//! ```text
//! max(0, (requests − K·accepts) / (requests + 1))
//! ```
//!
//! where `requests` counts attempts (and calls refused locally) and
//! `accepts` those the host did not fail. It needs no threshold tuned per
//! host, lets calls through in proportion to what the host still accepts,
//! and recovers by itself as successes come back. Two guards keep it from
//! refusing what it must not:
//!
//! - a quiet process is never refused: nothing is refused while the window
//!   holds fewer than `min_requests` requests;
//! - a blip is never refused: nothing is refused until the host has been
//!   failing for `min_failing`, and only while the attempts that ended in
//!   the last fifth of the window (two seconds by default) still fail more
//!   than `1 − 1/K` of the time, or none ended there (the calls let
//!   through hang until their timeout, or all were refused: the last
//!   evidence stands). A quiet spell (no call asked and no attempt ended
//!   in that last fifth of the window) ends a failing stretch: the calls
//!   after it are a new blip, however recent the last failure. A failure
//!   older than the whole window is forgotten. Refused calls are not
//!   attempts: the first success after a host comes back lets every call
//!   through again. An attempt timeout longer than the window weakens the
//!   breaker against a host that hangs.
//!
//! Refusals are spread out, not drawn at random: each call adds
//! `1 − probability` to a credit and goes out when the credit reaches one,
//! so exactly that share of calls goes through, and tests are deterministic.
//!
//! # With the other features
//!
//! - **Pacing.** A 429 is a limit of a route and a caller, which the
//!   pacing keeps: the breaker does not hear of it, so one route over its
//!   limit opens no breaker for the host's other routes and callers. A
//!   429 that also says "do not retry" is a failure, as every such answer
//!   is; so is a 503, with a Retry-After or without.
//! - **Replicas.** One replica's failure while another address of the
//!   host is healthy is not counted: the host still answers.
//! - **Hedging.** Asked once per call, before its first attempt; it counts
//!   the answer each attempt's race returned, the losing copy's not at
//!   all.
//! - **Deadlines.** A refused call spends none of its deadline; an attempt
//!   that times out is a failure (see the window above for a timeout
//!   longer than it).

use std::time::{Duration, Instant};

use crate::vocabulary::{ConfigError, Partition};

use super::partitions::{Bounds, Partitions};

/// Buckets of the sliding window.
const BUCKETS: usize = 10;

/// The buckets, newest first, that say whether a host fails *now*.
const RECENT: u64 = 2;

/// The settings of the circuit breaker, by name; see
/// `RetryPolicyBuilder::circuit_breaker`.
///
/// ```
/// use std::time::Duration;
/// use reqwest_safe_retry::RetryPolicy;
/// use reqwest_safe_retry::admission::CircuitBreakerConfig;
///
/// let policy = RetryPolicy::builder()
///     .circuit_breaker(CircuitBreakerConfig {
///         window: Duration::from_secs(30),
///         ..CircuitBreakerConfig::default()
///     })
///     .build()
///     .unwrap();
/// # let _ = policy;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CircuitBreakerConfig {
    /// `K`: calls are refused only while the host fails more than
    /// `1 − 1/K` of its requests (2: more than half). At least 1; lower is
    /// more eager to refuse. Default 2 (the SRE book's).
    pub accept_multiplier: f64,
    /// The sliding window over which requests and accepts are counted.
    /// Default 10 s (recovery after an outage takes about as long).
    pub window: Duration,
    /// Nothing is refused while the window holds fewer requests: a quiet
    /// process is never refused. Default 20.
    pub min_requests: u32,
    /// Nothing is refused until the host has been failing for this long: a
    /// blip is never refused. Default 2 s.
    pub min_failing: Duration,
    /// The most hosts whose state is kept (rounded down to a multiple of
    /// 16, and at least 16), about 300 bytes each. Default 10 000.
    pub max_partitions: usize,
    /// A host unused for this long is the first dropped when room is
    /// needed. Default 5 minutes.
    pub partition_idle_expiry: Duration,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        CircuitBreakerConfig {
            accept_multiplier: 2.0,
            window: Duration::from_secs(10),
            min_requests: 20,
            min_failing: Duration::from_secs(2),
            max_partitions: 10_000,
            partition_idle_expiry: Duration::from_secs(300),
        }
    }
}

/// The breaker: adaptive throttling per host.
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    config: CircuitBreakerConfig,
    /// Bucket `n` covers `[origin + n·slot, origin + (n+1)·slot)`.
    origin: Instant,
    slot: Duration,
    hosts: Partitions<Host>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// The slot number this bucket counts, +1 (0: never used).
    epoch: u64,
    /// Attempts sent.
    sent: u32,
    /// Of those, the ones the host did not fail.
    accepts: u32,
    /// Calls refused locally.
    refused: u32,
    /// Calls asked about, refused or not.
    calls: u32,
}

#[derive(Debug, Default)]
struct Host {
    buckets: [Bucket; BUCKETS],
    /// Since when more than `1 − 1/K` of the recent attempts failed.
    failing_since: Option<Instant>,
    /// Shares of calls earned by `1 − probability`; one goes out per whole
    /// share.
    credit: f64,
}

impl CircuitBreaker {
    pub(crate) fn new(config: CircuitBreakerConfig, origin: Instant) -> Result<Self, ConfigError> {
        let k = config.accept_multiplier;
        if !(k.is_finite() && k >= 1.0) {
            return Err(ConfigError::named(
                "circuit_breaker.accept_multiplier",
                "must be finite and at least 1",
            ));
        }
        if config.window < Duration::from_millis(BUCKETS as u64) {
            return Err(ConfigError::named(
                "circuit_breaker.window",
                "must be at least 10 ms",
            ));
        }
        if config.max_partitions == 0 {
            return Err(ConfigError::named(
                "circuit_breaker.max_partitions",
                "must be at least 1",
            ));
        }
        Ok(CircuitBreaker {
            slot: config.window / BUCKETS as u32,
            origin,
            hosts: Partitions::new(Bounds {
                max: config.max_partitions,
                idle: config.partition_idle_expiry,
            }),
            config,
        })
    }

    /// The slot `now` falls in, +1.
    fn epoch(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        let slot = self.slot.as_nanos().max(1);
        u64::try_from(since / slot).unwrap_or(u64::MAX - 1) + 1
    }

    /// May a first attempt go to `partition` now? A refusal counts as a
    /// request that was not accepted.
    pub(crate) fn allow(&self, partition: Partition, now: Instant) -> bool {
        let epoch = self.epoch(now);
        let c = &self.config;
        let k = c.accept_multiplier;
        self.hosts.with(partition, now, Host::default, |h| {
            h.wake(epoch);
            let window = h.counts(epoch, BUCKETS as u64);
            if window.sent == 0 {
                // No attempt ended in the whole window: a failure from
                // before it says nothing of now (a blip after an hour of
                // quiet is a new blip, not the old outage going on).
                h.failing_since = None;
            }
            let b = h.bucket(epoch);
            b.calls = b.calls.saturating_add(1);
            let requests = window.sent.saturating_add(window.refused);
            // The recent attempts still fail, or none has ended lately:
            // the calls let through are still out (a host that hangs until
            // the attempt's timeout) or were all refused, so the last
            // evidence stands.
            let recent = h.counts(epoch, RECENT);
            let failing_long = h
                .failing_since
                .is_some_and(|since| now.saturating_duration_since(since) >= c.min_failing)
                && (recent.sent == 0 || recent.failing(k));
            let p =
                (f64::from(requests) - k * f64::from(window.accepts)) / (f64::from(requests) + 1.0);
            if requests < c.min_requests || !failing_long || p <= 0.0 {
                h.credit = 0.0;
                return true;
            }
            h.credit += 1.0 - p;
            if h.credit >= 1.0 {
                h.credit -= 1.0;
                return true;
            }
            h.bucket(epoch).refused += 1;
            false
        })
    }

    /// An attempt to `partition` ended: `accepted` unless the host failed
    /// it (a transient failure).
    pub(crate) fn record(&self, partition: Partition, accepted: bool, now: Instant) {
        let epoch = self.epoch(now);
        let k = self.config.accept_multiplier;
        self.hosts.with(partition, now, Host::default, |h| {
            let b = h.bucket(epoch);
            b.sent = b.sent.saturating_add(1);
            b.accepts = b.accepts.saturating_add(u32::from(accepted));
            if h.counts(epoch, RECENT).failing(k) {
                h.failing_since.get_or_insert(now);
            } else {
                h.failing_since = None;
            }
        });
    }
}

impl Bucket {
    /// Whether the attempts sent failed more than `1 − 1/k` of the time
    /// (none sent: no).
    fn failing(&self, k: f64) -> bool {
        f64::from(self.sent) > k * f64::from(self.accepts)
    }
}

impl Host {
    /// The counts of the `slots` slots ending at `epoch`.
    fn counts(&self, epoch: u64, slots: u64) -> Bucket {
        let oldest = epoch.saturating_sub(slots - 1);
        self.buckets
            .iter()
            .filter(|b| b.epoch >= oldest && b.epoch <= epoch && b.epoch != 0)
            .fold(Bucket::default(), |sum, b| Bucket {
                epoch,
                sent: sum.sent.saturating_add(b.sent),
                accepts: sum.accepts.saturating_add(b.accepts),
                refused: sum.refused.saturating_add(b.refused),
                calls: sum.calls.saturating_add(b.calls),
            })
    }

    /// Called before a call is counted at `epoch`: after a quiet spell
    /// (no call asked, no attempt ended in the `RECENT` slots ending at
    /// `epoch`: two seconds, at least one, by default) a failing stretch
    /// is over, and what comes now is a new one (one failure, five quiet
    /// seconds, then a blip: the blip was refused as if the failure had
    /// gone on all along).
    fn wake(&mut self, epoch: u64) {
        let lately = self.counts(epoch, RECENT);
        if lately.calls == 0 && lately.sent == 0 {
            self.failing_since = None;
        }
    }

    /// The bucket counting `epoch`.
    fn bucket(&mut self, epoch: u64) -> &mut Bucket {
        #[allow(clippy::cast_possible_truncation)] // below BUCKETS
        let b = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        // An older slot is reused; a `now` from an earlier slot than the
        // bucket's (applied out of order) counts in the newer one.
        if b.epoch < epoch {
            *b = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        b
    }
}

#[cfg(test)]
mod tests;
