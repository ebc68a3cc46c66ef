//! Hedged requests: when a request is slower than its host usually is,
//! a second copy goes out and the first answer wins.
//!
//! ```
//! use std::time::Duration;
//! use reqwest_safe_retry::RetryPolicy;
//! use reqwest_safe_retry::hedging::HedgeConfig;
//!
//! // A second copy of a GET after its host's p95 latency (at least 5 ms),
//! // at most 5 % more requests, and each hedge admitted like a retry.
//! let policy = RetryPolicy::builder()
//!     .hedge(HedgeConfig {
//!         min_delay: Duration::from_millis(5),
//!         ..HedgeConfig::default()
//!     })
//!     .build()
//!     .unwrap();
//! # let _ = policy;
//! ```
//!
//! The parts: the configuration and the safety rule, and the per-host
//! latency tracker that gives the hedge delay with the extra-load budget.
//! The race itself is the middleware's (`HttpAttempts::attempt`).
//! [`HedgeConfig`] says what hedging does to the other features and they
//! to it.

use std::time::{Duration, Instant};

use http::Method;

use crate::vocabulary::{is_idempotent, ConfigError, Partition};

use super::admission::{Bounds, Partitions};

/// Hedging's settings: when a second copy of a slow request is sent.
/// Off unless a policy ([`crate::RetryPolicyBuilder::hedge`]) or a request
/// ([`crate::RequestOptions::hedge`]) turns it on.
///
/// A hedge is sent when an attempt has waited its host's `percentile`
/// latency (clamped to `min_delay..=max_delay`) without an answer, the
/// host has `min_samples` latencies on record, the host's hedge budget
/// (`max_extra_load` of its first attempts) has a hedge left, and the
/// policy's retry admission admits it like a retry (of
/// [`crate::admission::RetryKind::Hedge`]). The first answer wins and the other copy is
/// dropped, its connection closed; a copy that fails transiently does not
/// end the attempt while the other is still in flight. Both copies carry
/// the same idempotency key and end by the attempt's timeout and the
/// deadline.
///
/// # With the other features
///
/// - **Replayable bodies.** A hedge of a streamed body sends the bytes
///   its first copy's replay buffer kept, then follows that copy chunk by
///   chunk: one copy reads the caller's stream, the other waits for its
///   chunks, and the buffer is shared (a hedge keeps no bytes of its own).
///   With the buffer off (`body_replay_limit(0)`) a stream is not copied,
///   so it is never hedged. Once the body has outgrown the buffer (its
///   limit, or the client-wide cap), no hedge is sent: it could not send
///   the body's start. When the body outgrows the buffer after the hedge
///   went out, the copy that does not read the stream cannot go on: it
///   drops out of the race, and the copy that reads it is sent once, to
///   the end, and its answer is the attempt's (the call then ends as an
///   unhedged one would: a success, or a stop that names the body). The
///   first copy reads the stream unless the hedge got to it first (the
///   first copy had not begun sending its body, still connecting, say):
///   then the first copy is the one that drops out. A [`crate::replay::BodySource`]
///   makes each copy's body afresh, when the copy is sent.
/// - **Failed copies.** A copy that drops out, and a hedge that ends in
///   an error rather than an answer of its host (refused, timed out, a
///   failure below this layer), is never the attempt's answer while the
///   other copy has one or may still give one, and a hedge that failed is
///   never counted a win ([`crate::RetryReport::hedge_wins`]). A copy
///   dropped for its body tells the admission nothing of the host.
/// - **Pacing and admission.** A hedge is admitted like a retry
///   ([`crate::admission::RetryKind::Hedge`]), asks once and never waits; the default
///   admission pays it from its bucket only, never while a retry waits,
///   and never on a route it paces: a throttled route gets no hedge. What
///   a hedge's answer says of the host's rate (a 429, a Retry-After, the
///   rate-limit fields) reaches the admission as the first copy's would,
///   so a hedge's 429 paces the route; being no retry, a hedge's answer
///   neither raises nor lowers the rate at which an outage's retries are
///   released.
/// - **The breaker.** It is asked once per call, before the first
///   attempt; a hedge is part of an attempt it let through and is not
///   asked. It counts one answer per attempt, the one the race returned:
///   a hedge's success after the first copy's failure counts as the host
///   accepting; the losing copy's answer is not counted.
/// - **Replicas.** The hedge opens its connection through the same
///   resolver, healthy addresses first, and asks for `Connection: close`
///   as its first copy does while an address is out of service. Each
///   copy keeps the addresses its own connection was handed: a copy that
///   ends is judged on its own address (its answer's; for a failure
///   before any answer, the one its connection tried first), and a probe
///   ends with the verdict of the copy that made it, or with no verdict
///   when that copy is dropped as the race's loser. The attempt's address
///   ([`crate::RetryReport::addresses`]) and whether its retry goes to
///   another replica at once are those of the copy whose answer the race
///   returned, decided once both copies are judged: when the two copies
///   failed on two replicas and no other is healthy, the failure is the
///   host's.
/// - **Deadlines.** Both copies end by the attempt's timeout (its own, or
///   the time left to the deadline, the shorter): the hedge is sent with
///   what is left of it, says so in the deadline header, and is not sent
///   when the hedge delay would outlast the attempt or nothing is left.
///   The minimum window is not asked of a hedge (it is no new attempt).
///   When the first copy fails transiently, the attempt waits for the
///   hedge, within that timeout, before any retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgeConfig {
    /// The latency percentile, per host, after which the second copy goes.
    /// Default 0.95 (p95): about one request in twenty is hedged while
    /// the host is as usual.
    pub percentile: f64,
    /// The shortest hedge delay, whatever the percentile says. Default 1 ms.
    pub min_delay: Duration,
    /// The longest hedge delay. Default 1 s.
    pub max_delay: Duration,
    /// Latencies a host needs on record before it is hedged at all
    /// (1..=500; recent latencies weigh most, and old ones fade: the
    /// record holds about 500 to 1000 of them). Default 100.
    pub min_samples: u32,
    /// Extra load allowed per host, as a fraction of its first attempts
    /// (0 to 1). Default 0.05: at most 5 % more requests.
    pub max_extra_load: f64,
    /// Hedge PUT and DELETE too (GET, HEAD, OPTIONS and TRACE always are).
    /// Default off.
    pub idempotent_methods: bool,
    /// Hedge requests that carry an idempotency key (a POST with a key).
    /// Default off: a server with Stripe's semantics answers the later copy
    /// `409 Conflict` while the first is in progress, so the hedge only
    /// helps when the first copy never reached the server. An unkeyed POST
    /// or PATCH is never hedged.
    pub keyed: bool,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            percentile: 0.95,
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_secs(1),
            min_samples: 100,
            max_extra_load: 0.05,
            idempotent_methods: false,
            keyed: false,
        }
    }
}

impl HedgeConfig {
    /// Whether the safety rule lets a request of `method` be hedged.
    /// An unkeyed POST (or PATCH) never is.
    pub(crate) fn may_hedge(&self, method: &Method, keyed: bool) -> bool {
        let safe = matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        safe || (is_idempotent(method) && self.idempotent_methods) || (keyed && self.keyed)
    }

    /// Checks every setting, naming the first that is out of range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.percentile > 0.0 && self.percentile <= 1.0) {
            return Err(ConfigError::named(
                "hedge.percentile",
                "must be above 0 and at most 1",
            ));
        }
        if self.max_delay.is_zero() || self.max_delay < self.min_delay {
            return Err(ConfigError::named(
                "hedge.max_delay",
                "must be above zero and at least min_delay",
            ));
        }
        if self.min_samples == 0 || self.min_samples > WINDOW / 2 {
            return Err(ConfigError::named(
                "hedge.min_samples",
                "must be 1 to 500 (no more latencies are kept)",
            ));
        }
        if !(0.0..=1.0).contains(&self.max_extra_load) {
            return Err(ConfigError::named("hedge.max_extra_load", "must be 0 to 1"));
        }
        Ok(())
    }
}

/// Buckets of the latency histogram.
const BUCKETS: usize = 64;
/// The lower bound of the first bucket, in microseconds.
const FIRST_US: f64 = 50.0;
/// Each bucket is this much wider than the one before.
const GROWTH: f64 = 1.25;
/// Counts are halved when they reach this total: recent latency weighs most.
const WINDOW: u32 = 1000;
/// The most hedges a host may save up.
const MAX_TOKENS: f64 = 10.0;
/// Hosts tracked at most (a multiple of the map's 16 shards); when the
/// table is full, a host idle for `IDLE_HOST` makes room for a new one,
/// and else the least recently used.
const MAX_HOSTS: usize = 10_000;
/// A host unused for this long is the first dropped when room is needed.
const IDLE_HOST: Duration = Duration::from_secs(300);

/// One host's recent latencies (a fixed-size histogram) and hedge budget.
#[derive(Debug, Clone)]
struct Host {
    counts: [u32; BUCKETS],
    /// The sum of `counts`.
    total: u32,
    /// Latencies recorded, ever (saturating): what `min_samples` asks of.
    seen: u32,
    tokens: f64,
}

impl Host {
    fn new() -> Self {
        Host {
            counts: [0; BUCKETS],
            total: 0,
            seen: 0,
            tokens: 0.0,
        }
    }

    fn record(&mut self, latency: Duration) {
        self.counts[bucket(latency)] += 1;
        self.total += 1;
        self.seen = self.seen.saturating_add(1);
        if self.total >= WINDOW {
            self.total = 0;
            // Rounded down, so that old latencies leave: a count of one is
            // gone at the next halving. Rounded up, an outlier's bucket
            // kept a count of one for ever, and 42 of them held the p95 at
            // 155 ms among answers of 2 ms.
            for c in &mut self.counts {
                *c /= 2;
                self.total += *c;
            }
        }
    }

    /// The upper bound of the bucket holding the `p` percentile.
    fn percentile(&self, p: f64) -> Duration {
        // Casts: `total` is below WINDOW, the rank at most `total`.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = (f64::from(self.total) * p.clamp(0.0, 1.0)).ceil() as u32;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank.max(1) {
                return upper(i);
            }
        }
        upper(BUCKETS - 1)
    }
}

fn bucket(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_US {
        return 0;
    }
    // Casts: the logarithm of a finite positive ratio, clamped below BUCKETS.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((us / FIRST_US).ln() / GROWTH.ln()).floor() as usize + 1;
    i.min(BUCKETS - 1)
}

fn upper(i: usize) -> Duration {
    // `i` is below BUCKETS, so the exponent fits an i32.
    let exp = i32::try_from(i).unwrap_or(i32::MAX);
    Duration::from_secs_f64(FIRST_US * GROWTH.powi(exp) / 1e6)
}

/// The per-host latency tracker and extra-load budget, shared by every
/// clone of a policy. Its settings come with each call, so a request's own
/// [`HedgeConfig`] reads the same latencies. The table of hosts is
/// bounded, and makes room for a new host by dropping an idle one (a
/// table that kept its first 10 000 hosts for ever never hedged another).
#[derive(Debug)]
pub(crate) struct Hedger {
    hosts: Partitions<Host>,
}

impl Default for Hedger {
    fn default() -> Self {
        Hedger {
            hosts: Partitions::new(Bounds {
                max: MAX_HOSTS,
                idle: IDLE_HOST,
            }),
        }
    }
}

impl Hedger {
    /// A first attempt to `host` at `now` earns the budget its share.
    pub(crate) fn first_attempt(&self, config: &HedgeConfig, host: Partition, now: Instant) {
        self.hosts.with(host, now, Host::new, |h| {
            h.tokens = (h.tokens + config.max_extra_load).min(MAX_TOKENS);
        });
    }

    /// An attempt to `host` answered at `now` after `latency` (or was
    /// given up after it: the latency is at least that).
    pub(crate) fn record(&self, host: Partition, latency: Duration, now: Instant) {
        self.hosts.with(host, now, Host::new, |h| h.record(latency));
    }

    /// How long to wait before hedging a request to `host`: `None` before
    /// enough samples.
    pub(crate) fn delay(&self, c: &HedgeConfig, host: Partition) -> Option<Duration> {
        self.hosts
            .peek(host, |h| {
                (h.seen >= c.min_samples).then(|| {
                    h.percentile(c.percentile)
                        .clamp(c.min_delay, c.max_delay.max(c.min_delay))
                })
            })
            .flatten()
    }

    /// Spends one hedge of `host`'s budget at `now`: `false` when none is
    /// left.
    pub(crate) fn spend(&self, host: Partition, now: Instant) -> bool {
        self.hosts.with(host, now, Host::new, |h| {
            let left = h.tokens >= 1.0;
            if left {
                h.tokens -= 1.0;
            }
            left
        })
    }

    /// Gives back a hedge spent and then not sent (admission refused it).
    pub(crate) fn refund(&self, host: Partition, now: Instant) {
        self.hosts.with(host, now, Host::new, |h| {
            h.tokens = (h.tokens + 1.0).min(MAX_TOKENS);
        });
    }
}

#[cfg(test)]
mod tests;
